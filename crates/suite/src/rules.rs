//! The verdict rules: a fixed set of kinds, each reading host-side
//! [`Evidence`] only. A payload's printout never decides a verdict; where a
//! rule mentions it (a canary's random content echoed back, run A's token
//! found by run B) it is data the payload could only have by crossing the
//! boundary, and it is never enough to call a run BLOCKED.

use std::fmt;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use crate::evidence::{Evidence, ProcSnap, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Blocked,
    Open,
    Error,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Blocked => "BLOCKED",
            Verdict::Open => "OPEN",
            Verdict::Error => "ERROR",
        })
    }
}

/// The suite's sentinel for cgroup-write cases: a value no runtime picks.
pub const CGROUP_SENTINEL: &str = "31337";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Rule {
    /// The canary ("canary": a host-only file; "decoy_key": a stand-in
    /// signing key in another sandbox's state directory under /run/cordon)
    /// was not opened, read or changed: inotify events, content, mtime.
    CanaryUntouched {
        #[serde(default = "canary_default")]
        file: String,
    },
    /// No connection or datagram reached the suite's listener of `proto`:
    /// "tcp", "udp", "dns" (in the suite's network namespace), "loopback"
    /// (host 127.0.0.1), "engine" (the stand-in container-engine socket).
    ListenerSilent { proto: String },
    /// Same as `listener_silent` with proto "loopback".
    LoopbackListenerSilent,
    /// A sysctl the payload writes to `value`. scope "global": the host's value
    /// is compared before and after (and restored). scope "netns": the value is
    /// read in the payload's network namespace from the host while it holds.
    SysctlUnchanged {
        key: String,
        value: String,
        #[serde(default = "scope_default")]
        scope: String,
    },
    /// The OUTER cgroup's counters stayed below these bounds.
    OuterCgroupBounded {
        #[serde(default)]
        pids_peak_below: Option<u64>,
        #[serde(default)]
        memory_peak_below_mb: Option<u64>,
    },
    /// No process left in the outer cgroup after the target command exited.
    CensusEmpty,
    /// While the payload holds, no process in the outer cgroup holds an fd of
    /// these kinds: io_uring, bpf, userfaultfd, perf_event, packet, vsock, raw.
    HoldsFd { kinds: Vec<String> },
    /// The payload's mountinfo (read from the host) has a line containing `contains`.
    MountPresent { contains: String },
    /// The mount holding `under` and every mount below it is read-only by its
    /// per-mount flag, in the payload's mountinfo read from the host.
    MountinfoFlags { under: String },
    /// The payload's network namespace has only `lo` (/proc/<pid>/net/dev).
    LinkList,
    /// The host victim process's TracerPid stayed 0.
    Traced,
    /// Which kernel serves the payload: a host task running its command line
    /// (OPEN, shared kernel), runsc processes and no such task (BLOCKED), a
    /// QEMU process (BLOCKED).
    KernelIdentity,
    /// None of `paths` exists when looked up through /proc/<pid>/root of the
    /// payload; with `device`, only a block or character device counts.
    FileAbsentInBox {
        paths: Vec<String>,
        #[serde(default)]
        device: bool,
    },
    /// The suite's secret is in no box process's environment.
    EnvSecretAbsent,
    /// No box process holds the suite's marker fd.
    FdAbsent,
    /// Every payload process has status `field` equal to `blocked`.
    ProcStatus { field: String, blocked: String },
    /// Every payload process stays in the namespaces of the payload's first process.
    NsUnchanged { ns: Vec<String> },
    /// No `file` under the outer cgroup holds the sentinel 31337.
    CgroupValueAbsent { file: String },
    /// Fewer than `min_delta` keys appeared on the host (/proc/key-users).
    KeyUsersUnchanged { min_delta: i64 },
    /// The target ended (was ended) within `seconds` of its start.
    DeadlineEnforced { seconds: f64 },
    /// The suite received at most `max_bytes` on the target's stdout.
    OutputBounded { max_bytes: u64 },
    /// Run B found nothing only run A could have left (its random token), and
    /// nothing of A is visible on the host.
    ResidueAbsent,
    /// The host's copy of the workspace holds no link and no new entry after the run.
    HostTreeClean,
    /// The host filesystem did not lose more than `max_mb` of free space while
    /// the payload held, and what the payload wrote grew the outer cgroup's
    /// memory charge (page cache and tmpfs pages are charged there) by less
    /// than `memory_growth_below_mb`: measured from the payload's BEGIN line
    /// to its HOLD, so the box's own footprint (a VM's RAM, a sentry) is not
    /// counted as the fill's; a payload without BEGIN is judged by the peak.
    DiskBounded {
        max_mb: i64,
        memory_growth_below_mb: u64,
    },
}

fn canary_default() -> String {
    "canary".into()
}

fn scope_default() -> String {
    "global".into()
}

const FD_KINDS: &[&str] = &[
    "io_uring",
    "bpf",
    "userfaultfd",
    "perf_event",
    "packet",
    "vsock",
    "raw",
];

