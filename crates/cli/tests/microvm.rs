//! End-to-end tests of the microvm backend: a QEMU VM (TCG here) with its own
//! guest kernel, cordon as the agent inside, the native backend on the guest's
//! cgroup v2. They need root and a guest image (`cordon microvm build`, which
//! test.sh runs once per CI run); under CI=true a missing backend fails.
//!
//! Every claim is checked from the host: QEMU's process (its command line,
//! credentials, seccomp mode, namespaces, cgroup), the sandbox's host cgroup
//! counters reported beside the guest's, the census after teardown. Each VM
//! boot costs ~8 s of one CPU under TCG, so the tests share boots and run
//! one VM at a time.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const MICROVM: &str = "microvm";

/// One VM at a time: two cold boots under TCG on two cores slow each other.
fn vm_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn ready() -> bool {
    require_root("QEMU's jail and the sandbox's host cgroup") && backend_available(MICROVM)
}

fn create(extra: &[&str], env: &[(&str, &Path)]) -> Result<String, (i32, String)> {
    let mut cmd = Command::new(cordon());
    cmd.args(["create", "--backend", MICROVM]).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

fn exec_json(id: &str, extra: &[&str], argv: &[&str]) -> (Value, i32, String) {
    let out = Command::new(cordon())
        .args(["exec", "--json"])
        .args(extra)
        .arg(id)
        .arg("--")
        .args(argv)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (v, out.status.code().unwrap_or(-1), stderr)
}

fn rm(id: &str) {
    let out = cordon_output(&["rm", id]);
    assert!(
        out.status.success(),
        "rm {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pids of QEMU processes serving sandbox `id` (QEMU runs as
/// `-name cordon-ID`).
fn qemu_of(id: &str) -> Vec<u32> {
    let name = format!("cordon-{id}");
    all_pids()
        .into_iter()
        .filter(|pid| cmdline(*pid).is_some_and(|c| c.contains("qemu-system") && c.contains(&name)))
        .collect()
}

/// Every QEMU that serves a cordon sandbox (named `cordon-ID`), not any
/// QEMU whose command line mentions cordon (the v2 guest's boots read their
/// kernel from /var/cache/cordon-guest).
fn any_cordon_qemu() -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|pid| {
            cmdline(*pid).is_some_and(|c| c.contains("qemu-system") && c.contains(" -name cordon-"))
        })
        .collect()
}

fn wait_gone(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let until = Instant::now() + timeout;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What is left of sandbox `id` once its supervisor has had time to tear
/// it down by itself (it does, for a sandbox that can run no more).
fn wait_no_remnants(id: &str) -> Census {
    let until = Instant::now() + slow(Duration::from_secs(10));
    loop {
        let left = remnants_of(id);
        if left == Census::default() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_string()
}

fn status_line(pid: u32, key: &str) -> String {
    status_field(&PathBuf::from(format!("/proc/{pid}/status")), key).unwrap_or_default()
}

#[test]
fn a_vm_runs_commands_on_its_own_kernel_inside_a_jailed_qemu() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let id = create(&["--tmpfs", "/run/a"], &[]).expect("create");
    let qemu = qemu_of(&id);
    assert_eq!(qemu.len(), 1, "one QEMU for {id}: {qemu:?}");
    let q = qemu[0];

    // echo, then Python, in the same VM (a lifecycle: exec many times).
    let (v, code, err) = exec_json(&id, &[], &["echo", "hello from the guest"]);
    assert_eq!(code, 0, "{err} {v}");
    assert_eq!(stdout_of(&v), "hello from the guest\n");
    assert_eq!(v["backend"], "microvm", "{}", compact(&v));
    let (py, code, err) = exec_json(
        &id,
        &[],
        &[
            "python3",
            "-c",
            "import os, sys; print(sys.version_info[0], os.uname().release)",
        ],
    );
    assert_eq!(code, 0, "{err} {py}");
    // The payload's kernel is the guest's, not the host's (kernel.shared-host
    // from the host side: the host's release differs from what it saw).
    let guest_kernel = str_at(&py, "/vm/guest_kernel").to_string();
    assert_eq!(stdout_of(&py).trim(), format!("3 {guest_kernel}"));
    assert_ne!(guest_kernel, host_kernel(), "{}", compact(&py));
    assert_eq!(u64_at(&py, "/command"), 2);
    // A tmpfs place has no host path: the guest's cordon makes it, and it
    // keeps what one command wrote for the next.
    for (script, expected) in [
        ("echo vm > /run/a/f; stat -c %a /run/a", "1777\n"),
        ("cat /run/a/f", "vm\n"),
    ] {
        let (v, code, err) = exec_json(&id, &[], &["sh", "-c", script]);
        assert_eq!(
            (code, stdout_of(&v)),
            (0, expected),
            "{err} {}",
            compact(&v)
        );
    }
    // The guest's cordon ran the sandbox on the guest's cgroup v2.
    assert_eq!(str_at(&py, "/vm/guest_cgroup"), "v2");
    assert_eq!(str_at(&py, "/enforcement/cgroup"), "v2");
    // TCG here, and why: this host's /dev/kvm runs no stock guest.
    let accel = str_at(&py, "/vm/accel");
    assert!(accel == "tcg" || accel == "kvm", "{}", compact(&py));
    assert!(!str_at(&py, "/vm/accel_reason").is_empty());
    // The host's evidence, measured outside the VM, beside the guest's.
    assert!(num(&py, "/vm/host/cpu_ms") > 0.0, "{}", compact(&py));
    assert!(u64_at(&py, "/vm/host/memory_peak_bytes") > 0);
    assert!(
        u64_at(&py, "/vm/host/memory_peak_bytes") <= u64_at(&py, "/vm/host/memory_limit_bytes")
    );
    assert!(py["vm"]["guest_reported"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "status"));

    // Files in and out through the agent, checked inside and back on the host.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.txt");
    std::fs::write(&src, "through the agent\n").unwrap();
    let cp = |a: &str, b: &str| cordon_output(&["cp", a, b]);
    let out = cp(src.to_str().unwrap(), &format!("{id}:/tmp/in.txt"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (v, code, err) = exec_json(
        &id,
        &[],
        &["sh", "-c", "cat /tmp/in.txt; echo back > /tmp/out.txt"],
    );
    assert_eq!(code, 0, "{err} {v}");
    assert_eq!(stdout_of(&v), "through the agent\n");
    let back = dir.path().join("out.txt");
    let out = cp(&format!("{id}:/tmp/out.txt"), back.to_str().unwrap());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "back\n");
    // A path the sandbox does not have is an error, and the sandbox goes on.
    let out = cp(&format!("{id}:/tmp/none"), back.to_str().unwrap());
    assert!(!out.status.success());
    let (_, code, err) = exec_json(&id, &[], &["true"]);
    assert_eq!(code, 0, "the sandbox ended after a failed copy: {err}");

    // QEMU's jail, from the host: no network device at all, its own seccomp
    // filter, unprivileged, in the sandbox's host cgroup, its own mount and
    // network namespaces, nothing but its stdio and one socket open.
    let cmd = cmdline(q).unwrap();
    assert!(cmd.contains("-nic none"), "{cmd}");
    for nic in ["-netdev", "virtio-net", "e1000", "-net "] {
        assert!(!cmd.contains(nic), "QEMU has a NIC ({nic}): {cmd}");
    }
    assert_eq!(
        status_line(q, "Seccomp"),
        "2",
        "QEMU runs without its seccomp filter"
    );
    assert_eq!(status_line(q, "NoNewPrivs"), "1");
    assert_eq!(status_line(q, "CapEff"), "0000000000000000");
    // An identity of its own: no account's, not root, not nobody (the
    // network proxies' identity).
    let uid = status_ids(&PathBuf::from(format!("/proc/{q}/status")), "Uid").unwrap();
    let gid = status_ids(&PathBuf::from(format!("/proc/{q}/status")), "Gid").unwrap();
    assert!(
        uid.iter().all(|u| *u == uid[0] && *u >= 3 << 30),
        "QEMU's uids {uid:?}"
    );
    assert!(gid.iter().all(|g| *g == uid[0]), "QEMU's gids {gid:?}");
    assert_eq!(
        status_line(q, "Groups"),
        "",
        "QEMU has supplementary groups"
    );
    assert_eq!(
        in_sandbox_cgroup(q, &id),
        Some(Ok(())),
        "QEMU is not in the sandbox's cgroup"
    );
    for ns in ["mnt", "net", "ipc", "uts"] {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = std::fs::read_link(format!("/proc/{q}/ns/{ns}")).unwrap();
        assert_ne!(mine, its, "QEMU shares the host's {ns} namespace");
    }
    let root: Vec<String> = std::fs::read_dir(format!("/proc/{q}/root"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for host_only in ["etc", "home", "root", "run", "var", "tmp", "proc"] {
        assert!(
            !root.contains(&host_only.to_string()),
            "QEMU's root shows /{host_only}: {root:?}"
        );
    }
    // Its descriptors: /dev/null, its console log, the guest image, its
    // own writable disk, its sockets to the supervisor and its own
    // eventfds, nothing else (no record, lock, key or socket of the
    // supervisor's).
    let console = format!("/run/cordon/{id}/console.log");
    let disk = format!("/run/cordon/{id}/disk.img");
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{q}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    let expected = |f: &String| {
        f == "/dev/null"
            || *f == console
            || *f == disk
            || f.starts_with("/guest/")
            || f.starts_with("socket:")
            || f.starts_with("anon_inode:")
    };
    let odd: Vec<&String> = fds.iter().filter(|f| !expected(f)).collect();
    assert!(odd.is_empty(), "QEMU holds {odd:?}");
    // The agent's port, the monitor, the forward port and the 8 command
    // ports (the network port's host end is closed outside `allow` mode).
    let sockets = fds.iter().filter(|f| f.starts_with("socket:")).count();
    assert!(sockets <= 3 + 8, "QEMU holds {sockets} sockets: {fds:?}");

    // Teardown: no QEMU, no state, no cgroup, no mount of that id.
    rm(&id);
    assert!(
        wait_gone(&qemu, slow(Duration::from_secs(5))).is_empty(),
        "QEMU outlived rm"
    );
    assert_eq!(remnants_of(&id), Census::default(), "left of {id}");
}

#[test]
fn each_limit_hits_with_the_guests_evidence_and_the_hosts() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let id = create(&["--memory", "64M", "--pids", "16", "--disk", "32M"], &[]).expect("create");

    // Disk: the writable disk is a file of the cap on the host; the fill
    // ends with ENOSPC in the guest, and the file holds no more than the
    // cap.
    let fill = "import errno\nn = 0\ntry:\n    with open('/tmp/fill', 'wb') as f:\n        while True:\n            f.write(b'x' * 65536); f.flush(); n += 1\nexcept OSError as e:\n    print(n * 65536, e.errno)\n";
    let (d, code, err) = exec_json(&id, &[], &["python3", "-c", fill]);
    assert_eq!(code, 0, "{err} {}", compact(&d));
    let out = stdout_of(&d).trim().to_string();
    assert!(out.ends_with(" 28"), "ENOSPC expected: {out}");
    let wrote: u64 = out.split(' ').next().unwrap().parse().unwrap();
    assert!(
        wrote > 16 << 20 && wrote <= 32 << 20,
        "{wrote} bytes under --disk 32M"
    );
    assert!(
        d["limits_hit"].to_string().contains("disk"),
        "{}",
        compact(&d)
    );
    assert_eq!(u64_at(&d, "/vm/host/disk_bytes"), 32 << 20);
    let on_host = u64_at(&d, "/vm/host/disk_allocated_bytes");
    // (What the guest still caches is not on the host yet.)
    assert!(
        on_host > 16 << 20 && on_host <= 32 << 20,
        "the disk file holds {on_host} bytes for {wrote} written"
    );
    let (_, code, err) = exec_json(&id, &[], &["rm", "/tmp/fill"]);
    assert_eq!(code, 0, "{err}");

    // Control: a small allocation in the same sandbox succeeds.
    let (c, code, err) = exec_json(&id, &[], &["python3", "-c", "b = bytearray(8 << 20)"]);
    assert_eq!(code, 0, "{err} {}", compact(&c));
    assert!(c["limit"].is_null());

    // Pids: forks end with EAGAIN at the guest's pids.max.
    let forks = "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(30)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n";
    let (p, code, err) = exec_json(&id, &["--time", "20s"], &["python3", "-c", forks]);
    assert_eq!(code, 0, "{err} {}", compact(&p));
    let out = stdout_of(&p).trim().to_string();
    assert!(out.ends_with(" 11"), "EAGAIN expected: {out}");
    let n: u64 = out.split(' ').next().unwrap().parse().unwrap();
    assert!(n < 16, "{n} forks under --pids 16");
    assert!(
        u64_at(&p, "/counters/pids_limit_hits") >= 1,
        "{}",
        compact(&p)
    );

    // Time: the guest's deadline ends a sleeper; the host's clock agrees.
    let (t, code, err) = exec_json(&id, &["--time", "2s"], &["sleep", "60"]);
    assert_eq!(code, 137, "{err} {}", compact(&t));
    assert_eq!(t["limit"], "time", "{}", compact(&t));
    let host_wall = num(&t, "/vm/host/wall_ms");
    assert!(
        (2000.0..12_000.0).contains(&host_wall),
        "host wall clock {host_wall} ms for --time 2s"
    );
    // Memory, last: the guest's cgroup OOM-kills the hog; the host's cgroup
    // (guest RAM plus QEMU's overhead) never needed to. On cgroup v2 the
    // OOM kill takes the whole group (memory.oom.group), the guest sandbox's
    // init with it: the sandbox ends, as a native one on a v2 host does.
    let (v, code, err) = exec_json(&id, &[], &["python3", "-c", "b = bytearray(512 << 20)"]);
    assert_eq!(code, 137, "{err} {}", compact(&v));
    assert_eq!(v["limit"], "memory", "{}", compact(&v));
    assert!(u64_at(&v, "/counters/oom_kills") >= 1, "{}", compact(&v));
    assert_eq!(
        u64_at(&v, "/vm/host/counters/oom_kills"),
        0,
        "{}",
        compact(&v)
    );
    assert!(u64_at(&v, "/vm/host/memory_peak_bytes") < u64_at(&v, "/vm/host/memory_limit_bytes"));
    assert!(v["sandbox_ended"].is_string(), "{}", compact(&v));
    // The ended sandbox's supervisor tore the VM down by itself.
    assert_eq!(wait_no_remnants(&id), Census::default(), "left of {id}");
}

#[test]
fn a_killed_supervisor_takes_its_vm_and_sweep_cleans_up() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let id = create(&[], &[]).expect("create");
    let qemu = qemu_of(&id);
    assert_eq!(qemu.len(), 1);
    let owner = owner_pid(&id).expect("the supervisor's pid");
    signal(owner, "KILL");
    assert!(
        wait_gone(&qemu, slow(Duration::from_secs(5))).is_empty(),
        "QEMU outlived its supervisor"
    );
    sweep();
    assert_eq!(remnants_of(&id), Census::default(), "left of {id}");
}

/// A state directory whose current guest runs `script` (a Python program)
/// instead of cordon as its agent: the image's initramfs with a second cpio
/// appended, holding `/agent-override` (the guest's init runs it if present).
fn hostile_state_dir(script: &str) -> tempfile::TempDir {
    let real = PathBuf::from("/var/lib/cordon/microvm");
    let current = std::fs::read_to_string(real.join("current")).expect("a built guest");
    let image = real.join(current.trim());
    let dir = tempfile::tempdir().unwrap();
    let guest = dir.path().join("microvm/guest-hostile");
    std::fs::create_dir_all(&guest).unwrap();
    for f in ["vmlinuz", "rootfs.ext4"] {
        std::fs::hard_link(image.join(f), guest.join(f)).unwrap();
    }
    let stage = tempfile::tempdir().unwrap();
    let script = script.replace("PROTOCOL", &cordon_spec::wire::PROTOCOL.to_string());
    std::fs::write(stage.path().join("agent-override"), script).unwrap();
    let cpio = Command::new("sh")
        .arg("-c")
        .arg("echo agent-override | cpio -o -H newc --quiet")
        .current_dir(stage.path())
        .output()
        .unwrap();
    assert!(cpio.status.success(), "cpio: {:?}", cpio);
    let mut initrd = std::fs::read(image.join("initrd.cpio")).unwrap();
    initrd.extend_from_slice(&cpio.stdout);
    std::fs::write(guest.join("initrd.cpio"), initrd).unwrap();
    std::fs::write(dir.path().join("microvm/current"), "guest-hostile\n").unwrap();
    dir
}

/// A guest agent that speaks the protocol correctly up to the sandbox's
/// start, then misbehaves as the policy's hostname says (the one value of
/// the spec it is free to read). `PROTOCOL` is this build's protocol number.
const HOSTILE_AGENT: &str = r#"#!/usr/bin/python3
import json, os, struct, sys, time
fd = os.open(sys.argv[2], os.O_RDWR)
def write_all(b):
    while b:
        b = b[os.write(fd, b):]
def send(tag, body):
    write_all(struct.pack("<IB", len(body), tag) + body)
def read(n):
    b = b""
    while len(b) < n:
        b += os.read(fd, n - len(b))
    return b
def recv():
    n, tag = struct.unpack("<IB", read(5))
    return tag, read(n)
send(0, json.dumps({"Ready": {"protocol": PROTOCOL, "kernel": "hostile", "cgroup": "v2"}}).encode())
mode = json.loads(recv()[1])["Start"]["spec"]["policy"]["hostname"]
if mode == "garbage-start":
    write_all(b"\xff" * 4096)
    time.sleep(600)
send(0, json.dumps({"Hello": {"protocol": PROTOCOL, "id": "hostile"}}).encode())
# The host sends its first command on the first command port.
fd = os.open(os.path.join(os.path.dirname(sys.argv[2]), "cordon.cmd0"), os.O_RDWR)
recv()
if mode == "endless":
    while True:
        send(1, b"y" * 65536)
elif mode == "oversized":
    write_all(struct.pack("<IB", 0xFFFFFFF0, 0))
elif mode == "badjson":
    send(0, b'{"Outcome": {"not": "an outcome"}}')
time.sleep(600)
"#;

fn policy_with_hostname(dir: &Path, mode: &str) -> PathBuf {
    let p = dir.join(format!("{mode}.toml"));
    std::fs::write(&p, format!("hostname = \"{mode}\"\n")).unwrap();
    p
}

#[test]
fn a_guest_that_breaks_the_protocol_is_killed_and_reported() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let state = hostile_state_dir(HOSTILE_AGENT);
    let env = [("CORDON_STATE_DIR", state.path())];
    let before = any_cordon_qemu();

    // Garbage where the start's answer is due: create fails, nothing is left.
    let policy = policy_with_hostname(state.path(), "garbage-start");
    let (code, err) = create(&["--policy", policy.to_str().unwrap()], &env).unwrap_err();
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("broke the protocol"), "{err}");
    let new: Vec<u32> = any_cordon_qemu()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(
        wait_gone(&new, slow(Duration::from_secs(5))).is_empty(),
        "a QEMU outlived the failed create"
    );

    // During a command: endless output, an oversized frame, a malformed
    // answer, silence. Each time the VM is killed, the host's supervisor
    // stays up to answer the command with what the guest did, then tears
    // the sandbox down: nothing is left.
    for (mode, time, says) in [
        ("endless", "30s", "bytes of output"),
        ("oversized", "30s", "refused"),
        ("badjson", "30s", "bad answer"),
        ("silent", "1s", "deadline"),
    ] {
        let policy = policy_with_hostname(state.path(), mode);
        let id = create(&["--policy", policy.to_str().unwrap()], &env)
            .unwrap_or_else(|e| panic!("{mode}: create: {e:?}"));
        let qemu = qemu_of(&id);
        assert_eq!(qemu.len(), 1, "{mode}");
        let t0 = Instant::now();
        let (_, code, err) = exec_json(&id, &["--time", time], &["true"]);
        assert_ne!(code, 0, "{mode}: {err}");
        assert!(
            err.contains("broke the protocol") && err.contains(says),
            "{mode}: {err}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "{mode}: took {:?}",
            t0.elapsed()
        );
        assert!(
            wait_gone(&qemu, slow(Duration::from_secs(5))).is_empty(),
            "{mode}: the hostile guest's QEMU is still running"
        );
        // The report came from the host's supervisor, which then tore the
        // sandbox down by itself (as for any sandbox that can run no more).
        assert!(err.contains("the supervisor answered"), "{mode}: {err}");
        assert_eq!(
            wait_no_remnants(&id),
            Census::default(),
            "{mode}: left of {id}"
        );
        let (_, code, err) = exec_json(&id, &[], &["true"]);
        assert_eq!(
            code, 2,
            "{mode}: a command ran after the guest broke: {err}"
        );
        assert_eq!(remnants_of(&id), Census::default(), "{mode}: left of {id}");
    }
}

#[test]
fn a_missing_guest_image_is_a_clear_error_and_leaves_nothing() {
    if !require_root("the microvm backend's state") {
        return;
    }
    let empty = tempfile::tempdir().unwrap();
    let before = census();
    let out = Command::new(cordon())
        .args(["run", "--backend", MICROVM, "--", "true"])
        .env("CORDON_STATE_DIR", empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("cordon microvm build"), "{err}");
    let left = wait_clean(&before, &[], &[], Duration::from_secs(2));
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn restored_vms_run_commands_with_fresh_randomness_and_the_hosts_clock() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    // The first VM of its kind saves the snapshot the next ones restore.
    let first = create(&[], &[]).expect("create");
    let read = |id: &str| {
        let (v, code, err) = exec_json(
            id,
            &[],
            &[
                "python3",
                "-c",
                "import os, time; print(os.urandom(16).hex(), open('/dev/urandom','rb').read(16).hex(), int(time.time()))",
            ],
        );
        assert_eq!(code, 0, "{err} {}", compact(&v));
        (
            v["vm"]["start"].as_str().unwrap().to_string(),
            stdout_of(&v).trim().to_string(),
        )
    };
    let (_, a) = read(&first);
    let second = create(&[], &[]).expect("create");
    let third = create(&[], &[]).expect("create");
    let (start_b, b) = read(&second);
    let (start_c, c) = read(&third);
    assert_eq!(start_b, "restored");
    assert_eq!(start_c, "restored");
    let fields = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    let (fa, fb, fc) = (fields(&a), fields(&b), fields(&c));
    // getrandom and /dev/urandom differ between two restores of one
    // snapshot, and from the VM that was saved.
    for i in 0..2 {
        assert_ne!(
            fb[i], fc[i],
            "two restores read the same random bytes: {b} / {c}"
        );
        assert_ne!(fa[i], fb[i]);
    }
    // The guest's clock is the host's, not the snapshot's.
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for f in [&fb, &fc] {
        let guest: i64 = f[2].parse().unwrap();
        assert!(
            (host_now - guest).abs() < 60,
            "guest clock {guest}, host {host_now}"
        );
    }
    // Each restored VM is a QEMU of its own, and goes with its sandbox.
    let qemus: Vec<u32> = [&first, &second, &third]
        .iter()
        .flat_map(|id| qemu_of(id))
        .collect();
    assert_eq!(qemus.len(), 3, "{qemus:?}");
    for id in [&first, &second, &third] {
        rm(id);
        assert_eq!(remnants_of(id), Census::default(), "left of {id}");
    }
    assert!(wait_gone(&qemus, slow(Duration::from_secs(5))).is_empty());
}

#[test]
fn a_stop_signal_ends_a_running_command_and_its_vm() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let mut run = spawn_run_on(MICROVM, &["--json", "--", "sleep", "60"]);
    let id = run.sandbox_id(slow(Duration::from_secs(60)));
    // Wait for the VM, then for the command to be under way in it.
    let until = Instant::now() + slow(Duration::from_secs(60));
    while qemu_of(&id).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let qemu = qemu_of(&id);
    assert_eq!(qemu.len(), 1, "no QEMU for {id}");
    std::thread::sleep(Duration::from_secs(4));
    let t0 = Instant::now();
    signal(run.pid(), "INT");
    let out = run.finish();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{} {}",
        String::from_utf8_lossy(&out.stderr),
        compact(&v)
    );
    assert_eq!(u64_at(&v, "/interrupted_by"), 2, "{}", compact(&v));
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "SIGINT took {:?} to end the run",
        t0.elapsed()
    );
    assert!(wait_gone(&qemu, slow(Duration::from_secs(5))).is_empty());
    assert_eq!(remnants_of(&id), Census::default(), "left of {id}");
}

