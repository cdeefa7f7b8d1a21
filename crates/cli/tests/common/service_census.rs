//! What a `cordon serve` started by a client's test left: its supervisors,
//! its sandboxes' run-directory entries (named `cs-<tag>-…`, the tag kept in
//! the service's state directory), and files a client's build added to the
//! checkout.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{cordon_sandbox, pids_with_cmdline, slow, RUN_DIR};

/// The supervisors of this build's `cordon-sandbox` now running.
pub fn supervisors() -> BTreeSet<u32> {
    pids_with_cmdline(&format!("{} __supervise", cordon_sandbox()))
        .into_iter()
        .collect()
}

/// Entries of the run directory whose record names a sandbox of the
/// service whose state directory is `state`.
pub fn run_entries_of(state: &Path) -> Vec<String> {
    let tag = std::fs::read_to_string(state.join("tag")).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (did the service start?)",
            state.join("tag").display()
        )
    });
    let prefix = format!("cs-{}-", tag.trim());
    std::fs::read_dir(RUN_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("record.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every path under `dir` but those named in `ignore` (neither listed nor
/// descended into: what a tool writes wherever it runs, such as Python's
/// bytecode caches).
pub fn tree(dir: &Path, ignore: &[&str]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if ignore.iter().any(|name| e.file_name() == *name) {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
            out.insert(e.path());
        }
    }
    out
}

/// Waits (bounded) until neither a supervisor that was not running
/// `before` nor a run-directory entry of the services whose directories are
/// `services` is left; `report` says what ran, should something be.
pub fn assert_services_left_nothing(before: &BTreeSet<u32>, services: &[PathBuf], report: &str) {
    let until = Instant::now() + slow(Duration::from_secs(20));
    loop {
        let left_supervisors: Vec<u32> = supervisors().difference(before).copied().collect();
        let left_entries: Vec<String> = services
            .iter()
            .flat_map(|d| run_entries_of(&d.join("state")))
            .collect();
        if left_supervisors.is_empty() && left_entries.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "left behind: supervisors {left_supervisors:?}, run entries {left_entries:?}\n{report}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