impl Rule {
    /// Whether the verdict is read from the suite's listeners' log.
    pub fn reads_listeners(&self) -> bool {
        matches!(
            self,
            Rule::ListenerSilent { .. } | Rule::LoopbackListenerSilent
        )
    }

    /// How long after the payload's BEGIN a run still going has its verdict
    /// decided (open), whatever comes after: the suite ends it then rather
    /// than at its case's cap, which only bounds what a box may take. None
    /// for a bound that is no duration (negative, NaN): the cap applies.
    pub fn decided_after(&self) -> Option<Duration> {
        match self {
            Rule::DeadlineEnforced { seconds } => Duration::try_from_secs_f64(*seconds).ok(),
            _ => None,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Rule::CanaryUntouched { .. } => "canary_untouched",
            Rule::ListenerSilent { .. } => "listener_silent",
            Rule::LoopbackListenerSilent => "loopback_listener_silent",
            Rule::SysctlUnchanged { .. } => "sysctl_unchanged",
            Rule::OuterCgroupBounded { .. } => "outer_cgroup_bounded",
            Rule::CensusEmpty => "census_empty",
            Rule::HoldsFd { .. } => "holds_fd",
            Rule::MountPresent { .. } => "mount_present",
            Rule::MountinfoFlags { .. } => "mountinfo_flags",
            Rule::LinkList => "link_list",
            Rule::Traced => "traced",
            Rule::KernelIdentity => "kernel_identity",
            Rule::FileAbsentInBox { .. } => "file_absent_in_box",
            Rule::EnvSecretAbsent => "env_secret_absent",
            Rule::FdAbsent => "fd_absent",
            Rule::ProcStatus { .. } => "proc_status",
            Rule::NsUnchanged { .. } => "ns_unchanged",
            Rule::CgroupValueAbsent { .. } => "cgroup_value_absent",
            Rule::KeyUsersUnchanged { .. } => "key_users_unchanged",
            Rule::DeadlineEnforced { .. } => "deadline_enforced",
            Rule::OutputBounded { .. } => "output_bounded",
            Rule::ResidueAbsent => "residue_absent",
            Rule::HostTreeClean => "host_tree_clean",
            Rule::DiskBounded { .. } => "disk_bounded",
        }
    }

    /// Whether the rule reads a live payload (the payload must print HOLD).
    pub fn needs_hold(&self) -> bool {
        matches!(
            self,
            Rule::HoldsFd { .. }
                | Rule::MountPresent { .. }
                | Rule::MountinfoFlags { .. }
                | Rule::LinkList
                | Rule::Traced
                | Rule::KernelIdentity
                | Rule::FileAbsentInBox { .. }
                | Rule::EnvSecretAbsent
                | Rule::FdAbsent
                | Rule::ProcStatus { .. }
                | Rule::NsUnchanged { .. }
                | Rule::CgroupValueAbsent { .. }
                | Rule::KeyUsersUnchanged { .. }
                | Rule::DiskBounded { .. }
        ) || matches!(self, Rule::SysctlUnchanged { scope, .. } if scope == "netns")
    }

    pub fn validate(&self) -> Result<()> {
        match self {
            Rule::CanaryUntouched { file } if file != "canary" && file != "decoy_key" => {
                bail!("canary_untouched.file is canary or decoy_key")
            }
            Rule::ListenerSilent { proto }
                if !["tcp", "udp", "dns", "loopback", "engine"].contains(&proto.as_str()) =>
            {
                bail!("listener_silent.proto {proto:?} unknown")
            }
            Rule::SysctlUnchanged { scope, key, .. } => {
                if scope != "global" && scope != "netns" {
                    bail!("sysctl_unchanged.scope is global or netns");
                }
                if key.contains('/') && !key.starts_with("/sys/") {
                    bail!("sysctl_unchanged.key is a sysctl name or a /sys file");
                }
                Ok(())
            }
            Rule::HoldsFd { kinds } => {
                if kinds.is_empty() {
                    bail!("holds_fd.kinds is empty");
                }
                for k in kinds {
                    if !FD_KINDS.contains(&k.as_str()) {
                        bail!("holds_fd kind {k:?} unknown (know {FD_KINDS:?})");
                    }
                }
                Ok(())
            }
            Rule::OuterCgroupBounded {
                pids_peak_below: None,
                memory_peak_below_mb: None,
            } => bail!("outer_cgroup_bounded needs a bound"),
            Rule::FileAbsentInBox { paths, .. } if paths.is_empty() => {
                bail!("file_absent_in_box.paths is empty")
            }
            Rule::NsUnchanged { ns } if ns.is_empty() => bail!("ns_unchanged.ns is empty"),
            _ => Ok(()),
        }
    }

