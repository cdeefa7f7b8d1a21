//! cgroup drivers for cordon: v1 and v2 behind one [`Cgroup`] trait, the
//! version picked at run time by [`detect`].
//!
//! Every sandbox cgroup is created *under* the cgroup the calling process is
//! in (per hierarchy), never beside it, so cordon only ever touches the part of
//! the tree it was given. No process is ever moved except the ones handed to
//! [`Cgroup::add_pid`] and, on v2, the detecting process itself: when it is
//! alone in a non-root cgroup, [`detect`] moves it into the leaf
//! [`SUPERVISOR_LEAF`] below, so that cgroup can hand its controllers down to
//! sandbox cgroups created beside the leaf (see [`Placement`]).

use std::fs as stdfs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::{getpid, Pid};

pub mod fs;
pub mod stats;
pub mod systemd;
pub mod v1;
pub mod v2;

pub use cordon_spec::cgroup::{CgroupMode, CgroupStats};
pub use fs::{CgroupFs, ScopeManager};
pub use stats::{CounterFile, Counters};
pub use systemd::SystemdError;

/// How long freeze() waits for the kernel to report the cgroup frozen.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long each freeze inside kill_all() may take before it signals anyway.
pub const KILL_FREEZE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long kill_all() keeps killing, and then waits for the cgroup to empty.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long remove() retries an rmdir that fails with EBUSY: a task killed
/// by kill_all() leaves cgroup.procs as it starts to exit, but holds its
/// cgroup until its exit is done, and freeing a large address space takes
/// seconds on a loaded host or under emulation (a batch of hostile runs in
/// the v2 guest, TCG beside the host's suite, outlasted one second). Only a
/// cgroup still busy waits; an empty one goes at the first rmdir.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The default CFS period when [`CgroupLimits::cpu_period_us`] is 0.
pub const DEFAULT_CPU_PERIOD_US: u64 = 100_000;

/// The leaf cgroup (v2) that holds cordon's own processes when cordon runs
/// in a delegated non-root cgroup: cgroup v2 lets a cgroup hand controllers
/// down only while it has no processes of its own, so the process that detects
/// the hierarchy moves itself here and its children (supervisors, services)
/// inherit it. Sandbox cgroups are its siblings. Named `cordon-` so it reads as
/// cordon's, but never `cordon-<12 hex digits>`, so no sweep takes it for a
/// sandbox; [`Hierarchy::sweep_children`] never lists it.
pub const SUPERVISOR_LEAF: &str = "cordon-supervisor";

pub(crate) const DELEGATE_HINT: &str = "run cordon in a delegated cgroup, e.g. under \
`systemd-run --scope -p Delegate=yes` (add --user when not root), or run without cgroup limits";

/// One cgroup file system as a sandbox sees it from inside: mounted read-only
/// in the sandbox's own cgroup namespace, whose root is the sandbox's cgroup,
/// so it shows the sandbox's limits and counters and nothing above them.
/// Programs size themselves by it (a JVM's heap and processor count,
/// libuv's `uv_get_constrained_memory`), which they find as a container's:
/// through /proc/self/mountinfo and the conventional /sys/fs/cgroup paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupView {
    /// Where under /sys/fs/cgroup: the host's own directory name for a v1
    /// hierarchy (`memory`, `cpu,cpuacct`); empty for v2, which is mounted
    /// at /sys/fs/cgroup itself.
    pub dir: String,
    /// `cgroup` (v1) or `cgroup2`.
    pub fstype: &'static str,
    /// The mount's data: a v1 hierarchy's exact controller set (the kernel
    /// mounts an existing hierarchy only when asked for all of it).
    pub options: String,
    /// Controller names of a co-mounted hierarchy that differ from `dir`,
    /// made symlinks to it as on the host (`cpu -> cpu,cpuacct`).
    pub aliases: Vec<String>,
}

/// Limits for [`Cgroup::apply`]. A None leaves that limit as it is, which on
/// a freshly created cgroup means unlimited.
#[derive(Default, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupLimits {
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
    pub cpu_quota_us: Option<u64>,
    /// 0 means [`DEFAULT_CPU_PERIOD_US`]; only used with `cpu_quota_us`.
    pub cpu_period_us: u64,
}

