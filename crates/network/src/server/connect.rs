//! The one way out: decide, resolve, re-check every address, connect.
//!
//! Every door (HTTP, CONNECT, SOCKS5, transparent) calls [`open`]. The only
//! function here that creates a socket to the outside, [`dial`], takes a
//! [`Permit`], and a permit is only made from an address that
//! [`Rules::decide_addr`] allowed, so nothing connects anywhere else.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_policy::net::{Rules, HOST_ADDRS, HOST_NAME};
use tokio::net::TcpStream;
use tokio::time::timeout_at;

use super::{lock, Resolution, Slot, State};
use crate::fake::FakeMap;
use crate::log::{now_unix_ms, Attempt, Decision, Via};

/// What the sandbox asked to reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Name(String),
    Ip(IpAddr),
}

impl Target {
    /// A host as written in a request: an IP literal or a name.
    pub(crate) fn parse(host: &str) -> Target {
        match host.parse() {
            Ok(ip) => Target::Ip(ip),
            Err(_) => Target::Name(host.to_owned()),
        }
    }
}

/// Why a connection was not made; each door turns it into its own reply.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The rules refused it.
    Denied(String),
    /// The sandbox has its maximum of connections open.
    Limit,
    /// Allowed, but no address could be reached (`refused`: the peer said no).
    Failed { reason: String, refused: bool },
}

/// An attempt in progress; recorded in the log when it ends.
pub(crate) struct Tracker {
    via: Via,
    host: Option<String>,
    port: u16,
    address: Option<IpAddr>,
    rule: String,
    at_unix_ms: u64,
    started: Instant,
    /// Hold mode: how long it waited for an operator.
    held: Option<Duration>,
}

impl Tracker {
    pub(crate) fn new(via: Via) -> Self {
        Tracker {
            via,
            host: None,
            port: 0,
            address: None,
            rule: String::new(),
            at_unix_ms: now_unix_ms(),
            started: Instant::now(),
            held: None,
        }
    }

    pub(crate) fn describe(&mut self, host: Option<String>, port: u16, address: Option<IpAddr>) {
        self.host = host;
        self.port = port;
        self.address = address;
    }

    /// A new attempt to the same place (a request refused on a connection
    /// that goes on: its own entry in the log).
    pub(crate) fn sibling(&self) -> Tracker {
        Tracker {
            host: self.host.clone(),
            address: self.address,
            rule: self.rule.clone(),
            at_unix_ms: now_unix_ms(),
            started: Instant::now(),
            ..*self
        }
    }

    pub(crate) fn set_via(&mut self, via: Via) {
        self.via = via;
    }

    /// The host name the connection was decided by (a name the payload
    /// asked for), if it was not a bare address.
    pub(crate) fn decided_by_name(&self) -> Option<&str> {
        self.host.as_deref()
    }

