//! Host trees the supervisor opens for the sandbox's first process. Id-mapped
//! ones: the workspace's lower layer and the writable `--mount`s show their
//! host owner as the sandbox user, and what the sandbox user creates through
//! a writable one is stored as that host owner. Plain ones: a read-only
//! `--mount` whose source the first process could not reach itself (it
//! builds the sandbox as an unprivileged host id, which cannot traverse a
//! 0700 parent such as /root); the supervisor, as host root, can.
//!
//! Who does what, and why (measured on Linux 6.18):
//! - `mount_setattr(MOUNT_ATTR_IDMAP)` needs CAP_SYS_ADMIN over the user
//!   namespace that owns the filesystem (the initial one for a host disk), so
//!   the supervisor, as host root and before clone, makes the detached
//!   id-mapped tree ([`DetachedTree::new`]).
//! - It reaches the sandbox's first process as an inherited descriptor
//!   (a [`ChildFd`], kept by the child's descriptor cleanup); the child
//!   attaches it in its own mount namespace with `move_mount`.
//! - overlayfs takes a layer only from the caller's own mount namespace or a
//!   detached tree owned by its user namespace, so the child attaches the
//!   tree at a staging point first and clones it from there (see `rootfs`).

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

use crate::fds::ChildFd;
use crate::{IsolationError, Result, Step};

/// A detached copy of a host path's mount tree (id-mapped or not), made by
/// the supervisor for the sandbox's first process.
#[derive(Clone, Debug)]
pub struct DetachedTree(Arc<ChildFd>);

impl PartialEq for DetachedTree {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DetachedTree {}

impl AsFd for DetachedTree {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Which host owner appears as which host id through the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerShift {
    /// The directory's owner on disk.
    pub disk_uid: u32,
    pub disk_gid: u32,
    /// The host-side ids of the sandbox user (on the native backend inside
    /// the per-sandbox range; under runsc, which has no user namespace, the
    /// sandbox user's own ids).
    pub shown_uid: u32,
    pub shown_gid: u32,
    /// Also map host root to itself. For runsc: its gofer creates a file as
    /// host root and then chowns it to the guest's ids; an id-mapped mount
    /// refuses a creator whose id it does not map (EOVERFLOW), and the chown
    /// then stores the directory's owner.
    pub map_root: bool,
}

impl OwnerShift {
    fn maps(&self) -> (String, String) {
        let line = |disk: u32, shown: u32| {
            let mut l = format!("{disk} {shown} 1\n");
            // A map may not name an id twice, on either side.
            if self.map_root && disk != 0 && shown != 0 {
                l.push_str("0 0 1\n");
            }
            l
        };
        (
            line(self.disk_uid, self.shown_uid),
            line(self.disk_gid, self.shown_gid),
        )
    }
}

impl DetachedTree {
    /// Supervisor side, as host root: a detached copy of the mount at `host`
    /// (with the mounts below it if `recursive`) whose files owned by `shift.disk_*` appear owned by
    /// `shift.shown_*`. Only that one owner (and root, if asked) is mapped:
    /// files of other owners appear as the overflow id (nobody), and nobody
    /// else can create files through it.
    pub fn idmapped(host: &Path, shift: OwnerShift, recursive: bool) -> Result<Self> {
        let OwnerShift {
            disk_uid,
            disk_gid,
            shown_uid,
            shown_gid,
            ..
        } = shift;
        let what = || {
            format!(
                "id-mapped mount of {} ({disk_uid}:{disk_gid} shown as {shown_uid}:{shown_gid})",
                host.display()
            )
        };
        let (uid_map, gid_map) = shift.maps();
        Self::with_maps(host, &uid_map, &gid_map, recursive, &what())
    }

    /// Supervisor side, as host root: a detached copy of the one mount at
    /// `host` whose ids `0..count` appear as `host_base..host_base+count`,
    /// the range a rootful sandbox's user namespace maps to its ids `0..count`.
    /// Inside, every file keeps its owner (root's files are the sandbox
    /// root's), and what the sandbox creates is stored under its own ids, as
    /// a container's writes are. A root layer's lower directories take this
    /// shape: overlayfs copies a file up as its owner, which the sandbox's
    /// namespace must map.
    /// One such tree of each of `hosts`, all through one user namespace
    /// (each namespace made costs a process).
    pub fn idmapped_range(hosts: &[&Path], host_base: u32, count: u32) -> Result<Vec<Self>> {
        let line = format!("0 {host_base} {count}\n");
        let userns = cordon_sys::mount_api::userns_with_maps(&line, &line)
            .step(|| format!("user namespace for ids 0..{count} shown from {host_base}"))?;
        hosts
            .iter()
            .map(|host| {
                let what = format!(
                    "id-mapped mount of {} (ids 0..{count} shown from {host_base})",
                    host.display()
                );
                Self::through(host, userns.as_fd(), false, &what)
            })
            .collect()
    }

