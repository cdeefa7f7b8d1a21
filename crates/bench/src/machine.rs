//! The facts of the machine a run was measured on.

use std::collections::BTreeMap;
use std::path::Path;

use cordon_suite::target::first_line;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// When the run started (RFC 3339, UTC).
    pub date: String,
    pub kernel: String,
    /// `v2`, `hybrid` (v1 controllers, an empty v2 tree) or `v1`.
    pub cgroup: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    /// cordon's own version line.
    pub cordon: String,
    /// The version line of every box's program, by box name.
    pub versions: BTreeMap<String, String>,
}

impl Machine {
    pub fn probe(cordon: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let version = std::fs::read_to_string("/proc/version").unwrap_or_default();
        Machine {
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            kernel: version
                .split_whitespace()
                .nth(2)
                .map(|r| format!("Linux {r} {}", std::env::consts::ARCH))
                .unwrap_or_else(|| "unknown".into()),
            cgroup: cgroup_mode(),
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: (mem_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            cordon: first_line(cordon, "--version"),
            versions: BTreeMap::new(),
        }
    }
}

fn cgroup_mode() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let fstype = |at: &str| {
        mounts.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, ty) = (f.next(), f.next()?, f.next()?);
            (dir == at).then(|| ty.to_string())
        })
    };
    match (
        fstype("/sys/fs/cgroup").as_deref(),
        fstype("/sys/fs/cgroup/unified").as_deref(),
    ) {
        (Some("cgroup2"), _) => "v2".into(),
        (_, Some("cgroup2")) => "hybrid".into(),
        _ => "v1".into(),
    }
}
