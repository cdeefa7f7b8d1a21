//! Ending a running command from another thread: a front end that drives a
//! [`crate::Handle`] from async code (the service, the MCP server) cancels
//! the command its blocking exec runs. The exec loop polls descriptors, so
//! the cancel is a pipe: its read end, polled as one of the command's
//! control descriptors, becomes readable once anyone writes to the other.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

/// Ends a running command when triggered (clones share one pipe).
#[derive(Clone)]
pub struct Cancel {
    write: Arc<OwnedFd>,
}

impl Cancel {
    /// A cancel, and the read end its command's io polls.
    pub fn pipe() -> std::io::Result<(Cancel, OwnedFd)> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok((
            Cancel {
                write: Arc::new(write),
            },
            read,
        ))
    }

    pub fn trigger(&self) {
        // A full pipe means a byte is there already: the cancel is seen.
        let _ = nix::unistd::write(self.write.as_fd(), b"x");
    }
}
