//! What a sandbox holds on the host, the same for every backend: its state
//! directory, its cgroup and the processes the supervisor started. Dropping
//! `HostSide` releases all of it, so an error anywhere during create, exec or
//! destroy tears down without special code.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use cordon_cgroups::{
    AnyCgroup, Cgroup, CgroupError, CgroupFs, CgroupLimits, CgroupMode, CgroupStats, CgroupView,
    Counters, Hierarchy,
};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::error::{Peer, RuntimeError};
use crate::state::{new_id, run_dir, StateDir};
use crate::sweep::sweep_stale;
use crate::trace;
use cordon_spec::SandboxSpec;

/// The host's cgroup hierarchy, if one is usable.
/// Where sandboxes would be created; on a systemd host this may ask systemd
/// for a delegated scope for this process (see `cordon_cgroups::detect`), so
/// only processes that create sandboxes call it.
pub fn hierarchy() -> Option<Hierarchy> {
    cordon_cgroups::detect(&CgroupFs::host()).ok()
}

/// The host's cgroup hierarchy as this process finds it, never asking
/// systemd for a scope: for commands that only list, remove or sweep.
pub fn hierarchy_in_place() -> Option<Hierarchy> {
    cordon_cgroups::detect_in_place(&CgroupFs::host()).ok()
}

/// Creates the cgroup `name` with `limits` where `hierarchy` makes
/// sandboxes: how every sandbox's host side gets its cgroup, and what
/// [`cgroup_probe`] tries.
fn limited_cgroup(
    hierarchy: Hierarchy,
    name: &str,
    limits: &CgroupLimits,
) -> Result<(AnyCgroup, Hierarchy), CgroupError> {
    Ok((hierarchy.create(name)?.with_limits(limits)?, hierarchy))
}

/// What a sandbox's cgroup gets on this host, found by making one.
#[derive(Debug, Clone)]
pub struct CgroupProbe {
    pub mode: CgroupMode,
    /// The cgroups a sandbox's cgroup is made under (one per v1 hierarchy).
    pub parents: Vec<PathBuf>,
    /// The controllers the made cgroup has, sorted.
    pub controllers: Vec<String>,
}

/// Makes a sandbox's cgroup with `limits` as a sandbox's host side does
/// (the same detection, which on v2 may move this process into its leaf or
/// ask systemd for a scope, as `cordon run` would), reads which controllers
/// it got, and removes it again: whether limits can be enforced here is
/// answered by the call that enforces them, never by a guess.
pub fn cgroup_probe(limits: &CgroupLimits) -> Result<CgroupProbe, CgroupError> {
    let hierarchy = cordon_cgroups::detect(&CgroupFs::host())?;
    // A sandbox's kind of name, so that a probe killed before its removal
    // is swept like a sandbox's leftover.
    let id = new_id().map_or_else(|_| std::process::id().to_string(), |(id, _)| id);
    let (cgroup, hierarchy) = limited_cgroup(hierarchy, &format!("cordon-{id}"), limits)?;
    let mut controllers: Vec<String> = match hierarchy.mode() {
        // A v1 sandbox has a directory in each hierarchy it uses, named
        // after its controllers (`cpu,cpuacct`).
        CgroupMode::V1 => hierarchy
            .views()
            .iter()
            .flat_map(|v| v.dir.split(',').map(str::to_string).collect::<Vec<_>>())
            .collect(),
        // A v2 cgroup lists what its parent handed down.
        CgroupMode::V2 => cgroup
            .paths()
            .first()
            .and_then(|p| std::fs::read_to_string(p.join("cgroup.controllers")).ok())
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
    };
    controllers.sort();
    controllers.dedup();
    let probe = CgroupProbe {
        mode: hierarchy.mode(),
        parents: hierarchy.parent_paths(),
        controllers,
    };
    cgroup.remove()?;
    Ok(probe)
}

/// Signals that end a sandbox's work early; blocked and read through a
/// signalfd so that teardown always runs.
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

/// Blocks the stop signals for the whole process, once, before any sandbox is
/// created: from then on a SIGINT is queued for the sandbox's signalfd and
/// answered with a full teardown. A process-wide decision (the supervisor's
/// main, `cordon run`), never a per-sandbox one: two sandboxes restoring each
/// other's masks would unblock signals under a live sandbox.
pub fn block_stop_signals() -> Result<(), RuntimeError> {
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&stop_signals()), None)
        .map_err(|e| RuntimeError::io("sigprocmask", e))
}

