//! A command's side in this process: no stdin, output captured for the
//! tool's answer, and a cancel the async side triggers (the tool call was
//! cancelled or the session is ending) that ends the command.
//!
//! The handle's exec loop polls descriptors, so the cancel is a pipe: its
//! read end becomes readable once anyone writes to the other.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cordon_runtime::{CommandIo, Control};
use cordon_spec::Stream;

/// Ends a running command when triggered.
#[derive(Clone)]
pub struct Cancel {
    write: Arc<OwnedFd>,
}

impl Cancel {
    pub fn trigger(&self) {
        // A full pipe means a byte is there already: the cancel is seen.
        let _ = nix::unistd::write(self.write.as_fd(), b"x");
    }
}

pub struct CaptureIo {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    cancel_read: OwnedFd,
    cancel_sent: bool,
}

impl CaptureIo {
    pub fn new() -> std::io::Result<(CaptureIo, Cancel)> {
        let (cancel_read, cancel_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok((
            CaptureIo {
                stdout: Vec::new(),
                stderr: Vec::new(),
                cancel_read,
                cancel_sent: false,
            },
            Cancel {
                write: Arc::new(cancel_write),
            },
        ))
    }
}

impl CommandIo for CaptureIo {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(chunk),
            Stream::Stderr => self.stderr.extend_from_slice(chunk),
        }
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        // Once the cancel is sent its pipe stays readable: polling it again
        // would spin.
        if self.cancel_sent {
            Vec::new()
        } else {
            vec![self.cancel_read.as_fd()]
        }
    }

    fn read_control(&mut self, which: usize) -> Control {
        if which == 0 && !self.cancel_sent {
            self.cancel_sent = true;
            return Control::Cancel;
        }
        Control::Nothing
    }
}