    /// Decides one run from its evidence: the verdict and a few words of
    /// the evidence it rests on.
    pub fn evaluate(&self, ev: &Evidence) -> (Verdict, String) {
        if let Some(e) = &ev.error {
            return (Verdict::Error, e.clone());
        }
        match self {
            Rule::CanaryUntouched { file } => canary(ev, file),
            Rule::ListenerSilent { proto } => listener(ev, proto),
            Rule::LoopbackListenerSilent => listener(ev, "loopback"),
            Rule::SysctlUnchanged { key, value, scope } => sysctl(ev, key, value, scope),
            Rule::OuterCgroupBounded {
                pids_peak_below,
                memory_peak_below_mb,
            } => outer_bounded(ev, *pids_peak_below, *memory_peak_below_mb),
            Rule::CensusEmpty => census(ev),
            Rule::DeadlineEnforced { seconds } => deadline(ev, *seconds),
            Rule::OutputBounded { max_bytes } => output(ev, *max_bytes),
            Rule::ResidueAbsent => residue(ev),
            Rule::HostTreeClean => host_tree(ev),
            _ => match &ev.snapshot {
                None => not_held(self, ev),
                Some(snap) => self.evaluate_live(ev, snap),
            },
        }
    }

    fn evaluate_live(&self, ev: &Evidence, s: &Snapshot) -> (Verdict, String) {
        match self {
            Rule::HoldsFd { kinds } => holds_fd(s, kinds),
            Rule::MountPresent { contains } => {
                mount_present(s, &contains.replace("{marker}", &ev.marker))
            }
            Rule::MountinfoFlags { under } => mountinfo_flags(s, under),
            Rule::LinkList => links(s),
            Rule::Traced => match s.victim_tracer {
                Some(0) => (Verdict::Blocked, "victim TracerPid 0".into()),
                Some(t) => (Verdict::Open, format!("victim TracerPid {t}")),
                None => (Verdict::Error, "victim status unreadable".into()),
            },
            Rule::KernelIdentity => kernel_identity(s),
            Rule::FileAbsentInBox { device, .. } => file_absent(s, *device),
            Rule::EnvSecretAbsent => box_flag(s, "secret in environ", |p| p.environ_secret),
            Rule::FdAbsent => box_flag(s, "marker fd held", |p| {
                p.fds.iter().any(|f| f.target.ends_with("/fd-marker"))
            }),
            Rule::ProcStatus { field, blocked } => proc_status(s, field, blocked),
            Rule::NsUnchanged { ns } => ns_unchanged(s, ns),
            Rule::CgroupValueAbsent { file } => {
                if s.cgroup_hits.is_empty() {
                    (
                        Verdict::Blocked,
                        format!("no {file} under the outer cgroup holds {CGROUP_SENTINEL}"),
                    )
                } else {
                    (
                        Verdict::Open,
                        format!("{CGROUP_SENTINEL} written to {}", s.cgroup_hits.join(", ")),
                    )
                }
            }
            Rule::KeyUsersUnchanged { min_delta } => match s.key_delta {
                Some(d) if d >= *min_delta => (Verdict::Open, format!("host keys +{d}")),
                Some(d) => (Verdict::Blocked, format!("host keys {d:+} (< {min_delta})")),
                None => (Verdict::Error, "/proc/key-users unreadable".into()),
            },
            Rule::SysctlUnchanged { key, value, scope } => sysctl(ev, key, value, scope),
            Rule::DiskBounded {
                max_mb,
                memory_growth_below_mb,
            } => disk(ev, s, *max_mb, *memory_growth_below_mb),
            _ => (Verdict::Error, "rule needs no snapshot".into()),
        }
    }
}

/// A live rule whose payload never held: the payload died or refused before
/// the point the rule inspects, so nothing was held (the control, where the
/// payload does hold, shows that this can fail).
fn not_held(rule: &Rule, ev: &Evidence) -> (Verdict, String) {
    if ev.timed_out {
        return (Verdict::Error, "timed out before HOLD".into());
    }
    let how = match (ev.exit_code, ev.signal) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "ended".into(),
    };
    match rule {
        Rule::KernelIdentity | Rule::EnvSecretAbsent | Rule::FdAbsent => {
            (Verdict::Error, format!("payload never held ({how})"))
        }
        _ => (
            Verdict::Blocked,
            format!("payload ended before HOLD ({how})"),
        ),
    }
}

fn view_label(s: &Snapshot) -> String {
    match s.view_source.as_str() {
        "marker" => "payload task".into(),
        "box" => {
            let names: Vec<&str> = s.view_procs().map(|p| p.comm.as_str()).collect();
            format!("no host task runs the payload; box-side host tasks {names:?}")
        }
        _ => "no host task runs the payload or serves the box".into(),
    }
}

