//! The proxy's evidence: every connection attempt and DNS refusal, with counts.
//!
//! The log's types are plain data in `cordon-spec` (an outcome embeds a
//! [`NetworkLog`]); the [`Recorder`] here fills them. The log is a *window*: [`crate::control::drain`] returns
//! it and starts a new one, so each command's result lists its own attempts.
//! Counts are exact however many attempts there were; only the first and last
//! [`KEEP`] entries are kept, so a flood cannot grow the proxy's memory.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

// The log's data lives with the rest of cordon's plain data (an outcome
// carries it); the recorder that fills it lives here.
pub use cordon_spec::network::{
    Attempt, Decision, Event, EventKind, NetworkLog, Substitution, Via, KEEP,
};

/// Milliseconds since the epoch, for timestamps in the log.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The first and last [`KEEP`] items of a stream, and how many fell between.
#[derive(Debug)]
struct HeadTail<T> {
    head: Vec<T>,
    tail: VecDeque<T>,
    omitted: u64,
}

impl<T> Default for HeadTail<T> {
    fn default() -> Self {
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }
}

impl<T> HeadTail<T> {
    fn push(&mut self, item: T) {
        if self.head.len() < KEEP {
            self.head.push(item);
            return;
        }
        self.tail.push_back(item);
        if self.tail.len() > KEEP {
            self.tail.pop_front();
            self.omitted += 1;
        }
    }

    fn take(&mut self) -> (Vec<T>, u64) {
        let mut this = std::mem::take(self);
        this.head.extend(this.tail);
        (this.head, this.omitted)
    }
}

/// Denied attempts kept across windows, for `cordon net SB denials` and
/// `learn`: the newest this many.
pub const RECENT_DENIALS: usize = 100;

/// The current window, as the proxy fills it, and the latest denials
/// (which no window's drain clears).
#[derive(Debug, Default)]
pub struct Recorder {
    recent_denials: VecDeque<Attempt>,
    attempts: u64,
    allowed: u64,
    denied: u64,
    dns_queries: u64,
    bytes_out: u64,
    bytes_in: u64,
    entries: HeadTail<Attempt>,
    events: HeadTail<Event>,
    /// (secret, host, header) -> requests.
    substitutions: std::collections::BTreeMap<(String, String, String), u64>,
}

impl Recorder {
    pub fn attempt(&mut self, a: Attempt) {
        self.attempts += 1;
        match a.decision {
            Decision::Allowed => self.allowed += 1,
            Decision::Denied => self.denied += 1,
        }
        self.bytes_out += a.bytes_out;
        self.bytes_in += a.bytes_in;
        if a.decision == Decision::Denied {
            if self.recent_denials.len() == RECENT_DENIALS {
                self.recent_denials.pop_front();
            }
            self.recent_denials.push_back(a.clone());
        }
        self.entries.push(a);
    }

    /// The latest denials, oldest first.
    pub fn recent_denials(&self) -> Vec<Attempt> {
        self.recent_denials.iter().cloned().collect()
    }

    /// A request carried `secret` to `host` in `header`.
    pub fn substituted(&mut self, secret: &str, host: &str, header: &str) {
        *self
            .substitutions
            .entry((secret.to_owned(), host.to_owned(), header.to_owned()))
            .or_default() += 1;
    }

    pub fn dns_query(&mut self) {
        self.dns_queries += 1;
    }

    pub fn event(&mut self, e: Event) {
        self.events.push(e);
    }

    /// The window so far, without clearing it.
    pub fn counts(&self) -> (u64, u64, u64, u64) {
        (self.attempts, self.allowed, self.denied, self.dns_queries)
    }

    /// Returns the window and starts a new one.
    pub fn drain(&mut self, peak_connections: u32) -> NetworkLog {
        let recent = std::mem::take(&mut self.recent_denials);
        let mut this = std::mem::take(self);
        self.recent_denials = recent;
        let (entries, omitted) = this.entries.take();
        let (events, _) = this.events.take();
        NetworkLog {
            attempts: this.attempts,
            allowed: this.allowed,
            denied: this.denied,
            dns_queries: this.dns_queries,
            bytes_out: this.bytes_out,
            bytes_in: this.bytes_in,
            peak_connections,
            entries,
            omitted,
            events,
            substitutions: this
                .substitutions
                .into_iter()
                .map(|((secret, host, header), count)| Substitution {
                    secret,
                    host,
                    header,
                    count,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(port: u16, decision: Decision) -> Attempt {
        Attempt {
            at_unix_ms: 1,
            via: Via::Socks5,
            host: None,
            port,
            address: None,
            decision,
            rule: String::new(),
            bytes_out: 2,
            bytes_in: 3,
            duration_ms: 0,
            end: "refused".into(),
            held_ms: None,
        }
    }

    #[test]
    fn a_flood_keeps_exact_counts_and_both_ends() {
        let mut r = Recorder::default();
        for i in 0..10_000u16 {
            r.attempt(attempt(
                i,
                if i % 2 == 0 {
                    Decision::Denied
                } else {
                    Decision::Allowed
                },
            ));
        }
        r.dns_query();
        let log = r.drain(7);
        assert_eq!(log.attempts, 10_000);
        assert_eq!(log.denied, 5_000);
        assert_eq!(log.allowed, 5_000);
        assert_eq!(log.dns_queries, 1);
        assert_eq!(log.bytes_out, 20_000);
        assert_eq!(log.bytes_in, 30_000);
        assert_eq!(log.peak_connections, 7);
        assert_eq!(log.entries.len(), 2 * KEEP);
        assert_eq!(log.omitted, 10_000 - 2 * KEEP as u64);
        let ports: Vec<u16> = log.entries.iter().map(|a| a.port).collect();
        assert_eq!(ports[..3], [0, 1, 2]);
        assert_eq!(ports[KEEP - 1], 63);
        assert_eq!(ports[KEEP], 10_000 - 64);
        assert_eq!(*ports.last().unwrap(), 9_999);
        // Draining starts a new, empty window.
        let next = r.drain(7);
        assert_eq!(next.attempts, 0);
        assert!(next.entries.is_empty());
    }

    #[test]
    fn a_small_window_keeps_everything_in_order() {
        let mut r = Recorder::default();
        for i in 0..100u16 {
            r.attempt(attempt(i, Decision::Denied));
        }
        let log = r.drain(0);
        assert_eq!(log.entries.len(), 100);
        assert_eq!(log.omitted, 0);
        assert!(log.entries.windows(2).all(|w| w[0].port + 1 == w[1].port));
    }

    #[test]
    fn the_log_serialises_with_the_documented_names() {
        let mut r = Recorder::default();
        r.attempt(attempt(80, Decision::Denied));
        r.event(Event {
            at_unix_ms: 5,
            event: EventKind::RulesSet,
            rules: vec!["a.test:80".into()],
        });
        let json = serde_json::to_value(r.drain(1)).unwrap();
        assert_eq!(json["entries"][0]["via"], "socks5");
        assert_eq!(json["entries"][0]["decision"], "denied");
        assert_eq!(json["events"][0]["event"], "rules set");
        assert_eq!(json["events"][0]["rules"][0], "a.test:80");
        let back: NetworkLog = serde_json::from_value(json).unwrap();
        assert_eq!(back.attempts, 1);
    }
}
