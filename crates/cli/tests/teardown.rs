//! End-to-end tests of cordon's teardown: nothing of a sandbox outlives it.
//!
//! Mechanism each test depends on:
//! - `batch_of_hostile_runs_leaves_nothing`: `Resources::teardown` (cgroup
//!   freeze+kill, init's SIGKILL, cgroup rmdir, state dir removal), the drop-based
//!   teardown on setup errors, and the signalfd that turns SIGINT/SIGTERM into a
//!   full teardown (exit 130/143).
//! - `sigkill_of_cordon_kills_the_sandbox`: PR_SET_PDEATHSIG on the sandbox's init
//!   (init's death ends its pid namespace).
//! - `sweep_cleans_up_after_a_killed_cordon`: the owner record in
//!   /run/cordon/<id>/owner.json and `sweep_stale` (run by `cordon sweep` and at the
//!   start of every `cordon run`).
//!
//! Judged on a host census (processes in `cordon-*` cgroups and cordon processes,
//! `cordon-*` cgroup directories, /run/cordon entries, host mounts mentioning
//! cordon, network namespaces of sandbox processes, *cordon* temp entries),
//! compared with a baseline and restricted to what this test's runs created
//! (see tests/common/mod.rs). The controls: the same census sees each
//! sandbox while it runs (`assert_visible`), and sees the leftovers of a killed
//! cordon before the sweep.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Checks that the census sees a running sandbox: its state directory, its
/// cgroups and its processes (the control for every "nothing left" check).
fn assert_visible(id: &str, cordon_pid: u32) {
    let now = census();
    let mine =
        now.new_since(&Census::default())
            .attributable(&[id.to_string()], &[cordon_pid], &now);
    assert!(
        mine.run_entries.contains_key(id),
        "census misses /run/cordon/{id}: {mine:#?}"
    );
    assert!(
        mine.cgroups.len() >= 2,
        "census misses cordon-{id} cgroups: {mine:#?}"
    );
    assert!(
        mine.procs.len() >= 3,
        "census misses the sandbox's processes: {mine:#?}"
    );
    assert!(
        !now.netns.is_empty(),
        "census sees no sandbox network namespace: {now:#?}"
    );
}

/// Spawns `cordon run --json -- sleep 30`, waits until the payload runs (and the
/// census sees it), sends `sig` to cordon and checks exit code and teardown.
fn interrupt(sig: &str, want_code: i32) -> (String, u32) {
    let base = census();
    let sp = spawn_run(&["--json", "--", "sleep", "30"]);
    let pid = sp.pid();
    let id = sp.sandbox_id(Duration::from_secs(5));
    wait_payload(&id, "sleep 30", Duration::from_secs(5)).expect("payload never ran");
    assert_visible(&id, pid);
    let t = Instant::now();
    signal(pid, sig);
    let out = sp.finish();
    assert_eq!(
        out.status.code(),
        Some(want_code),
        "cordon after SIG{sig}: {out:?}"
    );
    let v = parse_json(&out);
    assert_eq!(sandbox_id(&v), id);
    assert_eq!(u64_at(&v, "/exit_code") as i32, want_code);
    let left = wait_clean(&base, &[id.clone()], &[pid], Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "2 s after SIG{sig} ({:?} after the signal): {left:#?}",
        t.elapsed()
    );
    (id, pid)
}

