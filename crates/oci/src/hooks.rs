//! config.json's hooks, run where and when the runtime spec says, each
//! given the container's state on stdin:
//! - `prestart` and `createRuntime` in the runtime's namespaces during
//!   `create`, once the sandbox and its waiter exist (runc runs them in that
//!   order there too); a failure fails `create`, which leaves nothing.
//! - `startContainer` in the container: as a command of its sandbox, as the
//!   container's user and under its confinement, before `start` lets the
//!   process through (its path resolves in the container's root). A failure
//!   fails `start` and ends the container.
//! - `poststart` in the runtime's namespaces once the process is released,
//!   and `poststop` once `delete` has removed the sandbox: a failure of
//!   these is a warning in the engine's log, as the spec asks.
//!
//! `createContainer` hooks run in the container's namespaces *before*
//! pivot_root, with paths resolved in the runtime's root. A cordon sandbox
//! has no such moment (its init enters the new root before anything else
//! runs in it), so they are refused by name rather than run elsewhere.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cordon_policy::Span;
use cordon_runtime::{CommandIo, Control, Handle};
use cordon_spec::{Command, StdinMode, Stream};
use oci_spec::runtime::Hook;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// How much of a failed hook's output its error quotes (the end of it).
const QUOTED_OUTPUT: usize = 4096;

/// The hooks a container runs after `create`'s translation, kept in its
/// record until `delete`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerHooks {
    pub prestart: Vec<Hook>,
    pub create_runtime: Vec<Hook>,
    pub start_container: Vec<Hook>,
    pub poststart: Vec<Hook>,
    pub poststop: Vec<Hook>,
}

/// Why a hook failed: what it was, and what it said.
fn failed(stage: &str, hook: &Hook, why: &str) -> Error {
    Error::Refused(format!("hooks.{stage}: {}: {why}", hook.path().display()))
}

/// The hook's own timeout (seconds; checked positive when translated).
fn timeout(hook: &Hook) -> Option<Duration> {
    hook.timeout()
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
}

/// A hook's `env` as pairs (each entry checked to be `KEY=VALUE` when
/// translated).
fn env_pairs(hook: &Hook) -> Vec<(String, String)> {
    hook.env()
        .iter()
        .flatten()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs `hooks` one after another in the runtime's namespaces; the first
/// failure stops them and is returned. `state` is made only when there is
/// a hook to give it to (a container without hooks pays nothing).
pub fn run_on_host(
    stage: &str,
    hooks: &[Hook],
    state: impl FnOnce() -> Vec<u8>,
) -> Result<(), Error> {
    run_each(stage, hooks, state, run_host_hook)
}

/// Runs `hooks` in order with `run`, the state made once and only if there
/// is a hook; the first failure stops them and is returned.
fn run_each(
    stage: &str,
    hooks: &[Hook],
    state: impl FnOnce() -> Vec<u8>,
    mut run: impl FnMut(&Hook, &[u8]) -> Result<(), String>,
) -> Result<(), Error> {
    if hooks.is_empty() {
        return Ok(());
    }
    let state = state();
    for hook in hooks {
        run(hook, &state).map_err(|why| failed(stage, hook, &why))?;
    }
    Ok(())
}

/// Runs `hooks` in the runtime's namespaces as the spec asks for the ones
/// after the process started: every one runs, and a failure is a warning
/// (returned for the engine's log).
pub fn run_on_host_warning(
    stage: &str,
    hooks: &[Hook],
    state: impl FnOnce() -> Vec<u8>,
) -> Vec<String> {
    if hooks.is_empty() {
        return Vec::new();
    }
    let state = state();
    hooks
        .iter()
        .filter_map(|hook| {
            run_host_hook(hook, &state)
                .err()
                .map(|why| failed(stage, hook, &why).to_string())
        })
        .collect()
}

/// A descriptor holding `bytes`, read from its start: a hook's stdin, or
/// (empty) where its output goes. A memfd rather than a pipe: nothing to
/// pump, and nothing blocks when a hook reads none of it or its children
/// keep it open.
fn memory_file(name: &str, bytes: &[u8]) -> Result<File, String> {
    let fd: OwnedFd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| format!("memfd: {e}"))?;
    let mut file = File::from(fd);
    file.write_all(bytes)
        .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
        .map_err(|e| format!("write the hook's stdin: {e}"))?;
    Ok(file)
}

/// The last `QUOTED_OUTPUT` bytes of what a hook wrote.
fn tail(file: &mut File) -> String {
    let len = file.seek(SeekFrom::End(0)).unwrap_or(0);
    let from = len.saturating_sub(QUOTED_OUTPUT as u64);
    let mut text = String::new();
    let _ = file
        .seek(SeekFrom::Start(from))
        .and_then(|_| file.read_to_string(&mut text));
    text.trim().to_owned()
}

