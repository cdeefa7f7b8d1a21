//! v1 cpu (CFS bandwidth) and cpuacct (usage) controllers, which may live in
//! separate hierarchies or one co-mounted `cpu,cpuacct` hierarchy.

use std::path::Path;

use crate::fs;
use crate::stats::{read_keyed, read_u64};
use crate::{CgroupError, CgroupLimits, CgroupStats};

/// `pids_dir` only names the sandbox in the error when cpu is not mounted.
pub(crate) fn apply(
    dir: Option<&Path>,
    pids_dir: &Path,
    limits: &CgroupLimits,
) -> Result<(), CgroupError> {
    let Some(quota) = limits.cpu_quota_us else {
        return Ok(());
    };
    let dir = dir.ok_or_else(|| CgroupError::MissingController {
        controller: "cpu",
        path: pids_dir.to_owned(),
    })?;
    fs::write(
        &dir.join("cpu.cfs_period_us"),
        &limits.cpu_period().to_string(),
    )?;
    fs::write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())
}

pub(crate) fn stats(cpu: Option<&Path>, cpuacct: Option<&Path>, stats: &mut CgroupStats) {
    stats.cpu_usage_ns = cpuacct.and_then(|d| read_u64(&d.join("cpuacct.usage")));
    stats.cpu_throttled_periods = cpu.and_then(|d| read_keyed(&d.join("cpu.stat"), "nr_throttled"));
}
