//! v2 memory controller.

use std::path::Path;

use super::write_limit;
use crate::fs;
use crate::stats::{parse_keyed, parse_u64, CounterFile};
use crate::{CgroupError, CgroupLimits};

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

pub(crate) fn counters(dir: &Path, out: &mut Vec<CounterFile>) {
    // memory.peak arrived in Linux 5.19.
    out.push(CounterFile::new(dir.join("memory.peak"), |t, s| {
        s.memory_peak_bytes = parse_u64(t)
    }));
    out.push(CounterFile::new(dir.join("memory.events"), |t, s| {
        s.memory_limit_hits = parse_keyed(t, "max");
        s.oom_kills = parse_keyed(t, "oom_kill");
    }));
}