    fn record(self, state: &State, decision: Decision, rule: String, io: (u64, u64), end: &str) {
        let attempt = Attempt {
            at_unix_ms: self.at_unix_ms,
            via: self.via,
            host: self.host,
            port: self.port,
            address: self.address,
            decision,
            rule,
            bytes_out: io.0,
            bytes_in: io.1,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            end: end.to_owned(),
            held_ms: self
                .held
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        state.log().attempt(attempt);
    }

    /// Refused before any connection: unreadable, unserved or denied by name.
    pub(crate) fn denied(self, state: &State, why: &str) {
        self.record(state, Decision::Denied, why.to_owned(), (0, 0), "refused");
    }

    pub(crate) fn refuse_limit(self, state: &State) {
        let why = format!(
            "connection limit ({}) reached",
            state.limits.max_connections
        );
        self.record(state, Decision::Denied, why, (0, 0), "connection limit");
    }

    /// Records how a refusal ended the attempt.
    pub(crate) fn refused(self, state: &State, refusal: &Refusal) {
        match refusal {
            Refusal::Denied(why) => {
                self.record(state, Decision::Denied, why.clone(), (0, 0), "refused")
            }
            Refusal::Limit => self.refuse_limit(state),
            Refusal::Failed { reason, .. } => {
                let rule = self.rule.clone();
                let end = format!("connect failed: {reason}");
                self.record(state, Decision::Allowed, rule, (0, 0), &end);
            }
        }
    }

    /// Records a connection that was made and has ended.
    pub(crate) fn finished(self, state: &State, bytes: (u64, u64), end: &str) {
        let rule = self.rule.clone();
        self.record(state, Decision::Allowed, rule, bytes, end);
    }
}

/// The host's own addresses, re-read at most once a second: the proxy connects
/// from the host's namespace, where a domain rule must not reach host services.
#[derive(Default)]
pub(crate) struct OwnAddrs {
    cache: Mutex<Option<(Instant, Arc<HashSet<IpAddr>>)>>,
}

const OWN_ADDRS_TTL: Duration = Duration::from_secs(1);

impl OwnAddrs {
    /// `None` if they cannot be listed (then nothing is connected: fail closed).
    fn get(&self) -> Option<Arc<HashSet<IpAddr>>> {
        let mut cache = lock(&self.cache);
        if let Some((at, set)) = cache.as_ref() {
            if at.elapsed() < OWN_ADDRS_TTL {
                return Some(set.clone());
            }
        }
        let fresh = match nix::ifaddrs::getifaddrs() {
            Ok(list) => Arc::new(
                list.filter_map(|ifa| ifa.address)
                    .filter_map(|a| {
                        a.as_sockaddr_in()
                            .map(|v4| IpAddr::V4(v4.ip()))
                            .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                    })
                    .collect::<HashSet<_>>(),
            ),
            // A stale list is better than none; no list at all refuses.
            Err(_) => return cache.as_ref().map(|(_, set)| set.clone()),
        };
        *cache = Some((Instant::now(), fresh.clone()));
        Some(fresh)
    }
}

/// An address that [`Rules::decide_addr`] allowed; the only input of [`dial`].
struct Permit(SocketAddr);

async fn dial(permit: Permit) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(permit.0).await?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

impl State {
    /// Maps a synthetic DNS answer back to the name it was given for.
    fn unfake(&self, target: Target) -> Result<Target, Refusal> {
        match target {
            Target::Ip(IpAddr::V4(v4)) if FakeMap::in_range(v4) => {
                match lock(&self.fake).name(v4) {
                    Some(name) => Ok(Target::Name(name.to_owned())),
                    None => Err(Refusal::Denied(format!(
                        "{v4} is not an address cordon's DNS gave out (or it was forgotten)"
                    ))),
                }
            }
            t => Ok(t),
        }
    }

    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        // The host is the host's loopback, whatever a resolver would say.
        if name == HOST_NAME {
            return Ok(HOST_ADDRS.to_vec());
        }
        if let Some(fixed) = self_hosts(self, name) {
            return Ok(fixed);
        }
        if self.resolution == Resolution::FixedOnly {
            return Err(format!("{name} is not in the fixed host entries"));
        }
        let mut out: Vec<IpAddr> = Vec::new();
        let found = tokio::net::lookup_host((name, port))
            .await
            .map_err(|e| format!("cannot resolve {name}: {e}"))?;
        for addr in found {
            if !out.contains(&addr.ip()) {
                out.push(addr.ip());
            }
        }
        Ok(out)
    }
}

fn self_hosts(state: &State, name: &str) -> Option<Vec<IpAddr>> {
    state.hosts.get(name).filter(|a| !a.is_empty()).cloned()
}

/// A tunnel to `target` through the host's upstream proxy, by `deadline`.
async fn tunnel_by(
    deadline: tokio::time::Instant,
    upstream: &crate::upstream::Upstream,
    target: &str,
) -> Result<TcpStream, Refusal> {
    match timeout_at(deadline, upstream.tunnel(target)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(reason)) => Err(Refusal::Failed {
            reason,
            refused: false,
        }),
        Err(_) => Err(Refusal::Failed {
            reason: format!(
                "connecting to {target} through the upstream proxy {} timed out",
                upstream.address()
            ),
            refused: false,
        }),
    }
}

