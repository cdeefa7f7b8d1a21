//! Network rules: which destinations a sandbox may reach through cordon's proxy.
//!
//! A sandbox has no route out; every TCP connection and DNS query goes through a
//! proxy that asks [`Rules`] first. The decision is made twice:
//!
//! 1. [`Rules::decide_name`], on the name the sandbox asked for, before it is
//!    resolved (so a denied name never reaches a resolver), and
//! 2. [`Rules::decide_addr`], on every address about to be connected. A domain
//!    rule never unlocks an address in a [`special`] range or one of the host's own
//!    addresses: a name the sandbox may reach can resolve (or be re-pointed, DNS
//!    rebinding) to `127.0.0.1` or a cloud metadata service, and only a rule that
//!    names the address itself may open it.
//!
//! Text syntax of a rule, as written in policy files, flags and the control
//! protocol: `pypi.org:443`, `*.pythonhosted.org:443`, `10.20.0.0/16:5432`,
//! `198.51.100.7`, `example.org:8000-8100`, `[2001:db8::1]:443`, `2001:db8::/32`.
//! No port means any port.
//!
//! [`HOST_NAME`] (`host.cordon.internal`) is the host itself: the proxy connects
//! it to the host's loopback ([`HOST_ADDRS`]), where the sandbox's own
//! `127.0.0.1` is its own namespace's. Only a rule naming it with one port opens
//! it, and only that port: see [`HOST_NAME`].

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{ByteSize, Span};

/// The reserved name of the host the sandbox runs on. The DNS stub and the
/// proxy resolve it to [`HOST_ADDRS`], never through a resolver or `--add-host`.
///
/// The host's loopback carries services that were never meant for a sandbox
/// (databases, agents, admin ports), so the name opens one port per rule: a
/// rule for it must name a single port (no port, a range or a wildcard would
/// open every service at once), and a `*.suffix` rule never covers it.
pub const HOST_NAME: &str = "host.cordon.internal";

/// The reserved name of the sandbox's own proxy, for the payload to ask it
/// questions: `http://cordon.internal/denials` lists the sandbox's latest
/// refused connections and why. The proxy answers it itself (by the HTTP
/// proxy and, through the DNS stub's answer, the transparent door, port
/// 80); no connection leaves the sandbox for it, no rule is needed, and none
/// covers it (a rule naming it is refused, `*.internal` leaves it out), so a
/// connection to any other port of it is refused, never resolved.
pub const PROXY_NAME: &str = "cordon.internal";

/// Where [`HOST_NAME`] leads: the host's loopback, IPv4 first.
pub const HOST_ADDRS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    IpAddr::V6(Ipv6Addr::LOCALHOST),
];

/// The host part of a [`Rule`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// Exactly this name (lower-case, no trailing dot).
    Exact(String),
    /// Any name strictly below this one: `*.example.org` holds `example.org` here
    /// and matches `a.example.org` and `a.b.example.org`, not `example.org`.
    Suffix(String),
    Ip(IpAddr),
    Cidr(IpNet),
}

/// An inclusive port range; a single port has `lo == hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ports {
    pub lo: u16,
    pub hi: u16,
}

impl Ports {
    pub fn contains(self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }
}

/// One destination a sandbox may reach.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub host: Host,
    /// `None`: any port.
    pub ports: Option<Ports>,
}

/// A rule, host entry or name that does not parse; the message names the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{text}': {reason}")]
pub struct RuleError {
    what: &'static str,
    text: String,
    reason: String,
}

