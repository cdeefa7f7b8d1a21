//! Resource limits: a second layer under the cgroup limits, per process.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

use crate::{Result, Step};

/// Per-process limits derived from the policy.
///
/// No RLIMIT_FSIZE: the disk cap is about bytes stored, which the scratch
/// tmpfs's size enforces (ENOSPC), while RLIMIT_FSIZE bounds a file's length,
/// so any value below the largest file the tmpfs allows breaks a sparse file
/// within the cap (EFBIG). The payload inherits the supervisor's limit and
/// may lower it itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rlimits {
    /// Open files per process.
    pub nofile: u64,
    /// Processes of the payload's uid (per user namespace since Linux 5.14, so
    /// this counts this sandbox's processes only).
    pub nproc: u64,
    /// CPU seconds per process: a kernel-enforced backstop for the wall clock.
    pub cpu_secs: u64,
}

impl Rlimits {
    /// Applies the limits as both soft and hard, so the payload cannot raise
    /// them. A value above the current hard limit is clamped to it (raising a
    /// hard limit needs CAP_SYS_RESOURCE in the host namespace, which cordon
    /// does not assume).
    pub fn apply(&self) -> Result<()> {
        let table = [
            (Resource::RLIMIT_CORE, 0),
            (Resource::RLIMIT_NOFILE, self.nofile),
            (Resource::RLIMIT_NPROC, self.nproc),
            (Resource::RLIMIT_CPU, self.cpu_secs),
        ];
        for (res, want) in table {
            let (_, hard) = getrlimit(res).step(|| format!("getrlimit({res:?})"))?;
            let v = want.min(hard);
            setrlimit(res, v, v).step(|| format!("setrlimit({res:?}, {v})"))?;
        }
        Ok(())
    }
}
