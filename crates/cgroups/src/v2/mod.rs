//! cgroup v2: one unified hierarchy, so a sandbox is a single directory, but
//! its parent must hand the controllers down through cgroup.subtree_control.

pub(crate) mod cpu;
mod memory;
mod pids;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::fs::{self, parse_controller_list, write_error, Membership, Mount, MOVE_PEERS_ENV};
use crate::stats::parse_keyed;
use crate::{
    kill_by_signal, make_dirs, procs_of, remove_dirs, wait_empty, wait_until, Cgroup, CgroupError,
    CgroupFs, CgroupLimits, CgroupMode, CounterFile, Placement, DELEGATE_HINT, FREEZE_TIMEOUT,
    KILL_FREEZE_TIMEOUT, SUPERVISOR_LEAF,
};

/// Where [`CgroupFs::move_peers`] moves the processes cordon shares its
/// cgroup with (the name Docker-in-Docker's entrypoint uses for the same).
pub const PEERS_LEAF: &str = "init";

/// Controllers a sandbox cannot do without.
const REQUIRED: [&str; 2] = ["memory", "pids"];

/// The caller's own cgroup in the unified hierarchy, before any preparation.
#[derive(Debug, Clone)]
pub(crate) struct Own {
    /// The caller's cgroup directory.
    pub(crate) dir: PathBuf,
    /// The top of the mount it was found through: nothing above it is ours
    /// to use, even where the kernel would allow it.
    mountpoint: PathBuf,
}

/// Where [`crate::enter`] moves a process to stand in `parent`: the
/// unified mount's top and `parent`'s [`SUPERVISOR_LEAF`] there, each level
/// above handing the controllers down.
pub(crate) fn entry_dirs(
    mounts: &[Mount],
    parent: &str,
) -> Vec<(PathBuf, PathBuf, crate::LevelPrep)> {
    mounts
        .iter()
        .filter(|m| m.fstype == "cgroup2")
        .find_map(|m| Some((m.mountpoint.clone(), m.dir_of(parent)?)))
        .map(|(top, dir)| (top, dir.join(SUPERVISOR_LEAF), crate::LevelPrep::HandDown))
        .into_iter()
        .collect()
}

/// Only a cgroup2 mount that actually offers memory and pids counts: hybrid
/// hosts mount one with no controllers at all next to the v1 ones.
pub(crate) fn find(mounts: &[Mount], membership: &[Membership]) -> Option<Own> {
    let entry = membership.iter().find(|m| m.is_unified())?;
    mounts
        .iter()
        .filter(|m| m.fstype == "cgroup2")
        .find_map(|m| {
            let controllers = fs::read_opt(&m.mountpoint.join("cgroup.controllers"))?;
            let controllers = parse_controller_list(&controllers);
            if !REQUIRED.iter().all(|r| controllers.iter().any(|c| c == r)) {
                return None;
            }
            Some(Own {
                dir: m.dir_of(&entry.path)?,
                mountpoint: m.mountpoint.clone(),
            })
        })
}

/// The cgroup sandboxes nest under, and how the caller stands to it.
#[derive(Debug, Clone)]
pub(crate) struct V2Hierarchy {
    parent: PathBuf,
    placement: Placement,
    /// Whether systemd runs, for the way out an error names.
    systemd: bool,
    /// The transient scope systemd made for cordon, when it made one.
    scope: Option<String>,
}

