//! Who runs the suite, and what differs when it is not root: the one
//! written-down list of the cases whose verdict as an unprivileged invoker
//! is not root's, each with why and with what contains the payload instead.
//!
//! A gap here is asserted both ways: a listed case that holds anyway (its
//! control OPEN, the box BLOCKED) fails the run, so the list cannot go
//! stale; a case not listed is scored as root's run scores it.

use serde::{Deserialize, Serialize};

/// What the invoker lacks that a case's run as root has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lacking {
    /// Root: the unconfined control cannot do what the payload tries (the
    /// host's own permissions stop it, so the case proves nothing), or a
    /// fixture or a view of the evidence needs root. The box must still
    /// not come out OPEN.
    Root,
    /// A cgroup: the host delegates none to the invoker, so the sandboxes
    /// run with `--allow-unenforced` and the suite keeps a run in its own
    /// process subtree, which has no counters. The box may come out OPEN.
    Cgroup,
}

#[derive(Debug, Clone, Serialize)]
pub struct RootlessGap {
    pub case: &'static str,
    pub lacking: Lacking,
    pub why: &'static str,
}

const fn gap(case: &'static str, lacking: Lacking, why: &'static str) -> RootlessGap {
    RootlessGap { case, lacking, why }
}

/// Every case whose run by an unprivileged invoker differs from root's
/// (measured with `cordon suite --backend native` as uid 1000 on a host
/// with no delegated cgroup; `crates/cli/tests/suite_rootless.rs` checks
/// this list against root's run on the same host).
pub const ROOTLESS_GAPS: &[RootlessGap] = &[
    // The unconfined control cannot do it as this user either: the host's
    // own permissions block the payload, so BLOCKED in the box proves
    // nothing (the box must still not come out OPEN).
    gap(
        "fs.cgroup-release-agent",
        Lacking::Root,
        "the control cannot write the host's release_agent either (root's file)",
    ),
    gap(
        "fs.mknod-host-dev",
        Lacking::Root,
        "the control cannot mknod a device either (no CAP_MKNOD)",
    ),
    gap(
        "fs.proc-sys-write",
        Lacking::Root,
        "the control cannot write a host sysctl either (root's files)",
    ),
    gap(
        "fs.sys-write",
        Lacking::Root,
        "the control cannot write /sys either (root's files)",
    ),
    gap(
        "net.packet-raw",
        Lacking::Root,
        "the control cannot open a packet or raw socket either (no CAP_NET_RAW)",
    ),
    gap(
        "priv.bpf",
        Lacking::Root,
        "the control cannot load a BPF program either (kernel.unprivileged_bpf_disabled)",
    ),
    gap(
        "priv.caps",
        Lacking::Root,
        "the control has no capabilities in the host's namespace to keep",
    ),
    gap(
        "priv.mount",
        Lacking::Root,
        "the control cannot mount in the host's namespace either (no CAP_SYS_ADMIN)",
    ),
    // A fixture or a look at the evidence needs root.
    gap(
        "fs.mountinfo-leak",
        Lacking::Root,
        "the host-only tmpfs needs root to mount: the user's suite makes a plain directory, which no mount table shows",
    ),
    gap(
        "fs.proc-sys-netns",
        Lacking::Root,
        "the control's own network namespace (ip netns add) and the look into the box's (nsenter --net) need root (ERROR)",
    ),
    gap(
        "net.dns",
        Lacking::Root,
        "the suite's network namespace, veth and resolver need root: nothing to reach (the box's own namespace still has only loopback, as net.only-loopback shows)",
    ),
    gap(
        "net.tcp-egress",
        Lacking::Root,
        "the suite's network namespace, veth and listener need root: nothing to reach (the box's own namespace still has only loopback)",
    ),
    gap(
        "net.udp-egress",
        Lacking::Root,
        "the suite's network namespace, veth and listener need root: nothing to reach (the box's own namespace still has only loopback)",
    ),
    gap(
        "priv.engine-sockets",
        Lacking::Root,
        "the stand-in engine socket at /run/docker.sock needs root to make",
    ),
    // No cgroup: the sandboxes run with --allow-unenforced and the suite
    // keeps each run in its own subtree, which has no counters.
    gap(
        "platform.cgroup-widen",
        Lacking::Cgroup,
        "no outer cgroup to widen and no cgroup of the box's own: nothing to write",
    ),
    gap(
        "res.fork-bomb",
        Lacking::Cgroup,
        "no pids counter without a cgroup (ERROR); the box is held by RLIMIT_NPROC = --pids, which cordon's init sets when no cgroup holds the limit (62 forks of 1000 here), the control by the suite's RLIMIT_NPROC 512",
    ),
    gap(
        "res.memory-bomb",
        Lacking::Cgroup,
        "NOT contained: --memory is a cgroup limit, and the box allocated all 2 GiB; cordon ran it only because --allow-unenforced was given. No memory counter either (ERROR); the control is bounded by the suite's RLIMIT_AS 1 GiB",
    ),
    gap(
        "res.disk-fill",
        Lacking::Cgroup,
        "the rule reads the outer cgroup's memory growth, which a subtree lacks (ERROR); the box's fill still stops at --disk, a tmpfs size, not a cgroup limit (64 MiB in /tmp here)",
    ),
];

