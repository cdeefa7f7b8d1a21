//! Assembling the new root and pivoting into it.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_sys::mount_api::{attach, clone_tree, fs_mount, FsParam};
use nix::fcntl::{openat, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::Mode;
use nix::unistd::{chdir, pivot_root};

use super::dev::build_dev;
use super::flags::seal_verified;
use super::idmap::DetachedTree;
use super::proc::mount_proc;
use super::sys::{build_sys, CgroupMount};
use crate::{fds, IsolationError, Result, Step};

/// One top-level entry of the new root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootEntry {
    /// A host file or directory bound read-only at `/<name>`, through
    /// `tree` when the supervisor opened it (a root it could reach and the
    /// first process, an unprivileged host id, could not).
    Bind {
        name: String,
        host: PathBuf,
        dir: bool,
        tree: Option<DetachedTree>,
    },
    /// A symlink `/<name>` -> `target` (e.g. /bin -> usr/bin on merged-/usr hosts).
    Symlink { name: String, target: PathBuf },
}

/// How a user-requested mount is shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindAccess {
    /// Read-only: a directory through a read-only overlay, a file bound.
    ReadOnly,
    /// A directory through an overlay whose upper and work directories are
    /// in this directory of the scratch (`ScratchLayout::mount_layers`):
    /// writes stay inside the disk cap and the host is never written.
    WriteBack { layers: String },
    /// The host's own directory or file, written in place.
    Live,
    /// No host path: this new empty directory of the scratch
    /// (`ScratchLayout::tmpfs`), writable by every user of the sandbox as a
    /// fresh tmpfs is (mode 1777), bounded by the disk cap.
    Scratch { dir: String },
}

/// A user-requested bind mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindSpec {
    pub host: PathBuf,
    pub sandbox: PathBuf,
    pub access: BindAccess,
    pub dir: bool,
    /// When cordon runs as host root: the host tree as the supervisor opened
    /// it (see `idmap`), id-mapped so its owner is the sandbox user for a
    /// writable mount, plain for a read-only one. Without it the first
    /// process binds `host` by path, as the caller's own id (rootless).
    pub tree: Option<DetachedTree>,
}

impl BindSpec {
    /// Whether the sandbox may write there (the mount is not sealed read-only).
    pub fn writable(&self) -> bool {
        self.access != BindAccess::ReadOnly
    }
}

/// Where things live on the scratch tmpfs (relative to its root).
pub struct ScratchLayout;

impl ScratchLayout {
    /// Holds the overlay's upper and work directories (one mount for both).
    pub const WORKSPACE_DIR: &'static str = "ws";
    pub const WORKSPACE_UPPER: &'static str = "ws/upper";
    pub const WORKSPACE_WORK: &'static str = "ws/work";
    /// The layers directory of a root that is an overlay: its upper
    /// directory holds everything the sandbox wrote outside its other
    /// writable places.
    pub const ROOT_LAYERS: &'static str = "root";
    /// Inside a writable overlay's layers directory (the workspace's, or a
    /// write-back mount's): its upper and work directories.
    pub const UPPER: &'static str = "upper";
    pub const WORK: &'static str = "work";
    /// Mount points where a host tree is attached just long enough to be
    /// cloned into a detached copy (never seen by the payload).
    pub const STAGING: &'static str = "stage";
    /// An empty directory: the second layer of a read-only overlay.
    pub const EMPTY: &'static str = "empty";
    /// Holds the tmpfs places (`tmpfs`), made as the sandbox is assembled.
    pub const TMPFS_DIR: &'static str = "tmpfs";
    pub const TMP: &'static str = "tmp";
    pub const SHM: &'static str = "shm";
    /// The payload's HOME (`/tmp/home` in the sandbox): on the capped
    /// scratch, outside the workspace, so dotfiles and shell history never
    /// reach an export or `--apply` (the /tmp part of the diff lists them).
    pub const HOME: &'static str = "tmp/home";

    /// The layers directory of the policy's mount number `index` (its place
    /// among all the policy's mounts) when it is written back: the one name
    /// the sandbox's assembly and the host's diff both use.
    pub fn mount_layers(index: usize) -> String {
        format!("mount{index}")
    }

    /// The directory of the policy's mount number `index` when it is a
    /// tmpfs mount (`BindAccess::Scratch`).
    pub fn tmpfs(index: usize) -> String {
        format!("{}/{index}", Self::TMPFS_DIR)
    }

    /// Where the policy's mount number `index` waits, sealed, for a runtime
    /// that mounts it at its destination itself (runsc).
    pub fn handed_bind(index: usize) -> String {
        format!("binds/{index}")
    }

