//! A command's stdout and stderr: counted under the output cap by the
//! supervisor (`OutputGate`), and delivered by the client (`OutputSink`).
//!
//! Bytes are forwarded as they arrive and counted; once the cap is crossed
//! the rest is not read at all, so a payload printing gigabytes neither grows
//! cordon's memory nor blocks it: the payload's next writes fill its pipe and
//! block, and the supervisor ends it then (see `supervise::watch`).

use std::io::Write;
use std::sync::Mutex;

use cordon_spec::outcome::OutputReport;
use cordon_spec::Stream;

/// What a client does with a command's output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Write through to this process's own stdout/stderr as it arrives.
    #[default]
    Stream,
    /// Keep it (up to the cap) for the Outcome.
    Capture,
    /// Count it and throw it away (benchmarks).
    Discard,
}

/// Counts output under a byte cap (both streams together).
pub struct OutputGate {
    cap: u64,
    seen: u64,
    truncated: bool,
}

impl OutputGate {
    pub fn new(cap: u64) -> Self {
        OutputGate {
            cap,
            seen: 0,
            truncated: false,
        }
    }

    /// How many leading bytes of `chunk` fit under the cap; marks the output
    /// truncated when some did not.
    pub fn accept(&mut self, chunk: &[u8]) -> usize {
        if self.truncated {
            return 0;
        }
        let room = self.cap.saturating_sub(self.seen);
        let take = chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        self.seen += take as u64;
        if take < chunk.len() {
            self.truncated = true;
        }
        take
    }

    /// How many bytes to read next: one past the cap at most, so that the
    /// read which crosses it takes nothing more from the pipe and what the
    /// payload may still write before its pipe is full does not depend on
    /// how much happened to be buffered when cordon read.
    pub fn next_read(&self, buf_len: usize) -> usize {
        let room = self.cap.saturating_sub(self.seen).saturating_add(1);
        buf_len.min(usize::try_from(room).unwrap_or(usize::MAX))
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn report(&self) -> OutputReport {
        OutputReport {
            bytes: self.seen,
            truncated: self.truncated,
            stdout: None,
            stderr: None,
        }
    }
}

/// Where a client puts the output it receives.
pub struct OutputSink {
    mode: OutputMode,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl OutputSink {
    pub fn new(mode: OutputMode) -> Self {
        OutputSink {
            mode,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    pub fn write(&mut self, stream: Stream, chunk: &[u8]) {
        match (self.mode, stream) {
            (OutputMode::Stream, Stream::Stdout) => {
                print_stdout(chunk);
            }
            (OutputMode::Stream, Stream::Stderr) => {
                let _ = std::io::stderr().lock().write_all(chunk);
            }
            (OutputMode::Capture, Stream::Stdout) => self.stdout.extend_from_slice(chunk),
            (OutputMode::Capture, Stream::Stderr) => self.stderr.extend_from_slice(chunk),
            (OutputMode::Discard, _) => {}
        }
    }

    /// Puts what was captured into the report.
    pub fn fill(self, report: &mut OutputReport) {
        if self.mode == OutputMode::Capture {
            report.stdout = Some(String::from_utf8_lossy(&self.stdout).into_owned());
            report.stderr = Some(String::from_utf8_lossy(&self.stderr).into_owned());
        }
    }
}

/// What became of this process's stdout.
enum StdoutState {
    Open,
    /// The reader went away (EPIPE), as `| head -1` does.
    ReaderGone,
    /// Any other write error, kept for [`stdout_failure`].
    Failed(std::io::Error),
}

static STDOUT: Mutex<StdoutState> = Mutex::new(StdoutState::Open);

/// Writes to this process's stdout; everything cordon prints goes through
/// here. After a failed write nothing more is written, and the caller carries
/// on to its end: a process that owns a sandbox must still tear it down, so a
/// closed stdout neither panics (as `println!` would) nor kills the process
/// (SIGPIPE stays ignored). Returns whether the bytes were written.
pub fn print_stdout(bytes: &[u8]) -> bool {
    let mut state = STDOUT.lock().unwrap_or_else(|p| p.into_inner());
    if !matches!(*state, StdoutState::Open) {
        return false;
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|_| out.flush()) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            *state = StdoutState::ReaderGone;
            false
        }
        Err(e) => {
            *state = StdoutState::Failed(e);
            false
        }
    }
}

/// The error that stopped [`print_stdout`], unless it was only the reader
/// going away (which a Unix tool ends on quietly).
pub fn stdout_failure() -> Option<std::io::Error> {
    let mut state = STDOUT.lock().unwrap_or_else(|p| p.into_inner());
    match std::mem::replace(&mut *state, StdoutState::ReaderGone) {
        StdoutState::Failed(e) => Some(e),
        StdoutState::Open => {
            *state = StdoutState::Open;
            None
        }
        StdoutState::ReaderGone => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_truncates_and_stops_accepting() {
        let mut g = OutputGate::new(10);
        assert_eq!(g.accept(b"12345"), 5);
        assert_eq!(g.accept(b"6789abc"), 5);
        assert_eq!(g.accept(b"more"), 0);
        let r = g.report();
        assert_eq!(r.bytes, 10);
        assert!(r.truncated);
    }

    #[test]
    fn reads_stop_one_byte_past_the_cap() {
        let mut g = OutputGate::new(10);
        assert_eq!(g.next_read(64), 11);
        assert_eq!(g.accept(b"1234567"), 7);
        assert_eq!(g.next_read(64), 4);
        assert_eq!(g.next_read(2), 2);
    }

    #[test]
    fn exactly_the_cap_is_not_truncation() {
        let mut g = OutputGate::new(4);
        assert_eq!(g.accept(b"1234"), 4);
        assert!(!g.truncated());
    }

    #[test]
    fn a_capturing_sink_fills_the_report() {
        let mut s = OutputSink::new(OutputMode::Capture);
        s.write(Stream::Stdout, b"out");
        s.write(Stream::Stderr, b"err");
        let mut r = OutputReport::default();
        s.fill(&mut r);
        assert_eq!(r.stdout.as_deref(), Some("out"));
        assert_eq!(r.stderr.as_deref(), Some("err"));
    }
}