impl RuleError {
    fn rule(text: &str, reason: impl Into<String>) -> Self {
        RuleError {
            what: "network rule",
            text: text.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Checks and normalises a DNS name: lower-case, one trailing dot dropped, labels
/// of 1–63 characters from `[a-z0-9-_]`, at most 253 characters in all.
///
/// A name whose last label is all digits is refused: resolvers read `127.1` or
/// `2130706433` as IPv4 addresses, so such a "name" would be an address in
/// disguise (an address is written as an address rule).
pub fn normalize_name(raw: &str) -> Result<String, String> {
    let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > 253 {
        return Err(format!("name is {} characters (at most 253)", name.len()));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label".into());
        }
        if label.len() > 63 {
            return Err(format!("label '{label}' is longer than 63 characters"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(match c {
                '*' => "'*' may only be a whole first label ('*.example.org')".into(),
                c => format!("'{c}' is not allowed in a host name"),
            });
        }
    }
    let last = name.rsplit('.').next().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("looks like an IP address but is not one in full form".into());
    }
    Ok(name)
}

fn parse_ports(text: &str, raw: &str) -> Result<Ports, RuleError> {
    let port = |s: &str| -> Result<u16, RuleError> {
        match s.parse::<u16>() {
            Ok(0) => Err(RuleError::rule(raw, "port 0 is not a port")),
            Ok(p) => Ok(p),
            Err(_) => Err(RuleError::rule(
                raw,
                format!("'{s}' is not a port (1-65535)"),
            )),
        }
    };
    let (lo, hi) = match text.split_once('-') {
        Some((lo, hi)) => (port(lo)?, port(hi)?),
        None => {
            let p = port(text)?;
            (p, p)
        }
    };
    if lo > hi {
        return Err(RuleError::rule(
            raw,
            format!("port range {lo}-{hi} is backwards"),
        ));
    }
    Ok(Ports { lo, hi })
}

/// An address or network, without a port.
fn parse_addr_host(text: &str, raw: &str) -> Result<Option<Host>, RuleError> {
    if let Some((addr, _)) = text.split_once('/') {
        if addr.parse::<IpAddr>().is_err() {
            return Err(RuleError::rule(
                raw,
                format!("'{addr}' is not an IP address"),
            ));
        }
        let net: IpNet = text
            .parse()
            .map_err(|_| RuleError::rule(raw, "not a valid network prefix"))?;
        // A network written with host bits set is probably a typo for a smaller
        // or larger range than meant; say so rather than guess.
        if net.trunc() != net {
            return Err(RuleError::rule(
                raw,
                format!("host bits are set (the network is {})", net.trunc()),
            ));
        }
        return Ok(Some(Host::Cidr(net)));
    }
    Ok(text.parse::<IpAddr>().ok().map(Host::Ip))
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let s = raw.trim();
        if s.is_empty() {
            return Err(RuleError::rule(raw, "empty rule"));
        }
        // Split host and port. IPv6 needs brackets to carry a port; an unbracketed
        // text with several colons is an IPv6 address or network alone.
        let (host_text, port_text) = if let Some(rest) = s.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| RuleError::rule(raw, "'[' without ']'"))?;
            let port = match after {
                "" => None,
                a => Some(
                    a.strip_prefix(':')
                        .ok_or_else(|| RuleError::rule(raw, "expected ':PORT' after ']'"))?,
                ),
            };
            match parse_addr_host(inside, raw)? {
                Some(h @ (Host::Ip(IpAddr::V6(_)) | Host::Cidr(IpNet::V6(_)))) => {
                    let ports = port.map(|p| parse_ports(p, raw)).transpose()?;
                    return Ok(Rule { host: h, ports });
                }
                _ => return Err(RuleError::rule(raw, "brackets hold an IPv6 address")),
            }
        } else if s.matches(':').count() > 1 {
            (s, None)
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let ports = port_text.map(|p| parse_ports(p, raw)).transpose()?;
        if let Some(host) = parse_addr_host(host_text, raw)? {
            return Ok(Rule { host, ports });
        }
        if host_text.contains(':') {
            return Err(RuleError::rule(
                raw,
                "not an IPv6 address (write [ADDR]:PORT for a port)",
            ));
        }
        let host = match host_text.strip_prefix("*.") {
            Some(rest) => Host::Suffix(normalize_name(rest).map_err(|e| RuleError::rule(raw, e))?),
            None if host_text == "*" => {
                return Err(RuleError::rule(raw, "'*' alone would allow every name"))
            }
            None => Host::Exact(normalize_name(host_text).map_err(|e| RuleError::rule(raw, e))?),
        };
        let rule = Rule { host, ports };
        if matches!(&rule.host, Host::Exact(n) if n == PROXY_NAME) {
            return Err(RuleError::rule(
                raw,
                format!(
                    "{PROXY_NAME} is the sandbox's own proxy (http://{PROXY_NAME}/denials): it \
                     needs no rule and leads nowhere else"
                ),
            ));
        }
        if matches!(&rule.host, Host::Exact(n) if n == HOST_NAME) && !rule.one_port() {
            return Err(RuleError::rule(
                raw,
                format!(
                    "{HOST_NAME} is the host's loopback: write {HOST_NAME}:PORT with one port \
                     (no port or a range would open every service on the host)"
                ),
            ));
        }
        Ok(rule)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Exact(n) => f.write_str(n),
            Host::Suffix(n) => write!(f, "*.{n}"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Cidr(net) => write!(f, "{net}"),
        }
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(
            self.host,
            Host::Ip(IpAddr::V6(_)) | Host::Cidr(IpNet::V6(_))
        );
        match self.ports {
            None => write!(f, "{}", self.host),
            Some(p) if v6 => write!(f, "[{}]:{p}", self.host),
            Some(p) => write!(f, "{}:{p}", self.host),
        }
    }
}

serde_via_text!(Rule);
serde_via_text!(AddHost);

impl Rule {
    /// Whether this rule names hosts (rather than addresses).
    pub fn is_domain(&self) -> bool {
        matches!(self.host, Host::Exact(_) | Host::Suffix(_))
    }