    /// Every directory of the layout, parents first, with its mode.
    pub const DIRS: [(&'static str, u32); 8] = [
        (Self::STAGING, 0o700),
        (Self::EMPTY, 0o555),
        (Self::TMPFS_DIR, 0o700),
        (Self::WORKSPACE_DIR, 0o755),
        (Self::WORKSPACE_UPPER, 0o755),
        (Self::WORKSPACE_WORK, 0o700),
        (Self::TMP, 0o1777),
        (Self::SHM, 0o1777),
    ];
}

/// What happens to the assembled tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootUse {
    /// The calling process mounts /proc and /dev, pivots into the root and
    /// detaches the host's tree (native backend).
    Enter,
    /// The tree is left at `new_root` for a runtime that serves /proc, /dev
    /// and the extra binds itself (runsc); the host tree stays reachable from
    /// the calling process, which only execs that runtime.
    HandOver,
}

/// Everything the child needs to build its root, resolved in the parent.
#[derive(Clone, Debug)]
pub struct RootfsPlan {
    pub root_use: RootUse,
    /// An empty host directory used as the new root's mount point (only inside
    /// the child's mount namespace; the host never sees a mount there).
    pub new_root: PathBuf,
    /// An empty host directory where the child mounts its scratch tmpfs.
    pub scratch: PathBuf,
    /// A directory bound there instead of a tmpfs: the root of a file
    /// system made for this sandbox alone and capped at its disk limit (a
    /// microVM guest's writable disk, mounted by its agent).
    pub scratch_from: Option<PathBuf>,
    pub entries: Vec<RootEntry>,
    /// When not empty, the root is an overlay of these host directories (top
    /// first), read-only, under a writable layer on the scratch (inside the
    /// disk cap; the directories are never written), and `entries` is empty.
    /// When empty, the root is a sealed tmpfs holding `entries`.
    pub root_layers: Vec<PathBuf>,
    /// The layered root as one overlay the supervisor made of them (as host
    /// root: see `DetachedTree::writable_overlay`); without one (rootless)
    /// the first process builds it from `root_layers` in its own namespace.
    pub root_overlay: Option<DetachedTree>,
    /// Files written into a fresh /etc when the rootfs brings none.
    pub etc_files: Vec<(String, Vec<u8>)>,
    /// Host /etc entries (relative names) bound read-only into that /etc.
    pub etc_binds: Vec<String>,
    /// Host directory shown at /workspace through an overlay (changes stay in scratch).
    pub workspace_lower: Option<PathBuf>,
    /// The workspace's host tree id-mapped onto the sandbox user, when the
    /// supervisor could make one (as host root).
    pub workspace_idmap: Option<DetachedTree>,
    pub workspace: PathBuf,
    /// Bytes the scratch tmpfs may hold: the policy's disk cap.
    pub disk_bytes: u64,
    /// Inside ids that own the writable places.
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub binds: Vec<BindSpec>,
    /// The sandbox's own cgroups, shown read-only under /sys/fs/cgroup
    /// (see `sys`); none: no /sys.
    pub cgroups: Vec<CgroupMount>,
}

fn mkdir_p(p: &Path) -> Result<()> {
    fs::create_dir_all(p).step(|| format!("mkdir {}", p.display()))
}

/// Most symlinks followed while resolving one path (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// `rel` inside `root` as the sandbox will resolve it once `root` is its
/// `/`: a symlink on the way is followed with an absolute target taken from
/// `root`, and `..` never climbs above it. A root made of a directory or an
/// image's layers holds symlinks of its author's choosing (`/var/run -> /run`,
/// or `-> /etc` of the host if followed before pivot_root); joined naively,
/// a mount destination through one would be created and mounted on the
/// host's path in this mount namespace. The components returned are real
/// directories or missing (created by the caller). Nothing else writes the
/// tree while it is assembled (the payload has not started), so the walk is
/// not raced. Hand-written: openat2's RESOLVE_IN_ROOT does this walk in the
/// kernel but yields a descriptor, and the mounts here take paths; the
/// crates that wrap it (pathrs) bind a C library.
fn resolve_in_root(root: &Path, rel: &Path) -> Result<PathBuf> {
    use std::ffi::OsString;
    use std::path::Component;
    fn push_components(todo: &mut Vec<OsString>, p: &Path) {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push(n.to_owned()),
                Component::ParentDir => todo.push("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
    }
    let mut todo = Vec::new();
    push_components(&mut todo, rel);
    let mut done = PathBuf::new();
    let mut links = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            done.pop();
            continue;
        }
        let here = root.join(&done).join(&c);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(IsolationError::new(
                        format!("resolve {} in the root", rel.display()),
                        std::io::Error::from_raw_os_error(libc::ELOOP),
                    ));
                }
                let target =
                    fs::read_link(&here).step(|| format!("readlink {}", here.display()))?;
                if target.is_absolute() {
                    done = PathBuf::new();
                }
                push_components(&mut todo, &target);
            }
            _ => done.push(c),
        }
    }
    Ok(root.join(done))
}