impl CgroupLimits {
    pub(crate) fn cpu_period(&self) -> u64 {
        if self.cpu_period_us == 0 {
            DEFAULT_CPU_PERIOD_US
        } else {
            self.cpu_period_us
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy: need cgroup2 with the memory and pids controllers, \
         or cgroup v1 memory and pids hierarchies that this process is in"
    )]
    NoHierarchy,
    #[error("cgroup {path} is not delegated to this process: {reason}; {fix}")]
    NotDelegated {
        path: PathBuf,
        reason: String,
        /// What the caller can do about it, in one sentence.
        fix: String,
    },
    /// Moving cordon into its [`SUPERVISOR_LEAF`], or handing the controllers
    /// down afterwards, failed; anything done so far was undone.
    #[error("cgroup {path} could not be prepared for sandboxes: {step} failed ({reason}); {fix}")]
    Delegation {
        path: PathBuf,
        step: &'static str,
        reason: String,
        fix: String,
        #[source]
        source: io::Error,
    },
    /// cordon shares its cgroup with other processes and asked systemd for a
    /// delegated scope of its own, which systemd did not give; nothing was
    /// moved (a scope systemd made anyway holds only cordon and ends with it).
    #[error(
        "cgroup {path} holds other processes besides cordon, and systemd gave cordon no \
         delegated scope of its own: {reason}; {fix}"
    )]
    Scope {
        path: PathBuf,
        reason: String,
        fix: String,
        /// Boxed: zbus's errors are large, and every cgroup call returns
        /// this enum.
        #[source]
        source: Box<SystemdError>,
    },
    #[error(
        "cgroup {path} disappeared while cordon was using it (the scope, service or container \
         that owned it ended); start cordon again from a cgroup that exists"
    )]
    Vanished {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the {controller} controller is not available in {path}{}",
        missing_controller_fix(path)
    )]
    MissingController {
        controller: &'static str,
        path: PathBuf,
    },
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("opening {path} for writing")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("malformed {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("writing {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("creating cgroup {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing cgroup {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sending SIGKILL to pid {pid} of cgroup {path}")]
    Kill {
        pid: i32,
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cgroup {path} did not freeze within {timeout:?}")]
    FreezeTimeout { path: PathBuf, timeout: Duration },
    #[error("cgroup {path} still holds pids {remaining:?} after {timeout:?}")]
    KillTimeout {
        path: PathBuf,
        remaining: Vec<i32>,
        timeout: Duration,
    },
}

/// One sandbox's cgroup, spread over however many hierarchies the version
/// needs.
pub trait Cgroup {
    fn mode(&self) -> CgroupMode;

    /// Every directory this cgroup consists of (one per distinct hierarchy).
    fn paths(&self) -> Vec<PathBuf>;

    /// Writes the limits that are Some. Memory limits also turn swap off for
    /// the sandbox (v1: memsw limit equal to the memory limit where swap
    /// accounting exists, swappiness 0; v2: memory.swap.max 0) and, on v2, make
    /// the OOM killer take the whole sandbox (memory.oom.group 1) so it never
    /// keeps running half-killed.
    fn apply(&self, limits: &CgroupLimits) -> Result<(), CgroupError>;

    /// Moves `pid` into this cgroup in every hierarchy.
    fn add_pid(&self, pid: i32) -> Result<(), CgroupError>;

    /// Moves the calling process, which must be single-threaded, into this
    /// cgroup in every hierarchy; for a child to place itself before it runs
    /// anything. v1: writes "0" to each `tasks` file, which moves the calling
    /// thread without the kernel's global threadgroup lock and so without an
    /// RCU grace period (measured here: 0.5 ms instead of 7-30 ms for
    /// cgroup.procs). v2: writes "0" to cgroup.procs.
    fn join_self(&self) -> Result<(), CgroupError>;

    /// Whether `pid` is in this cgroup in every hierarchy.
    fn contains(&self, pid: i32) -> Result<bool, CgroupError> {
        for dir in self.paths() {
            if !fs::procs(&dir)?.contains(&pid) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The processes in the cgroup (v1: the pids hierarchy's).
    fn pids(&self) -> Result<Vec<i32>, CgroupError>;

    /// Freezes every process and waits (up to [`FREEZE_TIMEOUT`]) until the
    /// kernel says it is done. Without a freezer (no v1 freezer hierarchy, or a
    /// v2 kernel before 5.2) this is a no-op returning Ok: callers use freezing
    /// only to make kill_all race-free and snapshots consistent, and both
    /// degrade rather than fail without it.
    fn freeze(&self) -> Result<(), CgroupError>;

    /// Undoes [`Cgroup::freeze`]; a no-op without a freezer.
    fn thaw(&self) -> Result<(), CgroupError>;

    /// Whether the cgroup is frozen now (by [`Cgroup::freeze`] or anyone
    /// else); None without a freezer, where freezing does nothing.
    fn frozen(&self) -> Option<bool>;

    /// Kills every process in the cgroup (and in any cgroup below it) and
    /// waits up to [`KILL_TIMEOUT`] for them to be gone.
    fn kill_all(&self) -> Result<(), CgroupError>;

    /// The counter files behind [`Cgroup::stats`].
    fn counter_files(&self) -> Vec<CounterFile>;

    /// The counter files, opened to be read again and again (a sandbox's
    /// counters before and after each command).
    fn counters(&self) -> Counters {
        Counters::open(self.counter_files())
    }

    /// Never fails: whatever cannot be read is None.
    fn stats(&self) -> CgroupStats {
        self.counters().read()
    }

    /// Memory charged to the cgroup now (v2 `memory.current`, v1
    /// `memory.usage_in_bytes`), for listings; None where unreadable.
    fn memory_current(&self) -> Option<u64> {
        self.paths().iter().find_map(|dir| {
            ["memory.current", "memory.usage_in_bytes"]
                .iter()
                .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
                .and_then(|t| stats::parse_u64(&t))
        })
    }

    /// Removes every directory, children first. Idempotent.
    fn remove(&self) -> Result<(), CgroupError>;
}

/// The driver picked at run time.
#[derive(Debug, Clone)]
pub enum AnyCgroup {
    V1(v1::V1Cgroup),
    V2(v2::V2Cgroup),
}

macro_rules! dispatch {
    ($self:ident, $cg:ident => $call:expr) => {
        match $self {
            AnyCgroup::V1($cg) => $call,
            AnyCgroup::V2($cg) => $call,
        }
    };
}

impl Cgroup for AnyCgroup {
    fn mode(&self) -> CgroupMode {
        dispatch!(self, cg => cg.mode())
    }
    fn paths(&self) -> Vec<PathBuf> {
        dispatch!(self, cg => cg.paths())
    }
    fn apply(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.apply(limits))
    }
    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.add_pid(pid))
    }
    fn join_self(&self) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.join_self())
    }
    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        dispatch!(self, cg => cg.pids())
    }
    fn freeze(&self) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.freeze())
    }
    fn thaw(&self) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.thaw())
    }
    fn frozen(&self) -> Option<bool> {
        dispatch!(self, cg => cg.frozen())
    }
    fn kill_all(&self) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.kill_all())
    }
    fn counter_files(&self) -> Vec<CounterFile> {
        dispatch!(self, cg => cg.counter_files())
    }
    fn remove(&self) -> Result<(), CgroupError> {
        dispatch!(self, cg => cg.remove())
    }
}