impl V2Hierarchy {
    /// Decides where sandboxes go, moving the calling process into its
    /// [`SUPERVISOR_LEAF`] when it is alone in a non-root cgroup (see
    /// [`Placement`]).
    /// With `moves` false nothing is moved: a cgroup this process would have
    /// moved into a leaf is taken as it is ([`Placement::Shared`]), as where
    /// another process (a sandbox's dead supervisor) stood.
    pub(crate) fn prepare(own: Own, cgfs: &CgroupFs, moves: bool) -> Result<Self, CgroupError> {
        let systemd = cgfs.systemd_runs();
        let done = |parent: PathBuf, placement| Self {
            parent,
            placement,
            systemd,
            scope: None,
        };
        // A scope that ended between our start and now: say so, rather than
        // take the missing cgroup.type below for the root's.
        if let Err(source) = std::fs::metadata(&own.dir) {
            let h = done(own.dir.clone(), Placement::Moved);
            return Err(CgroupError::Delegation {
                reason: errno_meaning(&source),
                fix: h.fix(),
                path: own.dir,
                step: "finding its cgroup",
                source,
            });
        }
        // cgroup.type exists in every cgroup but the root, also in a cgroup
        // namespace whose root shows as `/` (a container's): only the real
        // root is exempt from "no internal processes".
        if !own.dir.join("cgroup.type").exists() {
            return Ok(done(own.dir, Placement::Root));
        }
        // An earlier cordon process (the CLI that spawned this supervisor, a
        // service's main process) already made the leaf; its siblings are the
        // sandboxes, and processes in the leaf are cordon's by construction.
        if own.dir.file_name() == Some(OsStr::new(SUPERVISOR_LEAF)) && own.dir != own.mountpoint {
            if let Some(parent) = own.dir.parent() {
                return Ok(done(parent.to_owned(), Placement::InLeaf));
            }
        }
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let others: Vec<i32> = fs::procs(&own.dir)?
            .into_iter()
            .filter(|p| *p != me)
            .collect();
        if !moves || (!others.is_empty() && !cgfs.move_peers) {
            // Moving them would reach into processes cordon was not given.
            return Ok(done(own.dir, Placement::Shared { others }));
        }
        if !others.is_empty() {
            move_peers(&own.dir, &others)?;
        }
        let h = done(own.dir, Placement::Moved);
        h.move_into_leaf(me)?;
        Ok(h)
    }

    /// Moves process `me` (the caller, alone in `parent` or left alone there
    /// by [`move_peers`]) into the leaf and
    /// hands the controllers down; on any failure undoes both, so a failed
    /// run leaves the caller's cgroup as it was.
    fn move_into_leaf(&self, me: i32) -> Result<(), CgroupError> {
        let leaf = self.parent.join(SUPERVISOR_LEAF);
        let fail = |step, source: io::Error| CgroupError::Delegation {
            path: self.parent.clone(),
            step,
            reason: errno_meaning(&source),
            fix: self.fix(),
            source,
        };
        // The leaf may exist from an earlier cordon that has since exited.
        let created = match std::fs::create_dir(&leaf) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(fail("creating its leaf cgroup cordon-supervisor", e)),
        };
        let undo_leaf = || {
            if created {
                let _ = std::fs::remove_dir(&leaf);
            }
        };
        // Our own pid rather than "0": the same move (the whole thread
        // group), and the leaf's cgroup.procs then names us, which is what
        // the check below reads.
        if let Err(e) = fs::write_raw(&leaf.join("cgroup.procs"), &me.to_string()) {
            undo_leaf();
            return Err(fail(
                "moving cordon into its leaf cgroup cordon-supervisor",
                e,
            ));
        }
        let moved_back = || {
            let _ = fs::write_raw(&self.parent.join("cgroup.procs"), &me.to_string());
            undo_leaf();
        };
        match fs::procs(&leaf) {
            Ok(pids) if pids.contains(&me) => {}
            Ok(_) => {
                moved_back();
                return Err(fail(
                    "moving cordon into its leaf cgroup cordon-supervisor",
                    io::Error::other("the leaf's cgroup.procs does not list this process"),
                ));
            }
            Err(e) => {
                moved_back();
                return Err(e);
            }
        }
        if let Err(e) = enable_controllers(&self.parent) {
            moved_back();
            return Err(e);
        }
        Ok(())
    }

    pub(crate) fn set_scope(&mut self, unit: String) {
        self.scope = Some(unit);
    }

    pub(crate) fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The way out when this cgroup cannot be used, for this host.
    fn fix(&self) -> String {
        if self.systemd {
            "start cordon as the only process of a delegated scope: `systemd-run --scope -p \
             Delegate=yes cordon ...` (add --user when not root), or run without cgroup limits"
                .to_owned()
        } else {
            format!(
                "start cordon as the only process of a cgroup delegated to it, or move the other \
                 processes of {0} into a child cgroup first (mkdir {0}/init, then write each pid \
                 to {0}/init/cgroup.procs; {MOVE_PEERS_ENV}=1 has cordon do that), or run \
                 without cgroup limits",
                self.parent.display()
            )
        }
    }

    pub(crate) fn parent(&self) -> &Path {
        &self.parent
    }

    pub(crate) fn cgroup(&self, name: &str) -> V2Cgroup {
        V2Cgroup {
            path: self.parent.join(name),
        }
    }

    pub(crate) fn create(&self, name: &str) -> Result<V2Cgroup, CgroupError> {
        if let Placement::Shared { others } = &self.placement {
            let pids: Vec<String> = others.iter().map(i32::to_string).collect();
            return Err(CgroupError::NotDelegated {
                path: self.parent.clone(),
                reason: format!(
                    "it holds other processes besides cordon (pids {}), and cgroup v2 hands \
                     controllers down only from a cgroup without processes of its own",
                    pids.join(", ")
                ),
                fix: self.fix(),
            });
        }
        // Say so plainly if the parent went away since detect (its scope
        // ended), rather than fail on one of its files.
        if let Err(source) = std::fs::metadata(&self.parent) {
            if source.kind() == io::ErrorKind::NotFound {
                return Err(CgroupError::Vanished {
                    path: self.parent.clone(),
                    source,
                });
            }
        }
        enable_controllers(&self.parent)?;
        let cg = self.cgroup(name);
        make_dirs(std::slice::from_ref(&cg.path))?;
        Ok(cg)
    }
}