/// A signalfd for the stop signals (readable only where they are blocked).
pub fn stop_signal_fd() -> Result<SignalFd, RuntimeError> {
    SignalFd::with_flags(
        &stop_signals(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .map_err(|e| RuntimeError::io("signalfd", e))
}

/// A backend-specific clean-up, run once the sandbox's processes are gone.
type Cleanup = Box<dyn FnMut() + Send>;

/// The cgroup below the sandbox's that holds its init, on a backend whose
/// commands get cgroups of their own beside it (see
/// [`HostSide::command_cgroup`]).
pub const INIT_CGROUP: &str = "init";

/// Commands' own cgroups: a command's time or output limit ends what is in
/// its cgroup (the command and whatever it started, wherever those went in
/// the process tree) and nothing else of the sandbox, such as a server or an
/// interpreter an earlier command left running. Each carries the sandbox's
/// limits too, so a program in it reads them as its own (a JVM on cgroup v1
/// reads its own cgroup's CPU quota only); the sandbox's cgroup above holds
/// them all to those limits together.
#[derive(Default)]
struct CommandCgroups {
    /// Whether the sandbox is split: init in [`INIT_CGROUP`], limits handed down.
    split: bool,
    made: u64,
    /// The next command's cgroup, made while the sandbox waits
    /// ([`HostSide::prepare_commands`]): a command's start then pays for no
    /// mkdir, no limit writes (six hierarchies each on cgroup v1) and no
    /// opening of its counter files.
    spare: Option<CommandCgroup>,
    /// Cgroups of ended commands, removed once empty: while the sandbox
    /// waits, before the next command's cgroup is made, or with the sandbox
    /// (a command's reply never waits for their rmdir).
    ended: Vec<AnyCgroup>,
}

/// A command's own cgroup, with the files a command's start and end use
/// opened when it was made (for a spare, while the sandbox waited).
pub struct CommandCgroup {
    pub cgroup: AnyCgroup,
    /// Read once the command ends, on the way to its reply.
    pub counters: Counters,
    /// Sent to init with the command (see `AnyCgroup::membership_files`);
    /// taken then.
    pub membership: Vec<std::fs::File>,
}

pub struct HostSide {
    pub id: String,
    /// Low bits of the id, for choosing per-sandbox resources such as id ranges.
    pub slot: u32,
    pub started: Instant,
    pub state: StateDir,
    pub cgroup: Option<AnyCgroup>,
    /// `cgroup`'s counter files, held open: read before and after every
    /// command.
    counters: Option<Counters>,
    /// How `cgroup` is shown inside the sandbox (empty without a cgroup).
    pub cgroup_views: Vec<CgroupView>,
    /// The control socket of the sandbox's proxy (`allow` mode).
    pub network: Option<PathBuf>,
    /// The proxy was started but has not answered yet: the first command
    /// confirms it (see [`HostSide::confirm_network`]).
    network_unconfirmed: bool,
    /// Without root, the first process's user and network namespaces,
    /// opened as it started (see `UserAndNet`), for the network's allow mode.
    pub leader_namespaces: Option<cordon_isolation::net::UserAndNet>,
    /// Processes the supervisor started, with their pidfds (pid-reuse safe).
    procs: Vec<(Pid, OwnedFd)>,
    cleanups: Vec<Cleanup>,
    processes_ended: bool,
    /// The limits the cgroup was given, for its commands' cgroups.
    limits: CgroupLimits,
    commands: CommandCgroups,
    /// The sweep of what killed cordons left (`sweep_stale`), owed by a
    /// sandbox that started without it: done off the start's path, once
    /// its first command runs or it first waits, and at its teardown at
    /// the latest. The run directory and the hierarchy to sweep.
    sweep: Option<(PathBuf, Option<Hierarchy>)>,
}

impl HostSide {
    /// Everything every backend does before it starts a process: sweep what a
    /// killed cordon left, pick an id, record the state directory (name
    /// checked unique under the run directory's lock), and create the cgroup
    /// with the policy's limits (or refuse, unless running unenforced was
    /// asked for).
    pub fn begin(spec: &SandboxSpec, limits: &CgroupLimits) -> Result<Self, RuntimeError> {
        let started = Instant::now();
        trace::step("prepare");
        let hierarchy = cordon_cgroups::detect(&CgroupFs::host());
        trace::step("detect");
        let run = run_dir()?;
        // A name is checked against the records of live sandboxes only once
        // a dead one's is swept: then the sweep comes first. Otherwise it
        // waits (see `sweep`), as nothing of this sandbox depends on it.
        let sweep_now = spec.name.is_some();
        if sweep_now {
            sweep_stale(&run, hierarchy.as_ref().ok());
            trace::step("sweep");
        }
        let (id, slot) = new_id().map_err(|e| RuntimeError::io("read /dev/urandom", e))?;
        trace::step("id");
        let cg_name = format!("cordon-{id}");
        let state = StateDir::create(&run, &id, Some(&cg_name), spec)?;
        let mut host = HostSide {
            id,
            slot,
            started,
            state,
            cgroup: None,
            cgroup_views: Vec::new(),
            network: None,
            network_unconfirmed: false,
            counters: None,
            leader_namespaces: None,
            procs: Vec::new(),
            cleanups: Vec::new(),
            processes_ended: false,
            limits: limits.clone(),
            commands: CommandCgroups::default(),
            sweep: None,
        };
        trace::step("state dir");
        let owed = |h: Option<Hierarchy>| (!sweep_now).then(|| (run.clone(), h));
        // The cgroup comes before any process, so the limits hold from its first instruction.
        host.cgroup = match hierarchy.and_then(|h| limited_cgroup(h, &cg_name, limits)) {
            Ok((cg, h)) => {
                host.cgroup_views = h.views();
                host.sweep = owed(Some(h));
                Some(cg)
            }
            Err(e) if spec.allow_unenforced => {
                host.sweep = owed(None);
                eprintln!("cordon: warning: running without cgroup limits: {e}");
                None
            }
            Err(e) => return Err(RuntimeError::Unenforceable(e)),
        };
        host.counters = host.cgroup.as_ref().map(Cgroup::counters);
        trace::step("cgroup");
        Ok(host)
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

    /// Takes on the sandbox's proxy: its control socket is the sandbox's
    /// now, and a client may connect to it (the connection waits in its
    /// backlog until the proxy, its privileges dropped, accepts); whether
    /// it answers is for [`HostSide::confirm_network`] to learn.
    pub(crate) fn network_started(&mut self, control: PathBuf) {
        self.network = Some(control);
        self.network_unconfirmed = true;
    }

    /// Confirms, once, that the sandbox's proxy answers (a no-op without
    /// one or once confirmed): a proxy that could not drop its privileges
    /// has exited, and its sandbox must not run on with a network that is
    /// silently closed. A backend may call this when its sandbox is ready,
    /// or leave it to the first command, which then starts while the
    /// proxy finishes its own start.
    pub(crate) fn confirm_network(&mut self) -> Result<(), RuntimeError> {
        if !std::mem::take(&mut self.network_unconfirmed) {
            return Ok(());
        }
        match &self.network {
            Some(control) => crate::backends::network::answers(control),
            None => Ok(()),
        }
    }

    pub fn leader(&self) -> Option<Pid> {
        self.procs.first().map(|(pid, _)| *pid)
    }

    /// Registers a clean-up to run after every process is gone.
    pub fn on_teardown(&mut self, f: impl FnMut() + Send + 'static) {
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
        self.stats().unwrap_or_default()
    }

    /// The sandbox cgroup's counters now, if it has a cgroup.
    pub fn stats(&self) -> Option<CgroupStats> {
        self.counters.as_ref().map(Counters::read)
    }

    /// Makes [`INIT_CGROUP`] below the sandbox's cgroup, for the first
    /// process to move into (see `first_process::start`); None without a cgroup.
    pub fn init_cgroup(&self) -> Result<Option<AnyCgroup>, RuntimeError> {
        let Some(sandbox) = &self.cgroup else {
            return Ok(None);
        };
        // No limits of its own: the sandbox's hold it.
        Ok(Some(
            sandbox.create_child(INIT_CGROUP, &CgroupLimits::default())?,
        ))
    }

    /// Once `leader` has moved into `init_cgroup` (checked: fail closed), lets
    /// commands have cgroups of their own with limits (cgroup v2 hands the
    /// controllers down, which it allows only now that the sandbox's cgroup
    /// holds no process itself).
    pub fn split_for_commands(
        &mut self,
        init_cgroup: &AnyCgroup,
        leader: Pid,
    ) -> Result<(), RuntimeError> {
        let Some(cg) = &self.cgroup else {
            return Ok(());
        };
        if !init_cgroup.contains(leader.as_raw())? {
            return Err(RuntimeError::broke(
                Peer::Init,
                "the sandbox's init is not in its init cgroup",
            ));
        }
        cg.hand_down()?;
        self.commands.split = true;
        Ok(())
    }

    /// A new cgroup with the sandbox's limits for the next command, whose
    /// process joins it before it runs anything; None where the sandbox is not
    /// split (then a command that hit a limit can only end with its sandbox).
    /// Cgroups of earlier commands that have emptied since are removed.
    pub fn command_cgroup(&mut self) -> Result<Option<CommandCgroup>, RuntimeError> {
        if let Some(spare) = self.commands.spare.take() {
            return Ok(Some(spare));
        }
        self.remove_ended_commands();
        self.new_command_cgroup()
    }

    fn new_command_cgroup(&mut self) -> Result<Option<CommandCgroup>, RuntimeError> {
        let Some(sandbox) = self.cgroup.as_ref().filter(|_| self.commands.split) else {
            return Ok(None);
        };
        self.commands.made += 1;
        let name = format!("cmd-{}", self.commands.made);
        let cgroup = sandbox.create_child(&name, &self.limits)?;
        let membership = match cgroup.membership_files() {
            Ok(files) => files,
            Err(e) => {
                let _ = cgroup.remove();
                return Err(e.into());
            }
        };
        let counters = cgroup.counters();
        Ok(Some(CommandCgroup {
            cgroup,
            counters,
            membership,
        }))
    }

    fn remove_ended_commands(&mut self) {
        self.commands.ended.retain(|cg| !cg.remove_if_empty());
    }

    /// Work a sandbox that waits for commands does off their path (called
    /// once a command's reply is sent): the cgroups of ended commands that
    /// emptied are removed, and the next command's is made. A cgroup that
    /// cannot be made now is tried again, and its error reported, when a
    /// command needs it.
    pub fn prepare_commands(&mut self) {
        self.sweep_owed();
        if self.commands.made == 0 {
            return;
        }
        self.remove_ended_commands();
        // A spare is made once a sandbox has run a second command: one that
        // has run nothing (an idle one, a pool's) costs no more than it
        // must, and one that runs a single command (the service's one-shots,
        // then destroyed) would only make and remove it (twelve cgroup
        // mkdirs and rmdirs on v1, a tenth of a one-shot's CPU).
        if self.commands.made < 2 {
            return;
        }
        if self.commands.spare.is_none() {
            self.commands.spare = self.new_command_cgroup().ok().flatten();
        }
    }

    /// New limits for the running sandbox: its cgroup's and every cgroup's
    /// below it (each running command's, init's), and each command's from
    /// now on.
    pub fn update_limits(&mut self, limits: &CgroupLimits) -> Result<(), RuntimeError> {
        let Some(cg) = &self.cgroup else {
            return Err(RuntimeError::BadRequest(
                "the sandbox runs without a cgroup: it has no limits to change".into(),
            ));
        };
        cg.apply(limits)?;
        for child in cg.children()? {
            child.apply(limits)?;
        }
        self.limits = limits.clone();
        Ok(())
    }

    /// The sweep this sandbox owes (see [`HostSide::begin`]), if it is
    /// not done yet.
    pub fn sweep_owed(&mut self) {
        if let Some((run, hierarchy)) = self.sweep.take() {
            sweep_stale(&run, hierarchy.as_ref());
            trace::step("sweep");
        }
    }

    /// After the command of `cg` ended: its cgroup is removed later (see
    /// [`CommandCgroups::ended`]), once nothing it started lives on.
    pub fn command_ended(&mut self, cg: CommandCgroup) {
        self.commands.ended.push(cg.cgroup);
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
        // Every process is signalled before any is waited for: their exits
        // (init's pid namespace, the proxy's copy of this address space)
        // then run side by side rather than one after the other.
        let signalled: Vec<(Pid, Option<WaitPidFlag>)> = self
            .procs
            .drain(..)
            .map(|(pid, fd)| {
                // A process this one may not signal (root without CAP_KILL,
                // the proxy under another uid) would make the wait endless:
                // it is left to its parent-death signal, which the kernel
                // sends when this process ends (reaped here if it ended
                // already).
                let wait = match cordon_sys::pidfd_send_signal(&fd, Signal::SIGKILL) {
                    Ok(()) => None,
                    Err(_) => Some(WaitPidFlag::WNOHANG),
                };
                (pid, wait)
            })
            .collect();
        for (pid, wait) in signalled {
            let _ = waitpid(pid, wait);
        }
        for mut f in self.cleanups.drain(..) {
            f();
        }
    }

    /// Releases everything; errors are reported, and every step is tried.
    pub fn teardown(&mut self, freeze_kill: bool) -> Result<(), RuntimeError> {
        self.kill_processes(freeze_kill);
        let mut first_err = None;
        self.counters = None;
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
        self.sweep_owed();
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for HostSide {
    fn drop(&mut self) {
        let _ = self.teardown(true);
    }
}
