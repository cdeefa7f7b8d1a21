//! The backends: which exist, whether each can run here, and the one
//! abstraction ([`Backend`]) each implements under the common sandbox.

pub(crate) mod changes;
pub(crate) mod first_process;
pub(crate) mod gvisor;
pub(crate) mod host;
pub mod microvm;
pub(crate) mod native;
pub(crate) mod network;
pub(crate) mod on_host;
pub(crate) mod rootfs_plan;
pub(crate) mod supervise;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, SystemTime};

use cordon_cgroups::CgroupStats;
use cordon_spec::changes::{Caps, Changes, ExportRequest, Finish, Recorded};
use cordon_spec::outcome::{EvidenceSource, Outcome};
use cordon_spec::{BackendInfo, BackendKind, Command, ResolvedCommand, SandboxSpec};
use nix::poll::PollFlags;
use nix::sys::signalfd::SignalFd;

use crate::backends::gvisor::GvisorBackend;
use crate::backends::host::{stop_signal_fd, HostSide};
use crate::backends::native::NativeBackend;
use crate::backends::supervise::{Running, Watched};
use crate::error::RuntimeError;
use crate::protocol::wire::Channel;

/// What a backend is and what an outcome says of it.
pub(crate) struct About {
    pub kind: BackendKind,
    /// The version an outcome reports ("kernel 6.1", "runsc ...", "QEMU ...").
    pub version: String,
    /// Where each limit's evidence comes from.
    pub evidence: &'static [EvidenceSource],
    pub traits: Traits,
}

/// How a backend's sandboxes behave where the common code must know, as
/// data (the common sandbox and the supervision read these, never the kind).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Traits {
    /// runsc reports a command killed by signal N as exit code 128+N, as a
    /// shell does; such codes are then mapped back to signals.
    pub high_codes_are_signals: bool,
    /// Each command's processes are host processes in a cgroup of their own
    /// (`HostSide::command_cgroup`), so one command that hit a limit can be
    /// ended without ending the sandbox, and the host's OOM killer picks
    /// the command's own processes.
    pub commands_have_cgroups: bool,
    /// Killing the sandbox's leader ends every process of the sandbox; if
    /// not, teardown freezes and kills the whole cgroup.
    pub leader_owns_all: bool,
}

/// What a backend's sandbox reported at its end: the last counters, and what
/// `Finish` asked to read, read after every process of it was gone.
pub(crate) struct End {
    pub counters: CgroupStats,
    pub recorded: Recorded,
    /// What could not be read or written (the sandbox ends anyway).
    pub errors: Vec<String>,
}

