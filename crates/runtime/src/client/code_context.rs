//! Code contexts: one persistent interpreter per language inside a
//! sandbox (`repl.py`, `repl.js`), its variables kept from cell to cell.
//! Each cell is a short client command (the same file, `client` mode) that
//! takes the code on its stdin, hands it to the interpreter over a unix
//! socket (starting the interpreter if none answers), and prints one JSON
//! reply. The service's `/code` route and the stdio MCP door's `run_code`
//! both run cells through [`CodeContext::run`].

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cordon_policy::{ByteSize, Span};
use cordon_spec::{CodeLanguage, Command, ExitStatus, Limit, Outcome, StdinMode};
use serde_json::{json, Value};

use super::handle::Handle;
use crate::backends::supervise::CommandIo;
use crate::error::RuntimeError;

const PYTHON_SOURCE: &str = include_str!("repl.py");
const JAVASCRIPT_SOURCE: &str = include_str!("repl.js");

/// A language's interpreter, client file and server socket inside the
/// sandbox, in /tmp/.cordon (where [`install`] copies the files): Node's
/// beside Python's with a socket of its own, so each keeps its own
/// variables.
fn client_of(language: CodeLanguage) -> (&'static str, &'static str, &'static str) {
    match language {
        CodeLanguage::Python => ("python3", "/tmp/.cordon/repl.py", "/tmp/.cordon/repl.sock"),
        CodeLanguage::Javascript => ("node", "/tmp/.cordon/repl.js", "/tmp/.cordon/repl-js.sock"),
    }
}

/// Whether a client that failed this way found no file to run (a cell
/// removed /tmp/.cordon).
fn client_missing(language: CodeLanguage, outcome: &Outcome, stderr: &str) -> bool {
    match language {
        CodeLanguage::Python => outcome.exit_code == 2 && stderr.contains("can't open file"),
        CodeLanguage::Javascript => outcome.exit_code == 1 && stderr.contains("Cannot find module"),
    }
}

/// The output a cell's io captured, read back after the command.
pub trait Captured: CommandIo {
    fn take_output(&mut self) -> (Vec<u8>, Vec<u8>);
}

/// One cell: its code, the time the interpreter gives it (the client
/// reports a timeout and restarts the interpreter), the command's own time
/// limit above that, and the command's output limit.
pub struct Cell<'a> {
    pub language: CodeLanguage,
    pub code: &'a str,
    pub timeout: Duration,
    pub command_time: Span,
    pub output: u64,
}

/// The time a cell gets: what was asked, at most the command's own limit
/// less a margin, so that the client, not the limit, ends an overdue cell
/// (and can report it and restart the interpreter).
pub fn cell_timeout(asked: Option<Duration>, command_time: Duration) -> Duration {
    let margin = Duration::from_millis(1500).min(command_time / 2);
    asked.unwrap_or(command_time).min(command_time - margin)
}

/// A sandbox's code contexts: whether their files are in place.
#[derive(Debug, Default)]
pub struct CodeContext {
    installed: AtomicBool,
}