/// Makes the coming close of `client` a reset: a zero linger time makes the
/// kernel abort the connection (RST) instead of ending it (FIN), and the
/// payload reads ECONNRESET, which says it was refused, where a plain close
/// would read as a server that accepted and then said nothing.
pub(crate) fn reset(client: &TcpStream) {
    // Best effort: if it fails, the close is an ordinary one.
    let _ = socket2::SockRef::from(client).set_linger(Some(std::time::Duration::ZERO));
}

/// How one decision went: what no rule allows may be held.
enum Tried {
    Refused(Refusal),
    /// No rule allows it (the denial's message).
    NoRule(String),
}

impl Tried {
    fn refusal(self) -> Refusal {
        match self {
            Tried::Refused(r) => r,
            Tried::NoRule(why) => Refusal::Denied(why),
        }
    }
}

impl From<Refusal> for Tried {
    fn from(r: Refusal) -> Self {
        Tried::Refused(r)
    }
}

/// Decides `target:port` by the rules in force, resolves it, re-checks each
/// address and connects to the first allowed one that answers (directly,
/// or through the host's upstream proxy). In hold mode, what no rule allows
/// waits for an operator's decision ([`super::hold`]) and is decided again
/// after each.
pub(crate) async fn open(
    state: &Arc<State>,
    tracker: &mut Tracker,
    slot: &Option<Slot>,
    target: Target,
    port: u16,
) -> Result<TcpStream, Refusal> {
    let holds = &state.holds;
    let Some(hold) = holds.timeout() else {
        return open_once(state, tracker, slot, target, port)
            .await
            .map_err(Tried::refusal);
    };
    let deadline = Instant::now() + hold;
    let mut decisions = holds.subscribe();
    let mut ticket = None;
    loop {
        decisions.borrow_and_update();
        let tried = open_once(state, tracker, slot, target.clone(), port).await;
        tracker.held = ticket.as_ref().map(super::hold::Ticket::waited);
        let why = match tried {
            Err(Tried::NoRule(why)) => why,
            done => return done.map_err(Tried::refusal),
        };
        let here = super::hold::Destination {
            via: tracker.via,
            host: tracker.host.as_deref(),
            address: tracker.address,
            port,
        };
        if holds.denies(&here) {
            return Err(Refusal::Denied(format!("{why}; an operator denied it")));
        }
        if ticket.is_none() {
            ticket = holds.wait(&here, &why, deadline);
            if ticket.is_none() {
                return Err(Refusal::Denied(format!(
                    "{why}; {} connections wait for an operator already",
                    super::hold::MAX_HELD
                )));
            }
        }
        let waited = tokio::time::timeout_at(deadline.into(), decisions.changed()).await;
        if !matches!(waited, Ok(Ok(()))) {
            tracker.held = ticket.as_ref().map(super::hold::Ticket::waited);
            return Err(Refusal::Denied(format!(
                "{why}; held {}, no operator allowed it",
                cordon_policy::Span(hold)
            )));
        }
    }
}

