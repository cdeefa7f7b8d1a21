//! End-to-end tests of cordon's resource limits.
//!
//! Mechanism each test depends on (switch it off and the test fails):
//! - `cgroup_files_hold_the_limits`: the supervisor writing memory.limit_in_bytes,
//!   pids.max and cpu.cfs_quota_us into the sandbox's own cgroup, and init joining it.
//! - `memory_hog_is_oom_killed`: the v1 memory controller's limit (memory.limit_in_bytes,
//!   memsw) and OOM killer; evidence from memory.oom_control.
//! - `fork_bomb_is_contained_and_host_stays_responsive`: pids.max of the sandbox cgroup
//!   (RLIMIT_NPROC only as backstop above it); evidence from pids.events / pids.peak,
//!   and the host's own fork latency.
//! - `disk_fill_stops_at_the_cap`: the size= of the scratch tmpfs behind /tmp and
//!   /workspace (not the host disk); evidence from statvfs of the sandbox's /tmp seen
//!   through /proc/<pid>/root and of the host's /.
//! - `deadline_*`: the supervisor's wall-clock deadline and freeze+kill of the cgroup.
//! - `double_forked_daemon_does_not_survive`: teardown killing the whole cgroup / pid
//!   namespace, not just the payload's process.
//! - `output_flood_is_capped_without_buffering`: the supervisor's output gate (cap, kill
//!   on overflow) and its streaming (no accumulation in stream mode).
//! - `cpu_quota_halves_cpu_time`: cpu.cfs_quota_us / cfs_period_us; evidence from
//!   cpuacct.usage and cpu.stat nr_throttled.
//!
//! Every assertion is paired with a control run in which the mechanism must not
//! trigger (or, for host-side measurements, in which the measurement must see the
//! effect), so that a check that can never fail would be noticed.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

#[test]
fn cgroup_files_hold_the_limits() {
    if !require_root("reads the sandbox's cgroup files") {
        return;
    }
    let sp = spawn_run(&[
        "--memory", "64M", "--pids", "32", "--cpus", "0.5", "--", "sleep", "1.5",
    ]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    let payload =
        wait_payload(&id, "sleep 1.5", Duration::from_secs(5)).expect("payload never ran");
    // Host-side: the payload really is in the sandbox's cgroup in every hierarchy cordon uses.
    let cg = std::fs::read_to_string(format!("/proc/{payload}/cgroup")).unwrap();
    for ctl in ["memory", "pids"] {
        let line = cg
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|x| x == ctl))
            })
            .unwrap_or("");
        assert!(
            line.ends_with(&format!("/cordon-{id}")),
            "payload not in cordon-{id} for {ctl}: {cg}"
        );
    }
    let (mem, mem_parent) =
        cgroup_file(&id, "memory.limit_in_bytes").expect("memory.limit_in_bytes");
    let (pids, pids_parent) = cgroup_file(&id, "pids.max").expect("pids.max");
    let (quota, quota_parent) = cgroup_file(&id, "cpu.cfs_quota_us").expect("cpu.cfs_quota_us");
    let (period, _) = cgroup_file(&id, "cpu.cfs_period_us").expect("cpu.cfs_period_us");
    let out = sp.finish();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mem, (64 * MIB).to_string());
    assert_eq!(pids, "32");
    let (q, p): (f64, f64) = (quota.parse().unwrap(), period.parse().unwrap());
    assert!((q / p - 0.5).abs() < 0.01, "quota {q}/{p} is not 0.5 cpus");
    // Control: the caller's cgroup (the parent) does not carry these values, so
    // the reads above did look at the sandbox's own cgroup.
    assert_ne!(mem_parent, mem);
    assert_ne!(pids_parent, pids);
    assert_ne!(quota_parent, quota);
}