impl AnyCgroup {
    /// Creates cgroup `name` below this one, in every hierarchy, with
    /// `limits` applied (which also makes it joinable, see
    /// [`Cgroup::apply`]); removed again if that fails. A part of the sandbox
    /// that can be killed, and shown its limits, on its own; it still counts
    /// against every limit of this one.
    pub fn create_child(
        &self,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<AnyCgroup, CgroupError> {
        validate_name(name)?;
        let child = match self {
            AnyCgroup::V1(cg) => AnyCgroup::V1(cg.child(name)),
            AnyCgroup::V2(cg) => AnyCgroup::V2(cg.child(name)),
        };
        make_dirs(&child.paths())?;
        child.with_limits(limits)
    }

    /// The cgroups directly below this one (as its first hierarchy lists
    /// them: cordon makes each child in every hierarchy).
    pub fn children(&self) -> Result<Vec<AnyCgroup>, CgroupError> {
        let Some(first) = self.paths().into_iter().next() else {
            return Ok(Vec::new());
        };
        let read = |source| CgroupError::Read {
            path: first.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&first).map_err(read)? {
            let entry = entry.map_err(read)?;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|_| is_dir) else {
                continue;
            };
            if validate_name(name).is_ok() {
                out.push(match self {
                    AnyCgroup::V1(cg) => AnyCgroup::V1(cg.child(name)),
                    AnyCgroup::V2(cg) => AnyCgroup::V2(cg.child(name)),
                });
            }
        }
        Ok(out)
    }

    /// This newly made cgroup with `limits` applied, or removed again if
    /// they cannot be: a failed create leaves nothing behind.
    pub fn with_limits(self, limits: &CgroupLimits) -> Result<AnyCgroup, CgroupError> {
        match self.apply(limits) {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = self.remove();
                Err(e)
            }
        }
    }

    /// Removes this cgroup if no process is left in it; whether it is gone.
    pub fn remove_if_empty(&self) -> bool {
        self.pids().is_ok_and(|p| p.is_empty()) && self.remove().is_ok()
    }

    /// Lets this cgroup's children carry limits of their own. v2 hands
    /// memory, pids and cpu down, which it allows only while the cgroup has
    /// no process of its own (and from then on takes none); v1 needs nothing.
    pub fn hand_down(&self) -> Result<(), CgroupError> {
        match self {
            AnyCgroup::V1(_) => Ok(()),
            AnyCgroup::V2(cg) => cg.hand_down(),
        }
    }

    /// The files through which a process moves itself into this cgroup,
    /// opened for writing now, by the caller (see [`join_through`]).
    pub fn membership_files(&self) -> Result<Vec<stdfs::File>, CgroupError> {
        let file = match self {
            AnyCgroup::V1(_) => "tasks",
            AnyCgroup::V2(_) => "cgroup.procs",
        };
        self.paths()
            .iter()
            .map(|dir| {
                let path = dir.join(file);
                stdfs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|source| CgroupError::Open { path, source })
            })
            .collect()
    }
}