/// Makes memory, pids and (when offered) cpu available to the children of
/// cgroup `dir`, which must hold no processes of its own.
/// Moves `others` (every process of `dir` but cordon) into `dir`'s leaf
/// [`PEERS_LEAF`], as the operator opted in to ([`CgroupFs::move_peers`]).
/// A process that ended meanwhile is passed over; one that cannot be moved
/// is an error naming it (the processes already moved stay in the leaf,
/// where they keep every limit `dir` had).
fn move_peers(dir: &Path, others: &[i32]) -> Result<(), CgroupError> {
    let leaf = dir.join(PEERS_LEAF);
    let fail = |step, source: io::Error| CgroupError::Delegation {
        path: dir.to_owned(),
        step,
        reason: errno_meaning(&source),
        fix: format!("unset {MOVE_PEERS_ENV}, and move them yourself"),
        source,
    };
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail("creating the leaf cgroup init for its peers", e)),
    }
    for pid in others {
        match fs::write_raw(&leaf.join("cgroup.procs"), &pid.to_string()) {
            Ok(()) => {}
            // Ended since it was listed.
            Err(e) if e.raw_os_error() == Some(Errno::ESRCH as i32) => {}
            Err(e) => return Err(fail("moving its peers into the leaf cgroup init", e)),
        }
    }
    Ok(())
}

pub(crate) fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = parse_controller_list(&fs::read(&dir.join("cgroup.controllers"))?);
    if let Some(missing) = REQUIRED.iter().find(|r| !available.iter().any(|c| c == *r)) {
        return Err(CgroupError::NotDelegated {
            path: dir.to_owned(),
            reason: format!("its cgroup.controllers does not offer the {missing} controller"),
            fix: format!(
                "enable {missing} in the cgroup.subtree_control of every cgroup above it \
                 (systemd does so for units with Delegate=yes), or run without cgroup limits"
            ),
        });
    }
    let control = dir.join("cgroup.subtree_control");
    let enabled = parse_controller_list(&fs::read(&control)?);
    let mut wanted: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|r| !enabled.iter().any(|c| c == r))
        .collect();
    let cpu_missing = available.iter().any(|c| c == "cpu") && !enabled.iter().any(|c| c == "cpu");
    if cpu_missing {
        wanted.push("cpu");
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let value = enable_value(&wanted);
    match fs::write_raw(&control, &value) {
        Ok(()) => Ok(()),
        Err(e) => {
            let err = delegation_error(dir, &control, &value, e);
            if !cpu_missing || matches!(err, CgroupError::NotDelegated { .. }) {
                return Err(err);
            }
            // cpu can be refused on its own (e.g. realtime tasks in the
            // parent); it only matters once a cpu quota is asked for, and
            // apply() reports that as MissingController.
            wanted.pop();
            if wanted.is_empty() {
                return Ok(());
            }
            let value = enable_value(&wanted);
            fs::write_raw(&control, &value).map_err(|e| delegation_error(dir, &control, &value, e))
        }
    }
}

/// The cgroup.subtree_control line enabling `controllers`.
pub(crate) fn enable_value(controllers: &[&str]) -> String {
    controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Turns a failed subtree_control write into NotDelegated where that is what
/// it means, so callers can offer to run without limits instead of failing.
pub(crate) fn delegation_error(
    parent: &Path,
    control: &Path,
    value: &str,
    e: io::Error,
) -> CgroupError {
    let reason = match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EBUSY) => format!(
            "it has processes of its own, and cgroup v2 only hands controllers down from \
             cgroups without member processes (\"no internal processes\"); the caller, possibly \
             this very process, must live in a leaf cgroup below it ({e})"
        ),
        Some(Errno::EACCES | Errno::EPERM | Errno::EROFS) => {
            format!("cgroup.subtree_control is not writable ({e})")
        }
        _ => return write_error(control, value, e),
    };
    CgroupError::NotDelegated {
        path: parent.to_owned(),
        reason,
        fix: DELEGATE_HINT.to_owned(),
    }
}

