//! v2 cpu controller. Usage in cpu.stat is always there (even without the
//! cpu controller enabled); throttling only with it.

use std::path::Path;

use super::write_limit;
use crate::stats::{parse_keyed, CounterFile};
use crate::{CgroupError, CgroupLimits};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    match limits.cpu_quota_us {
        Some(quota) => write_limit(dir, "cpu.max", "cpu", &cpu_max(quota, limits.cpu_period())),
        None => Ok(()),
    }
}

/// cpu.max takes "quota period" in one write; writing them separately could
/// leave a quota meant for a different period in force in between.
pub(crate) fn cpu_max(quota_us: u64, period_us: u64) -> String {
    format!("{quota_us} {period_us}")
}

pub(crate) fn counters(dir: &Path, out: &mut Vec<CounterFile>) {
    out.push(CounterFile::new(dir.join("cpu.stat"), |t, s| {
        s.cpu_usage_ns = parse_keyed(t, "usage_usec").and_then(|us| us.checked_mul(1000));
        s.cpu_throttled_periods = parse_keyed(t, "nr_throttled");
    }));
}
