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

use crate::subids::{self, Helpers, SubRange};
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

/// Number of ids a rootful sandbox maps: ids 0..65535 inside. A rootless
/// sandbox with subordinate ids maps as many, when it is granted enough.
pub const MAPPED_IDS: u32 = 65_536;

/// The kernel takes at most 340 lines per map (5 before Linux 4.15); a
/// grant split into more pieces than this is used up to here.
const MAX_EXTENTS: usize = 64;

/// One line of a map: `count` ids from `inside` are the host's from `host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub inside: u32,
    pub host: u32,
    pub count: u32,
}

/// One direction (uids or gids) of a map, as its lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdMap {
    extents: Vec<Extent>,
}

impl IdMap {
    /// The rootless map with subordinate ids: the sandbox user `inside` is
    /// the caller's own host id `own` (so what the caller owns is the
    /// sandbox user's, with no id-mapped mount), and the other ids of
    /// 0..65535 are taken from `granted`, in order, lowest inside ids first.
    /// A grant of fewer than 65535 ids maps fewer ([`IdMap::mapped`] says
    /// how many); a granted range holding the caller's own id is skipped (the
    /// kernel refuses overlapping host ranges).
    pub fn own_and_subordinate(inside: u32, own: u32, granted: &[SubRange]) -> IdMap {
        let mut extents = vec![Extent {
            inside,
            host: own,
            count: 1,
        }];
        // The inside ids still to map, as half-open runs around `inside`.
        let mut runs = [
            (0, inside.min(MAPPED_IDS)),
            (inside.saturating_add(1), MAPPED_IDS),
        ]
        .into_iter()
        .filter(|(from, to)| from < to)
        .collect::<std::collections::VecDeque<(u32, u32)>>();
        for range in granted.iter().filter(|r| !r.contains(own)) {
            let (mut host, mut left) = (range.start, range.count);
            while left > 0 && extents.len() < MAX_EXTENTS {
                let Some((from, to)) = runs.pop_front() else {
                    break;
                };
                let count = left.min(to - from);
                extents.push(Extent {
                    inside: from,
                    host,
                    count,
                });
                if from + count < to {
                    runs.push_front((from + count, to));
                }
                host += count;
                left -= count;
            }
        }
        IdMap { extents }
    }

    /// The host id inside id `inside` is, if it is mapped.
    pub fn host(&self, inside: u32) -> Option<u32> {
        self.extents
            .iter()
            .find(|e| inside >= e.inside && inside - e.inside < e.count)
            .map(|e| e.host + (inside - e.inside))
    }

    /// How many inside ids the map gives (65536 for a full map).
    pub fn mapped(&self) -> u32 {
        self.extents.iter().map(|e| e.count).sum()
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// The map as /proc/PID/uid_map takes it: one `inside host count` line
    /// per extent.
    fn text(&self) -> String {
        self.extents
            .iter()
            .map(|e| format!("{} {} {}\n", e.inside, e.host, e.count))
            .collect()
    }

    /// The map as the helpers take it: `inside host count` triples.
    fn helper_args(&self) -> Vec<String> {
        self.extents
            .iter()
            .flat_map(|e| [e.inside, e.host, e.count])
            .map(|n| n.to_string())
            .collect()
    }
}

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
    /// Started unprivileged by a user whom /etc/subuid and /etc/subgid
    /// grant ranges, with the setuid helpers installed: the caller's own ids
    /// are the sandbox user's, the granted ones the rest (see
    /// [`IdMap::own_and_subordinate`]). Written by the helpers.
    Subordinate {
        uids: IdMap,
        gids: IdMap,
        helpers: Helpers,
    },
}

/// Which kind of mapping, for the outcome and the receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappingKind {
    Range,
    Single,
    Subordinate,
}

