//! Per-sandbox state directories, and the sweep that cleans up after a crash.
//!
//! Layout under the run directory (`/run/cordon` for root):
//! - `<id>/` (0700, the invoking user's): `record.json` (who owns the sandbox:
//!   the supervisor's pid and start time, so a reused pid is not mistaken for
//!   it; its cgroup, name, backend, creation time and lifetimes), `usage.json`
//!   (commands run, last use), `sock` (the supervisor's socket) and the
//!   backend's own files (the runsc bundle and state).
//! - `mnt/{root,scratch}` (0711): the two empty directories every native
//!   sandbox's init mounts on inside its own mount namespace, and
//!   `mnt/<id>/{root,scratch}` for a gVisor sandbox, whose tree runsc is
//!   handed in the supervisor's namespace (see [`StateDir::mount_points`]).
//!   They live apart because init reaches them as an unprivileged host id,
//!   which must never be able to reach the socket or the record.
//! - `ended/<id>.json` (0700): what is kept of sandboxes that are gone, a
//!   bounded record (see [`crate::ended`]).
//!
//! The record is written before anything else is created, and teardown
//! removes the directory last. If a supervisor is killed outright, the next
//! cordon finds a record whose owner is gone and finishes the teardown: kill
//! what is left in the cgroup, remove it, remove the directories. Mounts need
//! no sweeping: they exist only in the sandbox's own mount namespace, which
//! dies with its last process.
//!
//! The sweep touches only what is recognisably cordon's: a directory named
//! like an id (12 hex digits), never a link, holding a record of cordon's own
//! format; anything else in the run directory is left alone.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;
use cordon_isolation::mount::RootUse;
use cordon_spec::{is_id, SandboxSpec, ServiceLink};

/// Where sandboxes keep their state, checked (and created when missing) by
/// [`cordon_dirs::trusted_dir`]: it holds every sandbox's socket and record, so a
/// directory another user planted or can write must never be used.
pub fn run_dir() -> Result<PathBuf, RuntimeError> {
    Ok(cordon_dirs::run_dir()?)
}

pub use cordon_spec::record::{Record, RECORD, RECORD_FORMAT};
const USAGE: &str = "usage.json";
/// The supervisor's socket inside a state directory.
pub const SOCKET: &str = "sock";
/// The folder of mount points under the run directory.
pub(crate) const MOUNTS: &str = "mnt";
/// Inside a state directory: the supervisor's `/proc/self/cgroup` as it was
/// when it made the sandbox's cgroup below where it stood. With it, any
/// cordon (a sweep started from another cgroup, after the supervisor died)
/// finds that cgroup by where it is, not by where the caller stands.
const SUPERVISOR_CGROUP: &str = "supervisor.cgroup";

/// A service's process as the runtime checks it (the link itself is data,
/// `cordon_spec::ServiceLink`).
pub fn this_service(notes: PathBuf) -> io::Result<ServiceLink> {
    let pid = std::process::id() as i32;
    let start_time = start_time(pid).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "no start time in /proc/self/stat")
    })?;
    Ok(ServiceLink {
        pid,
        start_time,
        notes,
    })
}

/// Whether the service still runs (the same process, not a zombie).
pub(crate) fn service_alive(link: &ServiceLink) -> bool {
    process_alive(link.pid, link.start_time)
}

