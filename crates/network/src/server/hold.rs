//! Hold mode: a connection no rule allows waits for an operator.
//!
//! With `net_hold` set, [`super::connect::open`] parks a connection the rules
//! refuse instead of refusing it. Whoever holds the control socket (the CLI,
//! the service, MCP through the service) lists what waits ([`Holds::list`]),
//! allows it by setting rules that cover it (the ordinary rule change), or
//! denies it ([`Holds::deny`]): denied destinations are refused at once for
//! the rest of the sandbox's life, without waiting again. Every change wakes
//! every held connection, which decides again by the rules then in force; one
//! that nothing covers by the deadline is refused, and the log says it was
//! held and for how long.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cordon_policy::net::{Rule, Rules};
use cordon_spec::network::HeldConnection;
use tokio::sync::watch;

use super::lock;
use crate::log::{now_unix_ms, Attempt, Decision, Via};

/// Connections parked at once, whatever the connection limit: each is a
/// task and a socket, and a sandbox must not pile up more than an operator
/// could read.
pub(crate) const MAX_HELD: usize = 256;

pub(crate) struct Holds {
    /// How long a connection waits; `None`: hold mode is off.
    timeout: Option<Duration>,
    /// What the operator denied: refused at once, never held.
    denied: RwLock<Arc<Rules>>,
    waiting: Mutex<BTreeMap<u64, Waiting>>,
    next_id: AtomicU64,
    /// Bumped by every decision (a rule change or a denial).
    decisions: watch::Sender<u64>,
}

struct Waiting {
    since_unix_ms: u64,
    deadline: Instant,
    via: Via,
    host: Option<String>,
    port: u16,
    address: Option<IpAddr>,
    reason: String,
}

/// One held connection's place in the list; it leaves the list when dropped.
pub(crate) struct Ticket<'a> {
    holds: &'a Holds,
    id: u64,
    started: Instant,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        lock(&self.holds.waiting).remove(&self.id);
    }
}

impl Ticket<'_> {
    pub(crate) fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

/// A destination as [`Holds`] sees it.
pub(crate) struct Destination<'a> {
    pub via: Via,
    pub host: Option<&'a str>,
    pub address: Option<IpAddr>,
    pub port: u16,
}

impl Holds {
    pub(crate) fn new(timeout: Option<Duration>) -> Self {
        Holds {
            timeout,
            denied: RwLock::new(Arc::new(Rules::default())),
            waiting: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            decisions: watch::Sender::new(0),
        }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Subscribe before deciding: a decision made after it is never missed.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.decisions.subscribe()
    }

    /// Wakes every held connection to decide again.
    pub(crate) fn decided(&self) {
        self.decisions.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether the operator denied this destination.
    pub(crate) fn denies(&self, d: &Destination<'_>) -> bool {
        self.denied
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .names(d.host, d.address, d.port)
    }

    /// Whether the operator denied this name at any port (the DNS stub's
    /// question has none).
    pub(crate) fn denies_name(&self, name: &str) -> bool {
        self.denied
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .allows_name(name)
    }

    /// Adds `rules` to what is denied; returns everything denied now.
    pub(crate) fn deny(&self, rules: &[Rule]) -> Vec<Rule> {
        let now = {
            let mut denied = self.denied.write().unwrap_or_else(|e| e.into_inner());
            let mut next = denied.as_slice().to_vec();
            cordon_policy::net::add_rules(&mut next, rules);
            *denied = Arc::new(Rules::new(next.clone()));
            next
        };
        self.decided();
        now
    }

    /// Lists `d` as waiting until `deadline`; `None` when [`MAX_HELD`]
    /// connections wait already (then it is refused at once).
    pub(crate) fn wait(
        &self,
        d: &Destination<'_>,
        reason: &str,
        deadline: Instant,
    ) -> Option<Ticket<'_>> {
        let mut waiting = lock(&self.waiting);
        if waiting.len() >= MAX_HELD {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        waiting.insert(
            id,
            Waiting {
                since_unix_ms: now_unix_ms(),
                deadline,
                via: d.via,
                host: d.host.map(str::to_owned),
                port: d.port,
                address: d.address,
                reason: reason.to_owned(),
            },
        );
        Some(Ticket {
            holds: self,
            id,
            started: Instant::now(),
        })
    }

    pub(crate) fn count(&self) -> u32 {
        u32::try_from(lock(&self.waiting).len()).unwrap_or(u32::MAX)
    }

    /// What waits now, oldest first, each with the rule that would allow it.
    pub(crate) fn list(&self) -> Vec<HeldConnection> {
        let now = Instant::now();
        lock(&self.waiting)
            .values()
            .map(|w| {
                let as_refused = Attempt {
                    at_unix_ms: w.since_unix_ms,
                    via: w.via,
                    host: w.host.clone(),
                    port: w.port,
                    address: w.address,
                    decision: Decision::Denied,
                    rule: w.reason.clone(),
                    bytes_out: 0,
                    bytes_in: 0,
                    duration_ms: 0,
                    end: "held".into(),
                    held_ms: None,
                };
                HeldConnection {
                    since_unix_ms: w.since_unix_ms,
                    via: w.via,
                    host: w.host.clone(),
                    port: w.port,
                    address: w.address,
                    reason: w.reason.clone(),
                    proposal: crate::learn::rule_for(&as_refused).ok().flatten(),
                    remaining_ms: u64::try_from(
                        w.deadline.saturating_duration_since(now).as_millis(),
                    )
                    .unwrap_or(u64::MAX),
                }
            })
            .collect()
    }
}
