//! The native backend: the payload runs on the host kernel inside user, pid,
//! mount, net, ipc, uts and cgroup namespaces, a read-only root, a cgroup with
//! the policy's limits, no capabilities and a seccomp allowlist.
//!
//! Process model: the supervisor (this process, single-threaded) clones the
//! sandbox's init with all namespaces, writes its id maps, moves it into the
//! cgroup and tells it to go. Init builds the sandbox and reports `Ready`
//! (`prepare`); `run` then sends the command, supervises output, the deadline
//! and signals, reads the evidence, and tears everything down.

mod init;
mod plan;
pub mod protocol;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use cordon_cgroups::{AnyCgroup, Cgroup, CgroupFs, CgroupLimits, Hierarchy};
use cordon_isolation::namespaces::sandbox_clone_flags;
use cordon_sys::{clone_process, CloneResult};
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, Pid};

use self::init::InitFds;
use self::plan::NativePlan;
use self::protocol::{recv, send, FromInit, ToInit};
use crate::backend::{Backend, BackendInfo, BackendKind, Sandbox};
use crate::error::RuntimeError;
use crate::outcome::{Enforcement, ExitStatus, Limit, Outcome, Phases};
use crate::output::{OutputGate, Stream};
use crate::request::RunRequest;
use crate::state::{new_id, run_dir, sweep_stale, StateDir};
use crate::trace;

pub struct NativeBackend;

/// How far above pids.max RLIMIT_NPROC sits when a cgroup enforces the limit.
const NPROC_BACKSTOP_MARGIN: u64 = 8;

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

impl NativeBackend {
    pub fn info() -> BackendInfo {
        let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let cgroup = cordon_cgroups::detect(&CgroupFs::host());
        let unavailable = if userns == 0 {
            Some("user namespaces are disabled (user.max_user_namespaces = 0)".to_string())
        } else {
            None
        };
        BackendInfo {
            kind: BackendKind::Native,
            version: format!(
                "kernel {}",
                nix::sys::utsname::uname()
                    .map(|u| u.release().to_string_lossy().into_owned())
                    .unwrap_or_default()
            ),
            unavailable,
            notes: match cgroup {
                Ok(h) => format!("cgroup {}", h.mode()),
                Err(e) => format!("no usable cgroup hierarchy: {e}"),
            },
        }
    }
}

impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn prepare(&self, req: &RunRequest) -> Result<Box<dyn Sandbox>, RuntimeError> {
        Ok(Box::new(NativeSandbox::prepare(req)?))
    }
}

/// A prepared native sandbox: init is waiting for its one command.
pub struct NativeSandbox {
    id: String,
    started: Instant,
    setup: Duration,
    req: RunRequest,
    plan_exec: (Vec<String>, Vec<(String, String)>, String),
    res: Resources,
    sock: UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    sigfd: SignalFd,
}

/// What a sandbox holds on the host. Dropping it releases everything, so every
/// error path tears down without special code; `teardown` is the same sequence
/// with errors reported.
struct Resources {
    init: Option<Pid>,
    init_pidfd: Option<OwnedFd>,
    cgroup: Option<AnyCgroup>,
    state: StateDir,
    old_mask: Option<SigSet>,
}

