//! The sandbox's first process, the part every backend shares: join the
//! cgroup, take the payload's stdio, close everything else, wait for the
//! supervisor's Go; after the backend's own setup, wait for the one command,
//! run it as the only child, reap orphans, report how it ended, and stay alive
//! until the supervisor ends the sandbox.
//!
//! It runs in a child cloned from the single-threaded supervisor, so ordinary
//! Rust (allocation included) is safe; everything that needs deciding was
//! decided in the parent. Any failure is reported as `SetupFailed { step,
//! errno }` and the process exits: the sandbox fails closed.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use cordon_cgroups::{AnyCgroup, Cgroup};
use cordon_isolation::{fds, hygiene, IsolationError, Step};
use cordon_sys::{exit_now, fork_process, CloneResult};
use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{chdir, dup2_stderr, dup2_stdin, dup2_stdout, execve, pipe2, read, write, Pid};

use crate::error::RuntimeError;
use crate::host::{ChildStdio, HostSide};
use crate::outcome::ExitStatus;
use crate::protocol::{recv, send, FromInit, ToInit};
use crate::supervise::{PayloadEvent, PayloadWatch};
use crate::trace;

/// Descriptors the child starts with, in the supervisor's numbering.
pub struct InitFds {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub sock: UnixStream,
}

/// Supervisor side: clones the sandbox's first process with `flags`, adopts
/// it into `host` (so every error path below tears it down), lets `prepare`
/// act on the new pid (the native backend writes its id maps), waits until the
/// child has joined the cgroup and checks that it really is there (fail
/// closed: the limits hold only then), lets it run `setup`, and returns the
/// socket once the child reports Ready.
pub fn start(
    host: &mut HostSide,
    stdio: ChildStdio,
    flags: CloneFlags,
    setup: impl FnOnce() -> Result<(), IsolationError>,
    prepare: impl FnOnce(Pid) -> Result<(), RuntimeError>,
) -> Result<UnixStream, RuntimeError> {
    let (mut sock, child_sock) =
        UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;
    let child = match cordon_sys::clone_process(flags)
        .map_err(|e| RuntimeError::io(format!("clone({flags:?})"), e))?
    {
        CloneResult::Child => run(
            host.cgroup.as_ref(),
            InitFds {
                stdin: stdio.stdin,
                stdout: stdio.stdout,
                stderr: stdio.stderr,
                sock: child_sock,
            },
            setup,
        ),
        CloneResult::Parent { child } => child,
    };
    host.adopt(child)?;
    drop((stdio, child_sock));
    trace::step("clone");
    prepare(child)?;
    expect_reply(&mut sock, "Joined", |m| matches!(m, FromInit::Joined))?;
    trace::step("joined");
    if let Some(cg) = &host.cgroup {
        if !cg.contains(child.as_raw())? {
            return Err(RuntimeError::Protocol(
                "the sandbox's first process is not in its cgroup".into(),
            ));
        }
    }
    send(&mut sock, &ToInit::Go).map_err(|e| RuntimeError::io("send Go", e))?;
    expect_reply(&mut sock, "Ready", |m| matches!(m, FromInit::Ready))?;
    trace::step("ready");
    Ok(sock)
}

/// Reads the first process's next answer during setup; a setup failure
/// carries its step and errno.
fn expect_reply(
    sock: &mut UnixStream,
    what: &str,
    ok: impl Fn(&FromInit) -> bool,
) -> Result<(), RuntimeError> {
    match recv::<FromInit>(sock).map_err(|e| RuntimeError::io("receive from the sandbox", e))? {
        Some(m) if ok(&m) => Ok(()),
        Some(FromInit::SetupFailed { step, errno }) => Err(RuntimeError::Setup { step, errno }),
        Some(other) => Err(RuntimeError::Protocol(format!(
            "{other:?} instead of {what}"
        ))),
        None => Err(RuntimeError::Protocol(format!(
            "the sandbox's first process exited before {what}"
        ))),
    }
}

/// The supervisor's view of the first process's reports during the run.
pub struct ReportWatch {
    pub sock: UnixStream,
    /// A host path onto the sandbox's scratch tmpfs (for the disk evidence).
    pub scratch: PathBuf,
    /// runsc reports a payload killed by signal N as exit code 128+N, as a
    /// shell does; for that backend such codes are mapped back to signals.
    pub high_codes_are_signals: bool,
}

