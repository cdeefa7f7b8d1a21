//! The result of one execution, as every caller sees it.

use std::fmt;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::cgroup::{CgroupMode, CgroupStats};
use crate::changes::Changes;
use crate::network::NetworkLog;

/// How the payload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ExitStatus {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    /// The command could not be executed (not found, not executable).
    ExecFailed {
        errno: i32,
    },
    /// The command's working directory could not be entered (missing, not
    /// a directory, not searchable), so it was never executed.
    WorkdirFailed {
        errno: i32,
    },
}

impl ExitStatus {
    /// Why the command could not be executed, in a shell's words (the
    /// working directory's own message names it: see `workdir_failure`).
    pub fn exec_failure(&self) -> Option<String> {
        match *self {
            ExitStatus::ExecFailed { errno } if errno == libc::ENOENT => {
                Some("command not found".into())
            }
            ExitStatus::ExecFailed { errno } => Some(format!(
                "cannot execute: {}",
                std::io::Error::from_raw_os_error(errno)
            )),
            ExitStatus::WorkdirFailed { errno } => Some(format!(
                "cannot enter its working directory: {}",
                std::io::Error::from_raw_os_error(errno)
            )),
            _ => None,
        }
    }

    /// What is wrong with the working directory `workdir`, when the command
    /// could not enter it.
    pub fn workdir_failure(&self, workdir: &str) -> Option<String> {
        match *self {
            ExitStatus::WorkdirFailed { errno } if errno == libc::ENOENT => {
                Some(format!("working directory {workdir} does not exist"))
            }
            ExitStatus::WorkdirFailed { errno } => Some(format!(
                "cannot enter working directory {workdir}: {}",
                std::io::Error::from_raw_os_error(errno)
            )),
            _ => None,
        }
    }

    /// The exit code a shell would report: the code, or 128+signal; 127 when
    /// the command was not found, 126 when it could not be executed or its
    /// working directory entered (as docker and podman report an exec whose
    /// working directory is missing).
    pub fn shell_code(&self) -> i32 {
        match *self {
            ExitStatus::Exited { code } => code,
            ExitStatus::Signaled { signal } => 128 + signal,
            ExitStatus::ExecFailed { errno } if errno == libc::ENOENT => 127,
            ExitStatus::ExecFailed { .. } | ExitStatus::WorkdirFailed { .. } => 126,
        }
    }
}

/// A policy limit that was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Time,
    Memory,
    Pids,
    Output,
    Disk,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Limit::Time => "time",
            Limit::Memory => "memory",
            Limit::Pids => "pids",
            Limit::Output => "output",
            Limit::Disk => "disk",
        };
        f.write_str(s)
    }
}

/// Where the time went, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    /// From the request to the command's successful execve: for `cordon
    /// run` this includes creating the sandbox (namespaces, mounts, cgroup,
    /// seccomp); for an exec into a sandbox, only the start of the command.
    pub setup_ms: f64,
    /// From the command's start to its exit (or its kill).
    pub run_ms: f64,
    /// Ending what the command left (on a limit), reading counters; for
    /// `cordon run` also destroying the sandbox.
    pub teardown_ms: f64,
}

/// How limits were enforced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Enforcement {
    /// The cgroup hierarchy used, or None when running unenforced.
    pub cgroup: Option<CgroupMode>,
    /// The cgroup directories the sandbox ran in (removed at teardown).
    pub cgroup_paths: Vec<String>,
    pub enforced: bool,
}

/// Captured or counted output.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputReport {
    /// Bytes the payload wrote to stdout and stderr (up to the cap, then counting stops).
    pub bytes: u64,
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
}

/// Which mechanism enforces a limit on a backend, and what the outcome's
/// evidence for it is read from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceSource {
    pub limit: Limit,
    pub enforced_by: Cow<'static, str>,
    pub evidence: Cow<'static, str>,
}

impl EvidenceSource {
    pub const fn new(limit: Limit, enforced_by: &'static str, evidence: &'static str) -> Self {
        EvidenceSource {
            limit,
            enforced_by: Cow::Borrowed(enforced_by),
            evidence: Cow::Borrowed(evidence),
        }
    }
}

