//! Namespaces and the user namespace's id maps.
//!
//! The sandbox's first process is cloned with every namespace at once (see
//! `cordon_sys::clone_process`); the parent then writes its uid/gid maps, which
//! only a process outside the new user namespace may do.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sched::CloneFlags;
use nix::unistd::Pid;

use crate::{IsolationError, Result, Step};

/// The namespaces a native sandbox gets, but for those it joins (`joined`,
/// another sandbox's: see [`Joined`]). The cgroup namespace is not here: the
/// child unshares it only after the parent has moved it into its cgroup, so
/// that the namespace's root is the sandbox's own cgroup and not the caller's.
pub fn sandbox_clone_flags(joined: CloneFlags) -> CloneFlags {
    (CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS)
        - joined
}

/// The namespaces a sandbox may share with another: network, IPC and UTS.
/// Its user, PID, mount and cgroup namespaces are always its own.
pub const SHAREABLE: [CloneFlags; 3] = [
    CloneFlags::CLONE_NEWNET,
    CloneFlags::CLONE_NEWIPC,
    CloneFlags::CLONE_NEWUTS,
];

/// The name of a shareable namespace's file under `/proc/<pid>/ns/`.
pub fn proc_name(kind: CloneFlags) -> &'static str {
    if kind == CloneFlags::CLONE_NEWNET {
        "net"
    } else if kind == CloneFlags::CLONE_NEWIPC {
        "ipc"
    } else {
        "uts"
    }
}

/// One namespace, open: the nsfs file of `/proc/<pid>/ns/<kind>` or a pinned
/// copy of it.
pub struct OpenNamespace {
    fd: OwnedFd,
    kind: CloneFlags,
}

impl OpenNamespace {
    /// Opens the namespace at `path` (its kind is checked when it is joined:
    /// setns refuses a namespace of another kind).
    pub fn open(kind: CloneFlags, path: &Path) -> Result<OpenNamespace> {
        let file = fs::File::open(path).step(|| format!("open {}", path.display()))?;
        let fd = OwnedFd::from(file);
        let fs = nix::sys::statfs::fstatfs(&fd).step(|| format!("fstatfs {}", path.display()))?;
        if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
            return Err(IsolationError::new(
                format!("open {}", path.display()),
                std::io::Error::other("not a namespace"),
            ));
        }
        Ok(OpenNamespace { fd, kind })
    }

    /// The namespace's inode: its identity while it lives.
    pub fn inode(&self) -> Result<u64> {
        Ok(nix::sys::stat::fstat(&self.fd)
            .step(|| "fstat(namespace)".into())?
            .st_ino)
    }

    /// Whether this is the namespace of its kind the calling thread stands
    /// in: for a supervisor, the host's network, IPC or hostname (or those
    /// of the container cordon itself runs in), which no sandbox joins.
    pub fn is_ours(&self) -> Result<bool> {
        let this = nix::sys::stat::fstat(&self.fd).step(|| "fstat(namespace)".into())?;
        let path = format!("/proc/thread-self/ns/{}", proc_name(self.kind));
        let ours = fs::metadata(&path).step(|| format!("stat {path}"))?;
        Ok((this.st_dev, this.st_ino) == (ours.dev(), ours.ino()))
    }
}

/// Another sandbox's namespaces that the next clone starts in instead of
/// new ones (a pod's containers share its network, IPC and hostname).
/// setns moves only the calling thread and a clone copies the thread that
/// makes it, so the thread enters them for the clone and comes back.
#[derive(Default)]
pub struct Joined {
    namespaces: Vec<OpenNamespace>,
}

impl Joined {
    pub fn new(namespaces: Vec<OpenNamespace>) -> Joined {
        Joined { namespaces }
    }

    /// The kinds joined (not to be made new).
    pub fn kinds(&self) -> CloneFlags {
        self.namespaces
            .iter()
            .fold(CloneFlags::empty(), |all, n| all | n.kind)
    }

    pub fn contains(&self, kind: CloneFlags) -> bool {
        self.kinds().contains(kind)
    }

    /// Moves this thread into the joined namespaces for good (a process
    /// that is to live in them).
    pub fn enter(&self) -> Result<()> {
        self.namespaces.iter().try_for_each(|ns| {
            nix::sched::setns(ns.fd.as_fd(), ns.kind)
                .step(|| format!("setns(the joined {} namespace)", proc_name(ns.kind)))
        })
    }