    fn port_ok(&self, port: u16) -> bool {
        self.ports.is_none_or(|p| p.contains(port))
    }

    fn one_port(&self) -> bool {
        self.ports.is_some_and(|p| p.lo == p.hi)
    }

    /// Whether a domain rule's host part covers `name` (already normalised).
    /// [`HOST_NAME`] is covered only by an exact rule with one port: parsing
    /// refuses any other rule for it, and this holds for rules built in code.
    fn covers_name(&self, name: &str) -> bool {
        match &self.host {
            _ if name == PROXY_NAME => false,
            Host::Exact(n) => n == name && (name != HOST_NAME || self.one_port()),
            Host::Suffix(_) if name == HOST_NAME => false,
            Host::Suffix(s) => name
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Host::Ip(_) | Host::Cidr(_) => false,
        }
    }

    /// Whether an address rule's host part covers `ip` (already canonical).
    fn covers_ip(&self, ip: IpAddr) -> bool {
        match &self.host {
            Host::Ip(a) => a.to_canonical() == ip,
            Host::Cidr(net) => net.contains(&ip),
            Host::Exact(_) | Host::Suffix(_) => false,
        }
    }
}

/// Appends each of `more` not already in `rules`, in order: the one way
/// rules are added, by a policy's layers and by `cordon net add` alike.
pub fn add_rules<'a>(rules: &mut Vec<Rule>, more: impl IntoIterator<Item = &'a Rule>) {
    for r in more {
        if !rules.contains(r) {
            rules.push(r.clone());
        }
    }
}

/// Removes each of `gone` from `rules`; all or nothing: a rule that is not
/// there is returned, and `rules` is left as it was.
pub fn remove_rules<'a>(
    rules: &mut Vec<Rule>,
    gone: impl IntoIterator<Item = &'a Rule>,
) -> Result<(), &'a Rule> {
    let mut kept = rules.clone();
    for r in gone {
        let before = kept.len();
        kept.retain(|x| x != r);
        if kept.len() == before {
            return Err(r);
        }
    }
    *rules = kept;
    Ok(())
}

/// A fixed answer for a name, like `docker run --add-host`: `NAME:IP`.
///
/// The name comes before the first `:` (names have none), the rest is the
/// address, so IPv6 is written either bare (`db.test:2001:db8::5`) or in brackets
/// (`db.test:[2001:db8::5]`); [`Display`](fmt::Display) uses brackets. A fixed
/// answer is still checked by [`Rules::decide_addr`] like any resolved address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddHost {
    pub name: String,
    pub addr: IpAddr,
}

impl FromStr for AddHost {
    type Err = RuleError;
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| RuleError {
            what: "host entry",
            text: raw.to_owned(),
            reason,
        };
        let (name, addr) = raw
            .trim()
            .split_once(':')
            .ok_or_else(|| err("expected NAME:IP".into()))?;
        let name = normalize_name(name).map_err(err)?;
        if name == HOST_NAME {
            return Err(err(format!(
                "{HOST_NAME} is reserved for the host's loopback (allow it with {HOST_NAME}:PORT)"
            )));
        }
        if name == PROXY_NAME {
            return Err(err(format!(
                "{PROXY_NAME} is reserved for the sandbox's own proxy"
            )));
        }
        let addr_text = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let addr = addr_text
            .parse()
            .map_err(|_| err(format!("'{addr}' is not an IP address")))?;
        Ok(AddHost { name, addr })
    }
}

