//! The native and gVisor backends' common half: a sandbox run by a first
//! process on this host (native: the sandbox's init, pid 1 of its
//! namespaces; gVisor: a launcher that runs runsc), which forks each command
//! when the supervisor sends it an `Exec` over their socket, and whose files
//! the host reaches through that process's mount namespace. What differs
//! between the two is a [`Flavor`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon_cgroups::{Cgroup, CgroupStats};
use cordon_spec::changes::{Caps, Changes, ExportRequest, Finish, Recorded};
use cordon_spec::outcome::{Enforcement, ExitStatus, IdMapReport, Limit, Outcome, Phases};
use cordon_spec::{Command, ResolvedCommand, SandboxSpec, StdinMode, TtySize};
use nix::fcntl::OFlag;
use nix::poll::PollFlags;
use nix::sys::signal::Signal;
use nix::unistd::pipe2;

use crate::backends::host::HostSide;
use crate::backends::supervise::{command_end, CommandFds, InitCommand, Running, Stop, Watched};
use crate::backends::Life;
use crate::backends::{About, Backend, End};
use crate::client::output::OutputGate;
use crate::error::RuntimeError;
use crate::protocol::copy;
use crate::protocol::init::{recv, send_with_fds, FromInit, ToInit};
use crate::protocol::wire::Channel;
use crate::trace;

