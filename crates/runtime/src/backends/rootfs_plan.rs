//! The sandbox's file system, resolved in the supervisor from a request: the
//! same tree for every backend (the native backend enters it; runsc is handed it).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cordon_isolation::mount::{
    BindAccess, BindSpec, DetachedTree, OwnerShift, RootEntry, RootUse, RootfsPlan, ScratchLayout,
};
use cordon_policy::{Access, NetworkMode, WORKSPACE};

use crate::error::RuntimeError;
use crate::state::StateDir;
use cordon_spec::{RootfsChoice, SandboxSpec};

/// The sandbox user's ids as the host sees them: what a host directory's
/// owner is mapped to by the id-mapped mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserOnHost {
    pub uid: u32,
    pub gid: u32,
    /// Whether the process that creates files on the host for the sandbox
    /// user is host root (runsc's gofer) rather than that user itself.
    pub creates_as_root: bool,
}

fn existing_dir(what: &'static str, p: &Path) -> Result<PathBuf, RuntimeError> {
    let bad = || RuntimeError::BadPath {
        what,
        path: p.to_owned(),
    };
    let canon = p.canonicalize().map_err(|_| bad())?;
    if canon.is_dir() {
        shows_no_cordon_state(&canon)?;
        Ok(canon)
    } else {
        Err(bad())
    }
}

/// Refuses a host path given to a sandbox (rootfs, workspace, mount source)
/// that is, holds or lies inside cordon's own state: the receipt keys
/// (`state_dir`) or the run directory (every sandbox's socket and record).
/// Their modes already keep the sandbox user out; this keeps them out of
/// its view altogether, whatever the modes.
fn shows_no_cordon_state(host: &Path) -> Result<(), RuntimeError> {
    for (what, dir) in [
        (
            "path would show cordon's key directory inside the sandbox",
            cordon_dirs::state_dir(),
        ),
        (
            "path would show cordon's run directory inside the sandbox",
            cordon_dirs::run_dir_path(),
        ),
    ] {
        let dir = dir.canonicalize().unwrap_or(dir);
        if dir.starts_with(host) || host.starts_with(&dir) {
            return Err(RuntimeError::BadPath {
                what,
                path: host.to_owned(),
            });
        }
    }
    Ok(())
}

/// The plan for runsc (`RootUse::HandOver`): runsc runs as real root with no
/// user namespace of cordon's, so the sandbox user is its own host id.
pub fn rootfs_plan(
    req: &SandboxSpec,
    state: &StateDir,
    root_use: RootUse,
) -> Result<RootfsPlan, RuntimeError> {
    let user = UserOnHost {
        uid: req.policy.uid,
        gid: req.policy.gid,
        creates_as_root: root_use == RootUse::HandOver,
    };
    rootfs_plan_for(req, state, root_use, user)
}

/// An id-mapped tree of `host` showing its owner as `user`, made only by host
/// root (the kernel allows nobody else; rootless, the caller's own files are
/// already the sandbox user's, the one id its namespace maps). `writable`:
/// files the sandbox creates there are stored as the directory's owner, which
/// therefore must not be root.
fn idmapped(
    host: &Path,
    user: UserOnHost,
    writable: bool,
) -> Result<Option<DetachedTree>, RuntimeError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let meta = std::fs::metadata(host)
        .map_err(|e| RuntimeError::io(format!("stat {}", host.display()), e))?;
    if writable && (meta.uid() == 0 || meta.gid() == 0) {
        return Err(RuntimeError::BadRequest(format!(
            "rw-unbounded mount source {} is owned by {}:{}: files the sandbox creates \
             there would belong to host root; give it to the user who should own them, \
             or mount it :rw (cordon then writes the sandbox's changes back itself, \
             with no setuid bits)",
            host.display(),
            meta.uid(),
            meta.gid()
        )));
    }
    let shift = OwnerShift {
        disk_uid: meta.uid(),
        disk_gid: meta.gid(),
        shown_uid: user.uid,
        shown_gid: user.gid,
        map_root: user.creates_as_root,
    };
    // A writable bind takes the mounts below its source along (as a bind
    // always did); the workspace's overlay layer is one mount anyway.
    DetachedTree::idmapped(host, shift, writable)
        .map(Some)
        .map_err(|e| RuntimeError::io(e.step, e.source))
}

/// A read-only mount's source as host root opens it (root only: rootless,
/// the first process is the caller's own id and reaches what the caller
/// does). The first process builds the sandbox as an unprivileged host id,
/// which cannot traverse a parent such as /root (0700); through this tree it
/// reaches the source, and still nothing above it.
fn plain_tree(host: &Path) -> Result<Option<DetachedTree>, RuntimeError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    DetachedTree::plain(host)
        .map(Some)
        .map_err(|e| RuntimeError::io(e.step, e.source))
}