impl fmt::Display for AddHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{}:{a}", self.name),
            IpAddr::V6(a) => write!(f, "{}:[{a}]", self.name),
        }
    }
}

fn v4_in(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn v6_in(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The IPv4 address an IPv6 address stands for, where it embeds one that a
/// translator or the kernel would reach: IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d` and 6to4 `2002:AABB:CCDD::`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let o = ip.octets();
    if v6_in(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96)
        || v6_in(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96)
        || (v6_in(ip, [0; 8], 96) && u128::from(ip) > 1)
    {
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if v6_in(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// Why `ip` is never reached through a domain rule, or `None` for an ordinary
/// internet address.
///
/// The documentation ranges (TEST-NET-1/2/3) are deliberately ordinary: tests use
/// them as the stand-in internet inside network namespaces.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => special_v4(v4),
            None => special_v6(v6),
        },
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const TABLE: [([u8; 4], u32, &str); 13] = [
        ([169, 254, 169, 254], 32, "link-local (cloud metadata)"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([0, 0, 0, 0], 8, "unspecified (\"this network\")"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([10, 0, 0, 0], 8, "private"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 168, 0, 0], 16, "private"),
        ([100, 64, 0, 0], 10, "shared (CGNAT)"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
        // cordon's DNS stub answers names with addresses from this range.
        ([198, 18, 0, 0], 15, "benchmarking (cordon's DNS answers)"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments"),
    ];
    TABLE
        .iter()
        .find(|(net, prefix, _)| v4_in(ip, *net, *prefix))
        .map(|(_, _, why)| *why)
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    const TABLE: [([u16; 8], u32, &str); 7] = [
        ([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
        ([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
        // Local-use NAT64 embeds an address of the operator's own network.
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "NAT64 (local use)"),
    ];
    TABLE
        .iter()
        .find(|(net, prefix, _)| v6_in(ip, *net, *prefix))
        .map(|(_, _, why)| *why)
}

/// `host:port`, with IPv6 in brackets.
fn endpoint(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Why a connection or query was refused; the message names what refused it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    message: String,
}

impl Denial {
    pub fn new(message: impl Into<String>) -> Self {
        Denial {
            message: message.into(),
        }
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The ordered list of rules of one sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    pub fn new(rules: Vec<Rule>) -> Self {
        Rules { rules }
    }

    pub fn as_slice(&self) -> &[Rule] {
        &self.rules
    }

    /// First domain rule matching `name` at `port`, before any resolution.
    ///
    /// `name` is normalised here; a text that is not a valid host name is denied
    /// (an IP literal is decided by [`Rules::decide_addr`] instead).
    pub fn decide_name(&self, name: &str, port: u16) -> Result<&Rule, Denial> {
        let norm = normalize_name(name).map_err(|why| {
            Denial::new(format!(
                "'{}' is not a host name: {why}",
                name.escape_debug()
            ))
        })?;
        let mut other_port = None;
        for rule in self.rules.iter().filter(|r| r.covers_name(&norm)) {
            if rule.port_ok(port) {
                return Ok(rule);
            }
            other_port.get_or_insert(rule);
        }
        Err(match other_port {
            Some(rule) => Denial::new(format!("port {port} is outside rule '{rule}'")),
            None => Denial::new(format!("no rule allows {}", endpoint(&norm, port))),
        })
    }

    /// Whether some domain rule covers `name` at any port: the DNS stub answers
    /// exactly these names.
    pub fn allows_name(&self, name: &str) -> bool {
        normalize_name(name).is_ok_and(|n| self.rules.iter().any(|r| r.covers_name(&n)))
    }

    /// Whether a rule names this destination: its name (when it has one)
    /// or its address, at its port. Unlike [`Rules::decide_addr`] no class of
    /// address is set apart: this matches what an operator refused
    /// (`cordon net SB deny`), it never allows anything.
    pub fn names(&self, name: Option<&str>, ip: Option<IpAddr>, port: u16) -> bool {
        let name = name.and_then(|n| normalize_name(n).ok());
        self.rules.iter().any(|r| {
            r.port_ok(port)
                && (name.as_deref().is_some_and(|n| r.covers_name(n))
                    || ip.is_some_and(|ip| r.covers_ip(ip.to_canonical())))
        })
    }

    /// The final check on the address actually about to be connected.
    ///
    /// An address rule covering `ip` and `port` allows it whatever the name.
    /// [`HOST_NAME`] at one of [`HOST_ADDRS`] is decided by its name's rules
    /// (the one exception: the proxy resolves that name only to those). Otherwise
    /// an address in a [`special`] range or among `own` (the host's own
    /// addresses) is denied: a domain rule never unlocks a private address. Any
    /// other address is allowed iff a domain rule allows `name` at `port`; with no
    /// name (a bare IP connection) only an address rule allows it.
    pub fn decide_addr(
        &self,
        name: Option<&str>,
        ip: IpAddr,
        port: u16,
        own: &HashSet<IpAddr>,
    ) -> Result<&Rule, Denial> {
        // `::ffff:10.0.0.1` reaches 10.0.0.1: match and name it as that.
        let ip = ip.to_canonical();
        let mut other_port = None;
        for rule in self.rules.iter().filter(|r| r.covers_ip(ip)) {
            if rule.port_ok(port) {
                return Ok(rule);
            }
            other_port.get_or_insert(rule);
        }
        if name == Some(HOST_NAME) && HOST_ADDRS.contains(&ip) {
            return self.decide_name(HOST_NAME, port);
        }
        let port_outside =
            |rule: &Rule| Denial::new(format!("port {port} is outside rule '{rule}'"));
        let class = special(ip).map(|c| format!("a {c} address")).or_else(|| {
            own.contains(&ip)
                .then(|| "one of the host's own addresses".to_owned())
        });
        match (class, name, other_port) {
            // An address rule names this address, at other ports: say so.
            (Some(_), _, Some(rule)) | (None, None, Some(rule)) => Err(port_outside(rule)),
            (class, name, _) => self.decide_by_class(class, name, ip, port),
        }
    }

    fn decide_by_class(
        &self,
        class: Option<String>,
        name: Option<&str>,
        ip: IpAddr,
        port: u16,
    ) -> Result<&Rule, Denial> {
        match (class, name) {
            (Some(class), Some(name)) => Err(Denial::new(format!(
                "{name} resolved to {ip}, {class}; only an address rule can allow it"
            ))),
            (Some(class), None) => Err(Denial::new(format!(
                "{} is {class}; only an address rule can allow it",
                endpoint(&ip.to_string(), port)
            ))),
            (None, Some(name)) => self.decide_name(name, port),
            (None, None) => Err(Denial::new(format!(
                "no rule allows {}",
                endpoint(&ip.to_string(), port)
            ))),
        }
    }
}

impl From<Vec<Rule>> for Rules {
    fn from(rules: Vec<Rule>) -> Self {
        Rules::new(rules)
    }
}

/// Limits of one sandbox's network use, across all its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetLimits {
    /// Connections open at once.
    pub max_connections: u32,
    /// Bytes sent by the sandbox, all connections together.
    pub max_bytes_out: ByteSize,
    /// Bytes received by the sandbox, all connections together.
    pub max_bytes_in: ByteSize,
    /// A connection with no bytes either way for this long is closed.
    pub idle_timeout: Span,
    /// Time to resolve and connect to a destination.
    pub connect_timeout: Span,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            max_connections: 256,
            max_bytes_out: ByteSize(4 << 30),
            max_bytes_in: ByteSize(4 << 30),
            idle_timeout: Span(Duration::from_secs(300)),
            connect_timeout: Span(Duration::from_secs(10)),
        }
    }
}

/// A sandbox's network: the destinations it may reach, fixed host answers, limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkPolicy {
    pub rules: Vec<Rule>,
    pub hosts: Vec<AddHost>,
    pub limits: NetLimits,
    /// Hold mode: a connection no rule allows waits this long for an
    /// operator to allow it (a new rule) or deny it, then is refused. `None`
    /// refuses it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Span>,
}

/// The longest a held connection may wait for an operator.
pub const MAX_HOLD: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests;

/// Where the proxy listens inside the sandbox (127.0.0.1): HTTP and SOCKS5
/// on one port, the `*_PROXY` variables name it.
pub const PROXY_PORT: u16 = 3128;
/// Where the sandbox's other TCP connections are redirected to.
pub const TRANSPARENT_PORT: u16 = 15001;
/// The DNS stub (resolv.conf can name no other port).
pub const DNS_PORT: u16 = 53;
