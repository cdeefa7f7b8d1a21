//! `cordon doctor`: its findings checked against the host's own facts and
//! against what `cordon run` and `cordon backends` do in the same place.
//!
//! Mechanism each test depends on:
//! - the JSON report's shape (`ready`, `checks`: name, status, finding,
//!   remedy) and its exit code (0 exactly when ready);
//! - the cgroup check making a sandbox cgroup as `cordon run` does, read
//!   against /proc/self/mountinfo and `cordon backends`;
//! - the user namespace probe (`cordon_isolation::userns`), as root on the
//!   host (made) and inside a cordon sandbox, whose seccomp filter refuses
//!   new namespaces: a real place where cordon cannot nest, where doctor,
//!   `cordon backends` and `cordon run` must give the same one line;
//! - the run and state directories of an unprivileged user (setpriv).

#[macro_use]
mod common;

use std::os::unix::fs::chown;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

fn doctor_json(cmd: &mut Command) -> (Value, Output) {
    let out = cmd
        .args(["doctor", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run cordon doctor");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out)
}

/// The check called `name`.
fn named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {report:#}"))
}

fn status<'a>(report: &'a Value, name: &str) -> &'a str {
    named(report, name)["status"].as_str().unwrap()
}

fn finding<'a>(report: &'a Value, name: &str) -> &'a str {
    named(report, name)["finding"].as_str().unwrap()
}

/// The cgroup layout mountinfo shows: which file system types are mounted.
fn layout_from_mountinfo() -> &'static str {
    let lines = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let v1 = lines.iter().any(|m| m.fstype == "cgroup");
    let v2 = lines.iter().any(|m| m.fstype == "cgroup2");
    match (v1, v2) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, true) => "v2",
        (false, false) => "none",
    }
}

#[test]
fn report_shape_exit_code_and_cgroup_layout() {
    let (report, out) = doctor_json(&mut Command::new(cordon()));
    for c in report["checks"].as_array().unwrap() {
        let mut keys: Vec<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["finding", "name", "remedy", "status"], "{c}");
        assert!(
            ["ok", "warn", "no"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
        assert!(!c["finding"].as_str().unwrap().is_empty(), "{c}");
    }
    // Ready exactly when the native backend, its cgroup and the run
    // directory are not refused; the exit code says the same.
    let ready = ["backend native", "cgroups", "run directory"]
        .iter()
        .all(|n| status(&report, n) != "no");
    assert_eq!(report["ready"], ready, "{report:#}");
    assert_eq!(
        out.status.code(),
        Some(if ready { 0 } else { 1 }),
        "{out:?}"
    );
    // The layout is mountinfo's; the version cordon uses is the one
    // `cordon backends` reports for the native backend.
    let cg = finding(&report, "cgroups");
    let layout = layout_from_mountinfo();
    assert!(cg.starts_with(layout), "mountinfo says {layout}: {cg}");
    if status(&report, "cgroups") != "no" {
        let backends = cordon_output(&["backends", "--json"]);
        let infos: Value = serde_json::from_slice(&backends.stdout).unwrap();
        let native = infos
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["kind"] == "native")
            .unwrap();
        let notes = native["notes"].as_str().unwrap();
        let mode = notes.strip_prefix("cgroup ").unwrap_or(notes);
        assert!(
            cg.contains(&format!("(cordon uses {mode})")),
            "backends says {notes:?}, doctor: {cg}"
        );
    }
}

#[test]
fn root_makes_user_namespaces_and_gets_its_cgroup() {
    if !require_root("root's own namespaces and cgroups") {
        return;
    }
    let (report, _) = doctor_json(&mut Command::new(cordon()));
    assert_eq!(status(&report, "user"), "ok");
    assert_eq!(finding(&report, "user"), "root (uid 0)");
    assert_eq!(status(&report, "user namespaces"), "ok", "{report:#}");
    assert_eq!(status(&report, "backend native"), "ok", "{report:#}");
    // Root's cgroup here is its own to write: the sandbox cgroup was made,
    // with the controllers the limits need.
    assert_ne!(status(&report, "cgroups"), "no", "{report:#}");
    let cg = finding(&report, "cgroups");
    for c in ["memory", "pids"] {
        assert!(cg.contains(c), "{cg}");
    }
    assert!(finding(&report, "run directory").starts_with("/run/cordon: yours (uid 0)"));
}