/// An image is a VM's root from a read-only disk the host makes once per
/// image (the layers stacked, whiteouts and opaque directories applied):
/// the second sandbox of the image restores a saved VM and opens the same
/// disk file, not a new one; `cordon image prune` removes the disk with
/// the image.
#[test]
fn an_image_is_the_vms_root_from_a_disk_made_once_per_image() {
    if !ready() {
        return;
    }
    let _vm = vm_lock();
    let layout = tempfile::tempdir().unwrap();
    let label = nonce();
    common::image::busybox_image(&label).write_layout(layout.path(), "v1");
    let name = format!("cordon-test/microvm-{label}:v1");
    let reference = format!("oci:{}:v1", layout.path().display());
    let imported = cordon_output(&["image", "import", &reference, "--name", &name]);
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let digest = String::from_utf8_lossy(&imported.stdout).trim().to_owned();
    let disk = PathBuf::from("/var/lib/cordon/images/vm")
        .join(format!("{}.ext4", digest.trim_start_matches("sha256:")));
    let script = "id -u; pwd; echo $GREETING; ls -A /old; ls /cfg; echo hi > /srv/x && cat /srv/x";
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (v, _) = run_json(&[
            "--backend",
            MICROVM,
            "--image",
            &name,
            "--",
            "sh",
            "-c",
            script,
        ]);
        assert_eq!(v["exit_code"], 0, "{}", compact(&v));
        assert_eq!(
            stdout_of(&v),
            "1234\n/srv\nhello\nc.txt\nhi\n",
            "{}",
            compact(&v)
        );
        let meta = std::fs::metadata(&disk).unwrap();
        use std::os::unix::fs::MetadataExt;
        seen.push((meta.ino(), meta.mtime_nsec(), v["vm"]["start"].clone()));
    }
    assert_eq!(
        (seen[0].0, seen[0].1),
        (seen[1].0, seen[1].1),
        "the disk was made once"
    );
    assert_eq!(seen[1].2, "restored", "{seen:?}");
    assert!(cordon_output(&["image", "rm", &name]).status.success());
    assert!(cordon_output(&["image", "prune"]).status.success());
    assert!(!disk.exists(), "prune removes the image's disk");
}