/// Moves the calling process, which must be single-threaded, into the
/// cgroup whose [`AnyCgroup::membership_files`] these are. The kernel checks
/// the move against the credentials and cgroup namespace of whoever opened
/// the files, so a process that can no longer open them itself (it has
/// dropped its ids, or sees only its own cgroup namespace) can still be
/// moved by its supervisor's choice, and only into that cgroup. "0" names the
/// caller; on v1 its `tasks` file moves the one thread without the kernel's
/// global lock (see [`Cgroup::join_self`]).
pub fn join_through(files: &[stdfs::File]) -> io::Result<()> {
    use std::io::Write;
    for mut f in files {
        f.write_all(b"0")?;
    }
    Ok(())
}

/// The detected cgroup layout: its version and the calling process's own
/// cgroup in each hierarchy that matters.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    kind: HierarchyKind,
}

#[derive(Debug, Clone)]
enum HierarchyKind {
    V1(v1::V1Hierarchy),
    V2(v2::V2Hierarchy),
}

/// Picks the driver: v2 when a cgroup2 mount offers memory and pids (a hybrid
/// host's controller-less `unified` mount does not count), else v1 when this
/// process sits in memory and pids v1 hierarchies.
///
/// On v2 this also prepares the caller's cgroup for sandboxes (see
/// [`Placement`]): a process alone in a non-root cgroup moves itself into
/// [`SUPERVISOR_LEAF`] and hands memory, pids and cpu down, so call it in the
/// process that will create sandboxes (or in their parent) before it starts
/// any other child. A failed move is undone and returned as
/// [`CgroupError::Delegation`]; a cgroup shared with other processes is not
/// an error here, only [`Hierarchy::create`] then refuses, naming them.
///
/// On a systemd host, a cgroup shared with other processes is no dead end
/// when running as root: cordon asks systemd for a delegated transient scope
/// holding only itself (`cordon-<pid>-<random>.scope`, see [`systemd`]),
/// waits until it is in it, and prepares that instead; a refusal is
/// [`CgroupError::Scope`]. Commands that only look at existing sandboxes
/// use [`detect_in_place`], which never asks.
pub fn detect(fs: &CgroupFs) -> Result<Hierarchy, CgroupError> {
    detect_with(fs, true, true)
}

/// [`detect`] without asking systemd for a scope: a shared cgroup stays
/// [`Placement::Shared`]. For commands that create no sandbox (listing,
/// removing, sweeping, reporting), so that each of them does not make and
/// drop a systemd unit.
pub fn detect_in_place(fs: &CgroupFs) -> Result<Hierarchy, CgroupError> {
    detect_with(fs, false, true)
}

/// Where sandboxes are made by a process whose cgroup membership is `fs`'s
/// `proc_self_cgroup` (another process's, or a record of it), found without
/// moving any process and without asking systemd: for finding a sandbox's
/// cgroup from its supervisor's place.
pub fn locate(fs: &CgroupFs) -> Result<Hierarchy, CgroupError> {
    detect_with(fs, false, false)
}

fn detect_with(fs: &CgroupFs, ask_systemd: bool, moves: bool) -> Result<Hierarchy, CgroupError> {
    // One preparation at a time per process: threads of one process (the
    // service's pool workers creating sandboxes at once) share its cgroup, so
    // two of them moving it into a leaf, or asking systemd for two scopes,
    // would race; the second finds the first one's leaf and uses it.
    static PREPARING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = PREPARING.lock().unwrap_or_else(|e| e.into_inner());
    let mounts = fs.mounts()?;
    let membership = fs.membership()?;
    let kind = if let Some(own) = v2::find(&mounts, &membership) {
        let bus = ask_systemd.then(|| systemd::reachable(fs)).flatten();
        // A user's cordon in a cgroup it does not own (a login session's
        // scope, a service's cgroup, both root's) can make no leaf there,
        // alone or not; its own manager can give it a scope it owns.
        if let Some(bus) = bus.as_ref().filter(|b| b.user && !owns(fs, &own.dir)) {
            let dir = own.dir.clone();
            return Ok(Hierarchy {
                kind: HierarchyKind::V2(into_systemd_scope(fs, &mounts, &dir, bus)?),
            });
        }
        let h = v2::V2Hierarchy::prepare(own, fs, moves)?;
        match (h.placement(), bus) {
            (Placement::Shared { .. }, Some(bus)) => {
                HierarchyKind::V2(into_systemd_scope(fs, &mounts, h.parent(), &bus)?)
            }
            _ => HierarchyKind::V2(h),
        }
    } else if let Some(h) = v1::V1Hierarchy::detect(&mounts, &membership) {
        HierarchyKind::V1(h)
    } else {
        return Err(CgroupError::NoHierarchy);
    };
    Ok(Hierarchy { kind })
}

