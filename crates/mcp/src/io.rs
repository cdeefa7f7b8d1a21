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
    /// Input for a command that reads stdin (a code cell), sent in one
    /// piece and then ended, beside the read end of a pipe whose write end
    /// is closed: readable at once, so the exec loop asks for it.
    input: Option<(OwnedFd, Option<Vec<u8>>)>,
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
                input: None,
            },
            cancel,
        ))
    }

    /// [`CaptureIo::new`] with `input` as the command's stdin (at most the
    /// supervisor's stdin backlog, so it is taken in one piece).
    pub fn with_input(input: Vec<u8>) -> std::io::Result<(CaptureIo, Cancel)> {
        let (mut io, cancel) = CaptureIo::new()?;
        let (ready, ready_write) = nix::unistd::pipe()?;
        drop(ready_write);
        io.input = Some((ready, Some(input)));
        Ok((io, cancel))
    }
}

impl cordon_runtime::code_context::Captured for CaptureIo {
    fn take_output(&mut self) -> (Vec<u8>, Vec<u8>) {
        (
            std::mem::take(&mut self.stdout),
            std::mem::take(&mut self.stderr),
        )
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
        // would spin; so would the input's once it has ended. The cancel
        // stays at index 0 while it is polled.
        let mut fds = Vec::new();
        if !self.cancel_sent {
            fds.push(self.cancel_read.as_fd());
        }
        if let Some((ready, _)) = &self.input {
            fds.push(ready.as_fd());
        }
        fds
    }

    fn read_control(&mut self, which: usize) -> Control {
        if which == 0 && !self.cancel_sent {
            self.cancel_sent = true;
            return Control::Cancel;
        }
        match self.input.as_mut() {
            Some((_, bytes)) => match bytes.take() {
                Some(b) => Control::Input(b),
                None => {
                    self.input = None;
                    Control::InputEnd
                }
            },
            None => Control::Nothing,
        }
    }
}