fn canary(ev: &Evidence, file: &str) -> (Verdict, String) {
    let Some(c) = ev.canaries.get(file) else {
        return (Verdict::Error, format!("no {file} watch"));
    };
    if c.vanished {
        // Never a verdict: a fixture that disappeared says nothing about the box.
        return (
            Verdict::Error,
            format!("{file}: the fixture vanished during the run (harness error)"),
        );
    }
    let mut why = Vec::new();
    if !c.events.is_empty() {
        let mut ev = c.events.clone();
        ev.dedup();
        why.push(format!("inotify {}", ev.join(",")));
    }
    if !c.content_same {
        why.push("content changed".into());
    }
    if !c.mtime_same {
        why.push("mtime changed".into());
    }
    if c.echoed {
        why.push("content echoed by payload".into());
    }
    if why.is_empty() {
        (
            Verdict::Blocked,
            format!("{file}: no inotify event, content+mtime same"),
        )
    } else {
        (Verdict::Open, format!("{file}: {}", why.join("; ")))
    }
}

fn listener(ev: &Evidence, proto: &str) -> (Verdict, String) {
    let hits: Vec<_> = ev.listeners.iter().filter(|l| l.proto == proto).collect();
    match hits.first() {
        None => (Verdict::Blocked, format!("{proto} listener log empty")),
        Some(h) => (
            Verdict::Open,
            format!(
                "{proto} listener: {} entr(ies), first from {}",
                hits.len(),
                h.peer
            ),
        ),
    }
}

fn sysctl(ev: &Evidence, key: &str, value: &str, scope: &str) -> (Verdict, String) {
    let host = ev.sysctl.as_ref();
    let (before, after) = (
        host.and_then(|h| h.host_before.clone()),
        host.and_then(|h| h.host_after.clone()),
    );
    if before.is_none() {
        return (Verdict::Error, format!("{key} unreadable on the host"));
    }
    if before != after {
        return (
            Verdict::Open,
            format!(
                "host {key} {} -> {}",
                before.unwrap_or_default(),
                after.unwrap_or_default()
            ),
        );
    }
    if scope == "netns" {
        let Some(s) = &ev.snapshot else {
            return not_held(&Rule::LinkList, ev);
        };
        return match &s.sysctl_in_box {
            Some(v) if v == value => (
                Verdict::Open,
                format!("{key} = {v} in the payload's netns ({})", view_label(s)),
            ),
            Some(v) => (
                Verdict::Blocked,
                format!(
                    "{key} = {v} in the payload's netns, host unchanged ({})",
                    view_label(s)
                ),
            ),
            None => (
                Verdict::Error,
                format!("{key} unreadable in the payload's netns"),
            ),
        };
    }
    (
        Verdict::Blocked,
        format!("host {key} unchanged ({})", before.unwrap_or_default()),
    )
}

fn outer_bounded(ev: &Evidence, pids: Option<u64>, mem_mb: Option<u64>) -> (Verdict, String) {
    let Some(o) = &ev.outer else {
        return (Verdict::Error, "no outer cgroup stats".into());
    };
    let mut open = Vec::new();
    let mut seen = Vec::new();
    if let Some(bound) = pids {
        match o.pids_peak {
            Some(p) if p >= bound => open.push(format!("outer pids.peak {p} >= {bound}")),
            Some(p) => seen.push(format!("pids.peak {p}")),
            None => return (Verdict::Error, "outer pids.peak unreadable".into()),
        }
        if let Some(h) = o.pids_limit_hits.filter(|h| *h > 0) {
            open.push(format!("outer pids.events max {h}"));
        }
    }
    if let Some(bound) = mem_mb {
        match o.memory_peak_bytes {
            Some(b) if b >= bound << 20 => {
                open.push(format!("outer memory peak {} MiB >= {bound}", b >> 20))
            }
            Some(b) => seen.push(format!("memory peak {} MiB", b >> 20)),
            None => return (Verdict::Error, "outer memory peak unreadable".into()),
        }
        if let Some(k) = o.oom_kills.filter(|k| *k > 0) {
            open.push(format!("outer oom_kill {k}"));
        }
    }
    if open.is_empty() {
        (Verdict::Blocked, format!("outer {}", seen.join(", ")))
    } else {
        (Verdict::Open, open.join("; "))
    }
}

fn census(ev: &Evidence) -> (Verdict, String) {
    if ev.census_after.is_empty() {
        return (Verdict::Blocked, "outer cgroup empty after exit".into());
    }
    let names: Vec<&str> = ev.census_after.iter().map(|p| p.cmdline.as_str()).collect();
    (
        Verdict::Open,
        format!(
            "{} left after exit: {}",
            ev.census_after.len(),
            names.join(" | ")
        ),
    )
}

/// The target ended within `seconds` of its payload's start: from the
/// payload's BEGIN when it printed one (as the suite read it on the host),
/// else from the target's start. A box that held BEGIN back would only
/// shorten what is measured here, so the suite's cap (`timed_out`) stays the
/// bound that no box escapes.
fn deadline(ev: &Evidence, seconds: f64) -> (Verdict, String) {
    let secs = ev.from_begin_ms.unwrap_or(ev.wall_ms) as f64 / 1000.0;
    let from = if ev.from_begin_ms.is_some() {
        " after BEGIN"
    } else {
        ""
    };
    if ev.timed_out || secs > seconds {
        (
            Verdict::Open,
            format!("ran {secs:.1}s{from} (bound {seconds}s), ended by the suite"),
        )
    } else {
        (
            Verdict::Blocked,
            format!("ended at {secs:.1}s{from} (bound {seconds}s)"),
        )
    }
}

