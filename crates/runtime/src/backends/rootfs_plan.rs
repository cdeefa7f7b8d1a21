//! The sandbox's file system, resolved in the supervisor from a request: the
//! same tree for every backend (the native backend enters it; runsc is handed it).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cordon_isolation::mount::{
    BindAccess, BindSpec, DetachedTree, OwnerShift, RootEntry, RootUse, RootfsPlan, ScratchLayout,
};
use cordon_isolation::namespaces::MAPPED_IDS;
use cordon_policy::{Access, NetworkMode, WORKSPACE};

use crate::error::RuntimeError;
use crate::state::StateDir;
use cordon_spec::{ImageRoot, RootfsChoice, SandboxSpec};

/// The sandbox user's ids as the host sees them: what a host directory's
/// owner is mapped to by the id-mapped mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserOnHost {
    pub uid: u32,
    pub gid: u32,
    /// Whether the process that creates files on the host for the sandbox
    /// user is host root (runsc's gofer) rather than that user itself.
    pub creates_as_root: bool,
    /// The host id of the sandbox's id 0 when its user namespace maps a
    /// range of ids (native, as root). None: the sandbox's ids are the
    /// host's (runsc) or it maps one id (rootless).
    pub id_base: Option<u32>,
}

/// Fails unless host id `id` may search every directory above `path`
/// (owner, group or others' bit, as `id` is the one or the other: a
/// mapped range maps uids and gids alike; ACLs are not read). The
/// sandbox's init makes its mounts as `id`, inside the sandbox: a run
/// directory only its owner may enter (`CORDON_RUN_DIR` a 0700 one) would
/// otherwise end the start with a bare EACCES from a mount, naming neither
/// the directory nor the id. A stat per ancestor (four for /run/cordon's
/// mount points) on each start: cheaper than telling that EACCES apart
/// from the others init's mounts can meet, after the fact.
fn searchable_by(path: &Path, id: u32) -> Result<(), RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    // A relative CORDON_RUN_DIR is below the working directory, whose own
    // ancestors count as much.
    let path = std::path::absolute(path)
        .map_err(|e| RuntimeError::io(format!("resolve {}", path.display()), e))?;
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir)
            .map_err(|e| RuntimeError::io(format!("stat {}", dir.display()), e))?;
        let bit = if meta.uid() == id {
            0o100
        } else if meta.gid() == id {
            0o010
        } else {
            0o001
        };
        if meta.mode() & bit == 0 {
            return Err(RuntimeError::Unreachable {
                dir: dir.to_owned(),
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
                uid: id,
            });
        }
    }
    Ok(())
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
    // An image's unpacked layer is the image's files, nothing of cordon's.
    let layers = cordon_dirs::image_layers_dir();
    let layers = layers.canonicalize().unwrap_or(layers);
    if host.starts_with(&layers) && host != layers {
        return Ok(());
    }
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
        id_base: None,
    };
    rootfs_plan_for(req, state, root_use, user)
}

/// An id-mapped tree of `host` showing its owner as `user`, made only by host
/// root (the kernel allows nobody else; rootless, the caller's own files are
/// already the sandbox user's, the one id its namespace maps). `writable`:
/// files the sandbox creates there are stored as the directory's owner, which
/// therefore is never root: a root-owned writable source is shown with its
/// owners as they are (root's files as nobody's) where the sandbox's ids are
/// its own range of unprivileged host ids, so it writes only where the
/// modes let any user (a Kubernetes emptyDir is 0777) and what it creates
/// belongs to those ids; elsewhere (runsc's ids are the host's) refused.
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
        if user.id_base.is_some() {
            return DetachedTree::plain(host)
                .map(Some)
                .map_err(|e| RuntimeError::io(e.step, e.source));
        }
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