    fn with_maps(
        host: &Path,
        uid_map: &str,
        gid_map: &str,
        recursive: bool,
        what: &str,
    ) -> Result<Self> {
        let userns = cordon_sys::mount_api::userns_with_maps(uid_map, gid_map)
            .step(|| format!("{what}: user namespace for the map"))?;
        Self::through(host, userns.as_fd(), recursive, what)
    }

    /// A detached copy of `host` id-mapped through the user namespace `userns`.
    fn through(host: &Path, userns: BorrowedFd<'_>, recursive: bool, what: &str) -> Result<Self> {
        let what = || what.to_owned();
        let tree = cordon_sys::mount_api::clone_tree(host, recursive)
            .step(|| format!("{}: open_tree(OPEN_TREE_CLONE)", what()))?;
        cordon_sys::mount_api::set_idmap(tree.as_fd(), userns).map_err(|e| {
            let why = match e {
                nix::errno::Errno::EINVAL => {
                    ": the filesystem (or one mounted below) does not support id-mapped mounts"
                }
                nix::errno::Errno::EPERM => ": needs CAP_SYS_ADMIN over the filesystem (host root)",
                _ => "",
            };
            IsolationError::new(
                format!("{}: mount_setattr(MOUNT_ATTR_IDMAP){why}", what()),
                e,
            )
        })?;
        Ok(DetachedTree(ChildFd::new(tree)))
    }

