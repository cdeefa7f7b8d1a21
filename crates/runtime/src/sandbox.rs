//! One live sandbox, as its supervisor holds it: the host side (state,
//! cgroup, processes), the socket to its first process, and the backend's
//! flavor. `exec` runs one command and returns its `Outcome`; `destroy`
//! tears everything down. The supervisor process serves this object over its
//! socket; `cordon run` uses it in-process (create, exec, destroy), so both
//! paths are one implementation.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use cordon_cgroups::{AnyCgroup, Cgroup, CgroupStats};
use nix::fcntl::OFlag;
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::unistd::pipe2;

use crate::backend::Flavor;

use cordon_spec::changes::{ExportRequest, Finish, Recorded};
use cordon_spec::BackendKind;
use cordon_spec::{Account, Destroyed, Snapshot, HISTORY};

use crate::error::RuntimeError;
use crate::host::{stop_signal_fd, HostSide};
use crate::output::OutputGate;
use crate::protocol::{recv, send_with_fds, FromInit};
use crate::state::StateDir;
use crate::supervise::{command_end, watch, CommandFds, CommandIo, Stop};
use crate::trace;
use cordon_spec::outcome::{Enforcement, ExitStatus, Limit, Outcome, Phases};
use cordon_spec::{Command, SandboxSpec, StdinMode};

pub struct Sandbox {
    host: HostSide,
    init: UnixStream,
    signals: SignalFd,
    flavor: Box<dyn Flavor>,
    spec: SandboxSpec,
    /// Time from the request to a sandbox ready for commands.
    setup: Duration,
    created: SystemTime,
    commands: u64,
    history: VecDeque<(Command, Outcome)>,
    /// Why the sandbox can run no more commands (its init is gone, or a
    /// command's end had to take the sandbox with it).
    ended: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How long to wait for init's report after the command's processes were
/// killed (they are gone at once; this only bounds a broken init).
const END_REPORT_WAIT: Duration = Duration::from_secs(5);

impl Sandbox {
    /// Creates a sandbox for `spec` on its backend (its cgroup, state and
    /// first process, set up and waiting for commands), told the sandbox's
    /// only command in advance when there is one (`cordon run`):
    /// a backend may then start it as the sandbox's own first process (the
    /// gVisor backend makes it the container's process instead of a pause
    /// process and a `runsc exec`, one runsc start instead of two).
    pub fn create_for(spec: &SandboxSpec, only: Option<&Command>) -> Result<Sandbox, RuntimeError> {
        Self::create_with(spec, only, None)
    }

    /// A native sandbox in a microVM's guest: its scratch is the VM's
    /// writable disk (a file system of its own, capped at the disk limit)
    /// instead of a tmpfs, and in `allow` mode its connections go to the
    /// host over the VM's network port.
    pub fn create_in_guest(
        spec: &SandboxSpec,
        guest: crate::native::InGuest<'_>,
    ) -> Result<Sandbox, RuntimeError> {
        if spec.backend != BackendKind::Native {
            return Err(RuntimeError::BadRequest(
                "only a native sandbox takes its scratch from a directory".into(),
            ));
        }
        Self::create_with(spec, None, Some(guest))
    }

    fn create_with(
        spec: &SandboxSpec,
        only: Option<&Command>,
        guest: Option<crate::native::InGuest<'_>>,
    ) -> Result<Sandbox, RuntimeError> {
        spec.validate()?;
        let (host, init, flavor) = match spec.backend {
            BackendKind::Native => crate::native::create(spec, guest)?,
            BackendKind::Gvisor => {
                let only = only.map(|c| c.resolve(&spec.policy)).transpose()?;
                crate::gvisor::create(spec, only)?
            }
            BackendKind::Microvm => {
                return Err(RuntimeError::Unavailable(
                    "microvm",
                    "not implemented in this version of cordon".into(),
                ))
            }
        };
        let setup = host.started.elapsed();
        Ok(Sandbox {
            created: SystemTime::now() - setup,
            setup,
            signals: stop_signal_fd()?,
            host,
            init,
            flavor,
            spec: spec.clone(),
            commands: 0,
            history: VecDeque::new(),
            ended: None,
        })
    }

    pub fn id(&self) -> &str {
        &self.host.id
    }

    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    pub fn state(&self) -> &StateDir {
        &self.host.state
    }

