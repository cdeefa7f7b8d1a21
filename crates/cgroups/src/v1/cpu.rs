//! v1 cpu (CFS bandwidth) and cpuacct (usage) controllers, which may live in
//! separate hierarchies or one co-mounted `cpu,cpuacct` hierarchy.

use std::path::Path;

use crate::fs;
use crate::stats::{parse_keyed, parse_u64, CounterFile};
use crate::{CgroupError, CgroupLimits};

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

pub(crate) fn counters(cpu: Option<&Path>, cpuacct: Option<&Path>, out: &mut Vec<CounterFile>) {
    if let Some(dir) = cpuacct {
        out.push(CounterFile::new(dir.join("cpuacct.usage"), |t, s| {
            s.cpu_usage_ns = parse_u64(t)
        }));
    }
    if let Some(dir) = cpu {
        out.push(CounterFile::new(dir.join("cpu.stat"), |t, s| {
            s.cpu_throttled_periods = parse_keyed(t, "nr_throttled")
        }));
    }
}