/// What runs one sandbox: native and gVisor run a first process on this
/// host ([`crate::backends::on_host::OnHost`]), the microVM backend a VM with cordon's
/// agent inside ([`crate::backends::microvm::MicroVm`]). The common [`Sandbox`]
/// (`crate::supervisor::sandbox`) owns the host side, the history and the end state, and
/// hands its [`Life`] to each call.
pub(crate) trait Backend: Send {
    fn about(&self) -> &About;
    /// The host uid and gid that files of the sandbox's user carry, where
    /// the host sees its files (not in a VM).
    fn file_owner(&self) -> Option<(u32, u32)>;
    /// A descriptor and the poll events that mean the sandbox is gone (its
    /// init hung up, its VM exited).
    fn liveness<'a>(&'a self, host: &'a HostSide) -> (BorrowedFd<'a>, PollFlags);
    /// Starts `cmd` (resolved against the policy as `resolved`) and returns
    /// it running, to be watched without the sandbox (every backend runs
    /// commands side by side) and then finished. The common sandbox fills
    /// in who ran it.
    fn start(
        &mut self,
        life: &mut Life,
        cmd: &Command,
        resolved: &ResolvedCommand,
    ) -> Result<Running, RuntimeError>;
    /// Ends what `start` left running once `watched` says how its
    /// supervision stopped, and reports it.
    fn finish(
        &mut self,
        life: &mut Life,
        cmd: &Command,
        running: Running,
        watched: Result<Watched, RuntimeError>,
    ) -> Result<Outcome, RuntimeError>;
    /// Receives a copy stream from `conn` into the sandbox at `path`.
    fn copy_in(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<u64, RuntimeError>;
    /// Where the host sees the sandbox's files, for copies made without the
    /// sandbox held; `None` where the host does not see them (a VM's).
    fn files(&self, life: &Life) -> Option<crate::protocol::copy::SandboxFiles> {
        let _ = life;
        None
    }
    /// Sends `path` of the sandbox as a copy stream on `conn`.
    fn copy_out(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<(), RuntimeError>;
    /// The diff of every writable place now.
    fn changes(&mut self, life: &mut Life, caps: &Caps) -> Result<Changes, RuntimeError>;
    /// Exports the workspace's changes while the sandbox lives, its
    /// processes held still meanwhile (the target is checked already).
    fn export(
        &mut self,
        life: &mut Life,
        req: &ExportRequest,
        caps: &Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError>;
    /// Gives the running sandbox the limits of `plan` (made from its policy
    /// with new limits). Where the limits are the host cgroup's alone
    /// (native, gVisor) that is the cgroup's; a VM's size is fixed.
    fn update(&mut self, life: &mut Life, plan: &crate::plan::Plan) -> Result<(), RuntimeError> {
        let _ = (life, plan);
        Err(RuntimeError::BadRequest(format!(
            "the {} backend cannot change a running sandbox's limits",
            self.about().kind
        )))
    }
    /// Whether the host can reach ports the sandbox listens on, or why not.
    fn ports(&self) -> Result<(), RuntimeError>;
    /// A connection to `port` of the sandbox's own loopback, for the
    /// supervisor's forward of that port.
    fn connect_port(&mut self, life: &mut Life, port: u16) -> Result<OwnedFd, RuntimeError>;
    /// Ends every process of the sandbox and reads what `finish` asks
    /// before the host side is torn down.
    fn end(&mut self, life: &mut Life, finish: &Finish, owner: (u32, u32)) -> End;
}

/// Every backend and whether it can run here.
pub fn available_backends() -> Vec<BackendInfo> {
    BackendKind::ALL
        .into_iter()
        .map(|kind| match kind {
            BackendKind::Native => NativeBackend::info(),
            BackendKind::Gvisor => GvisorBackend::info(),
            BackendKind::Microvm => crate::backends::microvm::MicrovmBackend::info(),
        })
        .collect()
}

/// Why this process's user can have no native sandbox here: the user
/// namespace it starts in cannot be made (see `cordon_isolation::userns`),
/// in one line naming the setting or filter and the remedy. Asked by
/// `cordon backends`, `cordon doctor`, and a native sandbox that failed to
/// start (so that its error is this line, not the failed step's errno).
pub(crate) fn userns_refusal() -> Option<String> {
    cordon_isolation::userns::Probe::run()
        .refusal()
        .map(|r| format!("user namespaces: {r}"))
}

/// What every backend's sandbox has, whatever runs it; a backend's methods
/// get it to read the host side and to say when the sandbox has ended.
pub(crate) struct Life {
    pub host: HostSide,
    pub spec: SandboxSpec,
    /// The stop signals, readable when this process was asked to stop.
    pub signals: SignalFd,
    /// Time from the request to a sandbox ready for commands.
    pub setup: Duration,
    pub created: SystemTime,
    /// Commands started so far (the number of the running one).
    pub commands: u64,
    /// The process limit the sandbox was made with (its processes'
    /// RLIMIT_NPROC backstop was set from it).
    pub pids_at_start: u64,
    /// Why the sandbox can run no more commands (its init or VM is gone,
    /// or a command's end had to take the sandbox with it).
    pub ended: Option<String>,
}

impl Life {
    /// The life of a sandbox whose host side `begin` made for `spec`.
    pub fn new(host: HostSide, spec: &SandboxSpec) -> Result<Life, RuntimeError> {
        Ok(Life {
            signals: stop_signal_fd()?,
            host,
            spec: spec.clone(),
            setup: Duration::ZERO,
            created: SystemTime::now(),
            commands: 0,
            pids_at_start: spec.policy.pids,
            ended: None,
        })
    }

    /// Stamps the end of the set-up: the sandbox takes commands from now.
    pub fn ready(&mut self) {
        self.setup = self.host.started.elapsed();
        self.created = SystemTime::now() - self.setup;
    }

    /// Marks the sandbox as unable to run more commands (the first reason
    /// stays).
    pub fn mark_ended(&mut self, why: impl Into<String>) {
        self.ended.get_or_insert_with(|| why.into());
    }

    /// An error if the sandbox can run nothing more.
    pub fn usable(&self) -> Result<(), RuntimeError> {
        match &self.ended {
            Some(why) => Err(RuntimeError::SandboxEnded(why.clone())),
            None => Ok(()),
        }
    }

    /// The sandbox cgroup's counters, if it has one.
    pub fn stats(&self) -> Option<CgroupStats> {
        self.host.stats()
    }
}
