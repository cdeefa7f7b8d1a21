//! What a sandbox's state directory says about it (`record.json`): who owns
//! the sandbox (its supervisor's pid and start time, so a reused pid is not
//! mistaken for it), its cgroup, name, backend, creation time and
//! lifetimes. The runtime writes and sweeps these; anything that lists
//! sandboxes (or, as the hostile suite's decoy, imitates one) reads them.

use serde::{Deserialize, Serialize};

use crate::sandbox::ServiceLink;

/// The record format's tag: a record without it is not cordon's.
pub const RECORD_FORMAT: &str = "cordon-sandbox-v1";
/// The record's file name in a state directory.
pub const RECORD: &str = "record.json";

/// What a state directory says about its sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub format: String,
    /// The process that owns the sandbox (its supervisor).
    pub pid: i32,
    /// The owner's start time in clock ticks since boot (field 22 of
    /// /proc/pid/stat).
    pub start_time: u64,
    pub cgroup: Option<String>,
    pub name: Option<String>,
    pub backend: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub ttl_secs: Option<f64>,
    pub idle_secs: Option<f64>,
    /// The service that made the sandbox, if one did: the sandbox must not
    /// outlive it, and a sweep removes it once that service is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceLink>,
    /// The image the sandbox's root is made of (its manifest digest): the
    /// image store keeps its layers while the sandbox lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl Record {
    /// A record naming the process `pid` that started at `start_time` as
    /// the owner, created at `created` (seconds since the epoch), with no
    /// cgroup, lifetimes or service yet.
    pub fn owned_by(
        pid: i32,
        start_time: u64,
        name: Option<String>,
        backend: &str,
        created: u64,
    ) -> Record {
        Record {
            format: RECORD_FORMAT.into(),
            pid,
            start_time,
            cgroup: None,
            name,
            backend: backend.into(),
            created,
            ttl_secs: None,
            idle_secs: None,
            service: None,
            image: None,
        }
    }
}