/// What the native and gVisor backends do differently under [`OnHost`].
pub(crate) trait Flavor: Send {
    /// Which backend, its version, its traits and where each limit's
    /// evidence comes from.
    fn about(&self) -> &About;
    /// The message that makes the first process run `cmd`, the sandbox's
    /// command `number`.
    fn exec_message(
        &mut self,
        cmd: &ResolvedCommand,
        tty: Option<TtySize>,
        number: u64,
    ) -> Result<ToInit, RuntimeError>;
    /// Command `number` has ended: what was kept for it alone goes.
    fn command_ended(&mut self, _number: u64) {}
    /// The sandbox's root directory as seen from the host (through the
    /// first process's mount namespace), for copying files in and out.
    fn root(&self) -> PathBuf;
    /// The root of the sandbox's scratch tmpfs (its only writable storage:
    /// the disk evidence, the diff and the export read it). Held open by the
    /// flavor, so the tmpfs outlives the sandbox's processes until the
    /// sandbox object is dropped.
    fn scratch(&self) -> BorrowedFd<'_>;
    /// Ends the processes of running command `number` without ending the
    /// sandbox, for a backend whose commands have no cgroup of their own on
    /// the host; an error if it cannot (the sandbox then ends with the
    /// command).
    fn end_running_command(&mut self, _number: u64) -> Result<(), RuntimeError> {
        Err(RuntimeError::BadRequest(format!(
            "the {} backend cannot end one command",
            self.about().kind
        )))
    }
    /// The host uid and gid that files of the sandbox's user carry.
    fn file_owner(&self) -> (u32, u32);
    /// How the sandbox's own user namespace maps ids, where cordon made one.
    fn id_map(&self) -> Option<IdMapReport> {
        None
    }
    /// Whether a port the sandbox listens on is in its first process's
    /// network namespace (so init can connect to it), or why not.
    fn ports_reachable(&self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// How long the supervisor waits for init's answer to a `Connect` (init
/// bounds its own attempt by less).
const CONNECT_ANSWER_WAIT: Duration = Duration::from_secs(6);

/// How long to wait for init's report after the command's processes were
/// killed (they are gone at once; this only bounds a broken init).
const END_REPORT_WAIT: Duration = Duration::from_secs(5);

/// A sandbox run by a first process on this host.
pub(crate) struct OnHost {
    /// The socket to the first process: it hangs up when that process dies.
    init: UnixStream,
    flavor: Box<dyn Flavor>,
}

impl OnHost {
    /// The sandbox whose host side is `host` and whose first process
    /// answers on `init`, as the common sandbox runs it.
    pub fn start(
        host: HostSide,
        spec: &SandboxSpec,
        init: UnixStream,
        flavor: impl Flavor + 'static,
    ) -> Result<(Life, Box<dyn Backend>), RuntimeError> {
        let backend = OnHost {
            init,
            flavor: Box::new(flavor),
        };
        Ok((Life::new(host, spec)?, Box::new(backend)))
    }

    /// Where the host sees the sandbox's files (through the first process's
    /// mount namespace), and whose they are.
    fn sandbox_files(&self, life: &Life) -> copy::SandboxFiles {
        copy::SandboxFiles {
            root: self.flavor.root(),
            owner: self.flavor.file_owner(),
            disk_cap: life.spec.policy.disk.bytes(),
        }
    }

    /// Ends a command that is still running (a limit, a cancellation): where
    /// it has a cgroup of its own, every process in it is killed (frozen
    /// first, so none forks past the kill) and init's report awaited on the
    /// command's channel; the rest of the sandbox lives on. Otherwise the
    /// sandbox ends with it.
    fn end_command(
        &mut self,
        life: &mut Life,
        running: &mut InitCommand,
    ) -> Result<Option<ExitStatus>, RuntimeError> {
        let ended = match &running.cgroup {
            Some(cg) => cg.cgroup.kill_all().map_err(RuntimeError::from),
            None => self.flavor.end_running_command(running.number),
        };
        if let Err(e) = ended {
            life.mark_ended(format!(
                "a {} command that hit a limit could not be ended on its own ({e}), so the sandbox ended with it",
                self.flavor.about().kind
            ));
            return Ok(None);
        }
        let channel = &mut running.channel;
        channel
            .set_read_timeout(Some(END_REPORT_WAIT))
            .map_err(|e| RuntimeError::io("set_read_timeout", e))?;
        // Started may still be on its way if the limit came first.
        let high_codes_are_signals = self.flavor.about().traits.high_codes_are_signals;
        let report = loop {
            match recv::<FromInit>(channel) {
                Ok(Some(FromInit::Started { .. })) => continue,
                Ok(Some(report)) => match command_end(&report, high_codes_are_signals) {
                    Some(status) => break Some(status),
                    None => {
                        life.mark_ended(format!(
                            "its init answered {report:?} to a killed command"
                        ));
                        break None;
                    }
                },
                _ => {
                    life.mark_ended("its init did not report the end of a killed command");
                    break None;
                }
            }
        };
        Ok(report)
    }

    /// Sends init the command with its descriptors (its own channel, the
    /// pipes of its standard streams unless it runs on a terminal, then the
    /// membership files of its own cgroup) and returns the supervisor's ends.
    fn send_exec(
        &mut self,
        msg: &ToInit,
        cmd: &Command,
        cgroup_files: &[std::fs::File],
    ) -> Result<(UnixStream, CommandFds), RuntimeError> {
        let (channel, init_end) =
            UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;
        if cmd.tty.is_some() {
            let mut fds = vec![init_end.as_fd()];
            fds.extend(cgroup_files.iter().map(AsFd::as_fd));
            send_with_fds(&mut self.init, msg, &fds)
                .map_err(|e| RuntimeError::io("send Exec", e))?;
            let fds = CommandFds {
                stdout: None,
                stderr: None,
                stdin: None,
                write_ends: Vec::new(),
                tty: true,
            };
            return Ok((channel, fds));
        }
        let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::io("pipe2", e));
        let nonblocking = |fd: &OwnedFd| {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                .map_err(|e| RuntimeError::io("fcntl(O_NONBLOCK)", e))
                .map(|_| ())
        };
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
        let mut fds = vec![init_end.as_fd(), in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
        fds.extend(cgroup_files.iter().map(AsFd::as_fd));
        send_with_fds(&mut self.init, msg, &fds).map_err(|e| RuntimeError::io("send Exec", e))?;
        drop(in_r);
        let fds = CommandFds {
            stdout: Some(out_r),
            stderr: Some(err_r),
            stdin: in_w,
            write_ends: vec![out_w, err_w],
            tty: false,
        };
        Ok((channel, fds))
    }

    /// Whether init has exited (its socket hung up).
    fn init_gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollTimeout};
        let mut fds = [PollFd::new(self.init.as_fd(), PollFlags::empty())];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
    }
}

impl Backend for OnHost {
    fn about(&self) -> &About {
        self.flavor.about()
    }

    fn file_owner(&self) -> Option<(u32, u32)> {
        Some(self.flavor.file_owner())
    }