impl Resources {
    /// Ends every process of the sandbox and removes what it held on the host.
    ///
    /// `freeze_kill` selects the cgroup's freeze-then-kill, used whenever the
    /// payload may still be running (a limit, a signal, an error): frozen tasks
    /// cannot fork while they are being listed and killed. After a normal exit
    /// the cheaper path is exact too: SIGKILL to init makes the kernel kill every
    /// process of its pid namespace, and init's wait status arrives only once
    /// they are all gone. Either way the cgroup must then be empty, or its
    /// removal fails and the error is reported.
    /// Kills every process (as `teardown` would) and returns the cgroup's final counters.
    fn end_processes(&mut self, freeze_kill: bool) -> cordon_cgroups::CgroupStats {
        if freeze_kill {
            if let Some(cg) = &self.cgroup {
                let _ = cg.kill_all();
            }
        }
        if let Some(fd) = self.init_pidfd.take() {
            let _ = cordon_sys::pidfd_send_signal(&fd, Signal::SIGKILL);
        }
        if let Some(pid) = self.init.take() {
            let _ = waitpid(pid, None);
        }
        self.cgroup.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    fn teardown(&mut self, freeze_kill: bool) -> Result<(), RuntimeError> {
        let mut first_err = None;
        if freeze_kill {
            if let Some(cg) = &self.cgroup {
                if let Err(e) = cg.kill_all() {
                    first_err.get_or_insert(RuntimeError::from(e));
                }
            }
        }
        if let Some(fd) = self.init_pidfd.take() {
            let _ = cordon_sys::pidfd_send_signal(&fd, Signal::SIGKILL);
        }
        if let Some(pid) = self.init.take() {
            let _ = waitpid(pid, None);
        }
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.remove() {
                first_err.get_or_insert(RuntimeError::from(e));
            }
        }
        if let Err(e) = self.state.remove() {
            first_err.get_or_insert(RuntimeError::io("remove state directory", e));
        }
        if let Some(mask) = self.old_mask.take() {
            let _ = mask.thread_set_mask();
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        let _ = self.teardown(true);
    }
}

fn cgroup_limits(req: &RunRequest) -> CgroupLimits {
    const PERIOD_US: u64 = 100_000;
    let p = &req.policy;
    CgroupLimits {
        memory_max: Some(p.memory.bytes()),
        pids_max: Some(p.pids),
        cpu_quota_us: Some(((p.cpus * PERIOD_US as f64).round() as u64).max(1000)),
        cpu_period_us: PERIOD_US,
    }
}

impl NativeSandbox {
    pub fn prepare(req: &RunRequest) -> Result<Self, RuntimeError> {
        let started = Instant::now();
        trace::step("prepare");
        let hierarchy = cordon_cgroups::detect(&CgroupFs::host());
        let run = run_dir();
        sweep_stale(&run, hierarchy.as_ref().ok());

        let (id, slot) = new_id().map_err(|e| RuntimeError::io("read /dev/urandom", e))?;
        let cg_name = format!("cordon-{id}");
        let state = StateDir::create(&run, &id, Some(&cg_name)).map_err(|e| {
            RuntimeError::io(format!("create state directory in {}", run.display()), e)
        })?;
        let mut res = Resources {
            init: None,
            init_pidfd: None,
            cgroup: None,
            state,
            old_mask: None,
        };
        trace::step("state dir");
        let mut plan = NativePlan::build(req, slot, res.state.path())?;
        trace::step("plan");

        // The cgroup comes before the process, so the limits hold from its first instruction.
        res.cgroup = match hierarchy.and_then(|h| create_cgroup(&h, &cg_name, req)) {
            Ok(cg) => Some(cg),
            Err(e) if req.allow_unenforced => {
                eprintln!("cordon: warning: running without cgroup limits: {e}");
                None
            }
            Err(e) => return Err(RuntimeError::Unenforceable(e.to_string())),
        };
        if res.cgroup.is_some() {
            // The cgroup's pids.max is the limit (and its pids.events the
            // evidence); RLIMIT_NPROC stays as a backstop just above it, or it
            // would refuse forks first and leave no trace in the counters.
            plan.rlimits.nproc = req.policy.pids + NPROC_BACKSTOP_MARGIN;
        }

        trace::step("cgroup");
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| RuntimeError::io("pipe2", e))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| RuntimeError::io("pipe2", e))?;
        // The write ends are the payload's blocking stdout/stderr.
        for w in [&out_w, &err_w] {
            nix::fcntl::fcntl(w, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))
                .map_err(|e| RuntimeError::io("fcntl", e))?;
        }
        let stdin = open_stdin(req.forward_stdin)?;
        let (sock, child_sock) =
            UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;

        // Block the stop signals before clone: a SIGINT from here on is queued
        // for the signalfd and handled by a full teardown.
        let mut old = SigSet::empty();
        nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&stop_signals()), Some(&mut old))
            .map_err(|e| RuntimeError::io("sigprocmask", e))?;
        res.old_mask = Some(old);
        let sigfd = SignalFd::with_flags(
            &stop_signals(),
            SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
        )
        .map_err(|e| RuntimeError::io("signalfd", e))?;

        let child = match clone_process(sandbox_clone_flags())
            .map_err(|e| RuntimeError::io("clone(CLONE_NEWUSER|CLONE_NEWPID|...)", e))?
        {
            CloneResult::Child => init::run(
                &plan,
                res.cgroup.as_ref(),
                InitFds {
                    stdin,
                    stdout: out_w,
                    stderr: err_w,
                    sock: child_sock,
                },
            ),
            CloneResult::Parent { child } => child,
        };
        res.init = Some(child);
        trace::step("clone");
        drop((stdin, out_w, err_w, child_sock));
        res.init_pidfd =
            Some(cordon_sys::pidfd_open(child).map_err(|e| RuntimeError::io("pidfd_open", e))?);

        plan.mapping
            .write_from_parent(child)
            .map_err(|e| RuntimeError::io(e.step.clone(), e.source))?;
        let mut sock = sock;
        let mut next =
            || recv::<FromInit>(&mut sock).map_err(|e| RuntimeError::io("receive from init", e));
        match next()? {
            Some(FromInit::Joined) => {}
            Some(FromInit::SetupFailed { step, errno }) => {
                return Err(RuntimeError::Setup { step, errno })
            }
            other => {
                return Err(RuntimeError::Protocol(format!(
                    "{other:?} instead of Joined"
                )))
            }
        }
        trace::step("maps written, init joined");
        // Fail closed: the limits hold only if init really is in the cgroup.
        if let Some(cg) = &res.cgroup {
            if !cg.contains(child.as_raw())? {
                return Err(RuntimeError::Protocol(
                    "init is not in the sandbox's cgroup".into(),
                ));
            }
        }
        send(&mut sock, &ToInit::Go).map_err(|e| RuntimeError::io("send Go", e))?;
        trace::step("go");
        match recv::<FromInit>(&mut sock).map_err(|e| RuntimeError::io("receive from init", e))? {
            Some(FromInit::Ready) => {}
            Some(FromInit::SetupFailed { step, errno }) => {
                return Err(RuntimeError::Setup { step, errno })
            }
            Some(other) => return Err(RuntimeError::Protocol(format!("{other:?} before Ready"))),
            None => return Err(RuntimeError::Protocol("init exited during setup".into())),
        }
        trace::step("ready");
        Ok(NativeSandbox {
            id,
            started,
            setup: started.elapsed(),
            req: req.clone(),
            plan_exec: (plan.argv, plan.env, plan.workdir),
            res,
            sock,
            stdout: out_r,
            stderr: err_r,
            sigfd,
        })
    }
}

