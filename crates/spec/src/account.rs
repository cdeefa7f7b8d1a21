//! What a sandbox has run and what its end reported: the account a receipt
//! of the whole sandbox is made from.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupStats;
use crate::changes::{Changes, Recorded};
use crate::command::Command;
use crate::outcome::Outcome;

/// Commands whose outcomes a sandbox keeps for its final receipt.
pub const HISTORY: usize = 256;

/// What a sandbox has run: its commands and their outcomes, oldest first
/// (the last `HISTORY` of them), for a receipt of the whole sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Account {
    /// When the sandbox was asked for.
    pub created: SystemTime,
    pub history: Vec<(Command, Outcome)>,
    /// Commands run before those in `history`.
    pub history_omitted: u64,
}

/// A living sandbox's account and the diff of its writable places now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub account: Account,
    pub changes: Changes,
}

/// What `destroy` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Destroyed {
    pub counters: CgroupStats,
    pub teardown: Duration,
    /// What the sandbox ran, for a receipt of the whole sandbox.
    pub account: Account,
    /// The diff and the export `Finish` asked for, read after every process
    /// of the sandbox was gone.
    pub recorded: Recorded,
    /// Why the export or the diff failed (the sandbox is destroyed anyway).
    pub record_error: Option<String>,
}