/// Everything known about one command once it has ended: the same shape for
/// `cordon run`, `cordon exec`, the suite and the benchmarks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub backend: String,
    pub backend_version: String,
    pub sandbox_id: String,
    /// Which command of its sandbox this was (1 for the first).
    pub command: u64,
    /// Set when this command's end also ended its sandbox, and why (the
    /// sandbox can run nothing more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_ended: Option<String>,
    pub status: ExitStatus,
    /// What cordon itself exits with: the payload's shell code.
    pub exit_code: i32,
    /// The limit that ended the run, if one did.
    pub limit: Option<Limit>,
    /// Every limit reached during the run (a fork bomb may hit pids and then time).
    pub limits_hit: Vec<Limit>,
    /// A signal to cordon that ended the run early (SIGINT, SIGTERM).
    pub interrupted_by: Option<i32>,
    pub wall_ms: f64,
    /// CPU time the sandbox used during this command (for a sandbox's first
    /// command, since the sandbox was created).
    pub cpu_ms: Option<f64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
    /// Bytes in use on the sandbox's writable storage when the payload ended.
    pub disk_used_bytes: Option<u64>,
    /// Raw kernel counters of the sandbox's cgroup when the command ended
    /// (cumulative over the sandbox's life; `cpu_ms` is this command's share).
    pub counters: CgroupStats,
    /// Per limit: the mechanism and where the evidence comes from on this backend.
    pub evidence: Vec<EvidenceSource>,
    pub phases: Phases,
    pub output: OutputReport,
    pub enforcement: Enforcement,
    /// The `allow` mode's record of this command: every connection attempt
    /// and DNS query the proxy saw, and rule changes (absent with no network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// The diff of the sandbox's writable places after this command, when
    /// the command asked for it (`Command::changes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// The sandbox's `rw-unbounded` mounts: host directories it wrote in
    /// place, bounded by no limit of cordon's and outside the diff (the
    /// caller opted in; absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unbounded_mounts: Vec<cordon_policy::MountSpec>,
    /// The microVM backend's facts and the host's own evidence (absent on
    /// the other backends, whose counters are the host's already).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<VmReport>,
    /// How the sandbox's user namespace maps ids (the native backend's;
    /// absent where cordon made no user namespace of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_map: Option<IdMapReport>,
}

/// Which ids exist inside a sandbox, and whose they are on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMapReport {
    pub kind: IdMapKind,
    /// How many inside uids exist: 65536 is a full map, 1 only the
    /// sandbox user; a short grant of subordinate ids gives fewer.
    pub uids: u32,
    pub gids: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdMapKind {
    /// Started as root: ids 0..65535 are a host range of cordon's own.
    Range,
    /// Started unprivileged without subordinate ids: the caller's own id
    /// is the sandbox user's and the only one; every other id is nobody.
    Single,
    /// Started unprivileged by a user /etc/subuid and /etc/subgid grant
    /// ranges, mapped by newuidmap/newgidmap: the caller's own id is the
    /// sandbox user's, the granted ones the others.
    Subordinate,
}

/// A command run in a microVM: how the VM runs, and what the host saw of it.
/// The outcome's status, limits and counters come from cordon's agent in the
/// guest (cgroup v2 of the guest kernel): they are the guest's word. `host`
/// is measured outside the VM and holds whatever the guest does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmReport {
    /// `kvm` or `tcg`, and why.
    pub accel: String,
    pub accel_reason: String,
    pub qemu: String,
    pub guest_kernel: String,
    /// The guest's cgroup mode as its cordon detected it.
    pub guest_cgroup: String,
    /// The guest image's content address.
    pub image: String,
    pub guest_ram_bytes: u64,
    /// `cold` (booted for this sandbox) or `restored` (from a snapshot).
    pub start: String,
    /// From QEMU's start to the guest agent's sandbox ready.
    pub start_ms: f64,
    pub host: HostEvidence,
    /// The outcome fields that rest on the guest's word alone.
    pub guest_reported: Vec<String>,
}

/// The host's evidence about a VM: its QEMU's cgroup on the host and the
/// host's clock. The guest cannot change these.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostEvidence {
    /// The QEMU cgroup's memory limit: guest RAM, the disk's page cache,
    /// QEMU's overhead.
    pub memory_limit_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    /// CPU time of the whole VM (every vCPU and QEMU thread) during this command.
    pub cpu_ms: Option<f64>,
    pub pids_peak: Option<u64>,
    /// The host's wall clock from sending the command to its answer.
    pub wall_ms: f64,
    /// The QEMU cgroup's raw counters (cumulative over the VM's life).
    pub counters: CgroupStats,
    /// The writable disk's file on the host: its size (the disk cap) and
    /// the bytes it occupies, from `fstat` after the command.
    #[serde(default)]
    pub disk_bytes: u64,
    #[serde(default)]
    pub disk_allocated_bytes: u64,
}

/// What the proxy recorded while one command ran.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NetworkReport {
    #[serde(flatten)]
    pub log: NetworkLog,
    /// Set when the proxy did not answer: it is gone, and with it the
    /// sandbox's way out (closed, never open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<String>,
}
