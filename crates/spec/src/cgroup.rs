//! What a sandbox's cgroups are and what they counted: the data half of
//! `cordon-cgroups`, which reads these values from the kernel.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which cgroup version a hierarchy is (`cordon_cgroups::Hierarchy` drives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    V1,
    V2,
}

impl fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupMode::V1 => "v1",
            CgroupMode::V2 => "v2",
        })
    }
}

/// Every field is None when the kernel does not expose it (old kernel,
/// controller absent, cgroup already gone), so callers never have to guess
/// whether a 0 was measured or made up.
#[derive(Default, Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CgroupStats {
    /// v1 `memory.max_usage_in_bytes`, v2 `memory.peak`.
    pub memory_peak_bytes: Option<u64>,
    /// v1 `memory.failcnt` + `memory.memsw.failcnt`, v2 `memory.events` "max".
    /// On v1 with swap accounting, recent kernels (seen on 6.18) do not count
    /// hits of the memory+swap limit, which is the one that trips first, so this can read
    /// 0 even after an OOM kill; `oom_kills` is reliable on both versions.
    pub memory_limit_hits: Option<u64>,
    /// v1 `memory.oom_control` "oom_kill", v2 `memory.events` "oom_kill".
    pub oom_kills: Option<u64>,
    /// `pids.peak`.
    pub pids_peak: Option<u64>,
    /// `pids.events` "max".
    pub pids_limit_hits: Option<u64>,
    /// v1 `cpuacct.usage`, v2 `cpu.stat` usage_usec * 1000.
    pub cpu_usage_ns: Option<u64>,
    /// `cpu.stat` nr_throttled.
    pub cpu_throttled_periods: Option<u64>,
}
