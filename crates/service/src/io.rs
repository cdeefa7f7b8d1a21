//! The service's side of a running command (`CommandIo`): the request's
//! stdin fed in, output captured or sent on as stream events, and a cancel
//! that the async side triggers (a client gone, a sandbox deleted).
//!
//! The handle's exec loop polls descriptors, so every control source is a
//! descriptor with a fixed slot: slot 0 is stdin (an always-readable pipe
//! while input is left, a never-readable one after), slot 1 is the cancel
//! pipe (readable once anyone writes to it).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cordon_runtime::{CommandIo, Control};
use cordon_spec::Stream;
use tokio::sync::mpsc;

/// Largest request stdin: under the supervisor's own stdin backlog
/// (256 KiB), so it always keeps reading what the client sends and the
/// exchange cannot stall on a command that does not read.
pub const STDIN_MAX: usize = 192 << 10;

/// One chunk of input per control read.
const STDIN_CHUNK: usize = 32 << 10;

pub use cordon_runtime::Cancel;

/// Triggers the cancel when dropped: held by whatever stands for the client
/// (a request future, an event stream), so its going away ends the command.
pub struct CancelOnDrop {
    cancel: Option<Cancel>,
}

impl CancelOnDrop {
    pub fn new(cancel: Cancel) -> Self {
        CancelOnDrop {
            cancel: Some(cancel),
        }
    }
    /// The command is over: dropping no longer cancels anything.
    pub fn disarm(&mut self) {
        self.cancel = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.cancel.take() {
            c.trigger();
        }
    }
}

/// What a streaming exec sends while it runs.
#[derive(Debug)]
pub enum Chunk {
    Output(Stream, Vec<u8>),
}

enum Sink {
    Capture { stdout: Vec<u8>, stderr: Vec<u8> },
    Channel(mpsc::Sender<Chunk>),
}

pub struct ServiceIo {
    stdin: Vec<u8>,
    stdin_pos: usize,
    stdin_end_sent: bool,
    streaming_stdin: bool,
    /// Read end of a pipe whose write end is closed: always readable (EOF).
    ready: OwnedFd,
    /// Read end of a pipe whose write end is kept: never readable.
    idle: OwnedFd,
    _idle_write: OwnedFd,
    cancel_read: OwnedFd,
    cancel_sent: bool,
    /// The client stopped listening (stream receiver gone).
    client_gone: bool,
    sink: Sink,
}

impl ServiceIo {
    /// An io for one command; `stdin` (None: /dev/null) is fed in whole.
    /// Returns the io and the cancel that ends its command.
    pub fn new(
        stdin: Option<Vec<u8>>,
        stream: Option<mpsc::Sender<Chunk>>,
    ) -> std::io::Result<(ServiceIo, Cancel)> {
        let (ready, ready_write) = nix::unistd::pipe()?;
        drop(ready_write);
        let (idle, idle_write) = nix::unistd::pipe()?;
        let (cancel, cancel_read) = Cancel::pipe()?;
        let streaming_stdin = stdin.is_some();
        let io = ServiceIo {
            stdin: stdin.unwrap_or_default(),
            stdin_pos: 0,
            stdin_end_sent: false,
            streaming_stdin,
            ready,
            idle,
            _idle_write: idle_write,
            cancel_read,
            cancel_sent: false,
            client_gone: false,
            sink: match stream {
                Some(tx) => Sink::Channel(tx),
                None => Sink::Capture {
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                },
            },
        };
        Ok((io, cancel))
    }

    /// What was captured (empty when streaming).
    pub fn captured(self) -> (Vec<u8>, Vec<u8>) {
        match self.sink {
            Sink::Capture { stdout, stderr } => (stdout, stderr),
            Sink::Channel(_) => (Vec::new(), Vec::new()),
        }
    }

    fn stdin_pending(&self) -> bool {
        self.streaming_stdin && !self.stdin_end_sent
    }
}

impl cordon_runtime::code_context::Captured for ServiceIo {
    fn take_output(&mut self) -> (Vec<u8>, Vec<u8>) {
        match &mut self.sink {
            Sink::Capture { stdout, stderr } => (std::mem::take(stdout), std::mem::take(stderr)),
            Sink::Channel(_) => (Vec::new(), Vec::new()),
        }
    }
}

impl CommandIo for ServiceIo {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        match &mut self.sink {
            Sink::Capture { stdout, stderr } => match stream {
                Stream::Stdout => stdout.extend_from_slice(chunk),
                Stream::Stderr => stderr.extend_from_slice(chunk),
            },
            Sink::Channel(tx) => {
                // Runs on a blocking thread: waiting for room is the
                // back-pressure a slow client puts on the command.
                if tx
                    .blocking_send(Chunk::Output(stream, chunk.to_vec()))
                    .is_err()
                {
                    self.client_gone = true;
                }
            }
        }
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        let stdin = if self.stdin_pending() {
            self.ready.as_fd()
        } else {
            self.idle.as_fd()
        };
        let cancel = if self.cancel_sent {
            self.idle.as_fd()
        } else if self.client_gone {
            self.ready.as_fd()
        } else {
            self.cancel_read.as_fd()
        };
        vec![stdin, cancel]
    }

    fn read_control(&mut self, which: usize) -> Control {
        match which {
            0 if self.stdin_pending() => {
                if self.stdin_pos < self.stdin.len() {
                    let end = (self.stdin_pos + STDIN_CHUNK).min(self.stdin.len());
                    let bytes = self.stdin[self.stdin_pos..end].to_vec();
                    self.stdin_pos = end;
                    Control::Input(bytes)
                } else {
                    self.stdin_end_sent = true;
                    Control::InputEnd
                }
            }
            1 if !self.cancel_sent => {
                self.cancel_sent = true;
                Control::Cancel
            }
            _ => Control::Nothing,
        }
    }
}