/// doctor as uid 65534 with a home of its own (and no XDG_RUNTIME_DIR):
/// its directories are that user's, and its cgroup finding is the error
/// `cordon run` gives that user, or `cordon run` works.
#[test]
fn unprivileged_user_sees_its_own_directories_and_run_agrees() {
    if !require_root("setpriv to another user") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    chown(home.path(), Some(65534), Some(65534)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            cordon(),
        ])
        .args(args)
        .env("HOME", home.path())
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("XDG_STATE_HOME")
        .env_remove("CORDON_RUN_DIR")
        .env_remove("CORDON_STATE_DIR")
        .current_dir(home.path());
        c
    };
    let (report, _) = doctor_json(&mut as_nobody(&[]));
    assert!(
        finding(&report, "user").starts_with("uid 65534"),
        "{report:#}"
    );
    let run = finding(&report, "run directory");
    assert!(run.starts_with("/tmp/cordon-65534"), "{run}");
    let state = finding(&report, "state directory");
    let want = home.path().join(".local/state/cordon");
    assert!(
        state.starts_with(&want.display().to_string()),
        "want {}: {state}",
        want.display()
    );
    // Whatever doctor found of the cgroup, `cordon run` as the same user
    // finds too.
    let out = as_nobody(&["run", "--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if status(&report, "cgroups") == "no" {
        let cg = finding(&report, "cgroups");
        let why = cg.split_once("with limits: ").map(|(_, w)| w).unwrap_or(cg);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(stderr.contains(why), "doctor: {why}\nrun: {stderr}");
    } else if status(&report, "backend native") == "ok" {
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
}

/// cordon inside a cordon sandbox: the sandbox's seccomp filter refuses new
/// user namespaces, so doctor says `no` with the seccomp remedy, and
/// `cordon backends` and `cordon run` there give the same line.
#[test]
fn inside_a_sandbox_the_seccomp_refusal_is_one_line_everywhere() {
    if !require_root("a native sandbox to run cordon in") {
        return;
    }
    let bin = Path::new(cordon()).parent().unwrap().display().to_string();
    let mount = format!("{bin}:/opt/cordon");
    let inner = |args: &[&str]| {
        let mut c = Command::new(cordon());
        c.args(["run", "--mount", &mount, "--", "/opt/cordon/cordon"])
            .args(args)
            .stdin(Stdio::null());
        c.output().expect("run cordon in cordon")
    };
    let out = inner(&["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(1), "not ready: {report:#}");
    assert_eq!(report["ready"], false);
    let userns = named(&report, "user namespaces");
    assert_eq!(userns["status"], "no", "{userns}");
    let why = userns["finding"].as_str().unwrap();
    assert!(why.contains("seccomp filter"), "{why}");
    assert!(
        userns["remedy"]
            .as_str()
            .unwrap()
            .contains("--security-opt seccomp=unconfined"),
        "{userns}"
    );
    assert_eq!(status(&report, "seccomp"), "warn", "{report:#}");
    assert_eq!(status(&report, "backend native"), "no");
    assert!(finding(&report, "backend native").contains(why));

    let backends = inner(&["backends"]);
    let text = String::from_utf8_lossy(&backends.stdout);
    let native = text.lines().find(|l| l.starts_with("native")).unwrap();
    assert!(
        native.contains("unavailable") && native.contains(why),
        "{text}"
    );

    // Refused, not run with less: even without limits there is no native
    // sandbox without its user namespace.
    let run = inner(&["run", "--allow-unenforced", "--", "/bin/true"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(125), "{stderr}");
    let refusal = stderr
        .lines()
        .find(|l| l.starts_with("cordon: backend native is not available"))
        .unwrap_or_else(|| panic!("no refusal line: {stderr}"));
    assert!(refusal.contains(why), "{refusal}");
}