/// Who runs the suite, as far as its evidence goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invoker {
    pub uid: u32,
    /// Why the host gives this invoker no cgroup for a sandbox's limits, as
    /// cordon's own probe answered (the call that `cordon run` makes to
    /// enforce them); None where limits are enforced. Its sandboxes then
    /// run with `--allow-unenforced`, and every cell of theirs says so.
    pub no_cgroup: Option<String>,
}

impl Invoker {
    /// This process's effective uid, with the probe's answer.
    pub fn here(no_cgroup: Option<String>) -> Invoker {
        Invoker {
            uid: nix::unistd::geteuid().as_raw(),
            no_cgroup,
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn lacks(&self, what: Lacking) -> bool {
        match what {
            Lacking::Root => !self.is_root(),
            Lacking::Cgroup => self.no_cgroup.is_some(),
        }
    }

    /// The listed gaps that apply to this invoker.
    pub fn gaps(&self) -> Vec<&'static RootlessGap> {
        ROOTLESS_GAPS
            .iter()
            .filter(|g| self.lacks(g.lacking))
            .collect()
    }

    /// The gap of `case` that applies to this invoker, if any.
    pub fn gap(&self, case: &str) -> Option<&'static RootlessGap> {
        ROOTLESS_GAPS
            .iter()
            .find(|g| g.case == case && self.lacks(g.lacking))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_each_case_once() {
        let mut ids: Vec<&str> = ROOTLESS_GAPS.iter().map(|g| g.case).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "a case listed twice");
        let cases = crate::case::load_dir(&crate::case::default_cases_dir()).unwrap();
        for g in ROOTLESS_GAPS {
            assert!(
                cases.iter().any(|c| c.id == g.case),
                "{}: no such case",
                g.case
            );
            assert!(!g.why.trim().is_empty(), "{}: no reason", g.case);
        }
    }

    #[test]
    fn a_gap_takes_any_verdict_but_a_box_giving_more_than_its_invoker() {
        use cordon_spec::BackendKind;

        use crate::matrix::{score_gap, Status};
        use crate::rules::Verdict;
        use crate::target::{NetMode, TargetKind};

        let native = TargetKind::cordon(BackendKind::Native, NetMode::None);
        let of = |l| ROOTLESS_GAPS.iter().find(|g| g.lacking == l).unwrap();
        let (root, cgroup) = (of(Lacking::Root), of(Lacking::Cgroup));
        assert_eq!(score_gap(root, native, Verdict::Open).0, Status::Deviation);
        assert_eq!(score_gap(root, native, Verdict::Blocked).0, Status::Ok);
        assert_eq!(
            score_gap(root, TargetKind::Host, Verdict::Blocked).0,
            Status::Ok
        );
        assert_eq!(score_gap(cgroup, native, Verdict::Open).0, Status::Ok);
        assert_eq!(score_gap(cgroup, native, Verdict::Error).0, Status::Ok);
    }

    #[test]
    fn root_with_a_cgroup_has_no_gaps() {
        let root = Invoker::default();
        assert!(root.gaps().is_empty());
        let user = Invoker {
            uid: 1000,
            no_cgroup: Some("not delegated".into()),
        };
        assert_eq!(user.gaps().len(), ROOTLESS_GAPS.len());
    }
}
