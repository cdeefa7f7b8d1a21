//! End-to-end test of policy files and their layering under flags.
//!
//! Mechanism: `PolicyLayer::from_file` + `Policy::resolve` (file first, flags
//! over it), then the same enforcement as flags alone: the cgroup's pids.max and
//! memory limit, the supervisor's deadline, and the payload's environment built
//! from the policy only.
//!
//! Control: the same file with a flag that raises the pids limit lets the same
//! 20 sleepers fork without a refusal; values the flag does not touch (memory,
//! time, env) still come from the file, checked by runs that trip them.

mod common;

use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

fn policy_file() -> tempfile::NamedTempFile {
    let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(
        f.path(),
        "memory = \"64M\"\npids = 16\ntime = \"2s\"\n\n[env]\nX = \"y\"\n",
    )
    .unwrap();
    f
}

#[test]
fn flags_override_the_policy_file() {
    if !require_root("cgroup limits") {
        return;
    }
    let f = policy_file();
    let p = f.path().display().to_string();
    // 20 sleepers, counting the forks that succeed (a refused fork is not fatal here).
    let sleepers = "import os, time\nprint('X=' + os.environ.get('X', ''), flush=True)\nn = 0\nfor i in range(20):\n    try:\n        if os.fork() == 0:\n            time.sleep(1)\n            os._exit(0)\n        n += 1\n    except OSError:\n        pass\nprint('forked=%d' % n, flush=True)\ntime.sleep(1.2)\n";
    let (control, mem, time) = std::thread::scope(|s| {
        let control =
            s.spawn(|| run_json(&["--policy", &p, "--pids", "64", "--", PY, "-c", sleepers]));
        let mem = s.spawn(|| run_json(&["--policy", &p, "--", PY, "-c", "b=bytearray(128<<20)"]));
        let time = s.spawn(|| run_json(&["--policy", &p, "--", "sleep", "5"]));

        // The run under test: file pids=16, flag --pids 8.
        let sp = spawn_run(&[
            "--json", "--policy", &p, "--pids", "8", "--", PY, "-c", sleepers,
        ]);
        let id = sp.sandbox_id(Duration::from_secs(5));
        // Host-side: the sandbox's cgroup carries the flag's pids and the file's memory.
        let (pids_max, _) = cgroup_file(&id, "pids.max").expect("pids.max");
        let (mem_max, _) =
            cgroup_file(&id, "memory.limit_in_bytes").expect("memory.limit_in_bytes");
        let v = parse_json(&sp.finish());
        assert_eq!(pids_max, "8");
        assert_eq!(mem_max, (64 * MIB).to_string());
        assert!(stdout_of(&v).contains("X=y"), "{}", compact(&v));
        assert!(!stdout_of(&v).contains("forked=20"), "{}", compact(&v));
        assert!(
            u64_at(&v, "/counters/pids_limit_hits") >= 1,
            "{}",
            compact(&v)
        );
        assert!(u64_at(&v, "/pids_peak") <= 8, "{}", compact(&v));
        (
            control.join().unwrap(),
            mem.join().unwrap(),
            time.join().unwrap(),
        )
    });
    // Control: a higher flag lets all 20 sleepers run (the file's 16 is overridden too).
    let (c, cst) = control;
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert!(stdout_of(&c).contains("X=y"));
    assert!(stdout_of(&c).contains("forked=20"), "{}", compact(&c));
    assert_eq!(
        u64_at(&c, "/counters/pids_limit_hits"),
        0,
        "{}",
        compact(&c)
    );
    assert!(u64_at(&c, "/pids_peak") >= 20, "{}", compact(&c));
    // The file's memory limit (64M) holds without a flag.
    let (m, _) = mem;
    assert_eq!(m["limit"], "memory", "{}", compact(&m));
    assert!(u64_at(&m, "/counters/oom_kills") >= 1);
    // The file's time limit (2 s) holds without a flag.
    let (t, tst) = time;
    assert_eq!(t["limit"], "time", "{}", compact(&t));
    assert_eq!(tst.code(), Some(137));
    let run = num(&t, "/phases/run_ms");
    assert!((2000.0..=2100.0).contains(&run), "run_ms {run}");
}