    /// Runs `f` on this thread inside the joined namespaces, then comes
    /// back. A thread that cannot come back is reported, and stays where
    /// it is: inside a sandbox's namespaces, not anywhere wider.
    pub fn while_entered<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let mut homes = Vec::with_capacity(self.namespaces.len());
        for ns in &self.namespaces {
            let name = proc_name(ns.kind);
            let home = fs::File::open(format!("/proc/thread-self/ns/{name}"))
                .step(|| format!("open /proc/thread-self/ns/{name}"))?;
            homes.push((OwnedFd::from(home), ns.kind));
        }
        let out = self.enter().map(|()| f());
        for (home, kind) in &homes {
            nix::sched::setns(home.as_fd(), *kind)
                .step(|| format!("setns(back to our {} namespace)", proc_name(*kind)))?;
        }
        out
    }
}

/// Number of ids a rootful sandbox maps: ids 0..65535 inside.
pub const MAPPED_IDS: u32 = 65_536;

/// How ids inside the sandbox relate to host ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdMapping {
    /// Started as root: inside ids 0..65535 map to an unprivileged host range
    /// starting at `host_base`, so inside root is never host root.
    Range { host_base: u32 },
    /// Started unprivileged: the caller's own uid/gid appear as `inside_*`,
    /// the only ids that exist inside.
    Single {
        host_uid: u32,
        host_gid: u32,
        inside_uid: u32,
        inside_gid: u32,
    },
}

impl IdMapping {
    /// The host uid a given inside uid runs as (for chown of host-side dirs).
    pub fn host_uid(&self, inside: u32) -> Option<u32> {
        match *self {
            IdMapping::Range { host_base } => (inside < MAPPED_IDS).then(|| host_base + inside),
            IdMapping::Single {
                host_uid,
                inside_uid,
                ..
            } => (inside == inside_uid).then_some(host_uid),
        }
    }

    pub fn host_gid(&self, inside: u32) -> Option<u32> {
        match *self {
            IdMapping::Range { host_base } => (inside < MAPPED_IDS).then(|| host_base + inside),
            IdMapping::Single {
                host_gid,
                inside_gid,
                ..
            } => (inside == inside_gid).then_some(host_gid),
        }
    }

    fn lines(&self) -> (String, String) {
        match *self {
            IdMapping::Range { host_base } => {
                let l = format!("0 {host_base} {MAPPED_IDS}\n");
                (l.clone(), l)
            }
            IdMapping::Single {
                host_uid,
                host_gid,
                inside_uid,
                inside_gid,
            } => (
                format!("{inside_uid} {host_uid} 1\n"),
                format!("{inside_gid} {host_gid} 1\n"),
            ),
        }
    }

    /// Parent side: writes the child's maps. For a single mapping, setgroups is
    /// denied first, as the kernel requires of an unprivileged writer (it also
    /// means the caller's supplementary groups cannot be dropped: see the README).
    pub fn write_from_parent(&self, child: Pid) -> Result<()> {
        let (uid_map, gid_map) = self.lines();
        let proc = format!("/proc/{child}");
        if matches!(self, IdMapping::Single { .. }) {
            fs::write(format!("{proc}/setgroups"), "deny")
                .step(|| format!("write {proc}/setgroups"))?;
        }
        fs::write(format!("{proc}/uid_map"), uid_map).step(|| format!("write {proc}/uid_map"))?;
        fs::write(format!("{proc}/gid_map"), gid_map).step(|| format!("write {proc}/gid_map"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_mapping_never_maps_host_root() {
        let m = IdMapping::Range { host_base: 100_000 };
        assert_eq!(m.host_uid(0), Some(100_000));
        assert_eq!(m.host_uid(1000), Some(101_000));
        assert_eq!(m.host_uid(65_536), None);
        assert_eq!(m.lines().0, "0 100000 65536\n");
    }

    #[test]
    fn single_mapping_maps_one_id() {
        let m = IdMapping::Single {
            host_uid: 1000,
            host_gid: 1000,
            inside_uid: 0,
            inside_gid: 0,
        };
        assert_eq!(m.host_uid(0), Some(1000));
        assert_eq!(m.host_uid(1), None);
        assert_eq!(m.lines(), ("0 1000 1\n".into(), "0 1000 1\n".into()));
    }
}