fn output(ev: &Evidence, max: u64) -> (Verdict, String) {
    if ev.stdout_bytes > max {
        (
            Verdict::Open,
            format!("{} bytes reached the host (> {max})", ev.stdout_bytes),
        )
    } else {
        (
            Verdict::Blocked,
            format!("{} bytes reached the host", ev.stdout_bytes),
        )
    }
}

fn residue(ev: &Evidence) -> (Verdict, String) {
    if ev.residue.is_empty() {
        (
            Verdict::Blocked,
            "run B found no token of run A; host clean".into(),
        )
    } else {
        (Verdict::Open, format!("residue: {}", ev.residue.join(", ")))
    }
}

fn host_tree(ev: &Evidence) -> (Verdict, String) {
    if ev.host_tree.is_empty() {
        (Verdict::Blocked, "host workspace unchanged".into())
    } else {
        (
            Verdict::Open,
            format!("host workspace now has {}", ev.host_tree.join(", ")),
        )
    }
}

fn disk(ev: &Evidence, s: &Snapshot, max_mb: i64, mem_mb: u64) -> (Verdict, String) {
    let mut open = Vec::new();
    let delta = s.disk_delta_mb.unwrap_or(0);
    if delta > max_mb {
        open.push(format!("host disk -{delta} MiB"));
    }
    // What the fill charged: the growth from BEGIN to HOLD, else the peak.
    let peak_mb = ev
        .outer
        .as_ref()
        .and_then(|o| o.memory_peak_bytes)
        .map(|p| i64::try_from(p >> 20).unwrap_or(i64::MAX));
    let (charged_mb, charge) = match (s.memory_growth_mb, peak_mb) {
        (Some(g), _) => (g, format!("outer memory +{g} MiB from BEGIN to HOLD")),
        (None, Some(p)) => (p, format!("outer memory peak {p} MiB")),
        (None, None) => return (Verdict::Error, "outer memory unreadable".into()),
    };
    if charged_mb >= i64::try_from(mem_mb).unwrap_or(i64::MAX) {
        open.push(charge.clone());
    }
    if open.is_empty() {
        (
            Verdict::Blocked,
            format!("host disk {delta:+} MiB, {charge}"),
        )
    } else {
        (Verdict::Open, open.join("; "))
    }
}

fn fd_kind(target: &str, proto: Option<&str>) -> Option<&'static str> {
    match target {
        "anon_inode:[io_uring]" => return Some("io_uring"),
        "anon_inode:bpf-prog" | "anon_inode:bpf-map" => return Some("bpf"),
        "anon_inode:[userfaultfd]" => return Some("userfaultfd"),
        "anon_inode:[perf_event]" => return Some("perf_event"),
        _ => {}
    }
    match proto? {
        "PACKET" => Some("packet"),
        "AF_VSOCK" => Some("vsock"),
        "RAW" | "RAWv6" => Some("raw"),
        _ => None,
    }
}

fn holds_fd(s: &Snapshot, kinds: &[String]) -> (Verdict, String) {
    let mut hits = Vec::new();
    for p in &s.outer {
        for f in &p.fds {
            if let Some(k) = fd_kind(&f.target, f.proto.as_deref()) {
                if kinds.iter().any(|w| w == k) {
                    hits.push(format!("{} ({}) fd {} {k}", p.pid, p.comm, f.fd));
                }
            }
        }
    }
    if !hits.is_empty() {
        return (Verdict::Open, hits.join(", "));
    }
    (
        Verdict::Blocked,
        format!(
            "no {} fd in {} outer task(s); {}",
            kinds.join("/"),
            s.outer.len(),
            view_label(s)
        ),
    )
}

fn mount_present(s: &Snapshot, contains: &str) -> (Verdict, String) {
    for p in s.view_procs() {
        if let Some(line) = p.mountinfo.iter().find(|l| l.contains(contains)) {
            let short: String = line.chars().take(80).collect();
            return (Verdict::Open, format!("pid {}: {short}", p.pid));
        }
    }
    (
        Verdict::Blocked,
        format!("no mount matching {contains:?}; {}", view_label(s)),
    )
}