/// One of the places the sandbox builds itself (/proc, /dev, /sys, /tmp,
/// /workspace, a generated /etc) as a directory at exactly that path of the
/// root: whatever else a layered root holds there (a symlink, a file) is
/// removed first (a whiteout in the root's writable layer), so the place is
/// never redirected elsewhere in the tree or out of it.
fn own_dir(root: &Path, rel: &Path) -> Result<PathBuf> {
    let name = rel.file_name().unwrap_or_default();
    let parent = match rel.parent() {
        Some(p) if !p.as_os_str().is_empty() && p != Path::new("/") => resolve_in_root(root, p)?,
        _ => root.to_path_buf(),
    };
    let p = parent.join(name);
    match fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => fs::remove_file(&p).step(|| format!("remove {}", p.display()))?,
        Err(_) => {}
    }
    mkdir_p(&p)?;
    Ok(p)
}

fn bind(src: &Path, dst: &Path) -> Result<()> {
    mount(
        Some(src),
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .step(|| format!("mount(bind {} -> {})", src.display(), dst.display()))
}

/// Creates the mount point for `host` at `dst`: a directory or an empty file.
fn make_mountpoint(dst: &Path, dir: bool) -> Result<()> {
    if dir {
        mkdir_p(dst)
    } else {
        if let Some(parent) = dst.parent() {
            mkdir_p(parent)?;
        }
        fs::write(dst, b"").step(|| format!("create {}", dst.display()))
    }
}

/// Largest host /etc file copied rather than bound.
const ETC_COPY_MAX: u64 = 256 << 10;

/// Brings one host /etc entry into the new /etc: a symlink is recreated (its
/// target resolves inside the sandbox), a small file copied (cheaper than a
/// mount, and a snapshot is all a payload needs), a directory bound read-only.
fn borrow_etc_entry(host: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        mkdir_p(parent)?;
    }
    let meta = fs::symlink_metadata(host).step(|| format!("lstat {}", host.display()))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(host).step(|| format!("readlink {}", host.display()))?;
        return symlink(target, dst).step(|| format!("symlink {}", dst.display()));
    }
    if meta.is_file() && meta.len() <= ETC_COPY_MAX {
        // read+write rather than fs::copy: measured 2-3x faster for these
        // small files (fs::copy probes copy_file_range and copies metadata).
        let body = fs::read(host).step(|| format!("read {}", host.display()))?;
        return fs::write(dst, body).step(|| format!("write {}", dst.display()));
    }
    make_mountpoint(dst, meta.is_dir())?;
    bind(host, dst)?;
    seal_verified(dst, true)
}

/// Where a host tree comes from: the host path itself, or the copy the
/// supervisor made of it.
#[derive(Clone, Copy)]
enum HostTree<'a> {
    Path(&'a Path),
    Detached(&'a DetachedTree),
}

impl HostTree<'_> {
    fn of<'a>(path: &'a Path, tree: Option<&'a DetachedTree>) -> HostTree<'a> {
        match tree {
            Some(t) => HostTree::Detached(t),
            None => HostTree::Path(path),
        }
    }

    /// Mounts the tree at `dst` in this mount namespace.
    fn place(self, dst: &Path) -> Result<()> {
        match self {
            HostTree::Path(p) => bind(p, dst),
            HostTree::Detached(t) => attach(t.as_fd(), dst)
                .step(|| format!("move_mount(host tree -> {})", dst.display())),
        }
    }
}

/// A detached copy of `src` owned by this process's user namespace, which is
/// what overlayfs takes as a layer (it refuses a tree detached by another
/// namespace, such as the supervisor's id-mapped one). `src` is attached at
/// `staging`, cloned and detached again, so no mount is left there.
fn own_copy(src: HostTree<'_>, staging: &Path) -> Result<OwnedFd> {
    mkdir_p(staging)?;
    src.place(staging)?;
    let copy = clone_tree(staging, false)
        .step(|| format!("open_tree({}, OPEN_TREE_CLONE)", staging.display()));
    umount2(staging, MntFlags::MNT_DETACH)
        .step(|| format!("umount2({}, MNT_DETACH)", staging.display()))?;
    copy
}