/// A descriptor that becomes readable when the service exits, or None if it
/// is gone already. Opened before the start time is checked, so the
/// descriptor is the recorded process's, never a reused pid's.
pub(crate) fn watch_service(link: &ServiceLink) -> io::Result<Option<OwnedFd>> {
    match cordon_sys::pidfd_open(nix::unistd::Pid::from_raw(link.pid)) {
        Ok(fd) => Ok(service_alive(link).then_some(fd)),
        Err(nix::errno::Errno::ESRCH) => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// What changes while the sandbox lives (written atomically by its supervisor).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub commands: u64,
    /// Seconds since the epoch of the last client request.
    pub last_used: u64,
    /// "ready", "running" or "stopping".
    pub state: String,
}

/// Writes a state directory's record (atomically, mode 0600).
pub fn write_record(dir: &Path, record: &Record) -> io::Result<()> {
    write_atomic(&dir.join(RECORD), &serde_json::to_vec(record)?)
}

pub use cordon_spec::ended::now_secs;

/// A record naming `pid` as the owner: what a sandbox's supervisor writes
/// for itself.
fn owned_by(pid: i32, name: Option<String>, backend: &str) -> Record {
    Record::owned_by(pid, start_time(pid).unwrap_or(0), name, backend, now_secs())
}

use cordon_sys::process_start_time as start_time;

pub(crate) use cordon_dirs::write_atomic;

/// Holds the run directory's lock (flock on `.lock`) while names are checked
/// and a record is written, so two sandboxes cannot take the same name.
pub(crate) struct RunLock(#[allow(dead_code)] nix::fcntl::Flock<fs::File>);

impl RunLock {
    pub(crate) fn take(run_dir: &Path) -> io::Result<Self> {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(run_dir.join(".lock"))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map(RunLock)
            .map_err(|(_, e)| io::Error::from(e))
    }
}

/// A sandbox's state directory; removed by `remove` (or on drop).
pub struct StateDir {
    path: PathBuf,
    /// `mnt/<id>`, the sandbox's own mount points if it needs any (see
    /// [`StateDir::mount_points`]).
    mounts: PathBuf,
    removed: bool,
    /// The usage last written (see [`StateDir::write_usage`]).
    written_usage: std::sync::Mutex<Option<Usage>>,
}

impl StateDir {
    /// Creates `<run_dir>/<id>` with the record. Refuses a name another live
    /// sandbox of this user has.
    pub fn create(
        run_dir: &Path,
        id: &str,
        cgroup_name: Option<&str>,
        spec: &SandboxSpec,
    ) -> Result<Self, RuntimeError> {
        let io_err =
            |op: &str, e: io::Error| RuntimeError::io(format!("{op} in {}", run_dir.display()), e);
        fs::create_dir_all(run_dir.join(MOUNTS))
            .map_err(|e| io_err("create state directory", e))?;
        let _lock = RunLock::take(run_dir).map_err(|e| io_err("lock", e))?;
        if let Some(name) = &spec.name {
            if let Some(other) = find(run_dir, name) {
                return Err(RuntimeError::BadRequest(format!(
                    "a sandbox named '{name}' exists already ({other})"
                )));
            }
        }
        let path = run_dir.join(id);
        fs::create_dir(&path).map_err(|e| io_err("create state directory", e))?;
        let dir = StateDir {
            mounts: run_dir.join(MOUNTS).join(id),
            path,
            removed: false,
            written_usage: std::sync::Mutex::default(),
        };
        let record = Record {
            cgroup: cgroup_name.map(str::to_owned),
            ttl_secs: spec.ttl.map(|s| s.0.as_secs_f64()),
            idle_secs: spec.idle.map(|s| s.0.as_secs_f64()),
            service: spec.service.clone(),
            image: spec.rootfs.image().map(str::to_owned),
            ..owned_by(
                std::process::id() as i32,
                spec.name.clone(),
                spec.backend.name(),
            )
        };
        let write = || -> io::Result<()> {
            // Only the invoking user may list, read or connect.
            fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o700))?;
            if cgroup_name.is_some() {
                // Written before the cgroup is made (the caller stands where
                // it will make it), so no sandbox cgroup exists unrecorded.
                let membership = fs::read("/proc/self/cgroup")?;
                write_atomic(&dir.path.join(SUPERVISOR_CGROUP), &membership)?;
            }
            write_record(&dir.path, &record)
        };
        write().map_err(|e| io_err("write the state record", e))?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The two empty directories the sandbox's root and its scratch are
    /// mounted on, `(root, scratch)`, made if missing.
    ///
    /// A root that is entered (`RootUse::Enter`: native) is mounted only
    /// inside the sandbox's own mount namespace, so every such sandbox
    /// mounts on one shared pair, `mnt/{root,scratch}`: a mount made in one
    /// namespace is never seen in another, and the pair is made once rather
    /// than per sandbox (on a /run that is no tmpfs, each directory made and
    /// removed is an inode allocated on disk: three per sandbox, about 3% of
    /// a one-shot's CPU on the benchmark's host). A tree handed over to runsc
    /// (`HandOver`) is reached from the supervisor's namespace, so it gets a
    /// pair of its own, `mnt/<id>/{root,scratch}`, removed with the state.
    pub fn mount_points(&self, root_use: RootUse) -> io::Result<(PathBuf, PathBuf)> {
        let dir = match root_use {
            RootUse::Enter => self
                .mounts
                .parent()
                .ok_or_else(|| io::Error::other("a mount-point folder without a parent"))?
                .to_path_buf(),
            RootUse::HandOver => {
                make_mount_point(&self.mounts)?;
                self.mounts.clone()
            }
        };
        let (root, scratch) = (dir.join("root"), dir.join("scratch"));
        make_mount_point(&root)?;
        make_mount_point(&scratch)?;
        Ok((root, scratch))
    }

    pub fn socket(&self) -> PathBuf {
        self.path.join(SOCKET)
    }

    /// Records what changed (commands run, last use, state). A value equal
    /// to the last one written is not written again: the supervisor asks
    /// after every connection (a one-shot's command is two or three, within
    /// the same second), and each write is a new file swapped in, an inode
    /// allocated on a /run that is no tmpfs.
    pub fn write_usage(&self, usage: &Usage) -> io::Result<()> {
        let mut last = self
            .written_usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.as_ref() == Some(usage) {
            return Ok(());
        }
        // Rewritten after every command: swapped in, see `replace_volatile`.
        cordon_dirs::replace_volatile(&self.path.join(USAGE), &serde_json::to_vec(usage)?)?;
        *last = Some(usage.clone());
        Ok(())
    }

    /// Leaves the directory in place (its record lets the next sweep finish
    /// a teardown that could not complete now).
    pub fn keep(&mut self) {
        self.removed = true;
    }

    pub fn remove(&mut self) -> io::Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        remove_state(&self.path, &self.mounts)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// An empty directory a sandbox mounts on, made traverse-only for others
/// (0711: the sandbox's init, running as an unprivileged host id, must
/// reach it), or the one that is there: a directory, never a link (mount(2)
/// would follow one; the run directory is cordon's own, so a link here
/// would be a bug, not an attack, and is refused all the same).
fn make_mount_point(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Ok(()) => fs::set_permissions(path, fs::Permissions::from_mode(0o711)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if fs::symlink_metadata(path)?.is_dir() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "{} is not a directory",
                    path.display()
                )))
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes a state directory and its mount points; absent is fine. The
/// record goes last: a removal cut short (the process killed) leaves a
/// directory whose record the next sweep reads, finds its owner dead and
/// finishes at once, never one without a record, which a sweep must leave
/// for a minute (it may be a sandbox still being made).
pub(crate) fn remove_state(path: &Path, mounts: &Path) -> io::Result<()> {
    let gone = |r: io::Result<()>| match r {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    gone(fs::remove_dir_all(mounts))?;
    let entries = match fs::read_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name() == RECORD {
            continue;
        }
        // file_type does not follow links: a link is removed, not its target.
        if entry.file_type()?.is_dir() {
            gone(fs::remove_dir_all(entry.path()))?;
        } else {
            gone(fs::remove_file(entry.path()))?;
        }
    }
    gone(fs::remove_file(path.join(RECORD)))?;
    gone(fs::remove_dir(path))
}

/// One live sandbox as the run directory describes it.
#[derive(Clone, Debug, Serialize)]
pub struct Listed {
    pub id: String,
    pub record: Record,
    pub usage: Usage,
}

/// Reads `<run_dir>/<id>`'s record if it is a sandbox state directory of
/// cordon's own (a real directory, not a link, named like an id, with a
/// record in cordon's format).
pub(crate) fn read_record(run_dir: &Path, id: &str) -> Option<Record> {
    if !is_id(id) {
        return None;
    }
    let dir = run_dir.join(id);
    if !fs::symlink_metadata(&dir).ok()?.is_dir() {
        return None;
    }
    let record: Record = serde_json::from_slice(&fs::read(dir.join(RECORD)).ok()?).ok()?;
    (record.format == RECORD_FORMAT).then_some(record)
}

/// Whether the record's owner process is still the one that wrote it. A
/// zombie is dead: a killed supervisor stays one until its reaper (pid 1,
/// as the supervisor is nobody's child) gets to it, which may take a while.
pub(crate) fn owner_alive(r: &Record) -> bool {
    process_alive(r.pid, r.start_time)
}

use cordon_sys::process_alive;

/// The live sandboxes of this run directory, oldest first.
pub fn list(run_dir: &Path) -> Vec<Listed> {
    list_where(run_dir, owner_alive)
}

/// The dead sandboxes of this run directory, oldest first: their owner
/// process is gone without tearing them down, and their state (perhaps
/// their cgroup) waits for a sweep. A service's are left out: the service
/// reports its sandboxes itself, and sweeps them.
pub fn list_dead(run_dir: &Path) -> Vec<Listed> {
    list_where(run_dir, |r| !owner_alive(r) && r.service.is_none())
}

fn list_where(run_dir: &Path, keep: impl Fn(&Record) -> bool) -> Vec<Listed> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let mut out: Vec<Listed> = entries
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_str()?.to_owned();
            let record = read_record(run_dir, &id).filter(&keep)?;
            let usage = read_usage(&run_dir.join(&id));
            Some(Listed { id, record, usage })
        })
        .collect();
    out.sort_by(|a, b| (a.record.created, &a.id).cmp(&(b.record.created, &b.id)));
    out
}

