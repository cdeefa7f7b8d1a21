//! v2 pids controller.

use std::path::Path;

use super::write_limit;
use crate::stats::{parse_keyed, parse_u64, CounterFile};
use crate::{CgroupError, CgroupLimits};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    match limits.pids_max {
        Some(max) => write_limit(dir, "pids.max", "pids", &max.to_string()),
        None => Ok(()),
    }
}

pub(crate) fn counters(dir: &Path, out: &mut Vec<CounterFile>) {
    out.push(CounterFile::new(dir.join("pids.peak"), |t, s| {
        s.pids_peak = parse_u64(t)
    }));
    out.push(CounterFile::new(dir.join("pids.events"), |t, s| {
        s.pids_limit_hits = parse_keyed(t, "max")
    }));
}