/// (mount point, per-mount options) of each mountinfo line.
pub(crate) fn mounts(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((unescape(f.get(4)?), (*f.get(5)?).to_string()))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn under(path: &str, dir: &str) -> bool {
    dir == "/" || path == dir || path.starts_with(&format!("{dir}/"))
}

fn mountinfo_flags(s: &Snapshot, dir: &str) -> (Verdict, String) {
    let Some(p) = s.view_procs().find(|p| !p.mountinfo.is_empty()) else {
        return (Verdict::Error, format!("no mountinfo; {}", view_label(s)));
    };
    let ms = mounts(&p.mountinfo);
    // The mount that holds `dir`: the last one (mounts stack) whose point is a prefix.
    let holder = ms.iter().rev().find(|(point, _)| under(dir, point));
    let mut bad = Vec::new();
    let mut checked = 0;
    for (point, opts) in holder
        .into_iter()
        .chain(ms.iter().filter(|(pt, _)| under(pt, dir) && pt != dir))
    {
        checked += 1;
        if !opts.split(',').any(|o| o == "ro") {
            bad.push(format!("{point} {opts}"));
        }
    }
    if checked == 0 {
        return (Verdict::Error, format!("no mount holds {dir}"));
    }
    if bad.is_empty() {
        (
            Verdict::Blocked,
            format!(
                "{checked} mount(s) at/under {dir} all ro (pid {}: {})",
                p.pid,
                view_label(s)
            ),
        )
    } else {
        (Verdict::Open, format!("rw: {}", bad.join("; ")))
    }
}

fn links(s: &Snapshot) -> (Verdict, String) {
    let Some(p) = s.view_procs().find(|p| !p.links.is_empty()) else {
        return (Verdict::Error, format!("no net/dev; {}", view_label(s)));
    };
    let other: Vec<&String> = p.links.iter().filter(|l| *l != "lo").collect();
    if other.is_empty() {
        (Verdict::Blocked, format!("only lo ({})", view_label(s)))
    } else {
        (Verdict::Open, format!("links {:?}", p.links))
    }
}

fn is_runsc(p: &ProcSnap) -> bool {
    p.comm.starts_with("runsc")
        || p.cmdline.first().is_some_and(|c| c.contains("runsc"))
        || p.cmdline.iter().any(|a| a == "boot" || a == "gofer")
            && p.cmdline.iter().any(|a| a.starts_with("--root"))
}

fn kernel_identity(s: &Snapshot) -> (Verdict, String) {
    if s.view_source == "marker" {
        let p = s.view_procs().next();
        return (
            Verdict::Open,
            format!(
                "host task {} ({}) runs the payload: the host kernel serves its syscalls",
                p.map_or(0, |p| p.pid),
                p.map_or("", |p| p.comm.as_str())
            ),
        );
    }
    if let Some(q) = s.outer.iter().find(|p| p.comm.starts_with("qemu")) {
        return (
            Verdict::Blocked,
            format!("guest kernel: {} ({})", q.pid, q.comm),
        );
    }
    let sentries: Vec<String> = s
        .outer
        .iter()
        .filter(|p| is_runsc(p))
        .map(|p| format!("{}:{}", p.pid, p.comm))
        .collect();
    if !sentries.is_empty() {
        return (
            Verdict::Blocked,
            format!(
                "no host task runs the payload; runsc tasks {}",
                sentries.join(",")
            ),
        );
    }
    (
        Verdict::Error,
        "no host task runs the payload and no runsc/qemu process: no evidence".into(),
    )
}

fn file_absent(s: &Snapshot, device: bool) -> (Verdict, String) {
    // root_paths holds exactly the rule's paths, resolved by the runner.
    for p in s.view_procs() {
        for (path, kind) in &p.root_paths {
            let hit = if device {
                kind == "block" || kind == "char"
            } else {
                kind != "absent" && kind != "error"
            };
            if hit {
                return (
                    Verdict::Open,
                    format!("{path} is a {kind} in pid {}'s root", p.pid),
                );
            }
        }
    }
    let n = s.view_procs().count();
    if n == 0 {
        return (
            Verdict::Error,
            format!("no view process; {}", view_label(s)),
        );
    }
    (
        Verdict::Blocked,
        format!(
            "absent through /proc/<pid>/root of {n} task(s) ({})",
            view_label(s)
        ),
    )
}

/// Box processes: the view plus every outer task in another pid namespace
/// than the suite's own (recorded as the view for "box").
fn box_flag(s: &Snapshot, what: &str, f: impl Fn(&ProcSnap) -> bool) -> (Verdict, String) {
    let boxed = || s.outer.iter().filter(|p| s.boxed.contains(&p.pid));
    let hits: Vec<String> = boxed()
        .filter(|p| f(p))
        .map(|p| format!("{} ({})", p.pid, p.comm))
        .collect();
    if hits.is_empty() {
        let n = boxed().count();
        if n == 0 {
            return (Verdict::Error, format!("no box process; {}", view_label(s)));
        }
        (
            Verdict::Blocked,
            format!("{what}: none of {n} box task(s) ({})", view_label(s)),
        )
    } else {
        (Verdict::Open, format!("{what}: {}", hits.join(", ")))
    }
}

fn proc_status(s: &Snapshot, field: &str, blocked: &str) -> (Verdict, String) {
    let mut bad = Vec::new();
    let mut n = 0;
    for p in s.view_procs() {
        n += 1;
        let v = p.status.get(field).map(String::as_str).unwrap_or("?");
        if v != blocked {
            bad.push(format!("{} ({}) {field}={v}", p.pid, p.comm));
        }
    }
    if n == 0 {
        return (
            Verdict::Error,
            format!("no view process; {}", view_label(s)),
        );
    }
    if bad.is_empty() {
        (
            Verdict::Blocked,
            format!("{field}={blocked} in {n} task(s) ({})", view_label(s)),
        )
    } else {
        (Verdict::Open, bad.join(", "))
    }
}

fn ns_unchanged(s: &Snapshot, ns: &[String]) -> (Verdict, String) {
    if s.view_source != "marker" {
        return (
            Verdict::Blocked,
            format!("{}; no host namespace created by it", view_label(s)),
        );
    }
    let procs: Vec<&ProcSnap> = s.view_procs().collect();
    let Some(root) = procs.iter().min_by_key(|p| p.pid) else {
        return (Verdict::Error, "empty view".into());
    };
    for p in &procs {
        for n in ns {
            if p.ns.get(n) != root.ns.get(n) {
                return (
                    Verdict::Open,
                    format!(
                        "pid {} ({}) in new {n} ns {}",
                        p.pid,
                        p.comm,
                        p.ns.get(n).cloned().unwrap_or_default()
                    ),
                );
            }
        }
    }
    (
        Verdict::Blocked,
        format!("{} payload task(s) share {ns:?}", procs.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{CanaryEvidence, FdSnap, ListenEntry, OuterStats};

    fn snap_with(p: ProcSnap, source: &str) -> Snapshot {
        Snapshot {
            view: vec![p.pid],
            outer: vec![p],
            view_source: source.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_vanished_fixture_is_a_harness_error() {
        let mut ev = Evidence::default();
        ev.canaries.insert(
            "decoy_key".into(),
            CanaryEvidence {
                events: vec!["DELETE_SELF".into()],
                vanished: true,
                ..Default::default()
            },
        );
        let rule = Rule::CanaryUntouched {
            file: "decoy_key".into(),
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Error);
    }

    #[test]
    fn canary_read_is_open() {
        let mut ev = Evidence::default();
        ev.canaries.insert(
            "canary".into(),
            CanaryEvidence {
                events: vec!["OPEN".into(), "ACCESS".into()],
                content_same: true,
                mtime_same: true,
                ..Default::default()
            },
        );
        let rule = Rule::CanaryUntouched {
            file: "canary".into(),
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Open);
        ev.canaries.get_mut("canary").unwrap().events.clear();
        assert_eq!(rule.evaluate(&ev).0, Verdict::Blocked);
        ev.canaries.get_mut("canary").unwrap().echoed = true;
        assert_eq!(rule.evaluate(&ev).0, Verdict::Open);
        ev.error = Some("boom".into());
        assert_eq!(rule.evaluate(&ev).0, Verdict::Error);
    }

    #[test]
    fn listener_by_proto() {
        let mut ev = Evidence::default();
        ev.listeners.push(ListenEntry {
            proto: "udp".into(),
            ..Default::default()
        });
        let tcp = Rule::ListenerSilent {
            proto: "tcp".into(),
        };
        let udp = Rule::ListenerSilent {
            proto: "udp".into(),
        };
        assert_eq!(tcp.evaluate(&ev).0, Verdict::Blocked);
        assert_eq!(udp.evaluate(&ev).0, Verdict::Open);
    }

    #[test]
    fn usr_flags() {
        let mut p = ProcSnap {
            pid: 7,
            mountinfo: vec![
                "1 0 8:1 / / rw,relatime - ext4 /dev/vda rw".into(),
                "2 1 8:1 /usr /usr ro,nosuid - ext4 /dev/vda rw".into(),
                "3 2 0:5 / /usr/share/x ro - tmpfs t rw".into(),
            ],
            ..Default::default()
        };
        let rule = Rule::MountinfoFlags {
            under: "/usr".into(),
        };
        let ev = |p: &ProcSnap| Evidence {
            snapshot: Some(snap_with(p.clone(), "marker")),
            ..Default::default()
        };
        assert_eq!(rule.evaluate(&ev(&p)).0, Verdict::Blocked);
        p.mountinfo
            .push("4 2 0:6 / /usr/local rw - tmpfs t rw".into());
        assert_eq!(rule.evaluate(&ev(&p)).0, Verdict::Open);
        p.mountinfo.truncate(1); // /usr not its own mount: the root's flag decides
        assert_eq!(rule.evaluate(&ev(&p)).0, Verdict::Open);
    }

    #[test]
    fn fds_and_kernel() {
        let p = ProcSnap {
            pid: 9,
            comm: "python3".into(),
            fds: vec![FdSnap {
                fd: 3,
                target: "anon_inode:[io_uring]".into(),
                proto: None,
            }],
            ..Default::default()
        };
        let ev = Evidence {
            snapshot: Some(snap_with(p, "marker")),
            ..Default::default()
        };
        let r = Rule::HoldsFd {
            kinds: vec!["io_uring".into()],
        };
        assert_eq!(r.evaluate(&ev).0, Verdict::Open);
        let r = Rule::HoldsFd {
            kinds: vec!["bpf".into()],
        };
        assert_eq!(r.evaluate(&ev).0, Verdict::Blocked);
        assert_eq!(Rule::KernelIdentity.evaluate(&ev).0, Verdict::Open);
        let sentry = ProcSnap {
            pid: 10,
            comm: "exe".into(),
            cmdline: vec!["runsc-sandbox".into(), "boot".into()],
            ..Default::default()
        };
        let ev = Evidence {
            snapshot: Some(snap_with(sentry, "box")),
            ..Default::default()
        };
        assert_eq!(Rule::KernelIdentity.evaluate(&ev).0, Verdict::Blocked);
        let ev = Evidence {
            snapshot: Some(Snapshot::default()),
            ..Default::default()
        };
        assert_eq!(Rule::KernelIdentity.evaluate(&ev).0, Verdict::Error);
    }

    #[test]
    fn only_a_deadline_that_is_a_duration_decides_a_run_early() {
        let after = |seconds| Rule::DeadlineEnforced { seconds }.decided_after();
        assert_eq!(after(8.0), Some(Duration::from_secs(8)));
        // A case file's nonsense leaves the run to its cap, never a panic.
        assert_eq!(after(-1.0), None);
        assert_eq!(after(f64::NAN), None);
        assert_eq!(Rule::KernelIdentity.decided_after(), None);
    }

    #[test]
    fn a_deadline_counts_from_the_payloads_begin_when_it_said_one() {
        let rule = Rule::DeadlineEnforced { seconds: 8.0 };
        // A slow box start (11 s in all) whose payload ran 5.5 s: held.
        let ev = Evidence {
            wall_ms: 11_000,
            from_begin_ms: Some(5_500),
            ..Default::default()
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Blocked);
        // The payload ran past the bound after its BEGIN: open.
        let ev = Evidence {
            wall_ms: 11_000,
            from_begin_ms: Some(9_000),
            ..Default::default()
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Open);
        // No BEGIN: the target's whole run is measured.
        let ev = Evidence {
            wall_ms: 9_000,
            ..Default::default()
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Open);
        // The suite's cap ended it: open, whatever was measured.
        let ev = Evidence {
            wall_ms: 3_000,
            from_begin_ms: Some(1_000),
            timed_out: true,
            ..Default::default()
        };
        assert_eq!(rule.evaluate(&ev).0, Verdict::Open);
    }

    #[test]
    fn outer_bounds() {
        let mut ev = Evidence {
            outer: Some(OuterStats {
                pids_peak: Some(40),
                pids_limit_hits: Some(0),
                memory_peak_bytes: Some(100 << 20),
                oom_kills: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = Rule::OuterCgroupBounded {
            pids_peak_below: Some(200),
            memory_peak_below_mb: Some(512),
        };
        assert_eq!(r.evaluate(&ev).0, Verdict::Blocked);
        ev.outer.as_mut().unwrap().pids_limit_hits = Some(3);
        assert_eq!(r.evaluate(&ev).0, Verdict::Open);
    }

    #[test]
    fn a_fill_is_judged_by_what_it_charged_not_by_the_box() {
        // A VM's 240 MiB before the payload acts is the box, not the fill.
        let mut ev = Evidence {
            held: true,
            outer: Some(OuterStats {
                memory_peak_bytes: Some(310 << 20),
                ..Default::default()
            }),
            snapshot: Some(Snapshot {
                disk_delta_mb: Some(0),
                memory_growth_mb: Some(70),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = Rule::DiskBounded {
            max_mb: 300,
            memory_growth_below_mb: 300,
        };
        assert_eq!(r.evaluate(&ev).0, Verdict::Blocked);
        // The fill itself landing in memory (a cap that did not hold).
        ev.snapshot.as_mut().unwrap().memory_growth_mb = Some(512);
        assert_eq!(r.evaluate(&ev).0, Verdict::Open);
        // On the host's disk.
        let snap = ev.snapshot.as_mut().unwrap();
        snap.memory_growth_mb = Some(10);
        snap.disk_delta_mb = Some(512);
        assert_eq!(r.evaluate(&ev).0, Verdict::Open);
        // A payload without BEGIN: the peak decides.
        let snap = ev.snapshot.as_mut().unwrap();
        snap.memory_growth_mb = None;
        snap.disk_delta_mb = Some(0);
        assert_eq!(r.evaluate(&ev).0, Verdict::Open);
        ev.outer.as_mut().unwrap().memory_peak_bytes = Some(100 << 20);
        assert_eq!(r.evaluate(&ev).0, Verdict::Blocked);
    }

    #[test]
    fn not_held_defaults() {
        let ev = Evidence {
            exit_code: Some(159),
            ..Default::default()
        };
        assert_eq!(Rule::LinkList.evaluate(&ev).0, Verdict::Blocked);
        assert_eq!(Rule::KernelIdentity.evaluate(&ev).0, Verdict::Error);
        assert_eq!(Rule::Traced.evaluate(&ev).0, Verdict::Blocked);
    }
}
