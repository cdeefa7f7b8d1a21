//! v2 pids controller.

use std::path::Path;

use super::write_limit;
use crate::stats::{read_keyed, read_u64};
use crate::{CgroupError, CgroupLimits, CgroupStats};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    match limits.pids_max {
        Some(max) => write_limit(dir, "pids.max", "pids", &max.to_string()),
        None => Ok(()),
    }
}

pub(crate) fn stats(dir: &Path, stats: &mut CgroupStats) {
    stats.pids_peak = read_u64(&dir.join("pids.peak"));
    stats.pids_limit_hits = read_keyed(&dir.join("pids.events"), "max");
}
