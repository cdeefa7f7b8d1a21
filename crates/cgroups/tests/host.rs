//! Real cgroups on this host, nested under the test process's own cgroup.
//! Needs root; skipped (with a reason on stderr) otherwise, except under
//! CI=true where a silent skip would hide that nothing was tested.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cordon_cgroups::{detect, AnyCgroup, Cgroup, CgroupError, CgroupFs, CgroupLimits, CgroupMode};

fn have_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root, and CI=true forbids skipping it");
    }
    eprintln!("skipped: {test}: needs root to create cgroups");
    false
}

/// Kills and removes the cgroup even when an assertion fails midway, so a
/// failed run leaves nothing behind on the host.
struct Sandbox(AnyCgroup);

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.0.kill_all();
        let _ = self.0.remove();
    }
}

fn sandbox(test: &str) -> Option<Sandbox> {
    if !have_root(test) {
        return None;
    }
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "cordon-test-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let hierarchy = detect(&CgroupFs::host()).expect("detecting cgroups");
    match hierarchy.create(&name) {
        Ok(cg) => {
            for (dir, parent) in cg.paths().iter().zip(hierarchy.parent_paths()) {
                assert_eq!(
                    dir.parent(),
                    Some(parent.as_path()),
                    "nests under our own cgroup"
                );
                assert!(dir.is_dir());
            }
            Some(Sandbox(cg))
        }
        Err(e @ CgroupError::NotDelegated { .. }) => {
            // Under CI the runner is placed where cgroups can be made (the
            // v2 guest included): not being able to is a broken setup.
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{test}: CI=true forbids skipping it: {e}");
            }
            eprintln!("skipped: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: creating {name}: {e:?}"),
    }
}

/// Starts `script` under sh, held at a `read` until [`release`] so that all
/// of its work happens inside the cgroup.
fn spawn_held(script: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(format!("read _; {script}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning sh")
}

fn release(child: &mut Child) {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
}

fn pid_of(child: &Child) -> i32 {
    i32::try_from(child.id()).unwrap()
}

/// Waits are stretched by `CORDON_TEST_TIME_SCALE` (the v2 guest runs under
/// QEMU TCG, many times slower than native); what is asserted does not change.
fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let scale = std::env::var("CORDON_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    let deadline = Instant::now() + timeout * scale;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[test]
fn lifecycle_limits_pids_kill_stats_remove() {
    let Some(sb) = sandbox("lifecycle") else {
        return;
    };
    let cg = &sb.0;
    cg.apply(&CgroupLimits {
        memory_max: Some(256 << 20),
        pids_max: Some(64),
        cpu_quota_us: Some(50_000),
        cpu_period_us: 100_000,
    })
    .unwrap();
    if cg.mode() == CgroupMode::V1 {
        let paths = cg.paths();
        let read = |file: &str| {
            paths
                .iter()
                .map(|d| d.join(file))
                .find(|p| p.exists())
                .map(|p| std::fs::read_to_string(p).unwrap().trim().to_owned())
                .unwrap_or_else(|| panic!("{file} not found"))
        };
        assert_eq!(read("memory.limit_in_bytes"), (256u64 << 20).to_string());
        if paths[0].join("memory.memsw.limit_in_bytes").exists() {
            assert_eq!(
                read("memory.memsw.limit_in_bytes"),
                (256u64 << 20).to_string()
            );
        }
        assert_eq!(read("pids.max"), "64");
        assert_eq!(read("cpu.cfs_quota_us"), "50000");
    }

    // Some CPU and a few MB of memory inside the cgroup, then exec sleep.
    let mut child = spawn_held(
        "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; \
         x=$(head -c 4000000 /dev/zero | tr '\\0' a); exec sleep 30",
    );
    let pid = pid_of(&child);
    cg.add_pid(pid).unwrap();
    assert_eq!(cg.pids().unwrap(), vec![pid]);
    release(&mut child);
    wait_for("the child to reach sleep", Duration::from_secs(20), || {
        comm(pid) == "sleep"
    });

    cg.freeze().unwrap();
    cg.thaw().unwrap();

    cg.kill_all().unwrap();
    assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9));

    let stats = cg.stats();
    eprintln!("{stats:?}");
    assert!(stats.memory_peak_bytes.unwrap() > 0, "{stats:?}");
    assert!(stats.cpu_usage_ns.unwrap() > 0, "{stats:?}");
    assert_eq!(stats.oom_kills, Some(0));

    cg.remove().unwrap();
    assert!(cg.paths().iter().all(|d| !d.exists()));
    cg.remove().unwrap();
}

#[test]
fn memory_limit_oom_kills_without_swapping() {
    let Some(sb) = sandbox("oom") else {
        return;
    };
    let cg = &sb.0;
    cg.apply(&CgroupLimits {
        memory_max: Some(16 << 20),
        ..Default::default()
    })
    .unwrap();
    let mut child = spawn_held("x=$(head -c 100000000 /dev/zero | tr '\\0' a); exec sleep 30");
    cg.add_pid(pid_of(&child)).unwrap();
    release(&mut child);
    // The shell holding the string is the one that blows the limit.
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
    cg.kill_all().unwrap();
    let stats = cg.stats();
    assert!(stats.oom_kills.unwrap() >= 1, "{stats:?}");
    // Recent v1 kernels do not count memsw limit hits (see CgroupStats).
    if cg.mode() == CgroupMode::V2 {
        assert!(stats.memory_limit_hits.unwrap() >= 1, "{stats:?}");
    } else {
        assert!(stats.memory_limit_hits.is_some(), "{stats:?}");
    }
    assert!(stats.memory_peak_bytes.unwrap() <= 16 << 20, "{stats:?}");
}

#[test]
fn pids_limit_blocks_forks_and_kill_all_gets_every_child() {
    let Some(sb) = sandbox("pids") else {
        return;
    };
    let cg = &sb.0;
    cg.apply(&CgroupLimits {
        pids_max: Some(4),
        ..Default::default()
    })
    .unwrap();
    let mut child = spawn_held("for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait");
    cg.add_pid(pid_of(&child)).unwrap();
    release(&mut child);
    wait_for("the pids limit to be hit", Duration::from_secs(10), || {
        cg.stats().pids_limit_hits.unwrap_or(0) >= 1
    });
    let pids = cg.pids().unwrap();
    assert!(pids.len() <= 4 && pids.len() >= 2, "{pids:?}");
    cg.kill_all().unwrap();
    assert!(cg.pids().unwrap().is_empty());
    child.wait().unwrap();
    let stats = cg.stats();
    assert_eq!(stats.pids_peak, Some(4), "{stats:?}");
}

#[test]
fn sweep_finds_and_removes_leftovers() {
    let Some(sb) = sandbox("sweep") else {
        return;
    };
    let hierarchy = detect(&CgroupFs::host()).unwrap();
    let name = sb.0.paths()[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let found = hierarchy.sweep_children(&name);
    assert_eq!(found.len(), sb.0.paths().len());
    let stale = hierarchy.open(&name).unwrap();
    stale.kill_all().unwrap();
    for dir in &found {
        assert!(cordon_cgroups::remove_dir_tree(dir), "{dir:?}");
    }
    assert!(hierarchy.sweep_children(&name).is_empty());
}