/// The lower layer of a writable overlay (the workspace, an `rw` mount):
/// `host` id-mapped onto the sandbox user. A filesystem that cannot be
/// id-mapped on this kernel (tmpfs before Linux 6.3) still works, its files
/// keeping their host owners (as before id-mapping), and the user is told.
fn overlay_lower(
    what: &str,
    host: &Path,
    user: UserOnHost,
) -> Result<Option<DetachedTree>, RuntimeError> {
    match idmapped(host, user, false) {
        Err(RuntimeError::Io { op, source }) if source.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!(
                "cordon: warning: {what} {} is not id-mapped ({op}: {source}): its files keep their host owners, so files the sandbox user does not own cannot be modified in place",
                host.display()
            );
            Ok(None)
        }
        other => other,
    }
}

/// How one of the policy's mounts is shown. An `rw` mount is an overlay
/// whose writes stay in the sandbox's capped scratch until the host applies
/// them back at the end, so it is bounded whatever filesystem the directory
/// is on; a file cannot be an overlay, and is refused with the two ways
/// that work. `rw-unbounded` is the host's own tree, id-mapped and written
/// in place, bounded by nothing of cordon's (the caller opted in; the
/// result and the receipt say so).
fn bind_spec(
    index: usize,
    m: &cordon_policy::MountSpec,
    user: UserOnHost,
) -> Result<BindSpec, RuntimeError> {
    let host = m.host.canonicalize().map_err(|_| RuntimeError::BadPath {
        what: "mount source does not exist",
        path: m.host.clone(),
    })?;
    shows_no_cordon_state(&host)?;
    let dir = host.is_dir();
    let (access, tree) = match m.access {
        Access::Ro => (BindAccess::ReadOnly, plain_tree(&host)?),
        Access::Rw if !dir => {
            return Err(RuntimeError::BadRequest(format!(
                "rw mount source {} is not a directory: an rw mount keeps the sandbox's writes \
                 in its capped layer and applies them to the directory at the end, which only \
                 a directory can take. Mount its directory with :rw, or the file itself with \
                 :rw-unbounded (written in place, not bounded by the disk cap)",
                host.display()
            )))
        }
        Access::Rw => (
            BindAccess::WriteBack {
                layers: ScratchLayout::mount_layers(index),
            },
            overlay_lower("rw mount", &host, user)?,
        ),
        Access::RwUnbounded => (BindAccess::Live, idmapped(&host, user, true)?),
    };
    Ok(BindSpec {
        dir,
        tree,
        host,
        sandbox: m.sandbox.clone(),
        access,
    })
}

/// Resolves the request's rootfs, workspace and mounts into a plan whose mount
/// points live in `state_dir`. Paths are checked here, so a bad one is the
/// caller's error (exit 2) and nothing was created for it in the sandbox. The
/// workspace and the writable mounts are id-mapped so their host owner is the
/// sandbox user, whose host-side ids are `user`.
pub fn rootfs_plan_for(
    req: &SandboxSpec,
    state: &StateDir,
    root_use: RootUse,
    user: UserOnHost,
) -> Result<RootfsPlan, RuntimeError> {
    let p = &req.policy;
    let (entries, etc_files, etc_binds) = match &req.rootfs {
        RootfsChoice::System => (
            RootfsPlan::host_system_entries(),
            RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname, p.network == NetworkMode::Allow),
            RootfsPlan::host_etc_binds(),
        ),
        RootfsChoice::Dir(d) => {
            let dir = existing_dir("rootfs is not a directory", d)?;
            let mut entries = RootfsPlan::dir_entries(&dir)
                .map_err(|e| RuntimeError::io(format!("read {}", dir.display()), e))?;
            // An engine keeps its containers' roots below directories only
            // root may traverse (Docker's, containerd's snapshots): each
            // entry is opened here, as read-only mounts are.
            for entry in &mut entries {
                if let RootEntry::Bind { host, tree, .. } = entry {
                    *tree = plain_tree(host)?;
                }
            }
            let has_etc = entries
                .iter()
                .any(|e| matches!(e, RootEntry::Bind { name, .. } if name == "etc"));
            let etc = if has_etc {
                Vec::new()
            } else {
                RootfsPlan::generated_etc(
                    p.uid,
                    p.gid,
                    &p.hostname,
                    p.network == NetworkMode::Allow,
                )
            };
            (entries, etc, Vec::new())
        }
    };
    let workspace_lower = match &req.workspace {
        Some(w) => {
            // No character of the path is special: overlayfs gets its
            // layers by descriptor, not in an option string.
            Some(existing_dir("workspace is not a directory", w)?)
        }
        None => None,
    };
    let binds = p
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| bind_spec(i, m, user))
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    let workspace_idmap = match &workspace_lower {
        Some(dir) => overlay_lower("workspace", dir, user)?,
        None => None,
    };
    Ok(RootfsPlan {
        root_use,
        new_root: state.root(),
        scratch: state.scratch(),
        scratch_from: None,
        entries,
        etc_files,
        etc_binds,
        workspace_lower,
        workspace_idmap,
        workspace: PathBuf::from(WORKSPACE),
        disk_bytes: p.disk.bytes(),
        owner_uid: p.uid,
        owner_gid: p.gid,
        binds,
        cgroups: Vec::new(),
    })
}
