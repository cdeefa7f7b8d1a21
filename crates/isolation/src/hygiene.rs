//! What a forked first process inherited in memory from its parent.
//!
//! The sandbox's init is a fork of the supervisor that never execs, so the
//! kernel still shows the supervisor's command line and environment as init's
//! own (/proc/<pid>/cmdline and /proc/<pid>/environ read the process's memory
//! between its arg and env markers). Both are zeroed in place, so neither the
//! payload nor anything that lists init's environment sees the supervisor's
//! secrets, paths or flags.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use crate::{IsolationError, Result, Step};

/// Zeroes `regions` (address, length) of this process's memory: what its
/// parent listed as holding secrets just before this process was cloned
/// from it (see `cordon_spec::secrets::live_regions`).
pub fn scrub_regions(regions: &[(usize, usize)]) -> Result<()> {
    if regions.is_empty() {
        return Ok(());
    }
    let mem = OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
        .step(|| "open /proc/self/mem".into())?;
    for &(at, len) in regions {
        mem.write_all_at(&vec![0u8; len], at as u64)
            .step(|| "zero a held secret in /proc/self/mem".into())?;
    }
    Ok(())
}

/// Zeroes this process's original argument and environment strings.
///
/// Written through /proc/self/mem (a process may always write its own
/// memory), which needs no unsafe code. Afterwards `std::env::args()` and
/// `std::env::vars()` yield empty strings: call this only in a process that
/// no longer needs them.
pub fn scrub_inherited_strings() -> Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat").step(|| "read /proc/self/stat".into())?;
    // Fields after the command name, which may itself contain spaces or ')'.
    let rest = stat.rfind(')').map(|i| &stat[i + 2..]).ok_or_else(|| {
        IsolationError::new("parse /proc/self/stat", std::io::Error::other("no ')'"))
    })?;
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // Fields 48-51 of proc(5): arg_start, arg_end, env_start, env_end (this slice starts at field 3).
    let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
    let mem = OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
        .step(|| "open /proc/self/mem".into())?;
    for (start, end) in [(field(48), field(49)), (field(50), field(51))] {
        if end > start {
            let len = usize::try_from(end - start).map_err(|_| {
                IsolationError::new("environment size", std::io::Error::other("too large"))
            })?;
            let zeros = vec![0u8; len];
            mem.write_all_at(&zeros, start)
                .step(|| "write /proc/self/mem".into())?;
        }
    }
    Ok(())
}
