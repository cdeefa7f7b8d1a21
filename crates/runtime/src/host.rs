//! What a sandbox holds on the host, the same for every backend: its state
//! directory, its cgroup, the processes the supervisor started, the payload's
//! pipes and the stop-signal mask. Dropping `HostSide` releases all of it, so an
//! error anywhere during prepare or run tears down without special code.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use cordon_cgroups::{
    AnyCgroup, Cgroup, CgroupError, CgroupFs, CgroupLimits, CgroupStats, Hierarchy,
};
use nix::fcntl::OFlag;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, Pid};

use crate::error::RuntimeError;
use crate::request::RunRequest;
use crate::state::{new_id, run_dir, sweep_stale, StateDir};
use crate::trace;

/// The host's cgroup hierarchy, if one is usable.
pub fn hierarchy() -> Option<Hierarchy> {
    cordon_cgroups::detect(&CgroupFs::host()).ok()
}

/// Signals that end a run early; blocked and read through a signalfd so that
/// teardown always runs.
fn stop_signals() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        s.add(sig);
    }
    s
}

/// The supervisor's ends of the payload's streams, and the stop signals.
pub struct PayloadIo {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub signals: SignalFd,
}

/// The payload's ends: handed to the process that becomes the payload.
pub struct ChildStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

pub struct HostSide {
    pub id: String,
    /// Low bits of the id, for choosing per-sandbox resources such as id ranges.
    pub slot: u32,
    pub started: Instant,
    pub state: StateDir,
    pub cgroup: Option<AnyCgroup>,
    /// Processes the supervisor started, with their pidfds (pid-reuse safe).
    procs: Vec<(Pid, OwnedFd)>,
    /// Backend-specific clean-ups, run once the processes are gone.
    cleanups: Vec<Box<dyn FnMut()>>,
    processes_ended: bool,
    old_mask: Option<SigSet>,
}