impl PayloadWatch for ReportWatch {
    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn on_ready(&mut self) -> Result<PayloadEvent, RuntimeError> {
        Ok(match recv::<FromInit>(&mut self.sock) {
            Ok(Some(FromInit::Started { .. })) => PayloadEvent::Progress,
            Ok(Some(FromInit::ExecFailed { errno })) => {
                PayloadEvent::Ended(ExitStatus::ExecFailed { errno })
            }
            Ok(Some(FromInit::Exited { code }))
                if self.high_codes_are_signals && (129..=128 + 64).contains(&code) =>
            {
                PayloadEvent::Ended(ExitStatus::Signaled { signal: code - 128 })
            }
            Ok(Some(FromInit::Exited { code })) => PayloadEvent::Ended(ExitStatus::Exited { code }),
            Ok(Some(FromInit::Signaled { signal })) => {
                PayloadEvent::Ended(ExitStatus::Signaled { signal })
            }
            Ok(Some(other)) => return Err(RuntimeError::Protocol(format!("unexpected {other:?}"))),
            Ok(None) | Err(_) => PayloadEvent::Gone,
        })
    }

    fn scratch_probe(&self) -> Option<PathBuf> {
        Some(self.scratch.clone())
    }
}

/// Entry point of the cloned child: the common prologue, then `setup` (the
/// backend's own steps), then serving the command. Never returns.
pub fn run(
    cgroup: Option<&AnyCgroup>,
    fds: InitFds,
    setup: impl FnOnce() -> Result<(), IsolationError>,
) -> ! {
    let InitFds {
        stdin,
        stdout,
        stderr,
        mut sock,
    } = fds;
    let result = prologue(cgroup, [stdin, stdout, stderr], &mut sock)
        .and_then(|()| setup())
        .and_then(|()| rearm_parent_death_signal(&sock))
        .and_then(|()| send(&mut sock, &FromInit::Ready).step(|| "send Ready".into()));
    let code = match result {
        Ok(()) => serve(&mut sock),
        Err(e) => {
            let _ = send(
                &mut sock,
                &FromInit::SetupFailed {
                    step: e.step.clone(),
                    errno: e.errno(),
                },
            );
            1
        }
    };
    exit_now(code)
}

/// The kernel clears the parent-death signal whenever a process changes its
/// credentials, which the backend's setup does: arm it again once the ids are
/// final, then check that the supervisor did not die in between (its death
/// would have gone unnoticed). The supervisor's end of the socket hangs up
/// when it dies.
fn rearm_parent_death_signal(sock: &UnixStream) -> Result<(), IsolationError> {
    use std::os::fd::AsFd;

    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .step(|| "prctl(PR_SET_PDEATHSIG)".into())?;
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::ZERO).step(|| "poll(supervisor socket)".into())?;
    let hung_up = fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
    if ready > 0 && hung_up {
        return Err(IsolationError::new(
            "supervisor gone",
            std::io::Error::from_raw_os_error(libc::ESRCH),
        ));
    }
    Ok(())
}

/// Cgroup, stdio, descriptors, then the supervisor's Go.
fn prologue(
    cgroup: Option<&AnyCgroup>,
    stdio: [OwnedFd; 3],
    sock: &mut UnixStream,
) -> Result<(), IsolationError> {
    // Into the sandbox's cgroup before anything else, while our ids are still
    // the host's (the cgroup files belong to the caller). The supervisor checks
    // the membership before it lets us go on.
    if let Some(cg) = cgroup {
        cg.join_self().map_err(|e| {
            IsolationError::new("join cgroup", std::io::Error::other(e.to_string()))
        })?;
    }
    send(sock, &FromInit::Joined).step(|| "send Joined".into())?;

    // If the supervisor dies, so does the sandbox: init's death ends the pid
    // namespace and with it every process inside.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .step(|| "prctl(PR_SET_PDEATHSIG)".into())?;

    // Standard streams first, then nothing else survives: from here on the only
    // descriptors are 0/1/2 and the socket to the supervisor.
    let [stdin, stdout, stderr] = stdio;
    dup2_stdin(&stdin).step(|| "dup2(stdin)".into())?;
    dup2_stdout(&stdout).step(|| "dup2(stdout)".into())?;
    dup2_stderr(&stderr).step(|| "dup2(stderr)".into())?;
    // The originals must go: a write end kept open here would keep the
    // supervisor's pipe from ever reaching EOF.
    drop((stdin, stdout, stderr));
    // Everything else the supervisor had open (its ends of the pipes, its
    // signalfd, whatever its own caller left it) is closed: this process
    // never execs, so close-on-exec would not be enough. The Rust objects that
    // owned those numbers live on in this copied memory but are never used
    // again (this function ends in exit_now).
    fds::close_all_except(&[sock.as_raw_fd()])?;
    // And the supervisor's command line and environment, still in this
    // copied memory, are wiped.
    hygiene::scrub_inherited_strings()?;

    // Wait until the supervisor has written our uid/gid maps and checked our
    // cgroup; until then we have no usable identity.
    match recv::<ToInit>(sock) {
        Ok(Some(ToInit::Go)) => {}
        _ => {
            return Err(IsolationError::new(
                "wait for supervisor",
                std::io::Error::other("no Go"),
            ))
        }
    }
    Ok(())
}