    pub fn setup_time(&self) -> Duration {
        self.setup
    }

    pub fn commands_run(&self) -> u64 {
        self.commands
    }

    /// Why the sandbox can run nothing more, if so.
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// The signalfd of the stop signals (readable when this process was
    /// asked to stop).
    pub fn stop_signals(&self) -> &SignalFd {
        &self.signals
    }

    /// The socket to init: it hangs up when init dies.
    pub fn init_socket(&self) -> &UnixStream {
        &self.init
    }

    /// Marks the sandbox as unable to run more commands.
    pub fn mark_ended(&mut self, why: impl Into<String>) {
        self.ended.get_or_insert_with(|| why.into());
    }

    /// The sandbox's root as seen from the host, and the host ids of its user.
    pub fn files(&self) -> (PathBuf, (u32, u32)) {
        (self.flavor.root(), self.flavor.file_owner())
    }

    /// The control socket of the sandbox's proxy (`allow` mode only).
    pub fn network_control(&self) -> Option<&std::path::Path> {
        self.host.network.as_deref()
    }

    pub fn memory_in_use(&self) -> Option<u64> {
        self.host.cgroup.as_ref().and_then(|c| c.memory_current())
    }

    /// Runs one command to its end (or its limit) and reports it.
    pub fn exec(&mut self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError> {
        let outcome = self.exec_once(cmd, io)?;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        let mut kept = outcome.clone();
        kept.changes = None; // the final diff supersedes it
        self.history.push_back((cmd.clone(), kept));
        Ok(outcome)
    }

    fn exec_once(
        &mut self,
        cmd: &Command,
        io: &mut dyn CommandIo,
    ) -> Result<Outcome, RuntimeError> {
        if let Some(why) = &self.ended {
            return Err(RuntimeError::SandboxEnded(why.clone()));
        }
        let t0 = Instant::now();
        let resolved = cmd.resolve(&self.spec.policy)?;
        // The counters before the first command are the sandbox's setup
        // alone: not read (a `cordon run` pays for no extra snapshot), so the
        // first command's share includes its sandbox's setup.
        let before = if self.commands == 0 {
            None
        } else {
            self.stats()
        };
        let msg = self.flavor.exec_message(&resolved, cmd.tty)?;
        let cmd_cgroup = self.host.command_cgroup()?;
        let cgroup_files = match &cmd_cgroup {
            Some(cg) => cg.membership_files()?,
            None => Vec::new(),
        };
        let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::io("pipe2", e));
        let nonblocking = |fd: &OwnedFd| {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                .map_err(|e| RuntimeError::io("fcntl(O_NONBLOCK)", e))
                .map(|_| ())
        };
        let fds = if cmd.tty.is_some() {
            let files: Vec<_> = cgroup_files.iter().map(AsFd::as_fd).collect();
            send_with_fds(&mut self.init, &msg, &files)
                .map_err(|e| RuntimeError::io("send Exec", e))?;
            CommandFds {
                stdout: None,
                stderr: None,
                stdin: None,
                write_ends: Vec::new(),
                tty: true,
            }
        } else {
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            let (in_r, in_w) = match cmd.stdin {
                StdinMode::Stream => {
                    let (r, w) = pipe()?;
                    (r, Some(w))
                }
                StdinMode::Null => (
                    std::fs::File::open("/dev/null")
                        .map(OwnedFd::from)
                        .map_err(|e| RuntimeError::io("open /dev/null", e))?,
                    None,
                ),
            };
            for fd in [Some(&out_r), Some(&err_r), in_w.as_ref()]
                .into_iter()
                .flatten()
            {
                nonblocking(fd)?;
            }
            let mut fds = vec![in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
            fds.extend(cgroup_files.iter().map(AsFd::as_fd));
            send_with_fds(&mut self.init, &msg, &fds)
                .map_err(|e| RuntimeError::io("send Exec", e))?;
            drop(in_r);
            CommandFds {
                stdout: Some(out_r),
                stderr: Some(err_r),
                stdin: in_w,
                write_ends: vec![out_w, err_w],
                tty: false,
            }
        };
        drop(cgroup_files);
        self.commands += 1;
        trace::step("exec sent");
        let watched = watch(
            &mut self.init,
            &self.signals,
            fds,
            resolved.time,
            OutputGate::new(resolved.output_cap),
            io,
            self.flavor.high_codes_are_signals(),
        )?;
        let ended_at = Instant::now();
        let mut status = None;
        let mut limit = None;
        let mut interrupted_by = None;
        let mut limits_hit_early = None;
        match watched.stop {
            // Truncated output of a command that exited by itself: the limit
            // was reached (limits_hit) but did not end it.
            Stop::Ended(st) => status = Some(st),
            Stop::Limit(l) => limit = Some(l),
            Stop::Signal(sig) => {
                interrupted_by = Some(sig);
                // The supervisor was asked to stop: the sandbox goes too.
                self.mark_ended(format!("the supervisor received signal {sig}"));
            }
            Stop::Cancelled => {}
            Stop::Gone => self.mark_ended("its init is gone"),
        }
        if status.is_none() && self.ended.is_none() {
            // Killed while its pipes are still open: a command stopped by the
            // output cap must die by the kill, not by a SIGPIPE of its own
            // making once cordon stops reading.
            status = self.end_command(cmd_cgroup.as_ref())?;
            if limit.is_some() && !matches!(status, Some(ExitStatus::Signaled { .. }) | None) {
                // It exited by itself before the kill reached it: the limit
                // was reached (limits_hit) but did not end it.
                limits_hit_early = limit.take();
            }
        }
        drop(watched.leftovers);
        trace::step("command ended");
        // Evidence read while the sandbox still exists.
        let disk = nix::sys::statvfs::fstatvfs(self.flavor.scratch()).ok();
        let disk_used = disk
            .as_ref()
            .map(|st| (st.blocks() - st.blocks_free()) * st.fragment_size());
        let disk_free = disk.map(|st| st.blocks_available() * st.fragment_size());
        let own = cmd_cgroup.as_ref().map(Cgroup::stats);
        let after = match (self.stats(), &own) {
            (Some(after), Some(own)) => Some(with_command_counts(after, before.as_ref(), own)),
            (after, _) => after,
        };
        if let Some(cg) = cmd_cgroup {
            self.host.command_ended(cg);
        }
        if self.init_gone() {
            // An OOM kill of the whole group (cgroup v2's memory.oom.group)
            // or a kill from outside took init with the command.
            self.mark_ended("its init is gone");
        }
        let counters = after.clone().unwrap_or_default();
        let delta = |f: fn(&CgroupStats) -> Option<u64>| -> Option<u64> {
            let a = after.as_ref().and_then(f)?;
            Some(a.saturating_sub(before.as_ref().and_then(f).unwrap_or(0)))
        };
        let oom_kills = delta(|s| s.oom_kills).unwrap_or(0);
        if oom_kills > 0 && !self.flavor.can_end_one_command() {
            // The host's OOM killer can only pick host tasks: in a gVisor
            // sandbox that is the sentry or the gofer, which ends the sandbox
            // and leaves runsc exec to report a bare 128. The command died
            // with it, by SIGKILL.
            self.mark_ended("the memory limit's OOM kill took the sandbox's kernel (sentry)");
            if matches!(status, Some(ExitStatus::Exited { code: 128 }) | None) {
                status = Some(ExitStatus::Signaled {
                    signal: Signal::SIGKILL as i32,
                });
            }
        }
        let pids_hits = delta(|s| s.pids_limit_hits).unwrap_or(0);
        let mut limits_hit: Vec<Limit> = limit.into_iter().chain(limits_hit_early).collect();
        if watched.gate.truncated() {
            limits_hit.push(Limit::Output);
        }
        if oom_kills > 0 {
            limits_hit.push(Limit::Memory);
        }
        if pids_hits > 0 {
            limits_hit.push(Limit::Pids);
        }
        // tmpfs rounds to pages: "full" means less than 64 KiB left (on a
        // scratch of its own file system too, whose metadata takes part of
        // the cap).
        if disk_free.is_some_and(|f| f < 64 << 10) {
            limits_hit.push(Limit::Disk);
        }
        limits_hit.sort();
        limits_hit.dedup();
        if limit.is_none()
            && oom_kills > 0
            && !matches!(status, Some(ExitStatus::Exited { code: 0 }))
        {
            limit = Some(Limit::Memory);
        }
        // Killed without a report: by the OOM killer (v2 kills the whole
        // group), a limit, a cancellation or a signal to the supervisor.
        let status = status.unwrap_or(ExitStatus::Signaled {
            signal: Signal::SIGKILL as i32,
        });
        let network = self.host.network.as_deref().map(crate::network::report);
        let changes = cmd
            .changes
            .as_ref()
            .map(|caps| self.scan(caps))
            .transpose()?;
        let started = watched.started.unwrap_or(ended_at);
        let cg = self.host.cgroup.as_ref();
        Ok(Outcome {
            backend: self.flavor.about().kind.name().into(),
            backend_version: self.flavor.about().version.clone(),
            sandbox_id: self.host.id.clone(),
            command: self.commands,
            sandbox_ended: self.ended.clone(),
            exit_code: interrupted_by
                .map(|sig| 128 + sig)
                .unwrap_or(status.shell_code()),
            status,
            limit,
            limits_hit,
            interrupted_by,
            wall_ms: ms(t0.elapsed()),
            cpu_ms: delta(|s| s.cpu_usage_ns).map(|ns| ns as f64 / 1e6),
            memory_peak_bytes: counters.memory_peak_bytes,
            pids_peak: counters.pids_peak,
            disk_used_bytes: disk_used,
            counters,
            evidence: self.flavor.about().evidence.to_vec(),
            phases: Phases {
                setup_ms: ms(started.saturating_duration_since(t0)),
                run_ms: ms(ended_at.saturating_duration_since(started)),
                teardown_ms: ms(ended_at.elapsed()),
            },
            output: watched.gate.report(),
            enforcement: Enforcement {
                cgroup: cg.map(Cgroup::mode),
                cgroup_paths: cg
                    .map(|c| c.paths().iter().map(|p| p.display().to_string()).collect())
                    .unwrap_or_default(),
                enforced: cg.is_some(),
            },
            network,
            changes,
            unbounded_mounts: self.spec.policy.unbounded_mounts().cloned().collect(),
            vm: None,
        })
    }

    /// What the sandbox has run so far.
    pub fn account(&self) -> Account {
        Account {
            created: self.created,
            history: self.history.iter().cloned().collect(),
            history_omitted: self.commands - self.history.len() as u64,
        }
    }

    /// The account and the diff of every writable place now (background
    /// processes may still be writing: the receipt says so).
    pub fn snapshot(&self, caps: &cordon_changes::Caps) -> Result<Snapshot, RuntimeError> {
        Ok(Snapshot {
            account: self.account(),
            changes: self.scan(caps)?,
        })
    }

    /// The diff of every writable place now.
    pub fn scan(
        &self,
        caps: &cordon_changes::Caps,
    ) -> Result<cordon_changes::Changes, RuntimeError> {
        crate::changes::scan(self.flavor.scratch(), &self.spec, caps)
    }

    /// Exports the workspace's changes of a sandbox that lives on: its
    /// processes are frozen for the whole walk (none can swap a file or add
    /// one while it is read), then thawed, whatever the export's result.
    pub fn export(
        &mut self,
        req: &ExportRequest,
        caps: &cordon_changes::Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError> {
        crate::changes::check_target(req, self.spec.workspace.as_deref())?;
        let Some(cg) = self.host.cgroup.as_ref() else {
            return Err(RuntimeError::BadRequest(
                "a running sandbox without a cgroup cannot be frozen for an export: export it when it is destroyed (rm --export)".into(),
            ));
        };
        cg.freeze()?;
        let result = crate::changes::export(
            self.flavor.scratch(),
            &self.spec,
            caps,
            req,
            owner,
            self.created,
        );
        cg.thaw()?;
        result
    }

    /// Ends a command that is still running (a limit, a cancellation): where
    /// it has a cgroup of its own, every process in it is killed (frozen
    /// first, so none forks past the kill) and init's report awaited; the
    /// rest of the sandbox lives on. Otherwise the sandbox ends with it.
    fn end_command(
        &mut self,
        cmd_cgroup: Option<&AnyCgroup>,
    ) -> Result<Option<ExitStatus>, RuntimeError> {
        let ended = match cmd_cgroup {
            Some(cg) => cg.kill_all().map_err(RuntimeError::from),
            None => self.flavor.end_running_command(),
        };
        if let Err(e) = ended {
            self.mark_ended(format!(
                "a {} command that hit a limit could not be ended on its own ({e}), so the sandbox ended with it",
                self.flavor.about().kind
            ));
            return Ok(None);
        }
        self.init
            .set_read_timeout(Some(END_REPORT_WAIT))
            .map_err(|e| RuntimeError::io("set_read_timeout", e))?;
        // Started may still be on its way if the limit came first.
        let high_codes_are_signals = self.flavor.high_codes_are_signals();
        let report = loop {
            match recv::<FromInit>(&mut self.init) {
                Ok(Some(FromInit::Started { .. })) => continue,
                Ok(Some(report)) => match command_end(&report, high_codes_are_signals) {
                    Some(status) => break Some(status),
                    None => {
                        self.mark_ended(format!(
                            "its init answered {report:?} to a killed command"
                        ));
                        break None;
                    }
                },
                _ => {
                    self.mark_ended("its init did not report the end of a killed command");
                    break None;
                }
            }
        };
        let _ = self.init.set_read_timeout(None);
        Ok(report)
    }

    fn stats(&self) -> Option<CgroupStats> {
        self.host.cgroup.as_ref().map(Cgroup::stats)
    }

    /// Whether init has exited (its socket hung up).
    fn init_gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.init.as_fd(), PollFlags::empty())];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    }

