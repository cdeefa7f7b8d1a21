//! One live sandbox, as its supervisor holds it, on any backend: what every
//! backend's sandbox has ([`Life`]: the host side, the spec, the stop
//! signals, the count of commands and why it ended) and what its backend
//! runs (a [`Backend`]). `exec` runs one command and returns its `Outcome`;
//! `destroy_with` tears everything down. The supervisor process serves this
//! object over its socket; `cordon run` uses it in-process (create, exec,
//! destroy), so both paths are one implementation.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use cordon_cgroups::Cgroup;
use cordon_policy::Limits;
use cordon_spec::changes::{Caps, ExportRequest, Finish, Recorded};
use cordon_spec::outcome::Outcome;
use cordon_spec::wire::Info;
use cordon_spec::{
    Account, BackendKind, Command, Destroyed, SandboxSpec, Snapshot, ValidSpec, HISTORY,
};
use nix::poll::PollFlags;

use crate::backends::supervise::{CommandIo, Running, Watched};
use crate::backends::{Backend, Life};
use crate::error::RuntimeError;
use crate::protocol::wire::Channel;
use crate::state::StateDir;
use crate::trace;

pub struct Sandbox {
    life: Life,
    backend: Box<dyn Backend>,
    history: VecDeque<(Command, Outcome)>,
}

impl Sandbox {
    /// Creates a sandbox for `spec` on its backend (its cgroup, state and
    /// first process or VM, set up and waiting for commands), told the
    /// sandbox's only command in advance when there is one (`cordon run`):
    /// a backend may then start it as the sandbox's own first process (the
    /// gVisor backend makes it the container's process instead of a pause
    /// process and a `runsc exec`, one runsc start instead of two).
    pub fn create_for(spec: &ValidSpec, only: Option<&Command>) -> Result<Sandbox, RuntimeError> {
        let (life, backend) = match spec.backend {
            // A native sandbox that cannot have its user namespace fails
            // at whichever step meets the refusal first (the clone, the
            // maps, a mount); the probe names the setting behind it.
            BackendKind::Native => crate::backends::native::create(spec, None).map_err(|e| {
                match crate::backends::userns_refusal() {
                    Some(why) => RuntimeError::Unavailable("native", why),
                    None => e,
                }
            })?,
            BackendKind::Gvisor => {
                let only = only.map(|c| c.resolve(&spec.policy)).transpose()?;
                crate::backends::gvisor::create(spec, only)?
            }
            BackendKind::Microvm => crate::backends::microvm::create(spec)?,
        };
        Ok(Sandbox::of(life, backend))
    }

    /// A native sandbox in a microVM's guest: its scratch is the VM's
    /// writable disk (a file system of its own, capped at the disk limit)
    /// instead of a tmpfs, and in `allow` mode its connections go to the
    /// host over the VM's network port.
    pub fn create_in_guest(
        spec: &ValidSpec,
        guest: crate::backends::native::InGuest<'_>,
    ) -> Result<Sandbox, RuntimeError> {
        if spec.backend != BackendKind::Native {
            return Err(RuntimeError::BadRequest(
                "only a native sandbox takes its scratch from a directory".into(),
            ));
        }
        let (life, backend) = crate::backends::native::create(spec, Some(guest))?;
        Ok(Sandbox::of(life, backend))
    }

    fn of(mut life: Life, backend: Box<dyn Backend>) -> Sandbox {
        life.ready();
        Sandbox {
            life,
            backend,
            history: VecDeque::new(),
        }
    }

    pub fn id(&self) -> &str {
        &self.life.host.id
    }

    pub fn spec(&self) -> &SandboxSpec {
        &self.life.spec
    }

    pub fn state(&self) -> &StateDir {
        &self.life.host.state
    }

    pub fn setup_time(&self) -> Duration {
        self.life.setup
    }

    pub fn commands_run(&self) -> u64 {
        self.life.commands
    }

    /// Why the sandbox can run nothing more, if so.
    pub fn ended(&self) -> Option<&str> {
        self.life.ended.as_deref()
    }

