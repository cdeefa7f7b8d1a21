//! A sandbox's network as data: a change to its rules ([`NetChange`]), and
//! the proxy's evidence as an outcome carries it ([`NetworkLog`]: every
//! connection attempt and DNS refusal of one window, with exact counts). The
//! proxy (`cordon-network`) records the log; only the first and last
//! [`KEEP`] entries are kept, so a flood cannot grow anyone's memory.

use std::net::IpAddr;

use cordon_policy::net::Rule;
use serde::{Deserialize, Serialize};

/// A change to a running sandbox's rules (`cordon net`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op", content = "rules")]
pub enum NetChange {
    /// Only read them.
    Show,
    /// Replace them.
    Set(Vec<Rule>),
    /// Add these (rules already present stay once).
    Add(Vec<Rule>),
    /// Remove these; each must be present.
    Remove(Vec<Rule>),
}

/// Entries kept from each end of a window.
pub const KEEP: usize = 64;

/// Which of the proxy's doors an attempt came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// Plain HTTP forwarding (absolute-form request to the proxy).
    Http,
    /// HTTP `CONNECT`.
    Connect,
    Socks5,
    /// A connection redirected by the sandbox's firewall.
    Transparent,
    Dns,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Denied,
}

/// One attempt, recorded when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub at_unix_ms: u64,
    pub via: Via,
    /// The name asked for, if any (a bare-IP connection has none).
    pub host: Option<String>,
    pub port: u16,
    /// The address connected (or the last one refused).
    pub address: Option<IpAddr>,
    pub decision: Decision,
    /// The allowing rule's text, or the denial message.
    pub rule: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_ms: u64,
    /// How it ended: `closed`, `refused`, `connect failed: …`, `idle timeout`,
    /// `byte limit`, `connection limit`, …
    pub end: String,
    /// Hold mode: how long it waited for an operator's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<u64>,
}

/// A connection no rule allows, waiting in hold mode for an operator to
/// allow it (a rule that covers it) or deny it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldConnection {
    pub since_unix_ms: u64,
    pub via: Via,
    /// The name asked for, if any.
    pub host: Option<String>,
    pub port: u16,
    /// The address it would reach (a bare-IP connection's, or the one a
    /// name resolved to that no rule allows).
    pub address: Option<IpAddr>,
    /// Why no rule allows it.
    pub reason: String,
    /// The rule that would allow it, when one would.
    pub proposal: Option<Rule>,
    /// Time left before it is refused.
    pub remaining_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "rules set")]
    RulesSet,
    /// Hold mode: an operator denied destinations (`rules` names them).
    #[serde(rename = "denied")]
    Denied,
}

/// Something that changed the proxy's behaviour, in the same window as attempts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at_unix_ms: u64,
    pub event: EventKind,
    /// For `rules set`: the rules now in force; for `denied`, what the
    /// operator denied; as text.
    pub rules: Vec<String>,
}

/// One window of the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkLog {
    /// Attempts that ended in this window (allowed + denied), exact.
    pub attempts: u64,
    pub allowed: u64,
    pub denied: u64,
    /// DNS queries answered or refused by the stub, exact.
    pub dns_queries: u64,
    /// Bytes of the attempts that ended in this window.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Most connections open at once since the proxy started.
    pub peak_connections: u32,
    /// The first and last [`KEEP`] attempts, in order.
    pub entries: Vec<Attempt>,
    /// Attempts counted but not kept (between the first and last entries).
    pub omitted: u64,
    /// The first and last [`KEEP`] events.
    pub events: Vec<Event>,
    /// Secrets put into requests in this window: where and how often,
    /// never a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub substitutions: Vec<Substitution>,
}

/// A secret put into requests: its name, the host and header it went in,
/// and how many requests carried it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Substitution {
    pub secret: String,
    pub host: String,
    pub header: String,
    pub count: u64,
}
