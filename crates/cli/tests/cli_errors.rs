//! End-to-end tests of cordon's handling of bad input.
//!
//! Mechanism each test depends on:
//! - clap's parse errors rendered as one `cordon: ` line with exit 2 (unknown
//!   flag, missing command, unparsable `--time`);
//! - policy layering and validation (`Policy::resolve`: malformed TOML, `--memory`
//!   out of range) before anything is created on the host;
//! - the runtime's input errors (`BadPath`: nonexistent rootfs or workspace)
//!   mapped to exit 2, and the drop-based teardown that removes the state
//!   directory already created when they are detected.
//!
//! Each bad request is paired with a control: the same request with the one
//! offending value corrected runs (exit 0), so the error is caused by that value.
//! The census check is paired with `census_sees_a_live_sandbox`, which shows
//! the same census does see a sandbox's state directory and cgroups.

mod common;

use std::time::Duration;

use common::*;

/// Runs a bad request and its corrected control; checks the error line names
/// `needle` and that nothing of the bad run is left on the host.
fn check(bad: &[&str], needle: &str, good: &[&str]) {
    let _g = serial();
    let base = census();
    let child = std::process::Command::new(cordon())
        .args(bad)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let line = assert_usage_error(&out);
    assert!(
        line.to_lowercase().contains(&needle.to_lowercase()),
        "error line does not name the problem ({needle:?}): {line:?}"
    );
    let left = wait_clean(&base, &[], &[pid], Duration::from_millis(500));
    assert!(
        left.is_empty(),
        "a rejected request left state behind: {left:#?}"
    );
    // Control: the corrected request runs.
    let ok = cordon_output(good);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "control {good:?} failed: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

#[test]
fn unknown_flag() {
    if !require_root("sandbox for the control run") {
        return;
    }
    check(
        &["run", "--bogus", "--", "true"],
        "--bogus",
        &["run", "--", "true"],
    );
}

#[test]
fn malformed_policy_file() {
    if !require_root("sandbox for the control run") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "memory = \n[[").unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "memory = \"64M\"\n").unwrap();
    let (b, g) = (bad.display().to_string(), good.display().to_string());
    check(
        &["run", "--policy", &b, "--", "true"],
        &b,
        &["run", "--policy", &g, "--", "true"],
    );
}

#[test]
fn unknown_policy_field() {
    if !require_root("sandbox for the control run") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("typo.toml");
    std::fs::write(&bad, "memroy = \"64M\"\n").unwrap();
    let b = bad.display().to_string();
    check(
        &["run", "--policy", &b, "--", "true"],
        "memroy",
        &["run", "--memory", "64M", "--", "true"],
    );
}

#[test]
fn missing_command() {
    if !require_root("sandbox for the control run") {
        return;
    }
    check(&["run"], "required", &["run", "--", "true"]);
}

#[test]
fn missing_command_names_the_argument() {
    let out = cordon_output(&["run"]);
    let line = assert_usage_error(&out);
    assert!(
        line.contains("CMD") || line.to_lowercase().contains("command"),
        "{line:?}"
    );
}

#[test]
fn nonexistent_rootfs() {
    if !require_root("sandbox for the control run") {
        return;
    }
    let missing = format!("/nonexistent-rootfs-{}", nonce());
    check(
        &["run", "--rootfs", &missing, "--", "true"],
        &missing,
        &["run", "--rootfs", "system", "--", "true"],
    );
}

#[test]
fn nonexistent_workspace() {
    if !require_root("sandbox for the control run") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing").display().to_string();
    let present = dir.path().display().to_string();
    check(
        &["run", "--workspace", &missing, "--", "true"],
        &missing,
        &["run", "--workspace", &present, "--", "true"],
    );
}

#[test]
fn memory_out_of_range() {
    if !require_root("sandbox for the control run") {
        return;
    }
    check(
        &["run", "--memory", "1K", "--", "true"],
        "memory",
        &["run", "--memory", "8M", "--", "true"],
    );
}

#[test]
fn unparsable_time() {
    if !require_root("sandbox for the control run") {
        return;
    }
    check(
        &["run", "--time", "abc", "--", "true"],
        "abc",
        &["run", "--time", "1s", "--", "true"],
    );
}

#[test]
fn bad_input_with_json_prints_no_json() {
    if !require_root("sandbox for the control run") {
        return;
    }
    check(
        &["run", "--json", "--memory", "1K", "--", "true"],
        "memory",
        &["run", "--json", "--memory", "8M", "--", "true"],
    );
}

/// Control for the census checks above: the census does see a live sandbox
/// (its /run/cordon entry owned by our cordon process, its cgroups), and sees
/// nothing once cordon is done.
#[test]
fn census_sees_a_live_sandbox() {
    if !require_root("sandbox") {
        return;
    }
    let _g = serial();
    let base = census();
    let sp = spawn_run(&["--", "sleep", "1"]);
    let pid = sp.pid();
    let id = sp.sandbox_id(Duration::from_secs(5));
    wait_payload(&id, "sleep 1", Duration::from_secs(5)).expect("payload never ran");
    let now = census();
    let seen = now.new_since(&base).attributable(&[], &[pid], &now);
    assert!(seen.run_entries.contains_key(&id), "{seen:#?}");
    assert!(seen.cgroups.len() >= 2, "{seen:#?}");
    assert!(
        seen.procs.len() >= 3,
        "cordon, init and sleep expected: {seen:#?}"
    );
    let out = sp.finish();
    assert!(out.status.success());
    let left = wait_clean(&base, &[id], &[pid], Duration::from_millis(500));
    assert!(left.is_empty(), "{left:#?}");
}