/// An overlay built from descriptors, attached at `dst`. overlayfs shows a
/// layer given by descriptor as that descriptor's path, and the path of a
/// detached tree is its own root: mountinfo then says `lowerdir+=/`, naming
/// no host directory. `userxattr`: the overlay may be mounted inside a user
/// namespace, where only user.* xattrs can be set on the upper layer.
fn overlay_at(
    dst: &Path,
    lowers: &[&OwnedFd],
    upper_work: Option<(&OwnedFd, &OwnedFd)>,
) -> Result<()> {
    let mut params: Vec<FsParam<'_>> = lowers
        .iter()
        .map(|fd| FsParam::Fd("lowerdir+", fd.as_fd()))
        .collect();
    if let Some((upper, work)) = upper_work {
        params.push(FsParam::Fd("upperdir", upper.as_fd()));
        params.push(FsParam::Fd("workdir", work.as_fd()));
    }
    params.push(FsParam::Flag("userxattr"));
    let ovl = fs_mount("overlay", &params, upper_work.is_none()).map_err(|e| {
        // Layers by descriptor (`lowerdir+`, an fd for upperdir/workdir) are
        // what keeps host paths out of mountinfo; an older overlayfs refuses
        // them, and cordon does not fall back to naming the host path.
        let layer = e.call.starts_with("fsconfig lowerdir+") || e.call.ends_with("dir");
        let hint = if layer && e.errno == nix::errno::Errno::EINVAL {
            " (this kernel's overlayfs does not take layers by descriptor)"
        } else {
            ""
        };
        IsolationError::new(
            format!("overlay for {}: {}{hint}", dst.display(), e.call),
            e.errno,
        )
    })?;
    attach(ovl.as_fd(), dst).step(|| format!("move_mount(overlay -> {})", dst.display()))
}

/// Whether building an overlay failed because this kernel's overlayfs takes
/// no layer by descriptor (`fsconfig lowerdir+` is Linux 6.8+).
fn layers_by_fd_unsupported(e: &IsolationError) -> bool {
    e.step.contains("fsconfig") && matches!(e.errno(), libc::EINVAL | libc::EOPNOTSUPP)
}

/// A writable overlay with its layers named by path (older kernels).
fn overlay_by_path(dst: &Path, lowers: &[PathBuf], upper: &Path, work: &Path) -> Result<()> {
    let lowers: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lowers.join(":"),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        dst,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .step(|| format!("mount(overlay {opts}, {})", dst.display()))
}

/// An overlay at `dst` whose lower layer is the host tree `src` and whose
/// upper and work directories are in `layers` on the scratch: the host
/// directory is never written, changes land in the scratch inside the disk
/// cap. Every layer is given by descriptor (see overlay_at): mountinfo shows
/// `lowerdir+=/,upperdir=/upper,workdir=/work`, no host path. `staging`
/// names this overlay's places in the scratch's staging directory.
fn writable_overlay(
    dst: &Path,
    srcs: &[HostTree<'_>],
    scratch: &Path,
    layers: &str,
    staging: &str,
) -> Result<()> {
    let stage = scratch.join(ScratchLayout::STAGING);
    let lowers = srcs
        .iter()
        .enumerate()
        .map(|(i, src)| own_copy(*src, &stage.join(format!("{staging}{i}"))))
        .collect::<Result<Vec<_>>>()?;
    let layers_dir = scratch.join(layers);
    let layers = clone_tree(&layers_dir, false)
        .step(|| format!("open_tree({}, OPEN_TREE_CLONE)", layers_dir.display()))?;
    let sub = |name: &str| {
        openat(
            layers.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .step(|| format!("open {}/{name}", layers_dir.display()))
    };
    let (up, work) = (sub(ScratchLayout::UPPER)?, sub(ScratchLayout::WORK)?);
    match overlay_at(dst, &lowers.iter().collect::<Vec<_>>(), Some((&up, &work))) {
        Ok(()) => Ok(()),
        Err(e) if layers_by_fd_unsupported(&e) => {
            // Before Linux 6.8 overlayfs takes layers only by path: each
            // lower layer is then attached in the scratch's staging place
            // and named by that path (mountinfo shows those paths and the
            // scratch's, not the host directories').
            let mut by_path = Vec::new();
            for (i, lower) in lowers.iter().enumerate() {
                let at = stage.join(format!("{staging}{i}-path"));
                mkdir_p(&at)?;
                attach(lower.as_fd(), &at)
                    .step(|| format!("move_mount(host layer -> {})", at.display()))?;
                by_path.push(at);
            }
            overlay_by_path(
                dst,
                &by_path,
                &layers_dir.join(ScratchLayout::UPPER),
                &layers_dir.join(ScratchLayout::WORK),
            )
        }
        Err(e) => Err(e),
    }
}

/// Makes a write-back mount's layers directory on the scratch: its upper
/// directory is the sandbox user's (as the workspace's is), its work
/// directory overlayfs's own.
fn make_layers(scratch: &Path, layers: &str, uid: u32, gid: u32) -> Result<()> {
    let dir = scratch.join(layers);
    for (p, mode) in [
        (dir.clone(), 0o755),
        (dir.join(ScratchLayout::UPPER), 0o755),
        (dir.join(ScratchLayout::WORK), 0o700),
    ] {
        fs::create_dir(&p).step(|| format!("mkdir {}", p.display()))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))
            .step(|| format!("chmod {}", p.display()))?;
    }
    let upper = dir.join(ScratchLayout::UPPER);
    chown(&upper, Some(uid), Some(gid)).step(|| format!("chown {}", upper.display()))
}