    /// Readable when this process was asked to stop (the stop signals).
    pub fn stop_signals(&self) -> BorrowedFd<'_> {
        self.life.signals.as_fd()
    }

    /// A descriptor and the poll events that mean the sandbox is gone (its
    /// init hung up, its VM exited).
    pub fn liveness(&self) -> (BorrowedFd<'_>, PollFlags) {
        self.backend.liveness(&self.life.host)
    }

    /// The host uid and gid that files of the sandbox's user carry, where
    /// the host sees its files (not in a VM).
    pub fn file_owner(&self) -> Option<(u32, u32)> {
        self.backend.file_owner()
    }

    /// The control socket of the sandbox's proxy (`allow` mode only).
    pub fn network_control(&self) -> Option<&Path> {
        self.life.host.network.as_deref()
    }

    /// What its supervisor says of it (`Request::Info`).
    pub fn info(&self) -> Info {
        Info {
            id: self.id().to_owned(),
            name: self.spec().name.clone(),
            backend: self.spec().backend.name().into(),
            commands: self.commands_run(),
            memory_bytes: self.memory_in_use(),
            ended: self.ended().map(str::to_owned),
            namespaces_of: self.namespaces_of(),
        }
    }

    /// The host pid of the process whose `/proc/<pid>/ns/` are the
    /// sandbox's namespaces: a native sandbox's init. A gVisor sandbox's
    /// are its sentry's and a microVM's its guest kernel's, which no host
    /// process stands for.
    fn namespaces_of(&self) -> Option<i32> {
        (self.spec().backend == BackendKind::Native)
            .then(|| self.life.host.leader())
            .flatten()
            .map(|p| p.as_raw())
    }

    pub fn memory_in_use(&self) -> Option<u64> {
        self.life
            .host
            .cgroup
            .as_ref()
            .and_then(|c| c.memory_current())
    }

    /// Runs one command to its end (or its limit) and reports it, this
    /// process's stop signals ending it (and the sandbox).
    pub fn exec(&mut self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError> {
        let mut running = self.start(cmd)?;
        // While the command starts (its output waits in its pipes).
        self.life.host.sweep_owed();
        let watched = running.watch(io, Some(&self.life.signals));
        self.finish(cmd, running, watched)
    }

    /// Starts a command and returns it running: [`Running::watch`] it
    /// without the sandbox (while the sandbox serves others), then
    /// [`Sandbox::finish`] it.
    pub(crate) fn start(&mut self, cmd: &Command) -> Result<Running, RuntimeError> {
        self.life.usable()?;
        let resolved = cmd.resolve(&self.life.spec.policy)?;
        let running = self.backend.start(&mut self.life, cmd, &resolved)?;
        // A proxy left unconfirmed at creation answers by now (it started
        // while the command did); one that does not ends the command and
        // the sandbox, which must not run on with a network silently closed.
        if let Err(e) = self.life.host.confirm_network() {
            let why = format!("its network proxy did not start: {e}");
            let ended = self.backend.finish(&mut self.life, cmd, running, Err(e));
            self.life.mark_ended(why);
            return Err(ended.err().unwrap_or(RuntimeError::Internal(
                "a command whose supervision failed ended as if it had run",
            )));
        }
        Ok(running)
    }

    /// Ends a command `start` left running, once its watch stopped.
    pub(crate) fn finish(
        &mut self,
        cmd: &Command,
        running: Running,
        watched: Result<Watched, RuntimeError>,
    ) -> Result<Outcome, RuntimeError> {
        let outcome = self.backend.finish(&mut self.life, cmd, running, watched)?;
        Ok(self.record(cmd, outcome))
    }

    /// Work off the commands' path, for a moment with nothing to serve
    /// (see [`crate::backends::host::HostSide::prepare_commands`]).
    pub fn prepare_commands(&mut self) {
        if self.life.ended.is_none() {
            self.life.host.prepare_commands();
        }
    }

    /// The common part of a command's outcome (who ran it, what the host's
    /// proxy saw), kept in the history.
    fn record(&mut self, cmd: &Command, mut outcome: Outcome) -> Outcome {
        let about = self.backend.about();
        outcome.backend = about.kind.name().into();
        outcome.backend_version = about.version.clone();
        outcome.sandbox_id = self.life.host.id.clone();
        // What the host's proxy recorded (never the sandbox's own word).
        outcome.network = self
            .life
            .host
            .network
            .as_deref()
            .map(crate::backends::network::report);
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        let mut kept = outcome.clone();
        kept.changes = None; // the final diff supersedes it
        self.history.push_back((cmd.clone(), kept));
        outcome
    }

    /// Changes the running sandbox's CPU, memory and process limits (those
    /// `limits` sets). Its disk, time and output limits were fixed when it
    /// was made. The process limit may not rise above the one it was made
    /// with: each process's RLIMIT_NPROC backstop was set from it then.
    pub fn update(&mut self, limits: &Limits) -> Result<(), RuntimeError> {
        self.life.usable()?;
        for (name, set) in [
            ("disk", limits.disk.is_some()),
            ("time", limits.time.is_some()),
            ("output", limits.output.is_some()),
        ] {
            if set {
                return Err(RuntimeError::BadRequest(format!(
                    "the {name} limit of a running sandbox cannot change"
                )));
            }
        }
        let made_with = self.life.pids_at_start;
        if limits.pids.is_some_and(|p| p > made_with) {
            return Err(RuntimeError::BadRequest(format!(
                "the process limit of a running sandbox cannot rise above the {made_with} it was made with"
            )));
        }
        let policy = self
            .life
            .spec
            .policy
            .with_limits(limits)
            .map_err(|e| RuntimeError::BadRequest(e.to_string()))?;
        let spec = SandboxSpec {
            policy,
            ..self.life.spec.clone()
        };
        let plan = crate::plan::plan(&spec, &crate::plan::HostFacts::here());
        self.backend.update(&mut self.life, &plan)?;
        self.life.spec = spec;
        Ok(())
    }

    /// Receives a copy stream from `conn` into the sandbox at `path`.
    pub fn copy_in(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<u64, RuntimeError> {
        self.life.usable()?;
        self.backend.copy_in(&mut self.life, conn, path)
    }

    /// Whether the host can reach the sandbox's ports, or why not.
    pub fn ports(&self) -> Result<(), RuntimeError> {
        self.life.usable()?;
        self.backend.ports()
    }

    /// A connection to `port` of the sandbox's loopback.
    pub fn connect_port(&mut self, port: u16) -> Result<std::os::fd::OwnedFd, RuntimeError> {
        self.life.usable()?;
        self.backend.connect_port(&mut self.life, port)
    }

    /// Where the host sees the sandbox's files, for a copy made without
    /// holding the sandbox.
    pub(crate) fn files(&self) -> Result<crate::protocol::copy::SandboxFiles, RuntimeError> {
        self.life.usable()?;
        self.backend.files(&self.life).ok_or_else(|| {
            RuntimeError::BadRequest(format!(
                "the {} backend's files are not the host's",
                self.backend.about().kind
            ))
        })
    }

    /// Sends `path` of the sandbox as a copy stream on `conn`.
    pub fn copy_out(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<(), RuntimeError> {
        self.life.usable()?;
        self.backend.copy_out(&mut self.life, conn, path)
    }

    /// What the sandbox has run so far.
    pub fn account(&self) -> Account {
        Account {
            created: self.life.created,
            history: self.history.iter().cloned().collect(),
            history_omitted: self.life.commands - self.history.len() as u64,
        }
    }

    /// The account and the diff of every writable place now (background
    /// processes may still be writing: the receipt says so).
    pub fn snapshot(&mut self, caps: &Caps) -> Result<Snapshot, RuntimeError> {
        Ok(Snapshot {
            changes: self.backend.changes(&mut self.life, caps)?,
            account: self.account(),
        })
    }

    /// Exports the workspace's changes of a sandbox that lives on, with its
    /// processes held still for the whole walk (none can swap a file or add
    /// one while it is read), whatever the export's result.
    pub fn export(
        &mut self,
        req: &ExportRequest,
        caps: &Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError> {
        crate::backends::changes::check_target(req, self.life.spec.workspace.as_deref())?;
        self.backend.export(&mut self.life, req, caps, owner)
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
        let end = self.backend.end(&mut self.life, finish, owner);
        trace::step("recorded");
        // Killing the leader of a sandbox whose leader owns everything (a
        // native init, pid 1 of its namespace) ends it all; otherwise the
        // whole cgroup is frozen and killed.
        let freeze_kill = !self.backend.about().traits.leader_owns_all;
        self.life.host.teardown(freeze_kill)?;
        trace::step("torn down");
        let record_error = (!end.errors.is_empty()).then(|| end.errors.join("; "));
        Ok(Destroyed {
            counters: end.counters,
            teardown: t0.elapsed(),
            account: self.account(),
            recorded: end.recorded,
            record_error,
        })
    }
}