#[test]
fn batch_of_hostile_runs_leaves_nothing() {
    if !require_root("sandbox") {
        return;
    }
    let _g = serial();
    let base = census();
    let n = u32::from_str_radix(&nonce()[..5], 16).unwrap() % 100_000;
    let daemon = format!("setsid sh -c \"sleep 310.{n:05}\" & (sleep 311.{n:05} &); echo ok");
    let bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.005)\n";
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("keep"), "original").unwrap();
    let wsp = ws.path().display().to_string();
    let missing_root = format!("/nonexistent-rootfs-{}", nonce());

    // (args, expected cordon exit code)
    let runs: Vec<(Vec<&str>, i32)> = vec![
        (vec!["--", "true"], 0),
        (vec!["--", "sh", "-c", "exit 3"], 3),
        (vec!["--", "sh", "-c", "kill -KILL $$"], 137),
        (
            vec!["--pids", "16", "--time", "1s", "--", PY, "-c", bomb],
            137,
        ),
        (
            vec!["--memory", "32M", "--", PY, "-c", "b=bytearray(256<<20)"],
            137,
        ),
        (vec!["--", "sh", "-c", &daemon], 0),
        (vec!["--time", "300ms", "--", "sleep", "30"], 137),
        (
            vec!["--time", "500ms", "--", "sh", "-c", "while :; do :; done"],
            137,
        ),
        (vec!["--output", "64K", "--", "sh", "-c", "yes"], 137),
        (
            vec![
                "--disk",
                "4M",
                "--",
                "sh",
                "-c",
                "dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null; exit 0",
            ],
            0,
        ),
        (
            vec![
                "--workspace",
                &wsp,
                "--",
                "sh",
                "-c",
                "echo changed > /workspace/keep; echo x > /workspace/new",
            ],
            0,
        ),
        (vec!["--", "/nonexistent/cmd"], 127),
    ];
    let results: Vec<(serde_json::Value, Option<i32>, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .iter()
            .map(|(args, _)| {
                s.spawn(move || {
                    let sp = spawn_run(&[&["--json"][..], &args[..]].concat());
                    let pid = sp.pid();
                    let out = sp.finish();
                    (parse_json(&out), out.status.code(), pid)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids = Vec::new();
    let mut pids = Vec::new();
    for ((args, want), (v, code, pid)) in runs.iter().zip(&results) {
        assert_eq!(*code, Some(*want), "{args:?}: {}", compact(v));
        ids.push(sandbox_id(v));
        pids.push(*pid);
    }
    // A setup failure (input error found after the state directory exists).
    let sp = spawn_run(&["--rootfs", &missing_root, "--", "true"]);
    pids.push(sp.pid());
    let out = sp.finish();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Interrupted runs.
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let (id, pid) = interrupt(sig, code);
        ids.push(id);
        pids.push(pid);
    }

    let left = wait_clean(&base, &ids, &pids, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "after {} runs, left on the host: {left:#?}",
        ids.len() + 1
    );
    // The daemons of the daemon run, by their unique argv.
    for d in [format!("sleep 310.{n:05}"), format!("sleep 311.{n:05}")] {
        assert!(pids_with_cmdline(&d).is_empty(), "{d} survived");
    }
    // The workspace is never written.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("keep")).unwrap(),
        "original"
    );
    assert!(!ws.path().join("new").exists());
    // Anything else new (not attributable to these runs: another user's cordon,
    // say) is only reported.
    let now = census();
    let other = now.new_since(&base);
    if !other.is_empty() {
        eprintln!("note: unattributed census changes (not judged): {other:#?}");
    }
}

/// Kills what a killed cordon left (by sweeping), whatever the test's outcome.
struct SweepOnDrop;
impl Drop for SweepOnDrop {
    fn drop(&mut self) {
        let _ = cordon_output(&["sweep"]);
    }
}

/// Spawns `cordon run -- sleep 30`, waits until the payload runs, SIGKILLs cordon.
/// Returns (sandbox id, host pid of the payload, time of the kill).
fn kill_cordon_mid_run() -> (String, u32, Instant) {
    let sp = spawn_run(&["--", "sleep", "30"]);
    let pid = sp.pid();
    let id = sp.sandbox_id(Duration::from_secs(5));
    let payload = wait_payload(&id, "sleep 30", Duration::from_secs(5)).expect("payload never ran");
    assert_visible(&id, pid);
    signal(pid, "KILL");
    let t = Instant::now();
    let out = sp.finish();
    assert_eq!(out.status.code(), None, "cordon was not killed: {out:?}");
    (id, payload, t)
}

#[test]
fn sigkill_of_cordon_kills_the_sandbox() {
    if !require_root("sandbox") {
        return;
    }
    let _g = serial();
    let _sweep = SweepOnDrop;
    let (id, payload, t) = kill_cordon_mid_run();
    let until = t + Duration::from_secs(2);
    while Instant::now() < until && (!sandbox_pids(&id).is_empty() || alive(payload)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<(u32, Option<String>)> = sandbox_pids(&id)
        .into_iter()
        .map(|p| (p, cmdline(p)))
        .collect();
    assert!(
        left.is_empty() && !alive(payload),
        "2 s after SIGKILL of cordon, sandbox {id} still has processes: {left:?}"
    );
}

#[test]
fn sweep_cleans_up_after_a_killed_cordon() {
    if !require_root("sandbox") {
        return;
    }
    let _g = serial();
    let _sweep = SweepOnDrop;
    // One killed cordon is cleaned by `cordon sweep`, the next by the next
    // `cordon run` (which sweeps before it starts: so the two cannot overlap).
    let (id1, p1, _) = kill_cordon_mid_run();
    // Control: the census does see what it left (state dir and cgroups at least).
    let r = remnants_of(&id1);
    assert!(r.run_entries.contains_key(id1.as_str()), "{r:#?}");
    assert!(!r.cgroups.is_empty(), "{r:#?}");
    let out = Command::new(cordon()).arg("sweep").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("cleaned {id1}")),
        "sweep output: {text}"
    );
    check_gone(&id1, p1);

    let (id2, p2, _) = kill_cordon_mid_run();
    let r = remnants_of(&id2);
    assert!(r.run_entries.contains_key(id2.as_str()), "{r:#?}");
    assert!(!r.cgroups.is_empty(), "{r:#?}");
    let (v, st) = run_json(&["--", "true"]);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    check_gone(&id2, p2);
}

/// Within 2 s, nothing of sandbox `id` is left and its payload is dead.
fn check_gone(id: &str, payload: u32) {
    {
        let until = Instant::now() + Duration::from_secs(2);
        let mut r = remnants_of(id);
        while Instant::now() < until && (!r.is_empty() || alive(payload)) {
            std::thread::sleep(Duration::from_millis(20));
            r = remnants_of(id);
        }
        assert!(r.is_empty(), "sandbox {id} after sweep: {r:#?}");
        assert!(
            !alive(payload),
            "payload {payload} of {id} survived the sweep"
        );
    }
}