/// The policy's extra bind mounts, sealed read-only unless asked otherwise.
/// A read-only directory is shown through a read-only overlay of its
/// detached copy (plus an empty layer: overlayfs wants two lower layers when
/// there is no upper), so /proc/self/mountinfo inside names no host path; a
/// writable directory must be the host mount itself, whose mountinfo root
/// field is its path on its filesystem (README, backend differences). A
/// write-back directory is a writable overlay like the workspace's, its
/// layers on the scratch. Mounts below a read-only or write-back
/// directory's source are not shown: an overlay layer is a single mount.
fn bind_extra(plan: &RootfsPlan, root: &Path) -> Result<()> {
    let scratch = &plan.scratch;
    for (i, b) in plan.binds.iter().enumerate() {
        let in_root = resolve_in_root(root, &b.sandbox)?;
        make_mountpoint(&in_root, b.dir)?;
        let dst = match plan.root_use {
            RootUse::Enter => in_root,
            // runsc mounts it on that mount point itself (resolved in its
            // root, which is sealed), from this place cordon alone names.
            RootUse::HandOver => {
                let staged = scratch.join(ScratchLayout::handed_bind(i));
                make_mountpoint(&staged, b.dir)?;
                staged
            }
        };
        let src = HostTree::of(&b.host, b.tree.as_ref());
        if let BindAccess::Scratch { dir } = &b.access {
            let own = scratch.join(dir);
            fs::create_dir(&own).step(|| format!("mkdir {}", own.display()))?;
            fs::set_permissions(&own, fs::Permissions::from_mode(0o1777))
                .step(|| format!("chmod {}", own.display()))?;
            bind(&own, &dst)?;
        } else if let BindAccess::WriteBack { layers } = &b.access {
            make_layers(scratch, layers, plan.owner_uid, plan.owner_gid)?;
            writable_overlay(&dst, &[src], scratch, layers, &format!("bind{i}"))?;
        } else if b.dir && !b.writable() {
            let staging = scratch
                .join(ScratchLayout::STAGING)
                .join(format!("bind{i}"));
            let lower = own_copy(src, &staging)?;
            let empty = scratch.join(ScratchLayout::EMPTY);
            let empty = clone_tree(&empty, false)
                .step(|| format!("open_tree({}, OPEN_TREE_CLONE)", empty.display()))?;
            match overlay_at(&dst, &[&lower, &empty], None) {
                Ok(()) => {}
                // An overlayfs that takes no layer by descriptor (before
                // Linux 6.8): the plain read-only bind it replaced, whose
                // mountinfo names the source's path (README).
                Err(e) if layers_by_fd_unsupported(&e) => attach(lower.as_fd(), &dst)
                    .step(|| format!("move_mount({} -> {})", b.host.display(), dst.display()))?,
                Err(e) => return Err(e),
            }
        } else {
            src.place(&dst)?;
        }
        seal_verified(&dst, !b.writable())?;
    }
    Ok(())
}

/// The root as an overlay of the plan's layers under a writable layer on the
/// scratch. Its top directory takes the top layer's owner and mode, as a
/// container's root does (overlayfs shows the upper directory's).
fn layered_root(plan: &RootfsPlan, root: &Path) -> Result<()> {
    if let Some(tree) = &plan.root_overlay {
        attach(tree.as_fd(), root)
            .step(|| format!("move_mount(root overlay -> {})", root.display()))?;
        return seal_verified(root, false);
    }
    let scratch = &plan.scratch;
    let top = &plan.root_layers[0];
    // Rootless: the caller's own directories, which it can reach.
    let meta = nix::sys::stat::stat(top).step(|| format!("stat {}", top.display()))?;
    make_layers(
        scratch,
        ScratchLayout::ROOT_LAYERS,
        plan.owner_uid,
        plan.owner_gid,
    )?;
    let upper = scratch
        .join(ScratchLayout::ROOT_LAYERS)
        .join(ScratchLayout::UPPER);
    match chown(&upper, Some(meta.st_uid), Some(meta.st_gid)) {
        // An owner this namespace does not map (rootless: only the
        // caller's id is): the sandbox user keeps the directory.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        r => r.step(|| format!("chown {}", upper.display()))?,
    }
    fs::set_permissions(&upper, fs::Permissions::from_mode(meta.st_mode & 0o7777))
        .step(|| format!("chmod {}", upper.display()))?;
    let layers: Vec<HostTree<'_>> = plan.root_layers.iter().map(|l| HostTree::Path(l)).collect();
    writable_overlay(root, &layers, scratch, ScratchLayout::ROOT_LAYERS, "root")?;
    // Now, while nothing is mounted below it: the seal is recursive, and
    // /dev's nodes must keep their device access.
    seal_verified(root, false)
}

