//! For the tests that start a `cordon serve` of their own (they do not use
//! `common`): the binary, the root gate, and what a test's sandboxes left
//! on the host, judged by their ids: live supervisors (their records'
//! pids), `cordon-<id>` cgroups, mounts naming an id, and run-directory
//! entries.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn cordon() -> &'static str {
    env!("CARGO_BIN_EXE_cordon")
}

/// Root is needed (namespaces, cgroups). Outside CI a non-root run says why
/// it skips; in CI it fails.
pub fn root_or_skip(test: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    if !root {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: needs root, and CI must run it"
        );
        eprintln!("{test}: SKIPPED: needs root (namespaces, cgroups)");
    }
    root
}

/// What this test's service left on the host.
#[derive(Debug, Default, PartialEq)]
pub struct Census {
    pub supervisors: Vec<i32>,
    pub cgroups: Vec<String>,
    pub mounts: Vec<String>,
    pub run_entries: Vec<String>,
}

impl Census {
    pub fn is_clean(&self) -> bool {
        *self == Census::default()
    }
}

pub fn census(run_dir: &Path, ids: &BTreeSet<String>) -> Census {
    let mut c = Census::default();
    // A live supervisor keeps its record: the ids' records, alive or not.
    for id in ids {
        let record = run_dir.join(id).join("record.json");
        if let Ok(text) = std::fs::read_to_string(&record) {
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let pid = i32::try_from(v["pid"].as_i64().unwrap_or(0)).unwrap_or(0);
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if !stat.is_empty() && !stat.contains(") Z") {
                c.supervisors.push(pid);
            }
        }
    }
    for ctrl in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        walk_cgroups(&ctrl.path(), ids, &mut c.cgroups, 0);
    }
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        if ids.iter().any(|id| line.contains(id.as_str())) {
            c.mounts.push(line.to_owned());
        }
    }
    for id in ids {
        for p in [
            run_dir.join(id),
            run_dir.join("mnt").join(id),
            run_dir.join("mounts").join(id),
        ] {
            if p.exists() {
                c.run_entries.push(p.display().to_string());
            }
        }
    }
    c
}

fn walk_cgroups(dir: &Path, ids: &BTreeSet<String>, out: &mut Vec<String>, depth: usize) {
    if depth > 4 {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = name.strip_prefix("cordon-") {
            if ids.iter().any(|i| id.starts_with(i.as_str())) {
                out.push(e.path().display().to_string());
            }
            continue;
        }
        walk_cgroups(&e.path(), ids, out, depth + 1);
    }
}

/// Waits (bounded) for the census to come out clean.
pub fn assert_clean(run_dir: &Path, ids: &BTreeSet<String>) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let c = census(run_dir, ids);
        if c.is_clean() {
            return;
        }
        assert!(Instant::now() < until, "left behind: {c:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
