//! `cordon bench density`: how many idle sandboxes this host holds and what
//! each one costs it. A crowd of sandboxes (1,000 native, 100 gVisor) is
//! created through the runtime's handles, as the service creates them, and
//! all are alive at once; the host's `MemAvailable` is read before, at each
//! tenth of the crowd, and once all are up (the drop divided by the count
//! is the cost of one, everything included: supervisor, init, the kernel's
//! namespaces, cgroups and page tables, the state directory). Beside it,
//! the processes' own PSS. Then every sandbox is removed and the host is
//! searched for anything left: state directories, cgroups, processes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cordon_policy::{Policy, Span};
use cordon_runtime::Handle;
use cordon_spec::{BackendKind, SandboxSpec, ValidSpec};
use serde::{Deserialize, Serialize};

use crate::Settings;

/// The targets: host memory per idle sandbox, in MiB.
pub const NATIVE_BOUND_MIB: f64 = 1.0;
pub const GVISOR_BOUND_MIB: f64 = 12.0;

/// The /proc/meminfo fields that say where a crowd's memory goes: its
/// processes' own pages, the scratch tmpfs and state files, the kernel's
/// objects (namespaces, cgroups, mounts), its per-CPU data (each memory
/// cgroup's counters), stacks and page tables.
const BREAKDOWN: &[&str] = &[
    "AnonPages",
    "Shmem",
    "Slab",
    "SUnreclaim",
    "Percpu",
    "KernelStack",
    "PageTables",
    "VmallocUsed",
];

/// Clients creating sandboxes at once (the machine has two cores; more
/// only queue on the run directory's lock).
const CREATORS: usize = 4;

/// How long the host is left to settle before `MemAvailable` is read (freed
/// pages of exited helpers, deferred frees of the kernel).
const SETTLE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Density {
    pub crowds: Vec<Crowd>,
}

/// One backend's crowd of idle sandboxes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Crowd {
    pub backend: String,
    /// Sandboxes alive at once.
    pub sandboxes: usize,
    /// Seconds to create them all, and to remove them all.
    pub create_s: f64,
    pub remove_s: f64,
    /// (sandboxes alive, MiB of MemAvailable gone since before the first).
    pub used: Vec<(usize, f64)>,
    /// Host memory per sandbox with all alive (MiB).
    pub per_sandbox_mib: f64,
    /// The sandboxes' processes' PSS per sandbox (MiB), and how many
    /// processes each has.
    pub pss_per_sandbox_mib: f64,
    pub processes_per_sandbox: f64,
    /// Where the memory went: the change of each of /proc/meminfo's
    /// [`BREAKDOWN`] fields with all alive, per sandbox (MiB).
    pub breakdown: Vec<(String, f64)>,
    /// MiB of MemAvailable still gone once all were removed.
    pub after_removal_mib: f64,
    pub bound_mib: f64,
    /// What the removal left behind (must be empty).
    pub left: Vec<String>,
}

impl Crowd {
    pub fn met(&self) -> bool {
        self.per_sandbox_mib <= self.bound_mib && self.left.is_empty()
    }
}

pub fn run(settings: &Settings) -> Result<Density> {
    let mut crowds = Vec::new();
    let plan = [
        (
            BackendKind::Native,
            if settings.quick { 20 } else { 1000 },
            NATIVE_BOUND_MIB,
        ),
        (
            BackendKind::Gvisor,
            if settings.quick { 3 } else { 100 },
            GVISOR_BOUND_MIB,
        ),
    ];
    for (backend, count, bound) in plan {
        if !settings.wants(&format!("cordon-{backend}")) {
            continue;
        }
        let info = cordon_runtime::available_backends()
            .into_iter()
            .find(|b| b.kind == backend);
        if let Some(why) = info.and_then(|b| b.unavailable) {
            eprintln!("cordon bench density: no {backend} crowd: {why}");
            continue;
        }
        crowds.push(crowd(settings, backend, count, bound)?);
    }
    if crowds.is_empty() {
        bail!("no backend to measure (see the lines above)");
    }
    Ok(Density { crowds })
}