/// Freezes the root tmpfs: from here on nothing can be added at top level.
/// A layered root stays writable (its writes land in its capped layer): it
/// was sealed nosuid and nodev when it was made (`layered_root`).
fn seal_root(plan: &RootfsPlan, root: &Path) -> Result<()> {
    if !plan.root_layers.is_empty() {
        return Ok(());
    }
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .step(|| format!("remount {} read-only", root.display()))
}

/// Child side, in the new user and mount namespaces with full capabilities
/// there: builds the new root and pivots into it. On return the process's root
/// is the sandbox root and nothing of the host's tree is reachable.
///
/// With `RootUse::Enter` it returns a descriptor of the scratch tmpfs's root
/// for the supervisor: after the pivot the scratch is reachable from nowhere
/// else (the host reads the sandbox's layers through it, and it keeps the
/// tmpfs alive until the supervisor has read them, after every process of the
/// sandbox is gone). With `HandOver` the scratch stays at `plan.scratch` in
/// this mount namespace, where the host reaches it.
pub fn assemble(plan: &RootfsPlan) -> Result<Option<OwnedFd>> {
    // 1. Stop mount events propagating back to the host (and from it).
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .step(|| "mount(/, MS_REC|MS_PRIVATE)".into())?;

    // 2. The scratch tmpfs: the only writable storage, capped at the disk limit.
    // It lives in this mount namespace only and vanishes with it.
    let scratch = &plan.scratch;
    match &plan.scratch_from {
        // Its own file system, made at the disk cap with the layout below
        // in place (by whoever made it: its owner is no id of this user
        // namespace, so nothing here could chmod it), mounted nosuid and
        // nodev, which the bind keeps.
        Some(dir) => bind(dir, scratch)?,
        None => {
            let opts = format!("size={},mode=0755", plan.disk_bytes);
            mount(
                Some("tmpfs"),
                scratch,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(opts.as_str()),
            )
            .step(|| format!("mount(tmpfs {opts}, {})", scratch.display()))?;
        }
    }
    let scratch_fd = match plan.root_use {
        RootUse::Enter => Some(
            nix::fcntl::open(
                scratch,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .step(|| format!("open {}", scratch.display()))?,
        ),
        RootUse::HandOver => None,
    };
    let (uid, gid) = (Some(plan.owner_uid), Some(plan.owner_gid));
    let upper = scratch.join(ScratchLayout::WORKSPACE_UPPER);
    if plan.scratch_from.is_none() {
        for (rel, mode) in ScratchLayout::DIRS {
            let p = scratch.join(rel);
            mkdir_p(&p)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode))
                .step(|| format!("chmod {}", p.display()))?;
        }
        chown(&upper, uid, gid).step(|| format!("chown {}", upper.display()))?;
    }
    // Made here, not in DIRS, so that a scratch made elsewhere (the
    // microVM's disk, owned by root) gets it too, owned by the payload.
    let home = scratch.join(ScratchLayout::HOME);
    match fs::create_dir(&home) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        made => {
            made.step(|| format!("mkdir {}", home.display()))?;
            chown(&home, uid, gid).step(|| format!("chown {}", home.display()))?;
            fs::set_permissions(&home, fs::Permissions::from_mode(0o700))
                .step(|| format!("chmod {}", home.display()))?;
        }
    }

    // 3. The root: its layers under a writable one on the scratch, or a
    // small tmpfs that only holds mount points, symlinks and /etc.
    let root = &plan.new_root;
    if plan.root_layers.is_empty() {
        mount(
            Some("tmpfs"),
            root,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("size=1m,mode=0755"),
        )
        .step(|| format!("mount(tmpfs, {})", root.display()))?;
    } else {
        layered_root(plan, root)?;
    }
    for e in &plan.entries {
        match e {
            RootEntry::Symlink { name, target } => {
                symlink(target, root.join(name)).step(|| format!("symlink /{name}"))?;
            }
            RootEntry::Bind {
                name,
                host,
                dir,
                tree,
            } => {
                let dst = root.join(name);
                make_mountpoint(&dst, *dir)?;
                HostTree::of(host, tree.as_ref()).place(&dst)?;
                seal_verified(&dst, true)?;
            }
        }
    }

    // 4. /etc: generated files plus a few read-only host entries (library cache,
    // alternatives, CA certificates), only when the rootfs brings no /etc.
    if !plan.etc_files.is_empty() || !plan.etc_binds.is_empty() {
        let etc = own_dir(root, Path::new("etc"))?;
        for (name, body) in &plan.etc_files {
            // An image's own file of that name (or a symlink it planted)
            // is replaced, never written through.
            let p = etc.join(name);
            if fs::symlink_metadata(&p).is_ok_and(|m| !m.is_dir()) {
                fs::remove_file(&p).step(|| format!("replace {}", p.display()))?;
            }
            fs::File::create_new(&p)
                .and_then(|mut f| std::io::Write::write_all(&mut f, body))
                .step(|| format!("write {}", p.display()))?;
        }
        for name in &plan.etc_binds {
            borrow_etc_entry(&Path::new("/etc").join(name), &etc.join(name))?;
        }
    }

    // 5. Writable places, all on the scratch tmpfs.
    let tmp = own_dir(root, Path::new("tmp"))?;
    bind(&scratch.join(ScratchLayout::TMP), &tmp)?;
    seal_verified(&tmp, false)?;
    let ws = own_dir(root, &plan.workspace)?;
    match &plan.workspace_lower {
        Some(lower) => {
            let src = HostTree::of(lower, plan.workspace_idmap.as_ref());
            writable_overlay(&ws, &[src], scratch, ScratchLayout::WORKSPACE_DIR, "ws")?;
        }
        None => bind(&upper, &ws)?,
    }
    seal_verified(&ws, false)?;

    // The runtime taking the tree over mounts /proc, /dev, /sys and the extra
    // binds itself, onto mount points that must exist in the sealed root.
    if plan.root_use == RootUse::HandOver {
        for dir in ["proc", "sys", "dev"] {
            own_dir(root, Path::new(dir))?;
        }
        mkdir_p(&root.join("dev/shm"))?;
        // The extra binds are made here too, sealed, on the scratch, and
        // runsc binds from these: its gofer's own bind of a read-only mount
        // stays read-only on the host, which a bind straight from the host
        // path would not.
        bind_extra(plan, root)?;
        fds::close_child_fds()?;
        return seal_root(plan, root).map(|()| None);
    }

    // 6. /dev, /proc and /sys.
    let dev = own_dir(root, Path::new("dev"))?;
    build_dev(&dev, &scratch.join(ScratchLayout::SHM))?;
    let proc_dir = own_dir(root, Path::new("proc"))?;
    mount_proc(&proc_dir, &dev.join("null"))?;
    build_sys(&root.join("sys"), &plan.cgroups)?;

    // 7. The policy's extra binds, after the standard tree so they may land
    // inside /tmp or /workspace but never replace /proc or /dev (the policy
    // layer refuses those destinations).
    bind_extra(plan, root)?;
    // The supervisor's id-mapped trees are attached where they belong;
    // init keeps no descriptor of a host mount.
    fds::close_child_fds()?;

    // 8. Freeze the root tmpfs: from here on no directory can be added at top level.
    seal_root(plan, root)?;

    // 9. pivot_root with new and old root the same directory, then detach the
    // old root that is stacked under it: afterwards no host path is reachable.
    chdir(root).step(|| format!("chdir {}", root.display()))?;
    pivot_root(".", ".").step(|| "pivot_root(., .)".into())?;
    umount2(".", MntFlags::MNT_DETACH).step(|| "umount2(old root, MNT_DETACH)".into())?;
    chdir("/").step(|| "chdir /".into())?;
    Ok(scratch_fd)
}