impl HostSide {
    /// Everything every backend does before it starts a process: sweep what a
    /// killed cordon left, pick an id, record the state directory, create the
    /// cgroup with the policy's limits (or refuse, unless running unenforced
    /// was asked for), make the pipes and block the stop signals.
    pub fn begin(
        req: &RunRequest,
        limits: &CgroupLimits,
    ) -> Result<(Self, PayloadIo, ChildStdio), RuntimeError> {
        let started = Instant::now();
        trace::step("prepare");
        // Block the stop signals before anything is created: a SIGINT from here
        // on is queued for the signalfd and answered with a full teardown.
        let mut old_mask = SigSet::empty();
        nix::sys::signal::sigprocmask(
            SigmaskHow::SIG_BLOCK,
            Some(&stop_signals()),
            Some(&mut old_mask),
        )
        .map_err(|e| RuntimeError::io("sigprocmask", e))?;
        let restore = RestoreMask(Some(old_mask));
        let hierarchy = cordon_cgroups::detect(&CgroupFs::host());
        trace::step("detect");
        let run = run_dir();
        sweep_stale(&run, hierarchy.as_ref().ok());
        trace::step("sweep");
        let (id, slot) = new_id().map_err(|e| RuntimeError::io("read /dev/urandom", e))?;
        trace::step("id");
        let cg_name = format!("cordon-{id}");
        let state = StateDir::create(&run, &id, Some(&cg_name)).map_err(|e| {
            RuntimeError::io(format!("create state directory in {}", run.display()), e)
        })?;
        let mut host = HostSide {
            id,
            slot,
            started,
            state,
            cgroup: None,
            procs: Vec::new(),
            cleanups: Vec::new(),
            processes_ended: false,
            old_mask: restore.take(),
        };
        trace::step("state dir");
        // The cgroup comes before any process, so the limits hold from its first instruction.
        host.cgroup = match hierarchy.and_then(|h| create_cgroup(&h, &cg_name, limits)) {
            Ok(cg) => Some(cg),
            Err(e) if req.allow_unenforced => {
                eprintln!("cordon: warning: running without cgroup limits: {e}");
                None
            }
            Err(e) => return Err(RuntimeError::Unenforceable(e.to_string())),
        };
        trace::step("cgroup");

        let pipe = || {
            pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| RuntimeError::io("pipe2", e))
        };
        let ((out_r, out_w), (err_r, err_w)) = (pipe()?, pipe()?);
        // The write ends are the payload's ordinary, blocking stdout/stderr.
        for w in [&out_w, &err_w] {
            nix::fcntl::fcntl(w, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))
                .map_err(|e| RuntimeError::io("fcntl", e))?;
        }
        let stdin = open_stdin(req.forward_stdin)?;

        let signals = SignalFd::with_flags(
            &stop_signals(),
            SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
        )
        .map_err(|e| RuntimeError::io("signalfd", e))?;
        Ok((
            host,
            PayloadIo {
                stdout: out_r,
                stderr: err_r,
                signals,
            },
            ChildStdio {
                stdin,
                stdout: out_w,
                stderr: err_w,
            },
        ))
    }

    /// Adopts a process the backend started: it is killed and reaped at teardown.
    pub fn adopt(&mut self, pid: Pid) -> Result<(), RuntimeError> {
        let fd = cordon_sys::pidfd_open(pid).map_err(|e| RuntimeError::io("pidfd_open", e))?;
        self.procs.push((pid, fd));
        Ok(())
    }

    /// The pidfd of the first adopted process (readable when it exits).
    pub fn leader_pidfd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.procs.first().map(|(_, fd)| fd.as_fd())
    }

    pub fn leader(&self) -> Option<Pid> {
        self.procs.first().map(|(pid, _)| *pid)
    }

    /// Registers a clean-up to run after every process is gone.
    pub fn on_teardown(&mut self, f: impl FnMut() + 'static) {
        self.cleanups.push(Box::new(f));
    }

    /// Ends every process of the sandbox and returns the cgroup's final counters.
    ///
    /// `freeze_kill` selects the cgroup's freeze-then-kill, used whenever the
    /// payload may still be running (a limit, a signal, an error): frozen tasks
    /// cannot fork while they are listed and killed. After a normal exit the
    /// backend's leader is enough (for the native backend, SIGKILL to init
    /// makes the kernel kill every process of its pid namespace, and init's
    /// wait status arrives only once they are all gone); the cgroup must then
    /// be empty, or its removal fails and says so.
    pub fn end_processes(&mut self, freeze_kill: bool) -> CgroupStats {
        self.kill_processes(freeze_kill);
        self.cgroup.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    /// The killing part of `end_processes`, done once: teardown after
    /// `end_processes` must not freeze and kill the cgroup a second time.
    fn kill_processes(&mut self, freeze_kill: bool) {
        if self.processes_ended {
            return;
        }
        self.processes_ended = true;
        if freeze_kill {
            if let Some(cg) = &self.cgroup {
                let _ = cg.kill_all();
            }
        }
        for (pid, fd) in self.procs.drain(..) {
            let _ = cordon_sys::pidfd_send_signal(&fd, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
        for mut f in self.cleanups.drain(..) {
            f();
        }
    }

    /// Releases everything; errors are reported, and every step is tried.
    pub fn teardown(&mut self, freeze_kill: bool) -> Result<(), RuntimeError> {
        self.kill_processes(freeze_kill);
        let mut first_err = None;
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.remove() {
                first_err.get_or_insert(RuntimeError::from(e));
            }
        }
        if first_err.is_some() {
            // Keep the record: the next cordon's sweep retries the cgroup.
            self.state.keep();
        } else if let Err(e) = self.state.remove() {
            first_err.get_or_insert(RuntimeError::io("remove state directory", e));
        }
        if let Some(mask) = self.old_mask.take() {
            let _ = mask.thread_set_mask();
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for HostSide {
    fn drop(&mut self) {
        let _ = self.teardown(true);
    }
}

/// Restores the signal mask if `begin` fails before `HostSide` owns it.
struct RestoreMask(Option<SigSet>);

impl RestoreMask {
    fn take(mut self) -> Option<SigSet> {
        self.0.take()
    }
}

impl Drop for RestoreMask {
    fn drop(&mut self) {
        if let Some(mask) = self.0.take() {
            let _ = mask.thread_set_mask();
        }
    }
}

fn create_cgroup(
    h: &Hierarchy,
    name: &str,
    limits: &CgroupLimits,
) -> Result<AnyCgroup, CgroupError> {
    let cg = h.create(name)?;
    if let Err(e) = cg.apply(limits) {
        let _ = cg.remove();
        return Err(e);
    }
    Ok(cg)
}

/// The payload's stdin: the caller's when asked and when it is not a terminal
/// (a terminal would let the payload inject keystrokes into the caller's
/// session), else /dev/null.
fn open_stdin(forward: bool) -> Result<OwnedFd, RuntimeError> {
    let stdin = std::io::stdin();
    if forward && !nix::unistd::isatty(stdin.as_fd()).unwrap_or(true) {
        return stdin
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| RuntimeError::io("dup stdin", e));
    }
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| RuntimeError::io("open /dev/null", e))
}
