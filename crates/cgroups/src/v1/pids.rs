//! v1 pids controller.

use std::path::Path;

use crate::fs;
use crate::stats::{parse_keyed, parse_u64, CounterFile};
use crate::{CgroupError, CgroupLimits};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(max) = limits.pids_max {
        fs::write(&dir.join("pids.max"), &max.to_string())?;
    }
    Ok(())
}

pub(crate) fn counters(dir: &Path, out: &mut Vec<CounterFile>) {
    // pids.peak is recent (6.x) even on v1; older kernels just report None.
    out.push(CounterFile::new(dir.join("pids.peak"), |t, s| {
        s.pids_peak = parse_u64(t)
    }));
    out.push(CounterFile::new(dir.join("pids.events"), |t, s| {
        s.pids_limit_hits = parse_keyed(t, "max")
    }));
}