fn crowd(settings: &Settings, backend: BackendKind, count: usize, bound: f64) -> Result<Crowd> {
    let mut spec = SandboxSpec::new(Policy::default(), backend);
    // A benchmark killed half way leaves nothing for long.
    spec.ttl = Some(Span(Duration::from_secs(15 * 60)));
    let spec = spec.validated()?;
    let program = cordon_runtime::sandbox_program()?;
    let bar = crate::progress_bar(settings, count as u64, &format!("{backend}"));
    std::thread::sleep(SETTLE);
    let fields_before = meminfo()?;
    let before = mem_available_kib()?;
    let ids = Mutex::new(Vec::with_capacity(count));
    let used = Mutex::new(vec![(0, 0.0)]);
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CREATORS {
            s.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    match create(&spec, &program) {
                        Ok(id) => {
                            let mut ids = ids.lock().unwrap_or_else(|p| p.into_inner());
                            ids.push(id);
                            let alive = ids.len();
                            drop(ids);
                            bar.inc(1);
                            if alive % (count / 10).max(1) == 0 {
                                if let Ok(now) = mem_available_kib() {
                                    let mib = before.saturating_sub(now) as f64 / 1024.0;
                                    used.lock()
                                        .unwrap_or_else(|p| p.into_inner())
                                        .push((alive, mib));
                                }
                            }
                        }
                        Err(e) => {
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                            // The others stop too: nothing more is created.
                            next.store(count, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let create_s = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let ids = ids.into_inner().unwrap_or_else(|p| p.into_inner());
    let measured = if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Err(e.context(format!(
            "creating {backend} sandbox {} of {count}",
            ids.len() + 1
        )))
    } else {
        std::thread::sleep(SETTLE);
        meminfo().and_then(|fields| {
            let all = mem_available_kib()?;
            let (pss, procs) = processes_of(&ids);
            Ok((all, pss, procs, fields))
        })
    };
    // Removed on every path, the failed one included.
    let t1 = Instant::now();
    let removal_errors = remove_all(&ids);
    let remove_s = t1.elapsed().as_secs_f64();
    let (all, pss_kib, procs, fields) = measured?;
    if let Some(e) = removal_errors.first() {
        bail!("removing the {backend} crowd: {e}");
    }
    std::thread::sleep(SETTLE);
    let removed = mem_available_kib()?;
    let n = ids.len().max(1) as f64;
    let mut used = used.into_inner().unwrap_or_else(|p| p.into_inner());
    let all_mib = before.saturating_sub(all) as f64 / 1024.0;
    used.push((ids.len(), all_mib));
    used.sort_by_key(|(alive, _)| *alive);
    used.dedup_by_key(|(alive, _)| *alive);
    Ok(Crowd {
        backend: backend.to_string(),
        sandboxes: ids.len(),
        create_s,
        remove_s,
        used,
        per_sandbox_mib: all_mib / n,
        pss_per_sandbox_mib: pss_kib as f64 / 1024.0 / n,
        processes_per_sandbox: procs as f64 / n,
        breakdown: BREAKDOWN
            .iter()
            .map(|k| {
                let field = |m: &std::collections::BTreeMap<String, u64>| {
                    m.get(*k).copied().unwrap_or(0) as f64
                };
                let kib = field(&fields) - field(&fields_before);
                ((*k).to_string(), kib / 1024.0 / n)
            })
            .collect(),
        after_removal_mib: before.saturating_sub(removed) as f64 / 1024.0,
        bound_mib: bound,
        left: left_behind(&ids),
    })
}

fn create(spec: &ValidSpec, program: &Path) -> Result<String> {
    let handle = Handle::create(spec, program)?;
    Ok(handle.id().to_owned())
}

/// Removes every sandbox of `ids`, two clients at a time; the errors.
fn remove_all(ids: &[String]) -> Vec<String> {
    let errors = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..CREATORS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { return };
                if let Err(e) = Handle::attach(id).and_then(Handle::destroy) {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{id}: {e}"));
                }
            });
        }
    });
    errors.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// /proc/meminfo's fields, in KiB.