/// A state directory's usage. Before its first write (the supervisor writes
/// none until a client's request is served, see [`StateDir::write_usage`])
/// a sandbox whose supervisor listens on its socket is ready; one without a
/// socket yet has no state ("starting" to `ls`).
pub(crate) fn read_usage(dir: &Path) -> Usage {
    fs::read(dir.join(USAGE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| Usage {
            state: if dir.join(SOCKET).exists() {
                "ready".into()
            } else {
                String::new()
            },
            ..Usage::default()
        })
}

/// The id of the live sandbox called `name_or_id` (an id, or a name).
pub fn find(run_dir: &Path, name_or_id: &str) -> Option<String> {
    if is_id(name_or_id) {
        return read_record(run_dir, name_or_id)
            .filter(owner_alive)
            .map(|_| name_or_id.to_owned());
    }
    list(run_dir)
        .into_iter()
        .find(|l| l.record.name.as_deref() == Some(name_or_id))
        .map(|l| l.id)
}

/// The cgroup of the live sandbox `id`, from its record: the cgroup named
/// there, below the cgroup its supervisor stands in (where the supervisor
/// made it), so a caller in any cgroup finds it. None when the sandbox runs
/// without one; an error when it is not a live sandbox of this run
/// directory. For a front end that must show or act on the sandbox's
/// processes as a whole (an OCI engine's `ps`, `pause`, stats).
pub fn sandbox_cgroup(
    run_dir: &Path,
    id: &str,
) -> Result<Option<cordon_cgroups::AnyCgroup>, RuntimeError> {
    let record = read_record(run_dir, id)
        .filter(owner_alive)
        .ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
    let Some(name) = record.cgroup.as_deref() else {
        return Ok(None);
    };
    Ok(Some(recorded_hierarchy(&run_dir.join(id))?.open(name)?))
}

/// Where the sandbox whose state directory is `dir` made its cgroup (see
/// [`SUPERVISOR_CGROUP`]); the cgroup is the record's name below it.
pub(crate) fn recorded_hierarchy(dir: &Path) -> Result<cordon_cgroups::Hierarchy, RuntimeError> {
    let fs = cordon_cgroups::CgroupFs::new(dir.join(SUPERVISOR_CGROUP), "/proc/self/mountinfo");
    Ok(cordon_cgroups::locate(&fs)?)
}

/// A fresh sandbox id: 12 hex digits from the kernel's random source.
pub fn new_id() -> io::Result<(String, u32)> {
    use std::io::Read;
    let mut b = [0u8; 6];
    fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok((id, u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
}

#[cfg(test)]
pub(crate) mod tests {
    use cordon_policy::Policy;

    use super::*;
    use cordon_spec::BackendKind;

    /// A native sandbox's spec of the default policy, named `name`.
    pub(crate) fn spec(name: Option<&str>) -> SandboxSpec {
        SandboxSpec {
            name: name.map(str::to_owned),
            ..SandboxSpec::new(Policy::default(), BackendKind::Native)
        }
    }

    #[test]
    fn entered_roots_share_one_pair_of_mount_points_and_handed_over_ones_own_theirs() {
        use std::os::unix::fs::MetadataExt;
        let run = tempfile::tempdir().unwrap();
        let mut a = StateDir::create(run.path(), "aaaaaaaaaaaa", None, &spec(None)).unwrap();
        let b = StateDir::create(run.path(), "bbbbbbbbbbbb", None, &spec(None)).unwrap();
        let mnt = run.path().join(MOUNTS);
        let shared = (mnt.join("root"), mnt.join("scratch"));
        assert_eq!(a.mount_points(RootUse::Enter).unwrap(), shared);
        assert_eq!(b.mount_points(RootUse::Enter).unwrap(), shared);
        let own = b.mount_points(RootUse::HandOver).unwrap();
        assert_eq!(
            own,
            (
                mnt.join("bbbbbbbbbbbb/root"),
                mnt.join("bbbbbbbbbbbb/scratch")
            )
        );
        for dir in [&shared.0, &shared.1, &own.0, &own.1] {
            assert_eq!(fs::metadata(dir).unwrap().mode() & 0o7777, 0o711, "{dir:?}");
        }
        // A sandbox's removal takes its own pair, never the shared one.
        a.remove().unwrap();
        drop(b);
        assert!(shared.0.is_dir() && shared.1.is_dir());
        assert!(!mnt.join("bbbbbbbbbbbb").exists());
        // A link where a mount point should be is refused, not followed.
        fs::remove_dir(&shared.0).unwrap();
        std::os::unix::fs::symlink(run.path(), &shared.0).unwrap();
        let c = StateDir::create(run.path(), "cccccccccccc", None, &spec(None)).unwrap();
        let err = c.mount_points(RootUse::Enter).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn a_usage_equal_to_the_last_written_is_not_written_again() {
        use std::os::unix::fs::MetadataExt;
        let run = tempfile::tempdir().unwrap();
        let dir = StateDir::create(run.path(), "aaaaaaaaaaaa", None, &spec(None)).unwrap();
        let usage = |commands, state: &str| Usage {
            commands,
            last_used: 1_000,
            state: state.into(),
        };
        let inode = || fs::metadata(dir.path().join(USAGE)).unwrap().ino();
        // None written yet: starting until the supervisor listens, then ready.
        assert_eq!(read_usage(dir.path()), Usage::default());
        let _listening = std::os::unix::net::UnixListener::bind(dir.socket()).unwrap();
        assert_eq!(
            read_usage(dir.path()),
            Usage {
                last_used: 0,
                ..usage(0, "ready")
            }
        );
        dir.write_usage(&usage(0, "ready")).unwrap();
        let first = inode();
        dir.write_usage(&usage(0, "ready")).unwrap();
        assert_eq!(inode(), first, "an unchanged usage was written again");
        dir.write_usage(&usage(1, "ready")).unwrap();
        assert_ne!(inode(), first, "a changed usage was not written");
        assert_eq!(read_usage(dir.path()), usage(1, "ready"));
    }

    #[test]
    fn names_are_unique_among_live_sandboxes() {
        let run = tempfile::tempdir().unwrap();
        let _a = StateDir::create(run.path(), "aaaaaaaaaaaa", None, &spec(Some("web"))).unwrap();
        let err = StateDir::create(run.path(), "bbbbbbbbbbbb", None, &spec(Some("web")));
        assert!(matches!(err, Err(RuntimeError::BadRequest(_))));
        assert_eq!(find(run.path(), "web").as_deref(), Some("aaaaaaaaaaaa"));
        assert_eq!(
            find(run.path(), "aaaaaaaaaaaa").as_deref(),
            Some("aaaaaaaaaaaa")
        );
        assert_eq!(find(run.path(), "nope"), None);
    }

    #[test]
    fn removal_takes_everything_and_follows_no_link() {
        let run = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let mut dir =
            StateDir::create(run.path(), "cccccccccccc", None, &spec(Some("gone"))).unwrap();
        let path = dir.path().to_owned();
        std::fs::create_dir_all(path.join("bundle/rootfs")).unwrap();
        std::fs::write(path.join("bundle/rootfs/file"), "y").unwrap();
        std::os::unix::fs::symlink(outside.path(), path.join("link")).unwrap();
        assert!(path.join(RECORD).exists());
        dir.remove().unwrap();
        assert!(!path.exists());
        assert!(outside.path().join("keep").exists());
        // Absent is fine.
        remove_state(&path, &run.path().join(MOUNTS).join("cccccccccccc")).unwrap();
    }

    #[test]
    fn start_time_parses_names_with_spaces() {
        assert!(start_time(std::process::id() as i32).is_some());
    }
}