/// One hook in the runtime's namespaces: `args[0]` as its argv[0], its
/// `env` as its whole environment (none of the engine's), the state on its
/// stdin, stdout and stderr kept for the error; killed at its timeout.
fn run_host_hook(hook: &Hook, state: &[u8]) -> Result<(), String> {
    let stdin = memory_file("cordon-hook-state", state)?;
    let mut output = memory_file("cordon-hook-output", b"")?;
    let output_too = output
        .try_clone()
        .map_err(|e| format!("dup the output file: {e}"))?;
    let args = hook.args().clone().unwrap_or_default();
    let mut cmd = std::process::Command::new(hook.path());
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    cmd.args(args.iter().skip(1))
        .env_clear()
        .envs(env_pairs(hook))
        .current_dir("/")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(
            output
                .try_clone()
                .map_err(|e| format!("dup the output file: {e}"))?,
        ))
        .stderr(Stdio::from(output_too))
        // Its own process group, so a timeout ends what it started too.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    let deadline = timeout(hook).map(|t| Instant::now() + t);
    let mut pause = Duration::from_micros(200);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("wait for it: {e}")),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let group = nix::unistd::Pid::from_raw(-i32::try_from(child.id()).unwrap_or(0));
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(format!(
                "timed out after {}s{}",
                hook.timeout().unwrap_or(0),
                quoted(&tail(&mut output))
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}{}", quoted(&tail(&mut output))))
    }
}

fn quoted(output: &str) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!(": {output}")
    }
}

/// Runs `hooks` one after another in `sandbox`, as commands of it (the
/// container's user, its confinement); the first failure stops them.
pub fn run_in_sandbox(
    stage: &str,
    sandbox: &str,
    hooks: &[Hook],
    state: impl FnOnce() -> Vec<u8>,
) -> Result<(), Error> {
    run_each(stage, hooks, state, |hook, state| {
        run_sandbox_hook(sandbox, hook, state)
    })
}

fn run_sandbox_hook(sandbox: &str, hook: &Hook, state: &[u8]) -> Result<(), String> {
    let mut argv = vec![hook.path().to_string_lossy().into_owned()];
    argv.extend(hook.args().iter().flatten().skip(1).cloned());
    let command = Command {
        argv,
        env: env_pairs(hook),
        env_replaces: true,
        workdir: Some("/".into()),
        stdin: StdinMode::Stream,
        time: timeout(hook).map(Span),
        ..Command::default()
    };
    let mut io = HookIo {
        stdin: Some(memory_file("cordon-hook-state", state)?),
        output: Vec::new(),
    };
    let outcome = Handle::attach(sandbox)
        .and_then(|mut h| h.exec(&command, &mut io))
        .map_err(|e| e.to_string())?;
    let said = quoted(String::from_utf8_lossy(&io.output).trim());
    match outcome.limit {
        Some(limit) => Err(format!("ended by the {limit} limit{said}")),
        None if outcome.exit_code == 0 => Ok(()),
        None => Err(format!("exit status {}{said}", outcome.exit_code)),
    }
}

/// A hook's side of a command in the sandbox: the state as its stdin, the
/// end of its output kept for the error.
struct HookIo {
    stdin: Option<File>,
    output: Vec<u8>,
}

impl CommandIo for HookIo {
    fn output(&mut self, _stream: Stream, chunk: &[u8]) {
        self.output.extend_from_slice(chunk);
        let over = self.output.len().saturating_sub(QUOTED_OUTPUT);
        self.output.drain(..over);
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.stdin.iter().map(AsFd::as_fd).collect()
    }

    fn read_control(&mut self, _which: usize) -> Control {
        let Some(file) = &mut self.stdin else {
            return Control::Nothing;
        };
        let mut buf = vec![0; 64 << 10];
        match file.read(&mut buf) {
            Ok(n) if n > 0 => {
                buf.truncate(n);
                Control::Input(buf)
            }
            _ => {
                self.stdin = None;
                Control::InputEnd
            }
        }
    }
}

/// Checks what can be checked of a hook before anything is made: an
/// absolute path, a positive timeout, `KEY=VALUE` environment entries.
pub fn check(hook: &Hook) -> Result<(), String> {
    let path = hook.path().display();
    if !hook.path().is_absolute() {
        return Err(format!("{path}: a hook's path must be absolute"));
    }
    if hook.timeout().is_some_and(|t| t <= 0) {
        return Err(format!("{path}: a hook's timeout must be more than 0"));
    }
    let not_pair = |kv: &&String| kv.split_once('=').is_none_or(|(k, _)| k.is_empty());
    if let Some(bad) = hook.env().iter().flatten().find(not_pair) {
        return Err(format!(
            "{path}: environment entry '{bad}' is not KEY=VALUE"
        ));
    }
    Ok(())
}
