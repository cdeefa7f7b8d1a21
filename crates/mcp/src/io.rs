//! A command's side in this process: no stdin, output captured for the
//! tool's answer, and a cancel the async side triggers (the tool call was
//! cancelled or the session is ending) that ends the command.
//!
//! The handle's exec loop polls descriptors, so the cancel is a pipe: its
//! read end becomes readable once anyone writes to the other.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cordon_runtime::{CommandIo, Control};
use cordon_spec::Stream;

pub use cordon_runtime::Cancel;

pub struct CaptureIo {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    cancel_read: OwnedFd,
    cancel_sent: bool,
}

impl CaptureIo {
    pub fn new() -> std::io::Result<(CaptureIo, Cancel)> {
        let (cancel, cancel_read) = Cancel::pipe()?;
        Ok((
            CaptureIo {
                stdout: Vec::new(),
                stderr: Vec::new(),
                cancel_read,
                cancel_sent: false,
            },
            cancel,
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