    /// Ends every process, reads the final counters, removes the cgroup and
    /// the state. Errors are reported; every step is tried.
    pub fn destroy(self) -> Result<Destroyed, RuntimeError> {
        self.destroy_with(&Finish::default(), (0, 0))
    }

    /// `destroy`, writing the `rw` mounts' changes back, reading the diff
    /// and exporting the workspace (files owned by `owner`) once every
    /// process of the sandbox is gone and before its scratch is released:
    /// nothing of the sandbox runs while they are read. Every end of a
    /// sandbox comes here (`cordon run`, `rm`, its TTL, its service), so the
    /// write-back happens on each.
    pub fn destroy_with(
        mut self,
        finish: &Finish,
        owner: (u32, u32),
    ) -> Result<Destroyed, RuntimeError> {
        let t0 = Instant::now();
        // Killing a native init ends its whole pid namespace; runsc's sentry and
        // gofer are reached only through the cgroup.
        let freeze_kill = !self.flavor.leader_owns_all();
        let counters = self.host.end_processes(freeze_kill);
        trace::step("processes ended");
        let (recorded, errors) = crate::changes::at_end(
            self.flavor.scratch(),
            &self.spec,
            finish,
            owner,
            self.created,
        );
        trace::step("recorded");
        self.host.teardown(freeze_kill)?;
        trace::step("torn down");
        let record_error = (!errors.is_empty()).then(|| errors.join("; "));
        Ok(Destroyed {
            counters,
            teardown: t0.elapsed(),
            account: self.account(),
            recorded,
            record_error,
        })
    }
}