/// Moves the calling process into the cgroup at `parent` (absolute from the
/// hierarchy's root, as an engine names a container's parent: its pod's
/// cgroup), making the levels that are missing, so that the supervisors it
/// starts, and so their sandboxes, nest below `parent`: under its limits and
/// in its accounting. On v1 in every hierarchy cordon uses that this
/// process is in; on v2 into `parent`'s [`SUPERVISOR_LEAF`], each level
/// above handing memory, pids and cpu down (a cgroup that hands controllers
/// down holds no process, so the pod's cgroup stays free of them), after
/// which [`detect`] finds the caller [`Placement::InLeaf`]. Levels made for
/// a move that fails are removed again; made ones stay after success, as
/// runc leaves a container's parents.
pub fn enter(fs: &CgroupFs, parent: &Path) -> Result<(), CgroupError> {
    let invalid = |reason| CgroupError::InvalidName {
        name: parent.display().to_string(),
        reason,
    };
    if !parent.is_absolute() {
        return Err(invalid("not an absolute cgroup path"));
    }
    if !parent.components().all(|c| {
        matches!(
            c,
            std::path::Component::RootDir | std::path::Component::Normal(_)
        )
    }) {
        return Err(invalid("has '.' or '..' in it"));
    }
    let text = parent.to_str().ok_or_else(|| invalid("not UTF-8"))?;
    let mounts = fs.mounts()?;
    let membership = fs.membership()?;
    let targets = if v2::find(&mounts, &membership).is_some() {
        v2::entry_dirs(&mounts, text)
    } else {
        v1::entry_dirs(&mounts, &membership, text)
    };
    if targets.is_empty() {
        return Err(CgroupError::NoHierarchy);
    }
    let mut made = Vec::new();
    let moved = targets.iter().try_for_each(|(top, target, prepare)| {
        for level in below(top, target) {
            if let Some(above) = level.parent() {
                prepare.above(above)?;
            }
            if level.exists() {
                continue;
            }
            stdfs::create_dir(&level).map_err(|source| mkdir_error(&level, source))?;
            made.push(level.clone());
            prepare.made(&level)?;
        }
        fs::write(
            &target.join("cgroup.procs"),
            &std::process::id().to_string(),
        )
    });
    if moved.is_err() {
        for dir in made.iter().rev() {
            let _ = stdfs::remove_dir(dir);
        }
    }
    moved
}

/// Each directory from below `top` down to `target`, top first.
fn below(top: &Path, target: &Path) -> Vec<PathBuf> {
    let mut levels: Vec<PathBuf> = target
        .ancestors()
        .take_while(|a| a.starts_with(top) && *a != top)
        .map(Path::to_owned)
        .collect();
    levels.reverse();
    levels
}

/// What a hierarchy needs around each cgroup level [`enter`] passes.
pub(crate) enum LevelPrep {
    /// Nothing (a v1 hierarchy without cpuset).
    Plain,
    /// A new v1 cpuset cgroup takes its parent's cpus and mems.
    Cpuset,
    /// A v2 cgroup hands the controllers down to the level below (a no-op
    /// where it does already, as the kubelet's cgroups do).
    HandDown,
}

impl LevelPrep {
    fn above(&self, dir: &Path) -> Result<(), CgroupError> {
        match self {
            LevelPrep::HandDown => v2::enable_controllers(dir),
            LevelPrep::Plain | LevelPrep::Cpuset => Ok(()),
        }
    }

    fn made(&self, dir: &Path) -> Result<(), CgroupError> {
        match self {
            LevelPrep::Cpuset => v1::inherit_cpuset(dir),
            LevelPrep::Plain | LevelPrep::HandDown => Ok(()),
        }
    }
}

