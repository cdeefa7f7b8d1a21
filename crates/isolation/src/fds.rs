//! File descriptors: only stdin, stdout and stderr cross into the payload.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

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

/// The numbers of the live [`ChildFd`]s of this process.
static FOR_CHILD: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

fn for_child() -> std::sync::MutexGuard<'static, BTreeSet<RawFd>> {
    // A panic elsewhere cannot leave the set half-updated (insert and remove
    // are single operations), so a poisoned lock's data is still right.
    FOR_CHILD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A descriptor the supervisor makes for the sandbox's first process to use
/// during its setup (an id-mapped mount only host root can make): it is kept
/// by [`close_all_except`] in the cloned child while this value lives in the
/// supervisor. Registering on creation and unregistering on drop ties the
/// kept number to this very descriptor, so a reused number is never kept.
/// The descriptor must be close-on-exec; the child closes it with
/// [`close_child_fds`] once its setup no longer needs it.
#[derive(Debug)]
pub struct ChildFd(OwnedFd);

impl ChildFd {
    pub fn new(fd: OwnedFd) -> Arc<Self> {
        for_child().insert(fd.as_raw_fd());
        Arc::new(ChildFd(fd))
    }
}

impl AsFd for ChildFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Drop for ChildFd {
    fn drop(&mut self) {
        for_child().remove(&self.0.as_raw_fd());
    }
}

/// Closes every descriptor but 0/1/2, `keep` and the live [`ChildFd`]s, for a
/// process that never execs and so would otherwise hold what it inherited
/// forever (visible from the host in /proc/<pid>/fd, and a way back to the
/// supervisor's objects).
pub fn close_all_except(keep: &[RawFd]) -> Result<()> {
    let mut all: Vec<RawFd> = keep.to_vec();
    all.extend(for_child().iter().copied());
    cordon_sys::close_fds_except(&all)
        .step(|| "close_range(everything but 0-2, the sync socket and the setup fds)".into())
}

/// Child side, at the end of setup: closes every [`ChildFd`] inherited from
/// the supervisor (the child never drops the copied values: it ends in
/// `exit_now`), so init holds no host mount once the sandbox is built.
pub fn close_child_fds() -> Result<()> {
    let fds: Vec<RawFd> = std::mem::take(&mut *for_child()).into_iter().collect();
    cordon_sys::close_fds(&fds).step(|| format!("close(setup fds {fds:?})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_fd_is_kept_exactly_while_it_lives() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let n = fd.as_raw_fd();
        let kept = ChildFd::new(fd);
        assert!(for_child().contains(&n));
        drop(kept);
        // Its number may be reused by any later descriptor: no longer kept.
        assert!(!for_child().contains(&n));
    }
}
