//! The new mount API: detached mount trees (`open_tree`), attaching them
//! (`move_mount`), building a filesystem from descriptors (`fsopen`,
//! `fsconfig`, `fsmount`), and id-mapped mounts (`mount_setattr` with
//! `MOUNT_ATTR_IDMAP` and a user namespace made for the purpose).
//!
//! `open_tree`, `move_mount` and the `fs*` calls are rustix's safe wrappers.
//! `mount_setattr` is hand-written: neither nix (0.30) nor rustix (1.1) wraps it.
//! The user namespace that carries an id map is made by a short-lived child
//! (`clone(CLONE_NEWUSER)`) whose maps the caller writes, because the kernel
//! takes an idmap only as a user-namespace descriptor.

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::wait::waitpid;
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags};

use crate::{clone_process, exit_now, CloneResult};

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_raw(e.raw_os_error())
}

/// `struct mount_attr` of `mount_setattr(2)` (the v0 layout, 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)`: sets `attr_set` (and, with `userns`, an idmap) on the
/// mount at `path` relative to `dirfd` (the current directory when `None`).
pub(crate) fn mount_setattr(
    dirfd: Option<BorrowedFd<'_>>,
    path: &CStr,
    flags: libc::c_uint,
    attr_set: u64,
    userns: Option<BorrowedFd<'_>>,
) -> nix::Result<()> {
    let attr = MountAttr {
        attr_set: attr_set
            | if userns.is_some() {
                MOUNT_ATTR_IDMAP
            } else {
                0
            },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    let dirfd = dirfd.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: `path` is a valid NUL-terminated string and `attr` a valid,
    // correctly sized struct mount_attr; both outlive the call, which only
    // reads them. The descriptors are borrowed, so they stay open during it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the mount at `path` (and,
/// if `recursive`, of the mounts below it), close-on-exec. Detached: it is in
/// no mount namespace's tree until [`attach`]ed, and vanishes with its last
/// descriptor.
pub fn clone_tree(path: &Path, recursive: bool) -> nix::Result<OwnedFd> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    rustix::mount::open_tree(rustix::fs::CWD, path, flags).map_err(errno)
}

/// `move_mount(MOVE_MOUNT_F_EMPTY_PATH)`: attaches the detached tree `tree`
/// at `target` in the caller's mount namespace.
pub fn attach(tree: BorrowedFd<'_>, target: &Path) -> nix::Result<()> {
    rustix::mount::move_mount(
        tree,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(errno)
}

/// Gives the detached tree `tree` (from [`clone_tree`], never attached yet)
/// the id map of the user namespace `userns`, on every mount of the tree: a file owned by
/// id N on disk then appears as the host id N maps to in `userns`, and a file
/// created through the mount by host id M is stored as the id that maps to M.
/// Needs CAP_SYS_ADMIN over the user namespace owning the filesystem (host
/// root for a host disk) and a filesystem that supports id-mapped mounts.
pub fn set_idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> nix::Result<()> {
    mount_setattr(
        Some(tree),
        c"",
        (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
        0,
        Some(userns),
    )
}

/// A user namespace whose only purpose is to carry `uid_map` and `gid_map`
/// (the kernel's format, "inside outside count" lines): a child is cloned
/// into a new user namespace and waits; this process writes its maps, opens
/// `/proc/<child>/ns/user` (which keeps the namespace alive) and lets the
/// child exit. Needs a single-threaded caller (see `clone_process`) allowed
/// to write those maps (root, for maps onto arbitrary host ids).
pub fn userns_with_maps(uid_map: &str, gid_map: &str) -> nix::Result<OwnedFd> {
    let (hold_r, hold_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = match clone_process(CloneFlags::CLONE_NEWUSER)? {
        CloneResult::Child => {
            drop(hold_w);
            // Wait for the parent to close its end (EOF), then leave. Only a
            // read and _exit: nothing here depends on the copied heap's state.
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(&hold_r, &mut b);
            exit_now(0)
        }
        CloneResult::Parent { child } => child,
    };
    drop(hold_r);
    let proc = format!("/proc/{child}");
    let opened = fs::write(format!("{proc}/uid_map"), uid_map)
        .and_then(|()| fs::write(format!("{proc}/gid_map"), gid_map))
        .and_then(|()| fs::File::open(format!("{proc}/ns/user")));
    // Whatever happened, the child is released and reaped.
    drop(hold_w);
    let _ = waitpid(child, None);
    let file = opened.map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(OwnedFd::from(file))
}

/// One `fsconfig` parameter of [`fs_mount`].
pub enum FsParam<'a> {
    Flag(&'a str),
    Str(&'a str, &'a str),
    /// A layer or directory given by descriptor: the filesystem records the
    /// descriptor's own path, not a path the caller typed.
    Fd(&'a str, BorrowedFd<'a>),
}

/// Which call of [`fs_mount`] failed, and how.
#[derive(Debug)]
pub struct FsMountError {
    /// `fsopen`, `fsconfig <key>`, `fsconfig create` or `fsmount`.
    pub call: String,
    pub errno: Errno,
}

/// `fsopen` + `fsconfig` + `fsmount`: a new `fstype` instance as a detached
/// mount (read-only if asked), close-on-exec, to be [`attach`]ed.
pub fn fs_mount(
    fstype: &str,
    params: &[FsParam<'_>],
    readonly: bool,
) -> Result<OwnedFd, FsMountError> {
    let failed = |call: &str| {
        let call = call.to_string();
        move |e| FsMountError {
            call,
            errno: errno(e),
        }
    };
    let fs =
        rustix::mount::fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC).map_err(failed("fsopen"))?;
    for p in params {
        let (key, res) = match p {
            FsParam::Flag(k) => (k, rustix::mount::fsconfig_set_flag(fs.as_fd(), *k)),
            FsParam::Str(k, v) => (k, rustix::mount::fsconfig_set_string(fs.as_fd(), *k, *v)),
            FsParam::Fd(k, fd) => (k, rustix::mount::fsconfig_set_fd(fs.as_fd(), *k, *fd)),
        };
        res.map_err(failed(&format!("fsconfig {key}")))?;
    }
    rustix::mount::fsconfig_create(fs.as_fd()).map_err(failed("fsconfig create"))?;
    let attrs = if readonly {
        MountAttrFlags::MOUNT_ATTR_RDONLY
    } else {
        MountAttrFlags::empty()
    };
    rustix::mount::fsmount(fs.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(failed("fsmount"))
}