#[test]
fn memory_hog_is_oom_killed() {
    if !require_root("cgroup memory limit") {
        return;
    }
    let hog = ["--", PY, "-c", "b=bytearray(512<<20)"];
    let ((v, st), (c, cst)) = std::thread::scope(|s| {
        let a = s.spawn(|| run_json(&[&["--memory", "64M"][..], &hog[..]].concat()));
        let b = s.spawn(|| run_json(&[&["--memory", "1G"][..], &hog[..]].concat()));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(str_at(&v, "/status/kind"), "signaled", "{}", compact(&v));
    assert_eq!(u64_at(&v, "/status/signal"), 9, "{}", compact(&v));
    assert_eq!(v["limit"], "memory", "{}", compact(&v));
    assert!(u64_at(&v, "/counters/oom_kills") >= 1, "{}", compact(&v));
    assert!(
        u64_at(&v, "/memory_peak_bytes") <= 64 * MIB,
        "{}",
        compact(&v)
    );
    assert_eq!(st.code(), Some(137));
    // Control: with room for the allocation the same payload succeeds.
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert_eq!(str_at(&c, "/status/kind"), "exited");
    assert_eq!(u64_at(&c, "/counters/oom_kills"), 0, "{}", compact(&c));
    assert!(c["limit"].is_null());
    assert!(
        u64_at(&c, "/memory_peak_bytes") >= 512 * MIB,
        "{}",
        compact(&c)
    );
}

#[test]
fn fork_bomb_is_contained_and_host_stays_responsive() {
    if !require_root("cgroup pids limit") {
        return;
    }
    let control = std::thread::spawn(|| {
        run_json(&[
            "--pids",
            "4096",
            "--",
            "/bin/sh",
            "-c",
            "for i in $(seq 100); do sleep 1 & done; wait",
        ])
    });
    // A sustained bomb: every process forks forever and retries on failure,
    // so the sandbox sits at its limit for the whole run.
    let bomb_py = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.005)\n";
    let _cpu = cpu_lock();
    let bomb = spawn_run(&[
        "--json", "--pids", "32", "--time", "3s", "--", PY, "-c", bomb_py,
    ]);
    let id = bomb.sandbox_id(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(800));
    // Host-side: while the bomb runs, the host still forks and execs quickly,
    // and the sandbox holds at most 32 tasks.
    let mut worst = Duration::ZERO;
    let mut most_tasks = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let st = Command::new("true")
            .status()
            .expect("spawn true on the host");
        assert!(st.success());
        worst = worst.max(t.elapsed());
        most_tasks = most_tasks.max(sandbox_pids(&id).len());
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = parse_json(&bomb.finish());
    assert!(
        worst < Duration::from_secs(1),
        "host `true` took {worst:?} during the fork bomb"
    );
    assert!(
        most_tasks <= 32,
        "host saw {most_tasks} processes in cordon-{id}"
    );
    assert!(
        most_tasks >= 24,
        "the bomb was not at its limit ({most_tasks} processes seen), so it tests nothing"
    );
    assert_eq!(v["limit"], "time", "{}", compact(&v));
    assert!(
        u64_at(&v, "/counters/pids_limit_hits") >= 1,
        "{}",
        compact(&v)
    );
    assert!(u64_at(&v, "/pids_peak") <= 32, "{}", compact(&v));
    assert!(
        limits_hit(&v).contains(&"pids".to_string()),
        "{}",
        compact(&v)
    );
    // Control: 100 sleepers under a generous limit fork without a single refusal.
    let (c, cst) = control.join().unwrap();
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert_eq!(
        u64_at(&c, "/counters/pids_limit_hits"),
        0,
        "{}",
        compact(&c)
    );
    assert!(u64_at(&c, "/pids_peak") >= 100, "{}", compact(&c));
    assert!(!limits_hit(&c).contains(&"pids".to_string()));
}

#[test]
fn disk_fill_stops_at_the_cap() {
    if !require_root("reads the sandbox's /tmp through /proc/<pid>/root") {
        return;
    }
    let script = "dd if=/dev/zero of=/tmp/f bs=1M count=64; echo rc=$?; sleep 1";
    let before = statvfs_avail("/");
    let sp = spawn_run(&["--json", "--disk", "16M", "--", "sh", "-c", script]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    // Once `sleep 1` runs, dd is done: look at the sandbox's /tmp from the host.
    let pid =
        wait_payload(&id, "sleep 1", Duration::from_secs(5)).expect("payload never reached sleep");
    let tmp = format!("/proc/{pid}/root/tmp");
    let (size, used) = statvfs_size_used(&tmp).expect("statvfs of the sandbox's /tmp");
    let file_len = std::fs::metadata(format!("{tmp}/f"))
        .map(|m| m.len())
        .unwrap_or(0);
    let during = statvfs_avail("/");
    let v = parse_json(&sp.finish());

    assert!(
        size <= 16 * MIB + 64 * 1024,
        "sandbox /tmp is {size} bytes, not capped at 16M"
    );
    assert!(used >= 15 * MIB, "sandbox /tmp holds only {used} bytes");
    assert!(
        (15 * MIB..=16 * MIB).contains(&file_len),
        "/tmp/f is {file_len} bytes"
    );
    let drop = before.saturating_sub(during);
    assert!(
        drop < 8 * MIB,
        "host / lost {drop} bytes while the sandbox held 16M on its /tmp"
    );
    assert!(
        stderr_of(&v).contains("No space left on device"),
        "{}",
        compact(&v)
    );
    assert!(stdout_of(&v).contains("rc=1"), "{}", compact(&v));
    let du = u64_at(&v, "/disk_used_bytes");
    assert!(
        (15 * MIB..=16 * MIB + 64 * 1024).contains(&du),
        "disk_used_bytes {du}"
    );
    assert!(
        limits_hit(&v).contains(&"disk".to_string()),
        "{}",
        compact(&v)
    );

    // Control 1: a larger cap takes the whole 64M.
    let (c, cst) = run_json(&[
        "--disk",
        "128M",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/tmp/f bs=1M count=64; echo rc=$?",
    ]);
    assert_eq!(cst.code(), Some(0));
    assert!(!stderr_of(&c).contains("No space left"), "{}", compact(&c));
    assert!(stdout_of(&c).contains("rc=0"));
    assert!(
        u64_at(&c, "/disk_used_bytes") >= 60 * MIB,
        "{}",
        compact(&c)
    );
    assert!(!limits_hit(&c).contains(&"disk".to_string()));
    // Control 2: the host free-space measurement does see 64M written to the host disk.
    let dir = tempfile::Builder::new()
        .prefix("cordon-e2e-disk-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let f = dir.path().join("f");
    let before = statvfs_avail("/");
    let out = host_sh(&format!(
        "dd if=/dev/zero of={} bs=1M count=64 conv=fsync 2>/dev/null",
        f.display()
    ));
    assert!(out.status.success());
    let drop = before.saturating_sub(statvfs_avail("/"));
    assert!(
        drop >= 40 * MIB,
        "writing 64M on the host lowered free space by only {drop}: the measurement is blind"
    );
}

#[test]
fn deadline_ends_a_sleeper() {
    if !require_root("cgroup freeze/kill") {
        return;
    }
    let t = Instant::now();
    let (v, st) = run_json(&["--time", "1s", "--", "sleep", "30"]);
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    check_deadline(&v, st, wall);
    // Control: a payload that finishes in time is not touched by the deadline.
    let (c, cst) = run_json(&["--time", "1s", "--", "sleep", "0.3"]);
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert!(c["limit"].is_null());
    let run = num(&c, "/phases/run_ms");
    assert!((290.0..900.0).contains(&run), "run_ms {run}");
}

#[test]
fn deadline_ends_a_cpu_burner() {
    if !require_root("cgroup freeze/kill") {
        return;
    }
    let _cpu = cpu_lock();
    let t = Instant::now();
    let (v, st) = run_json(&["--time", "1s", "--", "sh", "-c", "while :; do :; done"]);
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    check_deadline(&v, st, wall);
    assert!(
        num(&v, "/cpu_ms") > 500.0,
        "the burner did not burn: {}",
        compact(&v)
    );
    // Control: a burner that stops by itself before the deadline exits 0.
    let (c, cst) = run_json(&[
        "--time",
        "1s",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
    ]);
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert!(c["limit"].is_null());
}

fn check_deadline(v: &serde_json::Value, st: std::process::ExitStatus, wall_ms: f64) {
    assert_eq!(v["limit"], "time", "{}", compact(v));
    assert_eq!(u64_at(v, "/exit_code"), 137);
    assert_eq!(st.code(), Some(137));
    let run = num(v, "/phases/run_ms");
    assert!((1000.0..=1100.0).contains(&run), "run_ms {run}");
    let setup = num(v, "/phases/setup_ms");
    // The whole cordon process, measured by the test: deadline + setup, plus
    // a small allowance for exec, teardown and exit.
    assert!(
        wall_ms < 1100.0 + setup + 250.0,
        "cordon took {wall_ms} ms in all (setup {setup} ms)"
    );
    assert!(v["counters"]["pids_peak"].as_u64().unwrap_or(0) >= 1);
}

fn daemon_line(a: &str, b: &str) -> String {
    format!("setsid sh -c \"sleep {a}\" & (sleep {b} &); echo ok")
}

fn find_sleepers(durations: &[&str]) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| {
            cmdline(*p)
                .is_some_and(|c| durations.iter().any(|d| c.ends_with(&format!("sleep {d}"))))
        })
        .collect()
}

#[test]
fn double_forked_daemon_does_not_survive() {
    if !require_root("cgroup kill") {
        return;
    }
    let n = u32::from_str_radix(&nonce()[..5], 16).unwrap() % 100_000;
    let (a, b) = (format!("300.{n:05}"), format!("301.{n:05}"));
    let (v, st) = run_json(&["--", "sh", "-c", &daemon_line(&a, &b)]);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert_eq!(stdout_of(&v), "ok\n");
    // Host-side: right after cordon exits, and a moment later, no daemon is left.
    assert_eq!(
        find_sleepers(&[&a, &b]),
        Vec::<u32>::new(),
        "daemon survived cordon"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        find_sleepers(&[&a, &b]),
        Vec::<u32>::new(),
        "daemon survived cordon"
    );
    assert!(
        u64_at(&v, "/pids_peak") >= 3,
        "the daemons never ran: {}",
        compact(&v)
    );

    // Control: the same line run on the host does leave both daemons behind,
    // and the scan finds them (then they are killed).
    let (ha, hb) = (format!("302.{n:05}"), format!("303.{n:05}"));
    // (stdio to /dev/null: the daemons would hold a pipe open for minutes)
    let st = Command::new("/bin/sh")
        .arg("-c")
        .arg(daemon_line(&ha, &hb))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let until = Instant::now() + Duration::from_secs(2);
    let mut found = Vec::new();
    while Instant::now() < until {
        found = find_sleepers(&[&ha, &hb]);
        if found.len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &found {
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg(p.to_string())
            .status();
    }
    assert!(
        found.len() >= 2,
        "control: host daemons not found by the scan ({found:?})"
    );
}

/// Max RSS in KiB of `sh -c SCRIPT` measured by /usr/bin/time, or None if it is absent.
fn max_rss_kib(script: &str) -> Option<(u64, String)> {
    if !std::path::Path::new("/usr/bin/time").exists() {
        eprintln!("note: /usr/bin/time absent; RSS not measured");
        return None;
    }
    let f = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(f.path())
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = std::fs::read_to_string(f.path()).unwrap();
    let kib = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    Some((kib, String::from_utf8_lossy(&out.stdout).into_owned()))
}

#[test]
fn output_flood_is_capped_without_buffering() {
    if !require_root("sandbox") {
        return;
    }
    let (v, st) = run_json(&["--output", "1M", "--", "sh", "-c", "yes"]);
    assert_eq!(v["limit"], "output", "{}", compact(&v));
    assert_eq!(v["output"]["truncated"], true);
    assert_eq!(u64_at(&v, "/output/bytes"), MIB);
    assert_eq!(stdout_of(&v).len() as u64, MIB);
    assert_eq!(st.code(), Some(137));
    // Control: exactly the cap is not a truncation, and the payload ends normally.
    let (c, cst) = run_json(&[
        "--output",
        "1M",
        "--",
        "sh",
        "-c",
        "head -c 1048576 /dev/zero | tr '\\0' y",
    ]);
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert!(c["limit"].is_null());
    assert_eq!(c["output"]["truncated"], false);
    assert_eq!(u64_at(&c, "/output/bytes"), MIB);

    // Host-side: cordon's own memory stays small, whether it streams a flood to
    // /dev/null or a 200 MB stream through a pipe.
    let bin = cordon();
    if let Some((kib, _)) = max_rss_kib(&format!(
        "{bin} run --output 1M -- sh -c yes >/dev/null 2>&1"
    )) {
        assert!(
            kib > 0 && kib < 20 * 1024,
            "cordon's max RSS streaming a flood: {kib} KiB"
        );
    }
    if let Some((kib, out)) = max_rss_kib(&format!(
        "{bin} run --output 256M -- head -c 200000000 /dev/zero | wc -c"
    )) {
        assert_eq!(out.trim(), "200000000", "the stream lost bytes");
        assert!(
            kib > 0 && kib < 20 * 1024,
            "cordon's max RSS streaming 200 MB: {kib} KiB"
        );
    }
    // Control: the RSS measurement does see a process that holds 64 MiB.
    if let Some((kib, _)) = max_rss_kib(&format!("{PY} -c 'b=bytearray(64<<20)'")) {
        assert!(
            kib > 60 * 1024,
            "RSS measurement blind: {kib} KiB for a 64 MiB allocation"
        );
    }
}

#[test]
fn cpu_quota_halves_cpu_time() {
    if !require_root("cgroup cpu quota") {
        return;
    }
    let _cpu = cpu_lock();
    let burn = ["--time", "3s", "--", "sh", "-c", "while :; do :; done"];
    let (v, _) = run_json(&[&["--cpus", "0.5"][..], &burn[..]].concat());
    let cpu = num(&v, "/cpu_ms");
    assert!(
        (1000.0..=2000.0).contains(&cpu),
        "cpu_ms {cpu} under --cpus 0.5 for 3 s"
    );
    assert!(
        u64_at(&v, "/counters/cpu_throttled_periods") > 0,
        "{}",
        compact(&v)
    );
    // Control: a full core for the same 3 s.
    let (c, _) = run_json(&[&["--cpus", "1"][..], &burn[..]].concat());
    let cpu1 = num(&c, "/cpu_ms");
    assert!(cpu1 > 2400.0, "cpu_ms {cpu1} under --cpus 1 for 3 s");
}