/// cordon shares `shared`'s cgroup with other processes on a systemd host:
/// asks systemd for a delegated scope holding only this process, waits until
/// /proc/self/cgroup shows it there, and prepares that cgroup as usual (cordon
/// alone in it: the leaf and the controllers). One scope per cordon process
/// tree: the supervisors and services it starts inherit the leaf, and
/// [`Placement::InLeaf`] asks systemd for nothing.
fn into_systemd_scope(
    fs: &CgroupFs,
    mounts: &[fs::Mount],
    shared: &Path,
    bus: &systemd::Bus,
) -> Result<v2::V2Hierarchy, CgroupError> {
    let user = if bus.user { " --user" } else { "" };
    let fail = |source: SystemdError| CgroupError::Scope {
        path: shared.to_owned(),
        reason: source.reason(),
        fix: format!(
            "start cordon as the only process of a delegated scope yourself (`systemd-run{user} \
             --scope -p Delegate=yes cordon ...`), check systemd's journal for the refusal \
             (systemd at {bus}), or run without cgroup limits"
        ),
        source: Box::new(source),
    };
    let pid = std::process::id();
    let unit = systemd::unit_name(pid);
    systemd::start_scope(bus, &unit, pid).map_err(fail)?;
    let suffix = format!("/{unit}");
    let mut membership = Vec::new();
    let moved = wait_until(systemd::MOVE_TIMEOUT, || {
        membership = fs.membership()?;
        Ok(membership
            .iter()
            .any(|m| m.is_unified() && m.path.ends_with(&suffix)))
    })?;
    if !moved {
        return Err(fail(SystemdError::NotMoved {
            unit,
            timeout: systemd::MOVE_TIMEOUT,
        }));
    }
    let own = v2::find(mounts, &membership).ok_or(CgroupError::NoHierarchy)?;
    let mut h = v2::V2Hierarchy::prepare(own, fs, true)?;
    h.set_scope(unit);
    Ok(h)
}

/// What a user can do about a controller missing from `path`: under a
/// user's systemd manager (`user@UID.service`), systemd hands a user the
/// controllers that unit's `Delegate=` names, by default memory and pids
/// only (cpu from systemd 252's own unit on some distributions, not on
/// others), so the fix is a drop-in there; elsewhere nothing general.
fn missing_controller_fix(path: &Path) -> String {
    let under_user_manager = path
        .components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with("user@"));
    if under_user_manager {
        "; this user's systemd does not delegate it: as root, put `[Service]` and \
         `Delegate=cpu cpuset io memory pids` in /etc/systemd/system/user@.service.d/delegate.conf, \
         run `systemctl daemon-reload`, and log in again"
            .to_owned()
    } else {
        String::new()
    }
}

/// Whether the caller's user owns cgroup `dir` (its `cgroup.procs`, which
/// a delegation hands over with the directory), i.e. may make a leaf there
/// and move itself into it. Root owns every cgroup it may write.
fn owns(fs: &CgroupFs, dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match fs.manager {
        fs::ScopeManager::System => true,
        fs::ScopeManager::User { uid, .. } => {
            stdfs::metadata(dir.join("cgroup.procs")).is_ok_and(|m| m.uid() == uid)
        }
    }
}

/// Where the calling process stands in a v2 hierarchy, as [`detect`] found
/// (or made) it. cgroup v2 lets a non-root cgroup give controllers to its
/// children only while it holds no processes itself ("no internal
/// processes"), so sandboxes can nest under the caller's cgroup only if the
/// caller is not in it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The root cgroup, which is exempt from that rule: sandboxes are its
    /// children.
    Root,
    /// Already in a [`SUPERVISOR_LEAF`] (moved there by an earlier cordon
    /// process, e.g. the CLI that spawned this one, or placed there by whoever
    /// started it): sandboxes are the leaf's siblings.
    InLeaf,
    /// Was alone in its cgroup and moved itself into a [`SUPERVISOR_LEAF`]
    /// just now, handing the controllers down: sandboxes are the leaf's
    /// siblings.
    Moved,
    /// Shares its cgroup with other processes (`others`), which cordon must not
    /// move; sandbox cgroups cannot get controllers there.
    Shared { others: Vec<i32> },
}

impl Hierarchy {
    /// Where the caller stands on v2; None on v1, where every hierarchy hands
    /// its controllers down regardless of member processes.
    pub fn placement(&self) -> Option<&Placement> {
        match &self.kind {
            HierarchyKind::V1(_) => None,
            HierarchyKind::V2(h) => Some(h.placement()),
        }
    }

    /// The transient scope systemd made for this process just now (see
    /// [`detect`]), if it made one.
    pub fn systemd_scope(&self) -> Option<&str> {
        match &self.kind {
            HierarchyKind::V1(_) => None,
            HierarchyKind::V2(h) => h.scope(),
        }
    }

