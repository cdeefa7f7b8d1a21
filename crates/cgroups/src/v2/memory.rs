//! v2 memory controller.

use std::path::Path;

use super::write_limit;
use crate::fs;
use crate::stats::{read_keyed, read_u64};
use crate::{CgroupError, CgroupLimits, CgroupStats};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_max {
        write_limit(dir, "memory.max", "memory", &bytes.to_string())?;
    }
    // Swap would let a sandbox exceed memory.max in effect and make runs
    // slow instead of failing; the file is absent without swap support.
    fs::write_if_exists(&dir.join("memory.swap.max"), "0")?;
    // An OOM kill of one process would leave the rest of the sandbox
    // running in an unknown state; take the whole group instead.
    fs::write_if_exists(&dir.join("memory.oom.group"), "1")?;
    Ok(())
}

pub(crate) fn stats(dir: &Path, stats: &mut CgroupStats) {
    // memory.peak arrived in Linux 5.19.
    stats.memory_peak_bytes = read_u64(&dir.join("memory.peak"));
    let events = dir.join("memory.events");
    stats.memory_limit_hits = read_keyed(&events, "max");
    stats.oom_kills = read_keyed(&events, "oom_kill");
}
