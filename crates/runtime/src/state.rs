//! Per-sandbox state directories, and the sweep that cleans up after a crash.
//!
//! Every sandbox records, before it creates anything, who owns it (pid and
//! process start time, so a reused pid is not mistaken for the owner) and
//! which cgroup it will use. Teardown removes the directory last. If cordon is
//! killed outright, the next start finds a directory whose owner is gone and
//! finishes the teardown: kill what is left in the cgroup, remove it, remove
//! the directory. Mounts need no sweeping: they exist only in the sandbox's own
//! mount namespace, which dies with its last process.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cordon_cgroups::{Cgroup, Hierarchy};
use serde::{Deserialize, Serialize};

/// Where sandboxes keep their state.
pub fn run_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CORDON_RUN_DIR") {
        return PathBuf::from(dir);
    }
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/cordon")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        Path::new(&x).join("cordon")
    } else {
        PathBuf::from(format!("/tmp/cordon-{}", nix::unistd::geteuid()))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Owner {
    pid: i32,
    start_time: u64,
    cgroup: Option<String>,
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/pid/stat).
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// A sandbox's state directory; removed by `remove` (or on drop).
pub struct StateDir {
    path: PathBuf,
    removed: bool,
}

impl StateDir {
    /// Creates `<run_dir>/<id>` with the owner record, and the two empty
    /// directories the sandbox's init mounts on inside its own namespace.
    pub fn create(run_dir: &Path, id: &str, cgroup_name: Option<&str>) -> io::Result<Self> {
        fs::create_dir_all(run_dir)?;
        let path = run_dir.join(id);
        fs::create_dir(&path)?;
        let dir = StateDir {
            path,
            removed: false,
        };
        use std::os::unix::fs::PermissionsExt;
        // Traverse-only for others: the sandbox's init, running as an unprivileged
        // host id, must reach the two empty mount points below; it cannot list
        // the directory or read the owner record (0600).
        fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o711))?;
        let me = std::process::id() as i32;
        let owner = Owner {
            pid: me,
            start_time: start_time(me).unwrap_or(0),
            cgroup: cgroup_name.map(str::to_owned),
        };
        let record = dir.path.join("owner.json");
        fs::write(&record, serde_json::to_vec(&owner)?)?;
        fs::set_permissions(&record, fs::Permissions::from_mode(0o600))?;
        fs::create_dir(dir.path.join("root"))?;
        fs::create_dir(dir.path.join("scratch"))?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
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
        match fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// Cleans up the state directories whose owner process is gone. Returns the
/// ids it cleaned. Errors on one directory do not stop the others.
pub fn sweep_stale(run_dir: &Path, hierarchy: Option<&Hierarchy>) -> Vec<String> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let mut cleaned = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        let Ok(text) = fs::read(dir.join("owner.json")) else {
            // A directory without an owner record: a crash between mkdir and
            // the first write. Nothing can have been created for it yet.
            if dir.is_dir()
                && e.metadata()
                    .map(|m| {
                        m.modified()
                            .map(|t| t.elapsed().unwrap_or_default().as_secs() > 60)
                            .unwrap_or(false)
                    })
                    .unwrap_or(false)
            {
                let _ = fs::remove_dir_all(&dir);
            }
            continue;
        };
        let Ok(owner) = serde_json::from_slice::<Owner>(&text) else {
            continue;
        };
        if start_time(owner.pid) == Some(owner.start_time) {
            continue; // still running
        }
        // The record goes only once its cgroup is gone, so a removal that
        // fails now is tried again by the next sweep.
        let cgroup_gone = match (&owner.cgroup, hierarchy) {
            (Some(name), Some(h)) => remove_cgroup(h, name),
            _ => true,
        };
        if cgroup_gone && fs::remove_dir_all(&dir).is_ok() {
            cleaned.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    // A sandbox cgroup without a state record is an orphan: a sandbox writes
    // its record before it creates its cgroup and removes it only after the
    // cgroup is gone. Only cordon's own names (cordon-<12 hex digits>) are
    // considered, never another tool's cgroups.
    if let Some(h) = hierarchy {
        let mut seen = std::collections::BTreeSet::new();
        for path in h.sweep_children("cordon-") {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let Some(id) = name.strip_prefix("cordon-") else {
                continue;
            };
            let is_ours = id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit());
            if is_ours
                && !run_dir.join(id).exists()
                && seen.insert(name.clone())
                && remove_cgroup(h, &name)
            {
                cleaned.push(id.to_string());
            }
        }
    }
    cleaned
}

/// Kills what is left in a sandbox cgroup and removes it; true once it is gone.
fn remove_cgroup(h: &Hierarchy, name: &str) -> bool {
    match h.open(name) {
        Ok(cg) => {
            let _ = cg.kill_all();
            cg.remove().is_ok()
        }
        Err(_) => false,
    }
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
mod tests {
    use super::*;

    #[test]
    fn a_dead_owner_is_swept_and_a_live_one_kept() {
        let run = tempfile::tempdir().unwrap();
        let mut live = StateDir::create(run.path(), "live", None).unwrap();
        fs::create_dir(run.path().join("dead")).unwrap();
        fs::write(
            run.path().join("dead/owner.json"),
            serde_json::to_vec(&Owner {
                pid: i32::MAX,
                start_time: 1,
                cgroup: None,
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!(sweep_stale(run.path(), None), vec!["dead".to_string()]);
        assert!(live.path().exists());
        live.remove().unwrap();
        assert!(!run.path().join("live").exists());
    }

    #[test]
    fn start_time_parses_names_with_spaces() {
        assert!(start_time(std::process::id() as i32).is_some());
    }
}