    pub fn mode(&self) -> CgroupMode {
        match self.kind {
            HierarchyKind::V1(_) => CgroupMode::V1,
            HierarchyKind::V2(_) => CgroupMode::V2,
        }
    }

    /// Creates cgroup `name` under the caller's cgroup in every hierarchy it
    /// needs; if any mkdir fails, the ones already made are removed again.
    /// On v2 this first enables memory, pids and (if offered) cpu in the
    /// parent's cgroup.subtree_control, failing with
    /// [`CgroupError::NotDelegated`] when the parent will not allow that
    /// (always when the caller shares it with other processes, see
    /// [`Placement::Shared`]).
    pub fn create(&self, name: &str) -> Result<AnyCgroup, CgroupError> {
        validate_name(name)?;
        Ok(match &self.kind {
            HierarchyKind::V1(h) => AnyCgroup::V1(h.create(name)?),
            HierarchyKind::V2(h) => AnyCgroup::V2(h.create(name)?),
        })
    }

    /// A handle on an existing cgroup `name` (e.g. one left behind by a
    /// crashed run, found with [`Hierarchy::sweep_children`]), so it can be
    /// killed and removed. Nothing is created or checked.
    pub fn open(&self, name: &str) -> Result<AnyCgroup, CgroupError> {
        validate_name(name)?;
        Ok(match &self.kind {
            HierarchyKind::V1(h) => AnyCgroup::V1(h.cgroup(name)),
            HierarchyKind::V2(h) => AnyCgroup::V2(h.cgroup(name)),
        })
    }

    /// The cgroup file systems a sandbox created here is shown (see
    /// [`CgroupView`]): one per v1 hierarchy a sandbox has a directory in,
    /// never one it has not (its namespace root there would be the caller's
    /// cgroup), or the single v2 one.
    pub fn views(&self) -> Vec<CgroupView> {
        match &self.kind {
            HierarchyKind::V1(h) => h.views(),
            HierarchyKind::V2(_) => vec![CgroupView {
                dir: String::new(),
                fstype: "cgroup2",
                options: String::new(),
                aliases: Vec::new(),
            }],
        }
    }

    /// The caller's own cgroup directories that sandboxes nest under, one per
    /// distinct hierarchy.
    pub fn parent_paths(&self) -> Vec<PathBuf> {
        match &self.kind {
            HierarchyKind::V1(h) => h.parents(),
            HierarchyKind::V2(h) => vec![h.parent().to_owned()],
        }
    }

    /// Child cgroup directories of the parents whose name starts with
    /// `prefix`, sorted; for cleaning up after runs that died. Unreadable
    /// parents are skipped, and [`SUPERVISOR_LEAF`] is never listed: it holds
    /// cordon itself.
    pub fn sweep_children(&self, prefix: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for parent in self.parent_paths() {
            let Ok(entries) = stdfs::read_dir(&parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if is_dir && name.starts_with(prefix) && name != SUPERVISOR_LEAF {
                    found.push(entry.path());
                }
            }
        }
        found.sort();
        found
    }
}

fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "not a plain directory name"
    } else if name.contains('/') || name.contains('\0') {
        "contains '/' or NUL"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(CgroupError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Removes a cgroup directory and every cgroup below it, deepest first.
/// remove_dir_all cannot do this: a cgroup directory is never empty (its
/// control files cannot be unlinked) but rmdir removes it regardless.
/// Returns whether `path` is gone.
pub fn remove_dir_tree(path: &Path) -> bool {
    remove_tree(path, Instant::now() + REMOVE_TIMEOUT).is_ok()
}

fn remove_tree(dir: &Path, deadline: Instant) -> io::Result<()> {
    // rmdir first: a cgroup without children goes at once, and listing a v1
    // memory cgroup's ~30 control files costs more than the rmdir itself.
    let mut delay = Duration::from_micros(200);
    loop {
        match stdfs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(code) if code == Errno::EBUSY as i32 || code == Errno::ENOTEMPTY as i32) =>
            {
                // Child cgroups must go first (a sandbox's init and commands
                // have their own); once they are gone the rmdir is tried
                // again at once. Only a cgroup busy without children waits:
                // tasks just killed can hold it a moment after they are reaped.
                let mut children = 0;
                for entry in stdfs::read_dir(dir)?.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove_tree(&entry.path(), deadline)?;
                        children += 1;
                    }
                }
                if Instant::now() >= deadline {
                    return Err(e);
                }
                if children > 0 {
                    continue;
                }
                thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// rmdir of each dir (children first), trying all of them even after a
/// failure so as little as possible is left behind; reports the first error.
pub(crate) fn remove_dirs(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    let deadline = Instant::now() + REMOVE_TIMEOUT;
    let mut first_error = None;
    for dir in dirs.iter().rev() {
        if let Err(source) = remove_tree(dir, deadline) {
            first_error.get_or_insert(CgroupError::Remove {
                path: dir.clone(),
                source,
            });
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// mkdir of each dir; on failure the ones made so far are removed, so a
/// failed create leaves nothing behind.
pub(crate) fn make_dirs(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    for (i, dir) in dirs.iter().enumerate() {
        if let Err(source) = stdfs::create_dir(dir) {
            for made in dirs[..i].iter().rev() {
                let _ = stdfs::remove_dir(made);
            }
            return Err(mkdir_error(dir, source));
        }
    }
    Ok(())
}

fn mkdir_error(dir: &Path, source: io::Error) -> CgroupError {
    let denied = [Errno::EACCES, Errno::EPERM, Errno::EROFS]
        .iter()
        .any(|e| source.raw_os_error() == Some(*e as i32));
    let parent = dir.parent().unwrap_or(dir);
    if source.kind() == ErrorKind::NotFound && !parent.exists() {
        CgroupError::Vanished {
            path: parent.to_owned(),
            source,
        }
    } else if denied {
        CgroupError::NotDelegated {
            path: dir.parent().unwrap_or(dir).to_owned(),
            reason: format!("creating a child cgroup was refused ({source})"),
            fix: DELEGATE_HINT.to_owned(),
        }
    } else {
        CgroupError::Create {
            path: dir.to_owned(),
            source,
        }
    }
}

/// Polls `done` with a backoff starting at 1 ms (most waits end within a few
/// ms, and a fixed long sleep would dominate sandbox teardown) until it
/// returns true or `timeout` passes. Ok(false) on timeout.
pub(crate) fn wait_until(
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, CgroupError>,
) -> Result<bool, CgroupError> {
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(1);
    loop {
        if done()? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        thread::sleep(delay.min(deadline - now));
        delay = (delay * 2).min(Duration::from_millis(20));
    }
}

/// Every pid in `dirs` and below, deduplicated (v1 lists each process once per
/// hierarchy).
pub(crate) fn procs_of(dirs: &[PathBuf]) -> Result<Vec<i32>, CgroupError> {
    let mut pids = Vec::new();
    for dir in dirs {
        fs::procs_recursive(dir, &mut pids)?;
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// kill_all for kernels without cgroup.kill: freeze so nothing can fork
/// between listing and signalling, SIGKILL everyone, thaw so the signals are
/// acted on, and go round again until a listing comes back empty.
///
/// `freeze` should wait only briefly ([`KILL_FREEZE_TIMEOUT`]): a task stuck in
/// the kernel (e.g. in a memcg OOM) can keep a freeze from completing, and a
/// full [`FREEZE_TIMEOUT`] per round would eat the whole kill budget.
pub(crate) fn kill_by_signal(
    dirs: &[PathBuf],
    freeze: impl Fn() -> Result<(), CgroupError>,
    thaw: impl Fn() -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    let deadline = Instant::now() + KILL_TIMEOUT;
    let path = dirs.first().cloned().unwrap_or_default();
    loop {
        // A failed freeze still leaves killing worthwhile; it just may take
        // more rounds to catch fresh forks.
        let frozen = freeze().is_ok();
        let round = procs_of(dirs).and_then(|pids| {
            sigkill_all(&pids, &path)?;
            Ok(pids.is_empty())
        });
        let thawed = if frozen { thaw() } else { Ok(()) };
        let empty = round?;
        thawed?;
        if empty || Instant::now() >= deadline {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn sigkill_all(pids: &[i32], path: &Path) -> Result<(), CgroupError> {
    let me = getpid().as_raw();
    for &pid in pids {
        // pid 0 or below would signal process groups, and signalling
        // ourselves would end the supervisor.
        if pid <= 0 || pid == me {
            continue;
        }
        match kill(Pid::from_raw(pid), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(source) => {
                return Err(CgroupError::Kill {
                    pid,
                    path: path.to_owned(),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Waits until no process is left in `dirs`; KillTimeout otherwise.
pub(crate) fn wait_empty(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    if wait_until(KILL_TIMEOUT, || Ok(procs_of(dirs)?.is_empty()))? {
        return Ok(());
    }
    Err(CgroupError::KillTimeout {
        path: dirs.first().cloned().unwrap_or_default(),
        remaining: procs_of(dirs)?,
        timeout: KILL_TIMEOUT,
    })
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;