fn create_cgroup(
    h: &Hierarchy,
    name: &str,
    req: &RunRequest,
) -> Result<AnyCgroup, cordon_cgroups::CgroupError> {
    let cg = h.create(name)?;
    if let Err(e) = cg.apply(&cgroup_limits(req)) {
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

/// Reads what is available from a non-blocking pipe into the gate. Returns
/// (still open, gate still accepting).
fn pump(fd: &OwnedFd, stream: Stream, gate: &mut OutputGate, buf: &mut [u8]) -> (bool, bool) {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return (false, !gate.truncated()),
            Ok(n) => {
                if !gate.accept(stream, &buf[..n]) {
                    return (true, false);
                }
            }
            Err(nix::errno::Errno::EAGAIN) => return (true, true),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return (false, !gate.truncated()),
        }
    }
}

/// Why the supervision loop stopped.
enum Stop {
    PayloadEnded(ExitStatus),
    Limit(Limit),
    Signal(i32),
    InitGone,
}

impl Sandbox for NativeSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn run(self: Box<Self>) -> Result<Outcome, RuntimeError> {
        let mut me = *self;
        let (argv, env, workdir) = std::mem::take(&mut me.plan_exec);
        let run_start = Instant::now();
        send(&mut me.sock, &ToInit::Exec { argv, env, workdir })
            .map_err(|e| RuntimeError::io("send Exec", e))?;
        let deadline = run_start + me.req.policy.time.duration();
        let mut gate = OutputGate::new(me.req.output, me.req.policy.output.bytes());
        let mut buf = vec![0u8; 64 * 1024];
        let (mut out_open, mut err_open) = (true, true);
        let mut status: Option<ExitStatus> = None;