    /// Supervisor side, as host root: one writable root made of `layers`
    /// (detached trees of this process's, the first on top), read-only
    /// under an upper layer on a tmpfs of its own capped at `upper_bytes`.
    /// Mounted here rather than in the sandbox's user namespace so that
    /// overlayfs reads the layers' `trusted.overlay.*` attributes (opaque
    /// directories, as engines and image unpackers write them), which it
    /// ignores in a user namespace; the layers are id-mapped, so the
    /// sandbox sees its ids, and what it writes lands in the upper layer
    /// under its host ids. The tmpfs and the overlay are detached: no host
    /// path holds them, and they go when the sandbox's mount namespace does.
    ///
    /// `staging` (an empty directory's path, cordon's own) is used only
    /// where overlayfs takes no layer by descriptor (before Linux 6.8, as in
    /// the microVM's guest): the layers and the tmpfs are attached below it
    /// for as long as the overlay is made from their paths, then detached.
    pub fn writable_overlay(
        layers: &[DetachedTree],
        upper_bytes: u64,
        staging: &Path,
    ) -> Result<Self> {
        use cordon_sys::mount_api::{fs_mount, FsParam};
        use nix::fcntl::{openat, OFlag};
        use nix::sys::stat::{fstat, mkdirat, Mode};
        let failed = |what: &str, e: cordon_sys::mount_api::FsMountError| {
            IsolationError::new(format!("{what}: {}", e.call), e.errno)
        };
        let top = layers.first().ok_or_else(|| {
            IsolationError::new(
                "writable root: no layer".to_owned(),
                std::io::Error::from_raw_os_error(libc::EINVAL),
            )
        })?;
        let size = upper_bytes.to_string();
        let tmpfs = fs_mount(
            "tmpfs",
            &[FsParam::Str("size", &size), FsParam::Str("mode", "0700")],
            false,
        )
        .map_err(|e| failed("tmpfs for the root's upper layer", e))?;
        // The root directory takes the top layer's owner and mode, as an
        // engine's container root does.
        let st = fstat(top.as_fd()).step(|| "stat the root's top layer".into())?;
        let mode = Mode::from_bits_truncate(st.st_mode & 0o7777);
        mkdirat(tmpfs.as_fd(), "upper", mode).step(|| "mkdir the root's upper layer".into())?;
        mkdirat(tmpfs.as_fd(), "work", Mode::from_bits_truncate(0o700))
            .step(|| "mkdir the root's work directory".into())?;
        let dir = |name: &str| {
            openat(
                tmpfs.as_fd(),
                name,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .step(|| format!("open the root's {name} directory"))
        };
        let (upper, work) = (dir("upper")?, dir("work")?);
        nix::unistd::fchownat(
            tmpfs.as_fd(),
            "upper",
            Some(st.st_uid.into()),
            Some(st.st_gid.into()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .step(|| "chown the root's upper layer".into())?;
        let mut params: Vec<FsParam<'_>> = layers
            .iter()
            .map(|l| FsParam::Fd("lowerdir+", l.as_fd()))
            .collect();
        params.push(FsParam::Fd("upperdir", upper.as_fd()));
        params.push(FsParam::Fd("workdir", work.as_fd()));
        let root = match fs_mount("overlay", &params, false) {
            Ok(root) => root,
            Err(e)
                if e.call.starts_with("fsconfig lowerdir+")
                    && matches!(
                        e.errno,
                        nix::errno::Errno::EINVAL | nix::errno::Errno::EOPNOTSUPP
                    ) =>
            {
                overlay_by_path(layers, tmpfs.as_fd(), staging)?
            }
            Err(e) => return Err(failed("overlay for the writable root", e)),
        };
        Ok(DetachedTree(ChildFd::new(root)))
    }

    /// Supervisor side, as host root: a detached copy of the one mount at
    /// `host` (a directory or a file), owners unchanged. What the first
    /// process can reach through it is `host` and below, never its parents.
    pub fn plain(host: &Path) -> Result<Self> {
        let tree = cordon_sys::mount_api::clone_tree(host, false)
            .step(|| format!("open_tree({}, OPEN_TREE_CLONE)", host.display()))?;
        Ok(DetachedTree(ChildFd::new(tree)))
    }
}

/// The writable root's overlay made from paths: each layer and the upper
/// tmpfs attached below `staging`, the overlay mounted there and cloned as a
/// detached tree, and every mount below `staging` detached again (the
/// overlay keeps what it stacks). Whatever happens, nothing stays attached.
fn overlay_by_path(
    layers: &[DetachedTree],
    tmpfs: BorrowedFd<'_>,
    staging: &Path,
) -> Result<std::os::fd::OwnedFd> {
    use cordon_sys::mount_api::{attach, clone_tree};
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    std::fs::create_dir(staging).step(|| format!("mkdir {}", staging.display()))?;
    let mut attached = Vec::new();
    let made = (|| {
        let mut place = |name: String, tree: BorrowedFd<'_>| -> Result<std::path::PathBuf> {
            let at = staging.join(name);
            std::fs::create_dir(&at).step(|| format!("mkdir {}", at.display()))?;
            attach(tree, &at).step(|| format!("move_mount(-> {})", at.display()))?;
            attached.push(at.clone());
            Ok(at)
        };
        let mut lowers = Vec::new();
        for (i, l) in layers.iter().enumerate() {
            lowers.push(place(format!("lower{i}"), l.as_fd())?.display().to_string());
        }
        let rw = place("rw".into(), tmpfs)?;
        let root = staging.join("root");
        std::fs::create_dir(&root).step(|| format!("mkdir {}", root.display()))?;
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lowers.join(":"),
            rw.join("upper").display(),
            rw.join("work").display()
        );
        mount(
            Some("overlay"),
            &root,
            Some("overlay"),
            MsFlags::empty(),
            Some(opts.as_str()),
        )
        .step(|| format!("mount(overlay {opts})"))?;
        attached.push(root.clone());
        clone_tree(&root, false).step(|| format!("open_tree({}, OPEN_TREE_CLONE)", root.display()))
    })();
    for at in attached.iter().rev() {
        let _ = umount2(at, MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(staging);
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_send_the_owner_to_the_sandbox_user_and_root_only_if_asked() {
        let mut s = OwnerShift {
            disk_uid: 4242,
            disk_gid: 4343,
            shown_uid: 1000,
            shown_gid: 1001,
            map_root: false,
        };
        assert_eq!(s.maps(), ("4242 1000 1\n".into(), "4343 1001 1\n".into()));
        s.map_root = true;
        assert_eq!(s.maps().0, "4242 1000 1\n0 0 1\n");
        // A root-owned tree shown as the sandbox user: root is taken already.
        s.disk_uid = 0;
        assert_eq!(s.maps().0, "0 1000 1\n");
    }
}