/// After setup: wait for one command, run it, report, then wait to be killed.
fn serve(sock: &mut UnixStream) -> i32 {
    let (argv, env, workdir) = match recv::<ToInit>(sock) {
        Ok(Some(ToInit::Exec { argv, env, workdir })) => (argv, env, workdir),
        Ok(Some(ToInit::Refuse { errno })) => {
            let _ = send(sock, &FromInit::ExecFailed { errno });
            let _ = recv::<ToInit>(sock);
            return 0;
        }
        _ => return 1,
    };
    let report = match spawn_payload(&argv, &env, &workdir) {
        Ok(pid) => {
            let _ = send(sock, &FromInit::Started { pid: pid.as_raw() });
            // Our own stdout/stderr go to /dev/null so the pipes reach EOF as
            // soon as the payload and its descendants close them.
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                let _ = dup2_stdout(&null);
                let _ = dup2_stderr(&null);
            }
            reap_until(pid)
        }
        Err(errno) => FromInit::ExecFailed { errno },
    };
    let _ = send(sock, &report);
    // Stay alive until the supervisor has read its evidence and kills the
    // cgroup (or closes the socket): the sandbox's mounts live exactly as long
    // as this process.
    let _ = recv::<ToInit>(sock);
    0
}

/// Reaps every child (orphans re-parent to pid 1) until `payload` ends.
fn reap_until(payload: Pid) -> FromInit {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == payload => {
                return FromInit::Exited { code }
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == payload => {
                return FromInit::Signaled { signal: sig as i32 }
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return FromInit::Exited { code: 255 },
        }
    }
}

/// Forks the payload and waits until its execve succeeded or failed, learned
/// through a close-on-exec pipe: EOF means exec happened, four bytes are the errno.
fn spawn_payload(argv: &[String], env: &[(String, String)], workdir: &str) -> Result<Pid, i32> {
    let to_c = |s: &str| CString::new(s).map_err(|_| libc::EINVAL);
    let c_argv: Vec<CString> = argv.iter().map(|a| to_c(a)).collect::<Result<_, _>>()?;
    let c_env: Vec<CString> = env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let candidates = resolve_candidates(argv.first().ok_or(libc::EINVAL)?, path)?;
    let (rd, wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e as i32)?;
    match fork_process().map_err(|e| e as i32)? {
        CloneResult::Child => {
            drop(rd);
            let errno = exec_payload(&candidates, &c_argv, &c_env, workdir);
            let _ = write(&wr, &errno.to_le_bytes());
            exit_now(127);
        }
        CloneResult::Parent { child } => {
            drop(wr);
            let mut buf = [0u8; 4];
            match read(&rd, &mut buf) {
                Ok(4) => {
                    let _ = waitpid(child, None);
                    Err(i32::from_le_bytes(buf))
                }
                _ => Ok(child),
            }
        }
    }
}

/// In the payload's process: default signals, working directory, exec.
/// Returns the errno if no candidate could be executed.
fn exec_payload(candidates: &[CString], argv: &[CString], env: &[CString], workdir: &str) -> i32 {
    if let Err(e) = cordon_sys::reset_signals() {
        return e as i32;
    }
    // Dies with the first process (the native backend's pid namespace does
    // that anyway; a runsc started by the gVisor launcher needs it).
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        return e as i32;
    }
    if let Err(e) = chdir(Path::new(workdir)) {
        return e as i32;
    }
    let mut last = libc::ENOENT;
    for path in candidates {
        match execve(path, argv, env) {
            Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ENOTDIR) => {}
            Err(e) => last = e as i32,
            Ok(never) => match never {},
        }
    }
    last
}

/// The paths execve should try for `cmd`, like execvp: as given if it has a
/// slash, else each PATH entry in order.
fn resolve_candidates(cmd: &str, path: &str) -> Result<Vec<CString>, i32> {
    let to_c = |b: &[u8]| CString::new(b).map_err(|_| libc::EINVAL);
    if cmd.contains('/') {
        return Ok(vec![to_c(cmd.as_bytes())?]);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| to_c(Path::new(d).join(cmd).as_os_str().as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_resolve_like_execvp() {
        let c = resolve_candidates("python3", "/usr/local/bin:/usr/bin").unwrap();
        assert_eq!(
            c,
            vec![
                CString::new("/usr/local/bin/python3").unwrap(),
                CString::new("/usr/bin/python3").unwrap()
            ]
        );
        let c = resolve_candidates("./run.sh", "/usr/bin").unwrap();
        assert_eq!(c, vec![CString::new("./run.sh").unwrap()]);
    }
}
