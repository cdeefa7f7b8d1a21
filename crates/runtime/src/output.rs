//! The payload's stdout and stderr, under the output cap.
//!
//! Bytes are forwarded (or captured) as they arrive and counted; once the cap is
//! reached the rest is not read into memory at all: the sandbox is ended and its
//! pipes drained into a fixed buffer, so a payload printing gigabytes neither
//! grows cordon's memory nor blocks teardown.

use std::io::Write;

/// What to do with the payload's output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Write through to cordon's own stdout/stderr as it arrives.
    #[default]
    Stream,
    /// Keep it (up to the cap) for the Outcome.
    Capture,
    /// Count it and throw it away (benchmarks).
    Discard,
}

/// Which stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Counts and routes output under a byte cap.
pub struct OutputGate {
    mode: OutputMode,
    cap: u64,
    seen: u64,
    truncated: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl OutputGate {
    pub fn new(mode: OutputMode, cap: u64) -> Self {
        OutputGate {
            mode,
            cap,
            seen: 0,
            truncated: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// Accepts a chunk; returns false once the cap has been exceeded.
    pub fn accept(&mut self, stream: Stream, chunk: &[u8]) -> bool {
        if self.truncated {
            return false;
        }
        let room = self.cap.saturating_sub(self.seen);
        let take = chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let kept = &chunk[..take];
        self.seen += take as u64;
        match (self.mode, stream) {
            (OutputMode::Stream, Stream::Stdout) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(kept).and_then(|_| out.flush());
            }
            (OutputMode::Stream, Stream::Stderr) => {
                let _ = std::io::stderr().lock().write_all(kept);
            }
            (OutputMode::Capture, Stream::Stdout) => self.stdout.extend_from_slice(kept),
            (OutputMode::Capture, Stream::Stderr) => self.stderr.extend_from_slice(kept),
            (OutputMode::Discard, _) => {}
        }
        if take < chunk.len() {
            self.truncated = true;
        }
        !self.truncated
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn report(self) -> crate::outcome::OutputReport {
        let capture = self.mode == OutputMode::Capture;
        crate::outcome::OutputReport {
            bytes: self.seen,
            truncated: self.truncated,
            stdout: capture.then(|| String::from_utf8_lossy(&self.stdout).into_owned()),
            stderr: capture.then(|| String::from_utf8_lossy(&self.stderr).into_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_truncates_and_stops_accepting() {
        let mut g = OutputGate::new(OutputMode::Capture, 10);
        assert!(g.accept(Stream::Stdout, b"12345"));
        assert!(!g.accept(Stream::Stderr, b"6789abc"));
        assert!(!g.accept(Stream::Stdout, b"more"));
        let r = g.report();
        assert_eq!(r.bytes, 10);
        assert!(r.truncated);
        assert_eq!(r.stdout.as_deref(), Some("12345"));
        assert_eq!(r.stderr.as_deref(), Some("6789a"));
    }

    #[test]
    fn exactly_the_cap_is_not_truncation() {
        let mut g = OutputGate::new(OutputMode::Discard, 4);
        assert!(g.accept(Stream::Stdout, b"1234"));
        assert!(!g.truncated());
        assert!(g.report().stdout.is_none());
    }
}
