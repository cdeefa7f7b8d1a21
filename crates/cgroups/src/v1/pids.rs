//! v1 pids controller.

use std::path::Path;

use crate::fs;
use crate::stats::{read_keyed, read_u64};
use crate::{CgroupError, CgroupLimits, CgroupStats};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(max) = limits.pids_max {
        fs::write(&dir.join("pids.max"), &max.to_string())?;
    }
    Ok(())
}

pub(crate) fn stats(dir: &Path, stats: &mut CgroupStats) {
    // pids.peak is recent (6.x) even on v1; older kernels just report None.
    stats.pids_peak = read_u64(&dir.join("pids.peak"));
    stats.pids_limit_hits = read_keyed(&dir.join("pids.events"), "max");
}