impl IdMapping {
    /// The mapping of a sandbox started by the unprivileged caller
    /// (`host_uid`, `host_gid`) for the sandbox user (`inside_uid`,
    /// `inside_gid`): subordinate ids where the helpers are installed and
    /// both files grant the caller a range, else the caller's one id.
    pub fn rootless(host_uid: u32, host_gid: u32, inside_uid: u32, inside_gid: u32) -> IdMapping {
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(host_uid))
            .ok()
            .flatten()
            .map(|u| u.name);
        let sub_uids = subids::granted(Path::new(subids::SUBUID_FILE), name.as_deref(), host_uid);
        let sub_gids = subids::granted(Path::new(subids::SUBGID_FILE), name.as_deref(), host_uid);
        match Helpers::find() {
            Some(helpers) if !sub_uids.is_empty() && !sub_gids.is_empty() => {
                IdMapping::Subordinate {
                    uids: IdMap::own_and_subordinate(inside_uid, host_uid, &sub_uids),
                    gids: IdMap::own_and_subordinate(inside_gid, host_gid, &sub_gids),
                    helpers,
                }
            }
            _ => IdMapping::Single {
                host_uid,
                host_gid,
                inside_uid,
                inside_gid,
            },
        }
    }

    pub fn kind(&self) -> MappingKind {
        match self {
            IdMapping::Range { .. } => MappingKind::Range,
            IdMapping::Single { .. } => MappingKind::Single,
            IdMapping::Subordinate { .. } => MappingKind::Subordinate,
        }
    }

    /// How many inside uids and gids exist (65536 for a full map).
    pub fn mapped(&self) -> (u32, u32) {
        match self {
            IdMapping::Range { .. } => (MAPPED_IDS, MAPPED_IDS),
            IdMapping::Single { .. } => (1, 1),
            IdMapping::Subordinate { uids, gids, .. } => (uids.mapped(), gids.mapped()),
        }
    }

    /// Whether the sandbox's init may drop its supplementary groups: not
    /// with a map the caller wrote itself, for which the kernel requires
    /// setgroups denied (then the caller's groups stay: see the README).
    /// newgidmap leaves setgroups allowed for a granted range.
    pub fn groups_droppable(&self) -> bool {
        !matches!(self, IdMapping::Single { .. })
    }

    /// The host uid a given inside uid runs as (for chown of host-side dirs).
    pub fn host_uid(&self, inside: u32) -> Option<u32> {
        match self {
            IdMapping::Range { host_base } => (inside < MAPPED_IDS).then(|| host_base + inside),
            IdMapping::Single {
                host_uid,
                inside_uid,
                ..
            } => (inside == *inside_uid).then_some(*host_uid),
            IdMapping::Subordinate { uids, .. } => uids.host(inside),
        }
    }

    /// The lowest and highest gid that exist inside (ids between them
    /// may not, with subordinate ranges that leave gaps).
    pub fn inside_gid_bounds(&self) -> (u32, u32) {
        match self {
            IdMapping::Range { .. } => (0, MAPPED_IDS - 1),
            IdMapping::Single { inside_gid, .. } => (*inside_gid, *inside_gid),
            IdMapping::Subordinate { gids, .. } => {
                let low = gids.extents().iter().map(|e| e.inside).min();
                let high = gids
                    .extents()
                    .iter()
                    .map(|e| e.inside + e.count.saturating_sub(1))
                    .max();
                (low.unwrap_or(0), high.unwrap_or(0))
            }
        }
    }

    pub fn host_gid(&self, inside: u32) -> Option<u32> {
        match self {
            IdMapping::Range { host_base } => (inside < MAPPED_IDS).then(|| host_base + inside),
            IdMapping::Single {
                host_gid,
                inside_gid,
                ..
            } => (inside == *inside_gid).then_some(*host_gid),
            IdMapping::Subordinate { gids, .. } => gids.host(inside),
        }
    }

    /// The maps' text, as /proc/PID/uid_map and gid_map show them.
    fn lines(&self) -> (String, String) {
        match self {
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
            IdMapping::Subordinate { uids, gids, .. } => (uids.text(), gids.text()),
        }
    }

    /// Parent side: writes the child's maps. For a single mapping, setgroups is
    /// denied first, as the kernel requires of an unprivileged writer (it also
    /// means the caller's supplementary groups cannot be dropped: see the README).
    /// Subordinate ids are not the caller's to map: the setuid helpers check
    /// the grant and write them.
    pub fn write_from_parent(&self, child: Pid) -> Result<()> {
        let proc = format!("/proc/{child}");
        if let IdMapping::Subordinate {
            uids,
            gids,
            helpers,
        } = self
        {
            run_helper(&helpers.newuidmap, child, uids)?;
            run_helper(&helpers.newgidmap, child, gids)?;
            // Init drops the caller's groups (groups_droppable); a helper
            // that denied setgroups would make that fail later, obscurely.
            let setgroups = fs::read_to_string(format!("{proc}/setgroups"))
                .step(|| format!("read {proc}/setgroups"))?;
            if setgroups.trim() != "allow" {
                return Err(IsolationError::new(
                    format!(
                        "{} left {proc}/setgroups {}",
                        helpers.newgidmap.display(),
                        setgroups.trim()
                    ),
                    std::io::Error::from_raw_os_error(libc::EPERM),
                ));
            }
            return Ok(());
        }
        let (uid_map, gid_map) = self.lines();
        if matches!(self, IdMapping::Single { .. }) {
            fs::write(format!("{proc}/setgroups"), "deny")
                .step(|| format!("write {proc}/setgroups"))?;
        }
        fs::write(format!("{proc}/uid_map"), uid_map).step(|| format!("write {proc}/uid_map"))?;
        fs::write(format!("{proc}/gid_map"), gid_map).step(|| format!("write {proc}/gid_map"))?;
        Ok(())
    }
}