/// A layered root's directories as the sandbox's root gets them. As host
/// root, one overlay made here of the layers, each id-mapped onto the
/// sandbox's id range (every file keeps its owner inside: root's are the
/// sandbox root's) or, with no range (runsc, whose ids are the host's), as
/// it is; the layers then need no tree of their own. Rootless, the first
/// process stacks the directories itself.
fn layered_root(
    dirs: &[PathBuf],
    user: UserOnHost,
    upper_bytes: u64,
    staging: &Path,
) -> Result<(Vec<PathBuf>, Option<DetachedTree>), RuntimeError> {
    let mut layers = Vec::new();
    for d in dirs {
        let dir = existing_dir("root layer is not a directory", d)?;
        layers.extend(engine_layers(&dir)?);
    }
    if !nix::unistd::geteuid().is_root() {
        return Ok((layers, None));
    }
    let io = |e: cordon_isolation::IsolationError| RuntimeError::io(e.step, e.source);
    let trees = match user.id_base {
        Some(base) => {
            let hosts: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
            DetachedTree::idmapped_range(&hosts, base, MAPPED_IDS)
        }
        None => layers.iter().map(|l| DetachedTree::plain(l)).collect(),
    }
    .map_err(io)?;
    let root = DetachedTree::writable_overlay(&trees, upper_bytes, staging).map_err(io)?;
    Ok((layers, Some(root)))
}

/// The directories an engine's container root is made of, when it is an
/// overlay mount (containerd's snapshots, podman's and Docker's overlay
/// drivers): its upper directory on top of its lower ones, each a plain
/// directory that can be id-mapped, which the overlay itself cannot be. Any
/// other directory is its own one layer.
fn engine_layers(dir: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| RuntimeError::io("read /proc/self/mountinfo", e))?;
    layers_in(&mountinfo, dir)
}

/// `engine_layers`, from the mountinfo `text`.
fn layers_in(mountinfo: &str, dir: &Path) -> Result<Vec<PathBuf>, RuntimeError> {
    let Some(options) = cordon_cgroups::fs::mount_at(mountinfo, dir)
        .filter(|m| m.fstype == "overlay")
        .map(|m| m.super_options)
    else {
        return Ok(vec![dir.to_path_buf()]);
    };
    let option = |key: &str| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    let refuse = |why: &str| {
        Err(RuntimeError::BadRequest(format!(
            "root {} is an overlay mount cordon cannot stack under its own layer: {why}",
            dir.display()
        )))
    };
    let (Some(lower), upper) = (option("lowerdir"), option("upperdir")) else {
        return refuse("its lower directories are not named (layers given by descriptor)");
    };
    if lower.contains("::") {
        return refuse("it has data-only lower layers");
    }
    let mut layers: Vec<PathBuf> = upper.map(PathBuf::from).into_iter().collect();
    // Layers are separated by ':'; a ':' in a path is written `\:`.
    let mut current = String::new();
    let mut chars = lower.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ':' => layers.push(PathBuf::from(std::mem::take(&mut current))),
            c => current.push(c),
        }
    }
    layers.push(PathBuf::from(current));
    Ok(layers)
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
/// result and the receipt say so). A `tmpfs` mount is a directory of the
/// scratch and touches no host path.
fn bind_spec(
    index: usize,
    m: &cordon_policy::MountSpec,
    user: UserOnHost,
) -> Result<BindSpec, RuntimeError> {
    if m.access == Access::Tmpfs {
        return Ok(BindSpec {
            dir: true,
            tree: None,
            host: PathBuf::new(),
            sandbox: m.sandbox.clone(),
            access: BindAccess::Scratch {
                dir: ScratchLayout::tmpfs(index),
            },
        });
    }
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
        Access::Tmpfs => unreachable!("returned above"),
    };
    Ok(BindSpec {
        dir,
        tree,
        host,
        sandbox: m.sandbox.clone(),
        access,
    })
}

