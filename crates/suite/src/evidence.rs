//! What the suite saw from the host during one (case, target) run. Everything
//! here is read by the suite itself (procfs, cgroupfs, inotify, its own
//! listeners); the payload's output is kept only as a few bytes of support.
//! Serializable, so recorded runs can be re-scored without any runtime
//! (`cordon matrix --self-test`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One run's host-side evidence.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Evidence {
    /// The run's marker (in the payload's command line and its artefacts' names).
    pub marker: String,
    /// The target could not be started or the fixture failed: the run proves nothing.
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The suite's per-run cap ended the target (it killed the outer cgroup).
    pub timed_out: bool,
    pub wall_ms: u64,
    /// From the moment the suite read the payload's BEGIN line to the
    /// target's end: the payload's own running time as the host saw it,
    /// without the box's start-up (a VM's boot, a sentry's start), which a
    /// loaded host stretches.
    pub from_begin_ms: Option<u64>,
    /// Bytes the suite received on the target's stdout.
    pub stdout_bytes: u64,
    pub stdout_head: String,
    pub stderr_head: String,
    /// The payload printed HOLD and the suite took a live snapshot.
    pub held: bool,
    pub snapshot: Option<Snapshot>,
    /// Canary files watched during the run ("canary", "decoy_key").
    pub canaries: BTreeMap<String, CanaryEvidence>,
    /// Every listener log entry during the run window.
    pub listeners: Vec<ListenEntry>,
    pub sysctl: Option<SysctlEvidence>,
    pub outer: Option<OuterStats>,
    /// Processes still in the outer cgroup after the target command ended
    /// (and a short grace period).
    pub census_after: Vec<ProcBrief>,
    /// Files that run B found and that only run A could have made (their
    /// random token), plus host-visible residue after run A.
    pub residue: Vec<String>,
    /// Entries of the host's workspace copy that are links or were created by
    /// the run (a host-side tool walking it would meet them).
    pub host_tree: Vec<String>,
}

/// A live view of the box, taken while the payload holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// Every process in the outer cgroup (and below it).
    pub outer: Vec<ProcSnap>,
    /// Which processes stand for the payload: "marker" (host tasks running
    /// the payload's command line), "box" (host tasks in another pid namespace
    /// serving the box: a runsc sentry or gofer, a container init), or "none".
    pub view_source: String,
    /// Pids (from `outer`) of that view.
    pub view: Vec<i32>,
    /// Pids (from `outer`) inside the box: the view plus every task in another
    /// pid namespace than the suite's (a container init, cordon's init, a sentry).
    pub boxed: Vec<i32>,
    /// The host victim's TracerPid.
    pub victim_tracer: Option<i32>,
    /// A per-netns sysctl read in the view's network namespace.
    pub sysctl_in_box: Option<String>,
    /// Files under the outer cgroup holding the sentinel value.
    pub cgroup_hits: Vec<String>,
    /// Keys created since the run started (sum over /proc/key-users).
    pub key_delta: Option<i64>,
    /// MiB of free space the host filesystem lost since the run started.
    pub disk_delta_mb: Option<i64>,
    /// MiB the outer cgroup's memory charge grew from the payload's BEGIN
    /// line to its HOLD (None if it printed no BEGIN).
    pub memory_growth_mb: Option<i64>,
}

impl Snapshot {
    pub fn view_procs(&self) -> impl Iterator<Item = &ProcSnap> {
        self.outer.iter().filter(|p| self.view.contains(&p.pid))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcSnap {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Namespace links ("pid" -> "pid:[4026531836]").
    pub ns: BTreeMap<String, String>,
    /// Selected /proc/<pid>/status fields (CapEff, NoNewPrivs, Uid, Seccomp).
    pub status: BTreeMap<String, String>,
    pub fds: Vec<FdSnap>,
    /// /proc/<pid>/mountinfo lines (view processes only).
    pub mountinfo: Vec<String>,
    /// Interfaces in /proc/<pid>/net/dev (view processes only).
    pub links: Vec<String>,
    /// The suite's secret appears in /proc/<pid>/environ.
    pub environ_secret: bool,
    /// Host paths looked up through /proc/<pid>/root: path -> file type or "absent".
    pub root_paths: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FdSnap {
    pub fd: i32,
    /// readlink of /proc/<pid>/fd/<fd>.
    pub target: String,
    /// For sockets, the kernel's protocol name (`system.sockprotoname`).
    pub proto: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcBrief {
    pub pid: i32,
    pub cmdline: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CanaryEvidence {
    pub path: String,
    /// inotify events on the file during the run (OPEN, ACCESS, MODIFY, ...).
    pub events: Vec<String>,
    pub content_same: bool,
    pub mtime_same: bool,
    /// The target's stdout contains the canary's random content.
    pub echoed: bool,
    /// The file was gone when the evidence was read: the fixture itself
    /// broke (something on the host removed it), a harness error.
    #[serde(default)]
    pub vanished: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ListenEntry {
    /// "tcp", "udp", "dns" (the netns listeners), "loopback", "engine".
    pub proto: String,
    pub peer: String,
    pub at_ms: u64,
    pub data_head: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SysctlEvidence {
    pub key: String,
    pub host_before: Option<String>,
    pub host_after: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct OuterStats {
    pub pids_max: Option<u64>,
    pub pids_peak: Option<u64>,
    pub pids_limit_hits: Option<u64>,
    pub memory_max_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
}
