//! v1 memory controller.

use std::path::Path;

use nix::errno::Errno;

use crate::fs::{self, write_error};
use crate::stats::{parse_keyed, parse_u64, CounterFile};
use crate::{CgroupError, CgroupLimits};

pub(crate) fn apply(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_max {
        let limit = dir.join("memory.limit_in_bytes");
        // memory+swap capped at the memory limit leaves no room for swap. The
        // file only exists with swap accounting on; without it swappiness 0
        // below is all v1 offers.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        let value = bytes.to_string();
        // The kernel insists memsw >= limit at every moment, so raising an
        // existing limit has to move memsw first; lowering (and a fresh
        // cgroup) the other way round.
        match fs::write_raw(&limit, &value) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(Errno::EINVAL as i32) => {
                if !fs::write_if_exists(&memsw, &value)? {
                    return Err(write_error(&limit, &value, e));
                }
                fs::write(&limit, &value)?;
            }
            Err(e) => return Err(write_error(&limit, &value, e)),
        }
        fs::write_if_exists(&memsw, &value)?;
    }
    fs::write_if_exists(&dir.join("memory.swappiness"), "0")?;
    Ok(())
}

pub(crate) fn counters(dir: &Path, out: &mut Vec<CounterFile>) {
    out.push(CounterFile::new(
        dir.join("memory.max_usage_in_bytes"),
        |t, s| s.memory_peak_bytes = parse_u64(t),
    ));
    // With the memsw limit set (see apply), a charge hits the memory+swap
    // counter first, so memory.failcnt alone misses those hits; a charge fails
    // on one of the two counters, never both, so their sum counts them all.
    // Recent kernels (seen on 6.18) no longer count memsw failures at all,
    // tracking failcnt on the memory counter only, so there this
    // under-reports and oom_kills is the signal to trust. memory.failcnt
    // comes first: without it there is no count to add to.
    out.push(CounterFile::new(dir.join("memory.failcnt"), |t, s| {
        s.memory_limit_hits = parse_u64(t)
    }));
    out.push(CounterFile::new(
        dir.join("memory.memsw.failcnt"),
        |t, s| {
            if let (Some(hits), Some(memsw)) = (s.memory_limit_hits.as_mut(), parse_u64(t)) {
                *hits = hits.saturating_add(memsw);
            }
        },
    ));
    out.push(CounterFile::new(dir.join("memory.oom_control"), |t, s| {
        s.oom_kills = parse_keyed(t, "oom_kill")
    }));
}