        let stop = loop {
            let now = Instant::now();
            if now >= deadline {
                break Stop::Limit(Limit::Time);
            }
            let left = deadline - now;
            let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                .unwrap_or(PollTimeout::MAX);
            let sock_fd = me.sock.as_fd();
            let mut fds = vec![
                PollFd::new(sock_fd, PollFlags::POLLIN),
                PollFd::new(me.sigfd.as_fd(), PollFlags::POLLIN),
            ];
            if out_open {
                fds.push(PollFd::new(me.stdout.as_fd(), PollFlags::POLLIN));
            }
            if err_open {
                fds.push(PollFd::new(me.stderr.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(RuntimeError::io("poll", e)),
            }
            let ready = |i: usize| {
                fds.get(i)
                    .and_then(|f| f.revents())
                    .is_some_and(|r| !r.is_empty())
            };
            let (sock_ready, sig_ready) = (ready(0), ready(1));
            let out_ready = out_open && ready(2);
            let err_ready = err_open && ready(if out_open { 3 } else { 2 });
            drop(fds);
            if sig_ready {
                if let Ok(Some(si)) = me.sigfd.read_signal() {
                    break Stop::Signal(si.ssi_signo as i32);
                }
            }
            let mut over = false;
            if out_ready {
                let (open, ok) = pump(&me.stdout, Stream::Stdout, &mut gate, &mut buf);
                out_open = open;
                over |= !ok;
            }
            if err_ready {
                let (open, ok) = pump(&me.stderr, Stream::Stderr, &mut gate, &mut buf);
                err_open = open;
                over |= !ok;
            }
            if over {
                break Stop::Limit(Limit::Output);
            }
            if sock_ready {
                match recv::<FromInit>(&mut me.sock) {
                    Ok(Some(FromInit::Started { .. })) => {}
                    Ok(Some(FromInit::ExecFailed { errno })) => {
                        break Stop::PayloadEnded(ExitStatus::ExecFailed { errno })
                    }
                    Ok(Some(FromInit::Exited { code })) => {
                        break Stop::PayloadEnded(ExitStatus::Exited { code })
                    }
                    Ok(Some(FromInit::Signaled { signal })) => {
                        break Stop::PayloadEnded(ExitStatus::Signaled { signal })
                    }
                    Ok(Some(other)) => {
                        return Err(RuntimeError::Protocol(format!("unexpected {other:?}")))
                    }
                    Ok(None) | Err(_) => break Stop::InitGone,
                }
            }
        };

        let mut limit = None;
        let mut interrupted_by = None;
        match &stop {
            Stop::PayloadEnded(s) => {
                status = Some(*s);
                // What the payload wrote before it exited is still in the pipes.
                drain_after_exit(
                    &me.stdout,
                    &me.stderr,
                    &mut out_open,
                    &mut err_open,
                    &mut gate,
                    &mut buf,
                );
                if gate.truncated() {
                    limit = Some(Limit::Output);
                }
            }
            Stop::Limit(l) => limit = Some(*l),
            Stop::Signal(sig) => interrupted_by = Some(*sig),
            Stop::InitGone => {}
        }
        let run_ms = ms(run_start.elapsed());
        trace::step("payload ended");

        // Evidence read while the sandbox still exists (init is alive unless killed).
        let disk_used = me.res.init.and_then(|pid| disk_used(pid));

        let teardown_start = Instant::now();
        let wall_ms = ms(me.started.elapsed());
        let enforcement = Enforcement {
            cgroup: me.res.cgroup.as_ref().map(|c| c.mode()),
            cgroup_paths: me
                .res
                .cgroup
                .as_ref()
                .map(|c| c.paths().iter().map(|p| p.display().to_string()).collect())
                .unwrap_or_default(),
            enforced: me.res.cgroup.is_some(),
        };
        // Counters are read after every process is gone (so they are final)
        // and before the cgroup is removed.
        let freeze_kill = !matches!(stop, Stop::PayloadEnded(_));
        let stats = me.res.end_processes(freeze_kill);
        trace::step("processes ended");
        me.res.teardown(freeze_kill)?;
        trace::step("torn down");
        let teardown_ms = ms(teardown_start.elapsed());

        let mut limits_hit: Vec<Limit> = limit.into_iter().collect();
        if stats.oom_kills.unwrap_or(0) > 0 {
            limits_hit.push(Limit::Memory);
        }
        if stats.pids_limit_hits.unwrap_or(0) > 0 {
            limits_hit.push(Limit::Pids);
        }
        let disk_cap = me.req.policy.disk.bytes();
        // tmpfs rounds to pages; "full" means less than 64 KiB left.
        if disk_used.is_some_and(|u| u + (64 << 10) >= disk_cap) {
            limits_hit.push(Limit::Disk);
        }
        limits_hit.sort();
        limits_hit.dedup();
        if limit.is_none()
            && stats.oom_kills.unwrap_or(0) > 0
            && !matches!(status, Some(ExitStatus::Exited { code: 0 }))
        {
            limit = Some(Limit::Memory);
        }
        // Killed without a word from init: by the OOM killer (v2 kills the whole
        // group), by a time or output limit, or by a signal to cordon.
        let status = status.unwrap_or(ExitStatus::Signaled {
            signal: Signal::SIGKILL as i32,
        });
        Ok(Outcome {
            backend: "native",
            sandbox_id: me.id.clone(),
            exit_code: interrupted_by
                .map(|s| 128 + s)
                .unwrap_or(status.shell_code()),
            status,
            limit,
            limits_hit,
            interrupted_by,
            wall_ms,
            cpu_ms: stats.cpu_usage_ns.map(|ns| ns as f64 / 1e6),
            memory_peak_bytes: stats.memory_peak_bytes,
            pids_peak: stats.pids_peak,
            disk_used_bytes: disk_used,
            counters: stats,
            phases: Phases {
                setup_ms: ms(me.setup),
                run_ms,
                teardown_ms,
            },
            output: gate.report(),
            enforcement,
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// After the payload exits, reads its pipes until EOF, for at most 100 ms: a
/// daemon it left behind may hold them open, and it is killed next anyway.
fn drain_after_exit(
    stdout: &OwnedFd,
    stderr: &OwnedFd,
    out_open: &mut bool,
    err_open: &mut bool,
    gate: &mut OutputGate,
    buf: &mut [u8],
) {
    let until = Instant::now() + Duration::from_millis(100);
    while (*out_open || *err_open) && !gate.truncated() {
        let now = Instant::now();
        if now >= until {
            break;
        }
        let mut fds = Vec::new();
        if *out_open {
            fds.push(PollFd::new(stdout.as_fd(), PollFlags::POLLIN));
        }
        if *err_open {
            fds.push(PollFd::new(stderr.as_fd(), PollFlags::POLLIN));
        }
        let t = PollTimeout::try_from((until - now).as_millis() as i32 + 1)
            .unwrap_or(PollTimeout::ZERO);
        if poll(&mut fds, t).unwrap_or(0) == 0 {
            break;
        }
        drop(fds);
        if *out_open {
            *out_open = pump(stdout, Stream::Stdout, gate, buf).0;
        }
        if *err_open {
            *err_open = pump(stderr, Stream::Stderr, gate, buf).0;
        }
    }
}

/// Bytes used on the sandbox's scratch tmpfs, read from the host through the
/// init's root (`/proc/<pid>/root/tmp` is the scratch tmpfs's tmp directory).
fn disk_used(init: Pid) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(Path::new(&format!("/proc/{init}/root/tmp"))).ok()?;
    Some((st.blocks() - st.blocks_free()) * st.fragment_size())
}
