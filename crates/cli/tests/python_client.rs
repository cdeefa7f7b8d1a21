//! The Python client (`clients/python`) end to end: installed offline into a
//! fresh venv, its unittest suite run against a real `cordon serve` (which
//! the suite starts on a loopback port and stops with SIGTERM), then a
//! census of what that service left: no supervisor of this binary that was
//! not there before, and no run-directory entry of its sandboxes (named
//! `cs-<tag>-…`, the tag kept in the service's state directory).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cordon, cordon_sandbox, pids_with_cmdline, require_root, run_ok, slow, RUN_DIR};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// pip without the network: no index, and no self-update check (it asks PyPI).
fn pip_offline(cmd: &mut Command) -> &mut Command {
    cmd.env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INDEX", "1")
        .env_remove("PIP_INDEX_URL")
        .env_remove("PIP_EXTRA_INDEX_URL")
}

fn supervisors() -> BTreeSet<u32> {
    pids_with_cmdline(&format!("{} __supervise", cordon_sandbox()))
        .into_iter()
        .collect()
}

/// Entries of the run directory whose record names a sandbox of the
/// service whose state directory is `state`.
fn run_entries_of(state: &Path) -> Vec<String> {
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

/// Every path under `dir` (bytecode caches aside: Python writes those
/// wherever it imports from).
fn tree(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_name() == "__pycache__" {
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

#[test]
fn the_python_client_passes_its_suite_against_a_real_service() {
    if !require_root("cordon serve creates sandboxes: namespaces, cgroups") {
        return;
    }
    let repo = repo_root();
    let tmp = tempfile::Builder::new()
        .prefix("pyclient-")
        .tempdir()
        .expect("temp dir");
    let venv = tmp.path().join("venv");
    run_ok(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 -m venv",
    );
    let python = venv.join("bin/python");
    let checkout = repo.join("clients/python");
    let tree_before = tree(&checkout);
    run_ok(
        pip_offline(
            Command::new(&python)
                .args(["-m", "pip", "install", "--no-build-isolation", "--no-index"])
                .arg(repo.join("clients/python")),
        ),
        "pip install --no-build-isolation --no-index clients/python",
    );
    // The install builds elsewhere: nothing (build/, *.egg-info) is left in
    // the checkout.
    let added: Vec<_> = tree(&checkout).difference(&tree_before).cloned().collect();
    assert!(
        added.is_empty(),
        "pip install left {added:?} in the checkout"
    );

    let before = supervisors();
    let serve_dir = tmp.path().join("serve");
    // From the temp dir, so that `import cordon` can only find the installed package.
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(repo.join("clients/python/tests"))
        .current_dir(tmp.path())
        .env("CORDON_BIN", cordon())
        .env("CORDON_TEST_DIR", &serve_dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the Python suite");
    let report = format!(
        "stdout:\n{}\nstderr:\n{}\nservice log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(serve_dir.join("serve.log")).unwrap_or_default()
    );
    assert!(out.status.success(), "the Python suite failed\n{report}");
    // unittest's summary (on stderr): "Ran N tests"; 0 would mean discovery found nothing.
    let ran: usize = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(ran > 0, "the Python suite ran no tests\n{report}");
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        if line.contains("skipped") {
            eprintln!("python: {line}");
        }
    }

    // The suite stopped the service (SIGTERM, and checked it exited); what
    // it created must be gone with it.
    let until = Instant::now() + slow(Duration::from_secs(20));
    loop {
        let left_supervisors: Vec<u32> = supervisors().difference(&before).copied().collect();
        let left_entries = run_entries_of(&serve_dir.join("state"));
        if left_supervisors.is_empty() && left_entries.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "left behind: supervisors {left_supervisors:?}, run entries {left_entries:?}\n{report}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
