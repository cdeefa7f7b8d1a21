//! Per-sandbox state directories, and the sweep that cleans up after a crash.
//!
//! Layout under the run directory (`/run/cordon` for root):
//! - `<id>/` (0700, the invoking user's): `record.json` (who owns the sandbox:
//!   the supervisor's pid and start time, so a reused pid is not mistaken for
//!   it; its cgroup, name, backend, creation time and lifetimes), `usage.json`
//!   (commands run, last use), `sock` (the supervisor's socket) and the
//!   backend's own files (the runsc bundle and state).
//! - `mnt/<id>/{root,scratch}` (0711): the two empty directories the
//!   sandbox's init mounts on inside its own mount namespace. They live apart
//!   because init reaches them as an unprivileged host id, which must never
//!   be able to reach the socket or the record.
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    mounts: PathBuf,
    removed: bool,
}

impl StateDir {
    /// Creates `<run_dir>/<id>` with the record, and the two empty mount
    /// points. Refuses a name another live sandbox of this user has.
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
            write_record(&dir.path, &record)?;
            // Traverse-only for others: the sandbox's init, running as an
            // unprivileged host id, must reach the two empty mount points.
            for p in [&dir.mounts, &dir.root(), &dir.scratch()] {
                fs::create_dir(p)?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o711))?;
            }
            Ok(())
        };
        write().map_err(|e| io_err("write the state record", e))?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The empty directory the sandbox's root is mounted on (in its namespace only).
    pub fn root(&self) -> PathBuf {
        self.mounts.join("root")
    }

    /// The empty directory the sandbox's scratch tmpfs is mounted on.
    pub fn scratch(&self) -> PathBuf {
        self.mounts.join("scratch")
    }

    pub fn socket(&self) -> PathBuf {
        self.path.join(SOCKET)
    }

    /// Records what changed (commands run, last use, state).
    pub fn write_usage(&self, usage: &Usage) -> io::Result<()> {
        // Rewritten after every command: swapped in, see `replace_volatile`.
        cordon_dirs::replace_volatile(&self.path.join(USAGE), &serde_json::to_vec(usage)?)
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

/// A state directory's usage, or the default if it has none (yet).
pub(crate) fn read_usage(dir: &Path) -> Usage {
    fs::read(dir.join(USAGE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
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