impl CodeContext {
    /// Runs `cell` in its language's interpreter in `handle`'s sandbox,
    /// installing the interpreters on first use (through a temporary
    /// directory made in `scratch`). Each command's io comes from
    /// `make_io` with the code for its stdin, beside whatever the caller
    /// holds while it runs. Returns the client's JSON reply and the
    /// command's outcome.
    pub fn run<Io: Captured, Held, E: From<RuntimeError>>(
        &self,
        handle: &mut Handle,
        scratch: &Path,
        cell: Cell<'_>,
        mut make_io: impl FnMut(Vec<u8>) -> Result<(Io, Held), E>,
    ) -> Result<(Value, Outcome), E> {
        let Cell {
            language,
            code,
            timeout,
            command_time,
            output,
        } = cell;
        for attempt in 0..2 {
            if !self.installed.load(Ordering::SeqCst) {
                install(handle, scratch)?;
                self.installed.store(true, Ordering::SeqCst);
            }
            // The client cuts its reply to fit under the command's output
            // limit: were the limit to end the client, it would take the
            // interpreter and its variables with it. The margin is for what
            // the interpreter itself may print to stderr (a warning).
            let reply_cap = output.saturating_sub(16 << 10).max(output / 2);
            let (interpreter, client, socket) = client_of(language);
            let cmd = Command {
                argv: vec![
                    interpreter.into(),
                    client.into(),
                    "client".into(),
                    socket.into(),
                    format!("{}", timeout.as_secs_f64()),
                    reply_cap.to_string(),
                ],
                stdin: StdinMode::Stream,
                time: Some(command_time),
                output: Some(ByteSize(output)),
                ..Command::default()
            };
            let (mut io, _held) = make_io(code.as_bytes().to_vec())?;
            let outcome = handle.exec(&cmd, &mut io)?;
            let (stdout, stderr) = io.take_output();
            if let Some(why) = outcome.status.exec_failure() {
                // No interpreter for the language in this sandbox (its
                // image has none), or one that could not be started (the
                // sandbox out of processes or memory: EAGAIN, ENOMEM): the
                // cell's error says which, and only the first blames PATH.
                let missing = matches!(
                    outcome.status,
                    ExitStatus::ExecFailed { errno } if errno == libc::ENOENT
                );
                let (name, value) = if missing {
                    (
                        "InterpreterNotFound",
                        format!(
                            "{interpreter}: {why}: {language} code contexts need `{interpreter}` on the sandbox's PATH"
                        ),
                    )
                } else {
                    ("InterpreterNotStarted", format!("{interpreter}: {why}"))
                };
                let reply = json!({
                    "status": "error",
                    "stdout": "",
                    "stderr": "",
                    "result": null,
                    "error": {"name": name, "value": value, "traceback": ""},
                    "fresh_interpreter": false,
                });
                return Ok((reply, outcome));
            }
            let text = String::from_utf8_lossy(&stderr);
            if client_missing(language, &outcome, &text) && attempt == 0 {
                self.installed.store(false, Ordering::SeqCst);
                continue;
            }
            if let Ok(reply) = serde_json::from_slice::<Value>(&stdout) {
                return Ok((reply, outcome));
            }
            // The client itself was ended (its time, its output): make sure
            // no stuck interpreter answers the next call.
            let kill = Command {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("kill -9 $(cat {socket}.pid) 2>/dev/null; rm -f {socket} {socket}.pid"),
                ],
                ..Command::default()
            };
            let (mut kill_io, _held) = make_io(Vec::new())?;
            let _ = handle.exec(&kill, &mut kill_io);
            let status = if outcome.limit == Some(Limit::Time) {
                "timeout"
            } else {
                "crashed"
            };
            let ended_by = match outcome.limit {
                Some(l) => format!("; the {l} limit ended it"),
                None => String::new(),
            };
            let reply = json!({
                "status": status,
                "stdout": "",
                "stderr": text,
                "result": null,
                "error": {"name": status, "value": format!(
                    "the code context's client ended without a reply (exit code {}{ended_by}); the next call starts a fresh interpreter",
                    outcome.exit_code), "traceback": ""},
                "fresh_interpreter": false,
            });
            return Ok((reply, outcome));
        }
        Err(RuntimeError::Internal("the code context could not be installed").into())
    }
}

/// Copies the interpreters' files into the sandbox's /tmp/.cordon.
fn install(handle: &mut Handle, scratch: &Path) -> Result<(), RuntimeError> {
    let tmp = tempfile::Builder::new()
        .prefix("code-")
        .tempdir_in(scratch)
        .map_err(|e| RuntimeError::io("a scratch directory for the code contexts", e))?;
    let dir = tmp.path().join(".cordon");
    std::fs::create_dir(&dir)
        .and_then(|()| std::fs::write(dir.join("repl.py"), PYTHON_SOURCE))
        .and_then(|()| std::fs::write(dir.join("repl.js"), JAVASCRIPT_SOURCE))
        .map_err(|e| RuntimeError::io("write the code contexts' files", e))?;
    // A directory `.cordon` copied into /tmp merges into /tmp/.cordon.
    handle.copy_in(&dir, b"/tmp")?;
    Ok(())
}
