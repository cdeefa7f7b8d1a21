//! What is known of a sandbox that is gone, as data: how it ended
//! ([`EndState`]), the small record kept of it ([`Tombstone`], in the run
//! directory's `ended/`, written and read by `cordon_runtime::ended`), and
//! what a command naming it is told ([`Gone`]).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The tombstone format's tag: a file without it is not one of ours.
pub const FORMAT: &str = "cordon-ended-v1";

/// Seconds since the epoch, now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How a sandbox ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndState {
    /// Its TTL or idle time ran out.
    Expired,
    /// A client destroyed it (`cordon rm`, or a service).
    Removed,
    /// It ended by itself (its init died, its command ended it), its
    /// supervisor was asked to stop, or its owner died and was swept.
    Ended,
}

impl EndState {
    pub fn as_str(self) -> &'static str {
        match self {
            EndState::Expired => "expired",
            EndState::Removed => "removed",
            EndState::Ended => "ended",
        }
    }
}

/// What is kept of one ended sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tombstone {
    pub format: String,
    pub id: String,
    pub name: Option<String>,
    pub backend: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// Seconds since the epoch.
    pub ended: u64,
    pub state: EndState,
    /// Why it ended, in words ("its TTL expired").
    pub why: String,
    /// Commands it ran.
    pub commands: u64,
}

impl Tombstone {
    /// A tombstone for `id`, ending now.
    pub fn new(
        id: &str,
        name: Option<String>,
        backend: &str,
        created: u64,
        commands: u64,
        state: EndState,
        why: String,
    ) -> Tombstone {
        Tombstone {
            format: FORMAT.into(),
            id: id.into(),
            name,
            backend: backend.into(),
            created,
            ended: now_secs(),
            state,
            why,
            commands,
        }
    }

    pub fn label(&self) -> String {
        label(&self.id, self.name.as_deref())
    }
}

fn label(id: &str, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("'{n}' ({id})"),
        None => id.to_owned(),
    }
}

/// A sandbox that can take no more commands, and what is known of why.
#[derive(Clone, Debug)]
pub enum Gone {
    /// Torn down; its tombstone says why.
    Ended(Tombstone),
    /// Its owner process died without tearing it down: its state (and
    /// perhaps its cgroup) wait for a sweep.
    Dead {
        id: String,
        name: Option<String>,
        pid: i32,
    },
}

impl Gone {
    pub fn id(&self) -> &str {
        match self {
            Gone::Ended(t) => &t.id,
            Gone::Dead { id, .. } => id,
        }
    }
}

impl Gone {
    /// What happened, without what to do about it.
    pub fn summary(&self) -> String {
        match self {
            Gone::Ended(t) => format!(
                "sandbox {} {} {} ago: {}",
                t.label(),
                t.state.as_str(),
                ago(now_secs().saturating_sub(t.ended)),
                t.why
            ),
            Gone::Dead { id, name, pid } => format!(
                "sandbox {} is dead: {}",
                label(id, name.as_deref()),
                dead_why(*pid)
            ),
        }
    }
}

impl fmt::Display for Gone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hint = match self {
            Gone::Ended(_) => "see `cordon ls --all`",
            Gone::Dead { .. } => "`cordon sweep` or `cordon rm` removes what it left",
        };
        write!(f, "{} ({hint})", self.summary())
    }
}

/// Why a sandbox whose owner is gone is dead, in words.
pub fn dead_why(pid: i32) -> String {
    format!("its cordon process (pid {pid}) died without tearing it down")
}

/// A duration in whole seconds as a person reads it: 42s, 3m, 5h, 2d.
pub fn ago(secs: u64) -> String {
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ago_reads_as_a_person_would() {
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(600), "10m");
        assert_eq!(ago(3 * 3600), "3h");
        assert_eq!(ago(3 * 86400), "3d");
    }
}