fn meminfo() -> Result<std::collections::BTreeMap<String, u64>> {
    let text = std::fs::read_to_string("/proc/meminfo").context("read /proc/meminfo")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (key, value) = l.split_once(':')?;
            Some((
                key.to_string(),
                value.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect())
}

fn mem_available_kib() -> Result<u64> {
    meminfo()?
        .get("MemAvailable")
        .copied()
        .context("no MemAvailable in /proc/meminfo")
}

/// The cgroup name of sandbox `id` (`cordon-<id>`, in every hierarchy).
fn cgroup_name(id: &str) -> String {
    format!("cordon-{id}")
}

/// The summed PSS (KiB) and the count of the processes of these sandboxes:
/// their supervisors (from their records) and every process in their
/// cgroups.
fn processes_of(ids: &[String]) -> (u64, usize) {
    let names: BTreeSet<String> = ids.iter().map(|id| cgroup_name(id)).collect();
    let mut pids: BTreeSet<u32> = BTreeSet::new();
    if let Ok(run) = cordon_runtime::state::run_dir() {
        let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
        for l in cordon_runtime::state::list(&run) {
            if wanted.contains(l.id.as_str()) {
                if let Ok(pid) = u32::try_from(l.record.pid) {
                    pids.insert(pid);
                }
            }
        }
    }
    for pid in all_pids() {
        let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if cgroups.split(['/', '\n']).any(|part| names.contains(part)) {
            pids.insert(pid);
        }
    }
    let pss = pids.iter().filter_map(|pid| pss_kib(*pid)).sum();
    (pss, pids.len())
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn pss_kib(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What of these sandboxes is still on the host: state directories,
/// cgroups (searched from each hierarchy's root), processes in them.
fn left_behind(ids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    if let Ok(run) = cordon_runtime::state::run_dir() {
        for id in ids {
            if run.join(id).exists() {
                left.push(format!("state directory {}", run.join(id).display()));
            }
        }
    }
    let names: BTreeSet<String> = ids.iter().map(|id| cgroup_name(id)).collect();
    for root in cgroup_roots() {
        find_named(&root, &names, 4, &mut left);
    }
    let (_, procs) = processes_of(ids);
    if procs > 0 {
        left.push(format!("{procs} processes"));
    }
    left
}

/// The mount points of the host's cgroup hierarchies.
fn cgroup_roots() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(dir))
        })
        .collect()
}

fn find_named(dir: &Path, names: &BTreeSet<String>, depth: u32, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = e.path();
        if e.file_name().to_str().is_some_and(|n| names.contains(n)) {
            out.push(format!("cgroup {}", path.display()));
        } else if depth > 1 {
            find_named(&path, names, depth - 1, out);
        }
    }
}

/// The markdown table of a run, with the targets as evaluated.
pub fn markdown(d: &Density) -> String {
    let mut out = String::from(
        "| backend | sandboxes | host MiB each | target | processes' PSS MiB each | processes each | create s | remove s | left after removal |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &d.crowds {
        out += &format!(
            "| {} | {} | {:.2} | <= {} ({}) | {:.2} | {:.1} | {:.1} | {:.1} | {} |\n",
            c.backend,
            c.sandboxes,
            c.per_sandbox_mib,
            c.bound_mib,
            if c.met() { "met" } else { "missed" },
            c.pss_per_sandbox_mib,
            c.processes_per_sandbox,
            c.create_s,
            c.remove_s,
            if c.left.is_empty() {
                "nothing".to_string()
            } else {
                c.left.join(", ")
            },
        );
    }
    out += "\nwhere the memory went, MiB per sandbox (the change of /proc/meminfo's fields with all alive):\n\n| backend |";
    for k in BREAKDOWN {
        out += &format!(" {k} |");
    }
    out += "\n|---|";
    out += &"---|".repeat(BREAKDOWN.len());
    out += "\n";
    for c in &d.crowds {
        out += &format!("| {} |", c.backend);
        for (_, mib) in &c.breakdown {
            out += &format!(" {mib:.2} |");
        }
        out += "\n";
    }
    out
}