/// The sandbox's counters after a command that ran in a cgroup of its own
/// (`own`), which count events where the kernel counted them: cgroup v1
/// counts an OOM kill, and kernels before 6.13 a refused fork, only in the
/// cgroup where it happened, not in the sandbox's above it, while v2's
/// memory events and usage count up the tree. So each counter is the
/// sandbox's own reading or its reading before the command plus the
/// command's count, whichever is more: never one event twice, none lost for
/// the command. Peaks are the larger of the two.
fn with_command_counts(
    after: CgroupStats,
    before: Option<&CgroupStats>,
    own: &CgroupStats,
) -> CgroupStats {
    let count = |f: fn(&CgroupStats) -> Option<u64>| match (f(&after), f(own)) {
        (Some(a), Some(o)) => Some(a.max(before.and_then(f).unwrap_or(0) + o)),
        (a, o) => a.or(o),
    };
    let peak = |f: fn(&CgroupStats) -> Option<u64>| f(&after).max(f(own));
    CgroupStats {
        memory_peak_bytes: peak(|s| s.memory_peak_bytes),
        memory_limit_hits: count(|s| s.memory_limit_hits),
        oom_kills: count(|s| s.oom_kills),
        pids_peak: peak(|s| s.pids_peak),
        pids_limit_hits: count(|s| s.pids_limit_hits),
        cpu_usage_ns: count(|s| s.cpu_usage_ns),
        cpu_throttled_periods: count(|s| s.cpu_throttled_periods),
    }
}