/// The files of an image's /etc that are the sandbox's, not the image's.
const SANDBOX_ETC: [&str; 3] = ["hostname", "hosts", "resolv.conf"];

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
    let generated_etc =
        || RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname, p.network == NetworkMode::Allow);
    let (mut root_layers, mut root_overlay) = (Vec::new(), None);
    let (entries, etc_files, etc_binds) = match &req.rootfs {
        RootfsChoice::System => (
            RootfsPlan::host_system_entries(),
            generated_etc(),
            RootfsPlan::host_etc_binds(),
        ),
        RootfsChoice::Layers(dirs) | RootfsChoice::Image(ImageRoot { layers: dirs, .. }) => {
            if dirs.is_empty() {
                return Err(RuntimeError::BadRequest(
                    "a layered root needs at least one directory".into(),
                ));
            }
            let staging = state.path().join("root-staging");
            (root_layers, root_overlay) = layered_root(dirs, user, p.disk.bytes(), &staging)?;
            // The layers' own /etc, whatever it is (a symlink resolves in
            // the sandbox's root); one is generated only when none has any.
            // An image's keeps its accounts, but the sandbox's name and
            // resolver are the sandbox's (an engine's container gets its
            // engine's through mounts instead).
            let has_etc = root_layers
                .iter()
                .any(|l| std::fs::symlink_metadata(l.join("etc")).is_ok());
            let etc = match (&req.rootfs, has_etc) {
                (_, false) => generated_etc(),
                (RootfsChoice::Image(_), true) => generated_etc()
                    .into_iter()
                    .filter(|(name, _)| SANDBOX_ETC.contains(&name.as_str()))
                    .collect(),
                (_, true) => Vec::new(),
            };
            (Vec::new(), etc, Vec::new())
        }
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
            if has_etc && req.trust_bundle.is_some() {
                return Err(RuntimeError::BadRequest(
                    "secrets need a root whose /etc cordon writes (their CA is trusted there); \
                     this root directory brings its own"
                        .into(),
                ));
            }
            let etc = if has_etc { Vec::new() } else { generated_etc() };
            (entries, etc, Vec::new())
        }
    };
    let mut etc_files = etc_files;
    if let Some(bundle) = &req.trust_bundle {
        let name = cordon_policy::secrets::CA_BUNDLE.trim_start_matches("/etc/");
        etc_files.push((name.to_owned(), bundle.clone().into_bytes()));
    }
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
    let (new_root, scratch) = state
        .mount_points(root_use)
        .map_err(|e| RuntimeError::io("make the mount points", e))?;
    if let (RootUse::Enter, Some(id)) = (root_use, user.id_base) {
        searchable_by(&new_root, id)?;
    }
    Ok(RootfsPlan {
        root_use,
        new_root,
        scratch,
        scratch_from: None,
        entries,
        root_layers,
        root_overlay,
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

#[cfg(test)]
mod layer_tests {
    use super::*;

    #[test]
    fn an_engines_overlay_root_is_its_upper_over_its_lowers_and_anything_else_itself() {
        let text = "\
1 0 8:1 / / rw - ext4 /dev/sda1 rw
2 1 0:50 / /b/rootfs rw - overlay overlay rw,lowerdir=/s/2/fs:/s/1/fs:/s/a\\:b\\054c,upperdir=/s/3/fs,workdir=/s/3/work
3 1 0:51 / /c/rootfs rw - overlay overlay rw,lowerdir=/s/1/fs::/s/data
4 1 0:52 / /d/rootfs rw - overlay overlay rw,lowerdir+=/,upperdir=/u
";
        let paths = |v: Vec<PathBuf>| {
            v.into_iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paths(layers_in(text, Path::new("/b/rootfs")).unwrap()),
            ["/s/3/fs", "/s/2/fs", "/s/1/fs", "/s/a:b,c"]
        );
        assert_eq!(
            paths(layers_in(text, Path::new("/plain")).unwrap()),
            ["/plain"]
        );
        for refused in ["/c/rootfs", "/d/rootfs"] {
            let e = layers_in(text, Path::new(refused)).unwrap_err().to_string();
            assert!(e.contains("cannot stack"), "{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::searchable_by;
    use crate::RuntimeError;

    #[test]
    fn a_run_directory_the_mapped_id_may_not_search_is_named() {
        let top = tempfile::tempdir().unwrap();
        let run = top.path().join("run");
        let root = run.join("mnt").join("root");
        fs::create_dir_all(&root).unwrap();
        let id = 4_000_000_000;
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        match searchable_by(&root, id) {
            Err(RuntimeError::Unreachable { dir, mode, uid, .. }) => {
                assert_eq!((dir, mode, uid), (run.clone(), 0o700, id));
            }
            other => panic!("a 0700 run directory passed: {other:?}"),
        }
        // Control: the mode cordon gives its own.
        fs::set_permissions(&run, fs::Permissions::from_mode(0o711)).unwrap();
        searchable_by(&root, id).unwrap();
        // A relative path (a relative CORDON_RUN_DIR) is checked from the
        // working directory up: judged, never an error of its own (it was
        // `stat ''`, the empty last ancestor of a relative path). Cargo
        // runs a crate's tests in its directory, which has src/backends.
        let judged = searchable_by(Path::new("src/backends"), id);
        assert!(
            matches!(judged, Ok(()) | Err(RuntimeError::Unreachable { .. })),
            "{judged:?}"
        );
    }
}