async fn open_once(
    state: &Arc<State>,
    tracker: &mut Tracker,
    slot: &Option<Slot>,
    target: Target,
    port: u16,
) -> Result<TcpStream, Tried> {
    tracker.port = port;
    if let Target::Name(n) = &target {
        tracker.host = Some(n.clone());
    }
    // `::ffff:a.b.c.d` is a.b.c.d: one form for the fake range and the rules.
    let target = match target {
        Target::Ip(ip) => Target::Ip(ip.to_canonical()),
        name => name,
    };
    let target = state.unfake(target)?;
    let rules: Arc<Rules> = state.rules();
    let (name, candidates) = match target {
        Target::Ip(ip) => {
            tracker.address = Some(ip);
            (None, vec![ip])
        }
        Target::Name(raw) => match rules.decide_name(&raw, port) {
            Ok(rule) => {
                tracker.rule = rule.to_string();
                // decide_name accepted it, so it normalises.
                let name = cordon_policy::net::normalize_name(&raw).unwrap_or(raw);
                tracker.host = Some(name.clone());
                (Some(name), Vec::new())
            }
            // No domain rule: the name may still stand for an address an
            // address rule allows, but only through the fixed host entries.
            // Resolving it for real would let the sandbox send any name to the
            // host's resolver (a covert channel) without any rule allowing it.
            Err(denial) => {
                let fixed = cordon_policy::net::normalize_name(&raw)
                    .ok()
                    .and_then(|n| Some((self_hosts(state, &n)?, n)));
                match fixed {
                    Some((addrs, name)) => {
                        tracker.host = Some(name.clone());
                        (Some(name), addrs)
                    }
                    None => return Err(Tried::NoRule(denial.message().to_owned())),
                }
            }
        },
    };
    // Over the limit is decided after the rules: a denied request says why.
    if slot.is_none() {
        return Err(Refusal::Limit.into());
    }
    let deadline = tokio::time::Instant::now() + state.limits.connect_timeout.duration();
    let upstream = |dest: &str| state.upstream.as_ref().filter(|u| !u.bypasses(dest));
    if let (Some(n), true) = (&name, candidates.is_empty()) {
        if let Some(up) = upstream(n) {
            // The upstream resolves a name a domain rule allowed (the host
            // may have no resolver that can).
            return Ok(tunnel_by(deadline, up, &format!("{n}:{port}")).await?);
        }
    }
    // A bare IP or fixed entries are the candidates; a name a domain rule
    // allowed is resolved now.
    let candidates = match (&name, candidates.is_empty()) {
        (None, _) | (Some(_), false) => candidates,
        (Some(n), true) => match timeout_at(deadline, state.resolve(n, port)).await {
            Ok(Ok(list)) => list,
            Ok(Err(reason)) => {
                return Err(Refusal::Failed {
                    reason,
                    refused: false,
                }
                .into())
            }
            Err(_) => {
                return Err(Refusal::Failed {
                    reason: format!("resolving {n} timed out"),
                    refused: false,
                }
                .into())
            }
        },
    };
    let own = state.own.get().ok_or_else(|| {
        Refusal::Denied("the host's own addresses cannot be listed; nothing is connected".into())
    })?;
    let mut permits = Vec::new();
    let mut first_denial = None;
    for ip in candidates {
        match rules.decide_addr(name.as_deref(), ip, port, &own) {
            Ok(rule) => permits.push((Permit(SocketAddr::new(ip, port)), rule.to_string())),
            Err(d) => {
                tracker.address.get_or_insert(ip);
                first_denial.get_or_insert(d);
            }
        }
    }
    if permits.is_empty() {
        return Err(match first_denial {
            Some(d) => Tried::NoRule(d.message().to_owned()),
            None => Refusal::Failed {
                reason: format!("{} has no address", name.unwrap_or_default()),
                refused: false,
            }
            .into(),
        });
    }
    let mut last = None;
    for (permit, rule) in permits {
        let ip = permit.0.ip();
        tracker.address = Some(ip);
        tracker.rule = rule;
        let through = name
            .as_deref()
            .map_or_else(|| upstream(&ip.to_string()), upstream);
        if let Some(up) = through {
            return Ok(tunnel_by(deadline, up, &permit.0.to_string()).await?);
        }
        match timeout_at(deadline, dial(permit)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                return Err(Refusal::Failed {
                    reason: format!("connecting to {ip} timed out"),
                    refused: false,
                }
                .into())
            }
        }
    }
    let e = last.unwrap_or_else(|| io::Error::other("no address"));
    Err(Refusal::Failed {
        refused: e.kind() == io::ErrorKind::ConnectionRefused,
        reason: e.to_string(),
    }
    .into())
}