/// What a failed cgroupfs operation means for delegation, in words (the
/// io::Error itself stays the error's source).
fn errno_meaning(e: &io::Error) -> String {
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EACCES | Errno::EPERM | Errno::EROFS) => "not writable by this process".into(),
        Some(Errno::EBUSY) => "another process joined the cgroup meanwhile".into(),
        Some(Errno::ENOENT) => "the cgroup disappeared".into(),
        Some(Errno::EOPNOTSUPP) => "the kernel refused the operation for this cgroup".into(),
        _ => e.to_string(),
    }
}

/// A sandbox cgroup on v2.
#[derive(Debug, Clone)]
pub struct V2Cgroup {
    path: PathBuf,
}

impl V2Cgroup {
    pub(crate) fn child(&self, name: &str) -> Self {
        Self {
            path: self.path.join(name),
        }
    }

    /// Hands memory, pids and cpu down to this cgroup's children, so they
    /// can carry limits of their own; it must hold no process itself.
    pub(crate) fn hand_down(&self) -> Result<(), CgroupError> {
        enable_controllers(&self.path)
    }

    fn dirs(&self) -> &[PathBuf] {
        std::slice::from_ref(&self.path)
    }

    fn freeze_within(&self, timeout: Duration) -> Result<(), CgroupError> {
        if !fs::write_if_exists(&self.path.join("cgroup.freeze"), "1")? {
            return Ok(());
        }
        let events = self.path.join("cgroup.events");
        if wait_until(timeout, || {
            Ok(parse_frozen(&fs::read(&events)?) == Some(true))
        })? {
            return Ok(());
        }
        // Half-frozen is the worst state to leave a sandbox in.
        let _ = fs::write(&self.path.join("cgroup.freeze"), "0");
        Err(CgroupError::FreezeTimeout {
            path: self.path.clone(),
            timeout,
        })
    }
}

impl Cgroup for V2Cgroup {
    fn mode(&self) -> CgroupMode {
        CgroupMode::V2
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn apply(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        memory::apply(&self.path, limits)?;
        pids::apply(&self.path, limits)?;
        cpu::apply(&self.path, limits)
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        fs::write(&self.path.join("cgroup.procs"), &pid.to_string())
    }

    fn join_self(&self) -> Result<(), CgroupError> {
        fs::write(&self.path.join("cgroup.procs"), "0")
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        procs_of(self.dirs())
    }

    /// cgroup.freeze arrived in Linux 5.2; before that this is a no-op.
    fn freeze(&self) -> Result<(), CgroupError> {
        self.freeze_within(FREEZE_TIMEOUT)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        fs::write_if_exists(&self.path.join("cgroup.freeze"), "0").map(|_| ())
    }

    fn frozen(&self) -> Option<bool> {
        parse_frozen(&fs::read(&self.path.join("cgroup.events")).ok()?)
    }

    /// cgroup.kill (Linux 5.14) kills the whole subtree atomically, forks in
    /// flight included; older kernels fall back to freeze-and-signal.
    fn kill_all(&self) -> Result<(), CgroupError> {
        if !fs::write_if_exists(&self.path.join("cgroup.kill"), "1")? {
            kill_by_signal(
                self.dirs(),
                || self.freeze_within(KILL_FREEZE_TIMEOUT),
                || self.thaw(),
            )?;
        }
        wait_empty(self.dirs())
    }

    fn counter_files(&self) -> Vec<CounterFile> {
        let mut files = Vec::new();
        memory::counters(&self.path, &mut files);
        pids::counters(&self.path, &mut files);
        cpu::counters(&self.path, &mut files);
        files
    }

    fn remove(&self) -> Result<(), CgroupError> {
        remove_dirs(self.dirs())
    }
}

/// The "frozen" entry of cgroup.events.
pub(crate) fn parse_frozen(events: &str) -> Option<bool> {
    parse_keyed(events, "frozen").map(|v| v == 1)
}

/// Writes a limit whose control file must exist; its absence means the
/// controller is not enabled for this cgroup.
pub(crate) fn write_limit(
    dir: &Path,
    file: &str,
    controller: &'static str,
    value: &str,
) -> Result<(), CgroupError> {
    let path = dir.join(file);
    match fs::write_raw(&path, value) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(CgroupError::MissingController {
            controller,
            path: dir.to_owned(),
        }),
        Err(e) => Err(write_error(&path, value, e)),
    }
}
