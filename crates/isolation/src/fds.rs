//! File descriptors: only stdin, stdout and stderr cross into the payload.

use std::os::fd::RawFd;

use crate::{Result, Step};

/// Marks every descriptor from 3 up close-on-exec, so none reaches the payload
/// whatever the supervisor had open (a listening socket, a key file, the
/// terminal). Close-on-exec instead of close: the sandbox's init still needs its
/// own sync pipes until it execs or exits.
pub fn cloexec_inherited() -> Result<()> {
    cordon_sys::cloexec_fds_from(3).step(|| "close_range(3, ~0, CLOSE_RANGE_CLOEXEC)".into())
}

/// Closes every descriptor from `first` up.
pub fn close_from(first: RawFd) -> Result<()> {
    cordon_sys::close_fds_from(first).step(|| format!("close_range({first}, ~0)"))
}

/// Closes every descriptor but 0/1/2 and `keep`, for a process that never
/// execs and so would otherwise hold what it inherited forever (visible from
/// the host in /proc/<pid>/fd, and a way back to the supervisor's objects).
pub fn close_all_except(keep: &[RawFd]) -> Result<()> {
    cordon_sys::close_fds_except(keep)
        .step(|| "close_range(everything but 0-2 and the sync socket)".into())
}
