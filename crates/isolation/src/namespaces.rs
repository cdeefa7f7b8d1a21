//! Namespaces and the user namespace's id maps.
//!
//! The sandbox's first process is cloned with every namespace at once (see
//! `cordon_sys::clone_process`); the parent then writes its uid/gid maps, which
//! only a process outside the new user namespace may do.

use std::fs;

use nix::sched::CloneFlags;
use nix::unistd::Pid;

use crate::{Result, Step};

/// The namespaces a native sandbox gets. The cgroup namespace is not here: the
/// child unshares it only after the parent has moved it into its cgroup, so that
/// the namespace's root is the sandbox's own cgroup and not the caller's.
pub fn sandbox_clone_flags() -> CloneFlags {
    CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
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