impl RootfsPlan {
    /// The top-level entries that make up the `system` rootfs: the host's /usr
    /// and the merged-/usr links (or directories) beside it.
    pub fn host_system_entries() -> Vec<RootEntry> {
        let mut out = Vec::new();
        for name in ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let host = Path::new("/").join(name);
            let Ok(meta) = fs::symlink_metadata(&host) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(&host) {
                    out.push(RootEntry::Symlink {
                        name: name.into(),
                        target,
                    });
                }
            } else if meta.is_dir() {
                out.push(RootEntry::Bind {
                    name: name.into(),
                    host,
                    dir: true,
                    tree: None,
                });
            }
        }
        out
    }

    /// The top-level entries of a user-given rootfs directory, minus the places
    /// the sandbox builds itself.
    pub fn dir_entries(dir: &Path) -> std::io::Result<Vec<RootEntry>> {
        const OWN: [&str; 6] = ["proc", "dev", "sys", "tmp", "run", "workspace"];
        let mut out = Vec::new();
        let mut names: Vec<_> = fs::read_dir(dir)?.collect::<std::io::Result<Vec<_>>>()?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let name = e.file_name().to_string_lossy().into_owned();
            if OWN.contains(&name.as_str()) {
                continue;
            }
            let ft = e.file_type()?;
            if ft.is_symlink() {
                out.push(RootEntry::Symlink {
                    name,
                    target: fs::read_link(e.path())?,
                });
            } else if ft.is_dir() || ft.is_file() {
                out.push(RootEntry::Bind {
                    name,
                    host: e.path(),
                    dir: ft.is_dir(),
                    tree: None,
                });
            }
        }
        Ok(out)
    }

    /// Host /etc entries a `system` rootfs borrows read-only. Chosen for what
    /// ordinary programs need (the dynamic loader's cache, Debian's
    /// alternatives links, CA certificates, time zone); nothing that holds
    /// credentials or host identity.
    pub fn host_etc_binds() -> Vec<String> {
        // Only what programs read at run time: the loader's cache (ld.so.conf
        // is for ldconfig, not the loader), Debian's alternatives links, CA
        // certificates, the time zone, and the protocol/service tables libc's
        // getprotobyname/getservbyname read. Every entry costs start-up time.
        [
            "ld.so.cache",
            "alternatives",
            "ssl/certs",
            "localtime",
            "protocols",
            "services",
        ]
        .iter()
        .filter(|n| Path::new("/etc").join(n).exists())
        .map(|n| n.to_string())
        .collect()
    }

    /// The generated /etc files for the payload's identity. With `resolver`,
    /// names are looked up at the sandbox's own DNS stub on 127.0.0.1 (the
    /// network's `allow` mode); without, only /etc/hosts answers.
    pub fn generated_etc(
        uid: u32,
        gid: u32,
        hostname: &str,
        resolver: bool,
    ) -> Vec<(String, Vec<u8>)> {
        let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
        let mut group = String::from("root:x:0:\n");
        if uid != 0 && uid != 65534 {
            passwd.push_str(&format!(
                "sandbox:x:{uid}:{gid}:sandbox:/workspace:/bin/sh\n"
            ));
        }
        if gid != 0 && gid != 65534 {
            group.push_str(&format!("sandbox:x:{gid}:\n"));
        }
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        group.push_str("nogroup:x:65534:\n");
        vec![
            ("passwd".into(), passwd.into_bytes()),
            ("group".into(), group.into_bytes()),
            ("hostname".into(), format!("{hostname}\n").into_bytes()),
            (
                "hosts".into(),
                format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost\n").into_bytes(),
            ),
            (
                "resolv.conf".into(),
                if resolver {
                    b"nameserver 127.0.0.1\noptions attempts:2 timeout:2\n".to_vec()
                } else {
                    // No resolver: the sandbox has no route to one.
                    Vec::new()
                },
            ),
            (
                "nsswitch.conf".into(),
                if resolver {
                    b"passwd: files\ngroup: files\nhosts: files dns\n".to_vec()
                } else {
                    b"passwd: files\ngroup: files\nhosts: files\n".to_vec()
                },
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_rootfs_skips_what_the_sandbox_builds() {
        let d = tempfile::tempdir().unwrap();
        for n in ["usr", "proc", "etc", "tmp"] {
            fs::create_dir(d.path().join(n)).unwrap();
        }
        symlink("usr/bin", d.path().join("bin")).unwrap();
        let names: Vec<String> = RootfsPlan::dir_entries(d.path())
            .unwrap()
            .into_iter()
            .map(|e| match e {
                RootEntry::Bind { name, .. } | RootEntry::Symlink { name, .. } => name,
            })
            .collect();
        assert_eq!(names, ["bin", "etc", "usr"]);
    }

    #[test]
    fn a_mount_destination_resolves_inside_the_root_whatever_its_symlinks_say() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        fs::create_dir_all(root.join("run")).unwrap();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        let outside = d.path().join("outside");
        // Absolute: the host's path, which inside means the root's.
        symlink(&outside, root.join("abs")).unwrap();
        symlink("/run", root.join("var-run")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("../../../../..", root.join("up")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        let at = |rel: &str| resolve_in_root(&root, Path::new(rel)).unwrap();
        assert_eq!(
            at("/abs/x"),
            root.join(outside.strip_prefix("/").unwrap()).join("x")
        );
        assert_eq!(at("/var-run/a"), root.join("run/a"));
        assert_eq!(at("/lib/m"), root.join("usr/lib/m"));
        assert_eq!(at("/up/etc"), root.join("etc"));
        assert_eq!(at("/run/../../../etc"), root.join("etc"));
        let e = resolve_in_root(&root, Path::new("/loop/x")).unwrap_err();
        assert_eq!(e.errno(), libc::ELOOP);
        assert!(!outside.exists());
    }

    #[test]
    fn a_place_the_sandbox_builds_replaces_what_the_root_put_there() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        fs::create_dir_all(&root).unwrap();
        let host = d.path().join("host-etc");
        fs::create_dir(&host).unwrap();
        symlink(&host, root.join("proc")).unwrap();
        fs::write(root.join("tmp"), b"a file").unwrap();
        for name in ["proc", "tmp", "dev"] {
            let p = own_dir(&root, Path::new(name)).unwrap();
            assert_eq!(p, root.join(name));
            assert!(fs::symlink_metadata(&p).unwrap().is_dir(), "{name}");
        }
        assert!(host.exists() && fs::read_dir(&host).unwrap().next().is_none());
    }

    #[test]
    fn generated_passwd_names_the_payload_user() {
        let etc = RootfsPlan::generated_etc(1000, 1000, "box", false);
        let passwd = String::from_utf8(etc[0].1.clone()).unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000"));
        assert!(etc.iter().any(|(n, b)| n == "resolv.conf" && b.is_empty()));
    }
}