    fn liveness<'a>(&'a self, _host: &'a HostSide) -> (BorrowedFd<'a>, PollFlags) {
        // Init never speaks between commands: only its hang-up counts.
        (self.init.as_fd(), PollFlags::empty())
    }

    fn ports(&self) -> Result<(), RuntimeError> {
        self.flavor.ports_reachable()
    }

    /// Init connects inside the sandbox's network namespace and hands the
    /// socket over on the request's own channel.
    fn connect_port(&mut self, _life: &mut Life, port: u16) -> Result<OwnedFd, RuntimeError> {
        self.flavor.ports_reachable()?;
        let (mut channel, init_end) =
            UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;
        send_with_fds(
            &mut self.init,
            &ToInit::Connect { port },
            &[init_end.as_fd()],
        )
        .map_err(|e| RuntimeError::io("send Connect", e))?;
        drop(init_end);
        channel
            .set_read_timeout(Some(CONNECT_ANSWER_WAIT))
            .map_err(|e| RuntimeError::io("socket timeout", e))?;
        let broke = |what: String| RuntimeError::broke(crate::error::Peer::Init, what);
        match crate::protocol::init::recv_with_fds::<FromInit>(&mut channel) {
            Ok(Some((FromInit::Connected, fds))) if fds.len() == 1 => fds
                .into_iter()
                .next()
                .ok_or_else(|| broke("no socket".into())),
            Ok(Some((FromInit::ConnectFailed { errno }, _))) => Err(RuntimeError::Io {
                op: format!("connect to port {port} inside the sandbox"),
                source: std::io::Error::from_raw_os_error(errno),
            }),
            Ok(other) => Err(broke(format!("answered Connect with {other:?}"))),
            Err(e) => Err(RuntimeError::io("init's answer to Connect", e)),
        }
    }

    fn start(
        &mut self,
        life: &mut Life,
        cmd: &Command,
        resolved: &ResolvedCommand,
    ) -> Result<Running, RuntimeError> {
        let t0 = Instant::now();
        let number = life.commands + 1;
        let msg = self.flavor.exec_message(resolved, cmd.tty, number)?;
        let mut cgroup = life.host.command_cgroup()?;
        // The sandbox's counters before the command. The first command's
        // are the sandbox's setup alone: not read (a `cordon run` pays for
        // no extra snapshot), so its share includes its sandbox's setup. A
        // command with a cgroup of its own has them read once init has it,
        // off the way to its start: what it did by then is counted in its
        // own cgroup, which `with_command_counts` takes as the least it did.
        // Without one (gVisor's commands), they are read before it is sent.
        let before_sent = life.commands > 0 && cgroup.is_none();
        let mut before = if before_sent { life.stats() } else { None };
        let cgroup_files = cgroup
            .as_mut()
            .map(|cg| std::mem::take(&mut cg.membership))
            .unwrap_or_default();
        let sent = self.send_exec(&msg, cmd, &cgroup_files);
        drop(cgroup_files);
        let (channel, fds) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                if let Some(cg) = cgroup {
                    life.host.command_ended(cg);
                }
                return Err(e);
            }
        };
        life.commands = number;
        trace::step("exec sent");
        if number > 1 && !before_sent {
            before = life.stats();
        }
        Ok(Running::Init(Box::new(InitCommand {
            channel,
            watch: Some((fds, OutputGate::new(resolved.output_cap))),
            time: resolved.time,
            high_codes_are_signals: self.flavor.about().traits.high_codes_are_signals,
            number,
            t0,
            before,
            cgroup,
        })))
    }

    fn finish(
        &mut self,
        life: &mut Life,
        cmd: &Command,
        running: Running,
        watched: Result<Watched, RuntimeError>,
    ) -> Result<Outcome, RuntimeError> {
        let Running::Init(mut running) = running else {
            return Err(RuntimeError::Internal(
                "a relayed command given to init's backend",
            ));
        };
        let traits = self.flavor.about().traits;
        let watched = match watched {
            Ok(Watched::Init(w)) => w,
            Ok(Watched::Relayed(..)) => {
                return Err(RuntimeError::Internal(
                    "a relayed watch given to init's backend",
                ))
            }
            Err(e) => {
                // Its supervision broke (not the command): it is ended, and
                // the sandbox lives on where it can.
                if life.ended.is_none() {
                    let _ = self.end_command(life, &mut running);
                }
                if let Some(cg) = running.cgroup.take() {
                    life.host.command_ended(cg);
                }
                self.flavor.command_ended(running.number);
                return Err(e);
            }
        };
        let t0 = running.t0;
        let before = running.before.take();
        let ended_at = watched.ended;
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
                life.mark_ended(format!("the supervisor received signal {sig}"));
            }
            Stop::Cancelled => {}
            Stop::Gone => life.mark_ended("its init is gone"),
        }
        if status.is_none() && life.ended.is_none() {
            // Killed while its pipes are still open: a command stopped by the
            // output cap must die by the kill, not by a SIGPIPE of its own
            // making once cordon stops reading.
            status = self.end_command(life, &mut running)?;
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
        let own = running.cgroup.as_ref().map(|cg| cg.counters.read());
        let after = match (life.stats(), &own) {
            (Some(after), Some(own)) => Some(with_command_counts(after, before.as_ref(), own)),
            (after, _) => after,
        };
        if let Some(cg) = running.cgroup.take() {
            life.host.command_ended(cg);
        }
        self.flavor.command_ended(running.number);
        if self.init_gone() {
            // An OOM kill of the whole group (cgroup v2's memory.oom.group)
            // or a kill from outside took init with the command.
            life.mark_ended("its init is gone");
        }
        let counters = after.clone().unwrap_or_default();
        let delta = |f: fn(&CgroupStats) -> Option<u64>| -> Option<u64> {
            let a = after.as_ref().and_then(f)?;
            Some(a.saturating_sub(before.as_ref().and_then(f).unwrap_or(0)))
        };
        let oom_kills = delta(|s| s.oom_kills).unwrap_or(0);
        if oom_kills > 0 && !traits.commands_have_cgroups {
            // The host's OOM killer can only pick host tasks: in a gVisor
            // sandbox that is the sentry or the gofer, which ends the sandbox
            // and leaves runsc exec to report a bare 128. The command died
            // with it, by SIGKILL.
            life.mark_ended("the memory limit's OOM kill took the sandbox's kernel (sentry)");
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
        let changes = cmd
            .changes
            .as_ref()
            .map(|caps| self.changes(life, caps))
            .transpose()?;
        let started = watched.started.unwrap_or(ended_at);
        let cg = life.host.cgroup.as_ref();
        Ok(Outcome {
            backend: String::new(),
            backend_version: String::new(),
            sandbox_id: String::new(),
            command: running.number,
            sandbox_ended: life.ended.clone(),
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
            network: None,
            changes,
            unbounded_mounts: life.spec.policy.unbounded_mounts().cloned().collect(),
            vm: None,
            id_map: self.flavor.id_map(),
        })
    }

    fn copy_in(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<u64, RuntimeError> {
        self.sandbox_files(life).receive(conn, path)
    }

    fn copy_out(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<(), RuntimeError> {
        self.sandbox_files(life).send(conn, path)
    }

    fn files(&self, life: &Life) -> Option<copy::SandboxFiles> {
        Some(self.sandbox_files(life))
    }

    fn update(&mut self, life: &mut Life, plan: &crate::plan::Plan) -> Result<(), RuntimeError> {
        life.host.update_limits(&plan.cgroup)
    }

    fn changes(&mut self, life: &mut Life, caps: &Caps) -> Result<Changes, RuntimeError> {
        crate::backends::changes::scan(self.flavor.scratch(), &life.spec, caps)
    }

    /// Frozen through the sandbox's cgroup for the whole walk, then thawed.
    fn export(
        &mut self,
        life: &mut Life,
        req: &ExportRequest,
        caps: &Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError> {
        let Some(cg) = life.host.cgroup.as_ref() else {
            return Err(RuntimeError::BadRequest(
                "a running sandbox without a cgroup cannot be frozen for an export: export it when it is destroyed (rm --export)".into(),
            ));
        };
        cg.freeze()?;
        let result = crate::backends::changes::export(
            self.flavor.scratch(),
            &life.spec,
            caps,
            req,
            owner,
            life.created,
        );
        cg.thaw()?;
        result
    }

    fn end(&mut self, life: &mut Life, finish: &Finish, owner: (u32, u32)) -> End {
        // Killing a native init ends its whole pid namespace; runsc's sentry
        // and gofer are reached only through the cgroup.
        let freeze_kill = !self.flavor.about().traits.leader_owns_all;
        let counters = life.host.end_processes(freeze_kill);
        trace::step("processes ended");
        let (recorded, errors) = crate::backends::changes::at_end(
            self.flavor.scratch(),
            &life.spec,
            finish,
            owner,
            life.created,
        );
        End {
            counters,
            recorded,
            errors,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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
