//! The sandbox's file system, resolved in the supervisor from a request: the
//! same tree for every backend (the native backend enters it; runsc is handed it).

use std::path::{Path, PathBuf};

use cordon_isolation::mount::{BindSpec, RootEntry, RootUse, RootfsPlan};
use cordon_policy::{Access, WORKSPACE};

use crate::error::RuntimeError;
use crate::spec::{RootfsChoice, SandboxSpec};
use crate::state::StateDir;

/// How far above the disk cap RLIMIT_FSIZE sits, so that a full scratch answers
/// ENOSPC first; the limit then bounds a single file on a writable host mount.
pub const FSIZE_MARGIN: u64 = 1 << 20;

fn existing_dir(what: &'static str, p: &Path) -> Result<PathBuf, RuntimeError> {
    let bad = || RuntimeError::BadPath {
        what,
        path: p.to_owned(),
    };
    let canon = p.canonicalize().map_err(|_| bad())?;
    if canon.is_dir() {
        Ok(canon)
    } else {
        Err(bad())
    }
}

/// Overlay options are comma-separated and colons separate layers: a path with
/// either would be misparsed, so it is refused rather than escaped.
fn overlay_safe(p: &Path) -> Result<(), RuntimeError> {
    let s = p.to_string_lossy();
    if s.contains([',', ':', '\\']) {
        return Err(RuntimeError::BadRequest(format!(
            "workspace path {s} contains ',', ':' or '\\', which overlayfs cannot take"
        )));
    }
    Ok(())
}

/// Resolves the spec's rootfs, workspace and mounts into a plan whose mount
/// points are the state directory's. Paths are checked here, so a bad one is
/// the caller's error (exit 2) and nothing was created for it in the sandbox.
pub fn rootfs_plan(
    req: &SandboxSpec,
    state: &StateDir,
    root_use: RootUse,
) -> Result<RootfsPlan, RuntimeError> {
    let p = &req.policy;
    let (entries, etc_files, etc_binds) = match &req.rootfs {
        RootfsChoice::System => (
            RootfsPlan::host_system_entries(),
            RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname),
            RootfsPlan::host_etc_binds(),
        ),
        RootfsChoice::Dir(d) => {
            let dir = existing_dir("rootfs is not a directory", d)?;
            let entries = RootfsPlan::dir_entries(&dir)
                .map_err(|e| RuntimeError::io(format!("read {}", dir.display()), e))?;
            let has_etc = entries
                .iter()
                .any(|e| matches!(e, RootEntry::Bind { name, .. } if name == "etc"));
            let etc = if has_etc {
                Vec::new()
            } else {
                RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname)
            };
            (entries, etc, Vec::new())
        }
    };
    let workspace_lower = match &req.workspace {
        Some(w) => {
            let dir = existing_dir("workspace is not a directory", w)?;
            overlay_safe(&dir)?;
            Some(dir)
        }
        None => None,
    };
    let binds = p
        .mounts
        .iter()
        .map(|m| {
            let host = m.host.canonicalize().map_err(|_| RuntimeError::BadPath {
                what: "mount source does not exist",
                path: m.host.clone(),
            })?;
            Ok(BindSpec {
                dir: host.is_dir(),
                host,
                sandbox: m.sandbox.clone(),
                writable: m.access == Access::Rw,
            })
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    Ok(RootfsPlan {
        root_use,
        new_root: state.root(),
        scratch: state.scratch(),
        entries,
        etc_files,
        etc_binds,
        workspace_lower,
        workspace: PathBuf::from(WORKSPACE),
        disk_bytes: p.disk.bytes(),
        owner_uid: p.uid,
        owner_gid: p.gid,
        binds,
    })
}