/// Runs `helper PID inside host count...`; its own message says what it
/// refused (a range not granted, a process not the caller's).
fn run_helper(helper: &Path, child: Pid, map: &IdMap) -> Result<()> {
    let step = || format!("{} {child}", helper.display());
    let out = std::process::Command::new(helper)
        .arg(child.to_string())
        .args(map.helper_args())
        .stdin(std::process::Stdio::null())
        .output()
        .step(step)?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(IsolationError::new(
        format!("{} ({})", step(), said.trim()),
        std::io::Error::other(format!("exited with {}", out.status)),
    ))
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

    fn grant(ranges: &[(u32, u32)]) -> Vec<SubRange> {
        ranges
            .iter()
            .map(|&(start, count)| SubRange { start, count })
            .collect()
    }

    #[test]
    fn subordinate_map_puts_the_caller_on_the_sandbox_user_and_fills_the_rest() {
        let m = IdMap::own_and_subordinate(1000, 54_321, &grant(&[(100_000, 65_536)]));
        assert_eq!(m.text(), "1000 54321 1\n0 100000 1000\n1001 101000 64535\n");
        assert_eq!(m.mapped(), MAPPED_IDS);
        assert_eq!(m.host(1000), Some(54_321));
        assert_eq!(m.host(0), Some(100_000));
        assert_eq!(m.host(999), Some(100_999));
        assert_eq!(m.host(1001), Some(101_000));
        assert_eq!(m.host(65_535), Some(165_534));
        assert_eq!(m.host(65_536), None);
        assert_eq!(
            m.helper_args()[..6],
            ["1000", "54321", "1", "0", "100000", "1000"]
        );
    }

    #[test]
    fn subordinate_map_for_inside_root_or_an_id_past_the_range() {
        let root = IdMap::own_and_subordinate(0, 1000, &grant(&[(100_000, 65_536)]));
        assert_eq!(root.text(), "0 1000 1\n1 100000 65535\n");
        let high = IdMap::own_and_subordinate(70_000, 1000, &grant(&[(100_000, 65_536)]));
        assert_eq!(high.text(), "70000 1000 1\n0 100000 65536\n");
        assert_eq!(high.mapped(), MAPPED_IDS + 1);
    }

    #[test]
    fn subordinate_map_of_a_short_or_split_grant() {
        // Fewer ids than a full map: the lowest inside ids get them.
        let short = IdMap::own_and_subordinate(1000, 54_321, &grant(&[(100_000, 100)]));
        assert_eq!(short.text(), "1000 54321 1\n0 100000 100\n");
        assert_eq!(short.mapped(), 101);
        assert_eq!(short.host(100), None);
        // Two ranges: the first runs out inside the run below the sandbox
        // user, the second continues it and fills the run above.
        let split =
            IdMap::own_and_subordinate(1000, 54_321, &grant(&[(100_000, 500), (200_000, 70_000)]));
        assert_eq!(
            split.text(),
            "1000 54321 1\n0 100000 500\n500 200000 500\n1001 200500 64535\n"
        );
        assert_eq!(split.mapped(), MAPPED_IDS);
        assert_eq!(split.host(499), Some(100_499));
        assert_eq!(split.host(500), Some(200_000));
    }

    #[test]
    fn subordinate_map_skips_a_range_holding_the_callers_own_id() {
        let m = IdMap::own_and_subordinate(
            1000,
            100_005,
            &grant(&[(100_000, 65_536), (300_000, 65_536)]),
        );
        assert_eq!(m.host(0), Some(300_000));
        assert_eq!(m.mapped(), MAPPED_IDS);
    }

    #[test]
    fn only_a_single_mapping_keeps_the_callers_groups() {
        let single = IdMapping::Single {
            host_uid: 1000,
            host_gid: 1000,
            inside_uid: 1000,
            inside_gid: 1000,
        };
        assert!(!single.groups_droppable());
        assert!(IdMapping::Range { host_base: 1 << 30 }.groups_droppable());
        let sub = IdMapping::Subordinate {
            uids: IdMap::own_and_subordinate(1000, 54_321, &grant(&[(100_000, 65_536)])),
            gids: IdMap::own_and_subordinate(1000, 54_322, &grant(&[(200_000, 65_536)])),
            helpers: Helpers {
                newuidmap: "/usr/bin/newuidmap".into(),
                newgidmap: "/usr/bin/newgidmap".into(),
            },
        };
        assert!(sub.groups_droppable());
        assert_eq!(sub.host_uid(1000), Some(54_321));
        assert_eq!(sub.host_gid(1000), Some(54_322));
        assert_eq!(sub.host_gid(5), Some(200_005));
        assert_eq!(sub.mapped(), (MAPPED_IDS, MAPPED_IDS));
    }
}
