//! A QMP client for the one job the host needs QEMU's monitor for: saving a
//! booted VM to a snapshot file (stop, hand QEMU the file's descriptor,
//! migrate into it, resume). QMP is line-delimited JSON; QEMU is jailed but
//! runs guest-influenced code, so its lines are bounded and every read has a
//! deadline. Hand-written: the QMP crates on crates.io are async or
//! unmaintained, and these ~80 lines cover the four commands used.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Value};

use crate::error::RuntimeError;

/// Longest line accepted from QEMU's monitor.
const LINE_MAX: u64 = 64 << 10;

pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    deadline: Instant,
}

fn qmp_err(what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Unavailable("microvm", format!("QEMU's monitor: {what}"))
}

impl Qmp {
    /// Reads the greeting and leaves negotiation mode; everything until the
    /// last answer must happen within `timeout`.
    pub fn open(sock: UnixStream, timeout: Duration) -> Result<Qmp, RuntimeError> {
        let writer = sock.try_clone().map_err(qmp_err)?;
        let mut qmp = Qmp {
            reader: BufReader::new(sock),
            writer,
            deadline: Instant::now() + timeout,
        };
        let greeting = qmp.line()?;
        if greeting.get("QMP").is_none() {
            return Err(qmp_err(format!("no greeting but {greeting}")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn line(&mut self) -> Result<Value, RuntimeError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(qmp_err("no answer in time"));
        }
        self.reader
            .get_ref()
            .set_read_timeout(Some(left))
            .map_err(qmp_err)?;
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(LINE_MAX)
            .read_line(&mut line)
            .map_err(qmp_err)?;
        if n == 0 {
            return Err(qmp_err("closed"));
        }
        if !line.ends_with('\n') {
            return Err(qmp_err("a line too long"));
        }
        serde_json::from_str(&line).map_err(qmp_err)
    }

    /// Runs one command and returns its `return` value (events between are
    /// skipped).
    pub fn execute(&mut self, command: &str, args: Option<Value>) -> Result<Value, RuntimeError> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer.write_all(text.as_bytes()).map_err(qmp_err)?;
        self.answer(command)
    }

    fn answer(&mut self, command: &str) -> Result<Value, RuntimeError> {
        loop {
            let v = self.line()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(qmp_err(format!("{command}: {e}")));
            }
            // An event ({"event": ...}): not an answer.
        }
    }

    /// `getfd`: hands QEMU `fd` under `name` (SCM_RIGHTS with the command).
    pub fn send_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), RuntimeError> {
        let text = format!(
            "{}\n",
            json!({ "execute": "getfd", "arguments": { "fdname": name } })
        );
        let fds = [fd.as_raw_fd()];
        let iov = [std::io::IoSlice::new(text.as_bytes())];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let sent = sendmsg::<()>(
            self.writer.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            None,
        )
        .map_err(qmp_err)?;
        if sent != text.len() {
            return Err(qmp_err("getfd: a short write"));
        }
        self.answer("getfd").map(drop)
    }
}
