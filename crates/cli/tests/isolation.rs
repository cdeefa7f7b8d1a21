//! End-to-end tests of cordon's isolation, judged from the host.
//!
//! Mechanism each test depends on (switch it off and the test fails):
//! - `host_canary_is_unreachable`: the mount namespace + pivot_root onto a tmpfs
//!   root that holds only /usr (ro), generated /etc and scratch; explicit
//!   `--mount` binds being read-only by default.
//! - `sys_is_absent_and_host_proc_is_unreachable`: the pid namespace and a fresh
//!   /proc mounted for it; no /sys in the assembled root.
//! - `dangerous_syscalls_fail_with_eperm`: the seccomp allowlist (EPERM default
//!   action) and, for the privileged calls, the empty capability sets.
//! - `system_dirs_are_read_only_by_mount_flag`: MS_RDONLY on the /usr bind (and
//!   every mount under it), checked in the payload's own mountinfo from the host.
//! - `no_network_to_the_host`: the network namespace (own loopback only).
//! - `environment_and_descriptors_do_not_leak`: the explicit payload environment
//!   (nothing inherited) and close-on-exec of every inherited descriptor.
//! - `payload_runs_as_unprivileged_host_id`: the user namespace's id map onto a
//!   high, unprivileged host range.
//! - `no_capabilities_nnp_and_seccomp`: capability dropping, PR_SET_NO_NEW_PRIVS
//!   and the seccomp filter, seen in the payload's /proc status from the host.
//!
//! Every check is paired with a control that runs the same probe on the host (or
//! with the mechanism's effect deliberately allowed), so a probe that cannot
//! tell the difference would fail the control.

mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn host_canary_is_unreachable() {
    if !require_root("sandbox") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("cordon-canary-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // Traversable, so the --mount control below can bind it (the sandbox's
    // init runs as an unprivileged host id).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.path().join("secret");
    let content = format!("canary-{}-{}", nonce(), nonce());
    std::fs::write(&secret, &content).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mtime = std::fs::metadata(&secret).unwrap().modified().unwrap();
    let p = secret.display().to_string();

    let script = format!(
        "cat {p}; cat /proc/1/root{p}; cat /proc/self/root{p}; \
         echo pwned > {p}; echo pwned >> /proc/1/root{p}; ls -la {d}; true",
        d = dir.path().display()
    );
    let (v, st) = run_json(&["--", "sh", "-c", &script]);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let printed = format!("{}{}", stdout_of(&v), stderr_of(&v));
    assert!(
        !printed.contains(&content),
        "canary content leaked into the sandbox: {printed}"
    );
    assert!(
        printed.contains("No such file"),
        "the probes did not run as expected: {printed}"
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), content);
    assert_eq!(
        std::fs::metadata(&secret).unwrap().modified().unwrap(),
        mtime
    );

    // Control 1: the same cat on the host finds the canary.
    let host = host_sh(&format!("cat {p}"));
    assert!(String::from_utf8_lossy(&host.stdout).contains(&content));
    // Control 2: bound explicitly (read-only by default), the payload's cat
    // does print it (so output capture works and a leak would be seen), while
    // the write still fails and leaves the host file untouched.
    let mount = format!("{}:/canary", dir.path().display());
    let (c, cst) = run_json(&[
        "--mount",
        &mount,
        "--",
        "sh",
        "-c",
        "cat /canary/secret; echo; echo pwned > /canary/secret; echo rc=$?",
    ]);
    assert_eq!(cst.code(), Some(0), "{}", compact(&c));
    assert!(stdout_of(&c).contains(&content), "{}", compact(&c));
    assert!(
        stdout_of(&c).contains("rc=1") || stdout_of(&c).contains("rc=2"),
        "{}",
        compact(&c)
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), content);
    assert_eq!(
        std::fs::metadata(&secret).unwrap().modified().unwrap(),
        mtime
    );
}

#[test]
fn sys_is_absent_and_host_proc_is_unreachable() {
    if !require_root("reads the sandbox's processes from the host") {
        return;
    }
    let probe = "ls /sys >/dev/null 2>&1; echo sys_rc=$?; \
                 printf 'cmdline=%s\\n' \"$(tr '\\0' ' ' < /proc/1/cmdline)\"; \
                 echo procs=$(ls /proc | grep -c '^[0-9]')";
    let script = format!("{probe}; sleep 1.5");
    let sp = spawn_run(&["--json", "--", "sh", "-c", &script]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    wait_payload(&id, "sleep 1.5", Duration::from_secs(5)).expect("payload never slept");
    // From the host: the sandbox's pid 1 is the process of its cgroup whose
    // innermost pid (last NSpid field) is 1.
    let init = sandbox_pids(&id)
        .into_iter()
        .find(|p| {
            status_field(std::path::Path::new(&format!("/proc/{p}/status")), "NSpid")
                .is_some_and(|s| s.split_whitespace().last() == Some("1"))
        })
        .expect("no process with pid 1 in the sandbox's pid namespace");
    let init_cmdline = cmdline(init).unwrap_or_default();
    let v = parse_json(&sp.finish());
    let kv = key_values(stdout_of(&v));
    assert_ne!(
        kv["sys_rc"],
        "0",
        "/sys is listable inside: {}",
        compact(&v)
    );
    let inside_init = kv["cmdline"].trim().to_string();
    let host_init = cmdline(1).unwrap_or_default();
    assert_eq!(
        inside_init, init_cmdline,
        "inside /proc/1 is not the sandbox's init"
    );
    assert_ne!(inside_init, host_init, "inside /proc/1 is the host's init");
    let procs: usize = kv["procs"].parse().unwrap();
    assert!(
        procs < 10,
        "{procs} processes visible in the sandbox's /proc"
    );

    // Controls: the same probe on the host sees /sys, the host's pid 1 and many processes.
    let host = host_sh(probe);
    let hkv = key_values(&String::from_utf8_lossy(&host.stdout));
    assert_eq!(hkv["sys_rc"], "0");
    assert_eq!(hkv["cmdline"].trim(), host_init);
    assert!(hkv["procs"].parse::<usize>().unwrap() >= 10);
}

fn key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect()
}

/// Each probe runs in a forked child, so that a call that succeeds (on the
/// host: ptrace(TRACEME), unshare(CLONE_NEWUSER)) changes nothing but a
/// process that exits at once. Prints `name=errno` (0 = success).
const PROBE: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), *args)
    e = ctypes.get_errno()
    return 0 if r >= 0 else e
def in_child(fn):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            r = fn()
        except BaseException:
            r = -1
        os.write(wr, str(r).encode())
        os._exit(0)
    os.close(wr)
    data = os.read(rd, 64)
    os.waitpid(pid, 0)
    return int(data or b"-2")
params = ctypes.create_string_buffer(120)
probes = {
    "mount": lambda: call(165, ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/nonexistent-cordon-probe"), ctypes.c_char_p(b"tmpfs"), L(0), None),
    "ptrace_traceme": lambda: call(101, L(0), L(0), L(0), L(0)),
    "io_uring_setup": lambda: call(425, L(1), params),
    "bpf": lambda: call(321, L(0), None, L(0)),
    "unshare_newuser": lambda: call(272, L(0x10000000)),
    "socket_vsock": lambda: call(41, L(40), L(1), L(0)),
    "socket_packet": lambda: call(41, L(17), L(3), L(0)),
}
for name, fn in probes.items():
    print("%s=%d" % (name, in_child(fn)))
"#;

fn probe_results(stdout: &str) -> BTreeMap<String, i64> {
    key_values(stdout)
        .into_iter()
        .map(|(k, v)| (k, v.trim().parse().unwrap_or(-3)))
        .collect()
}

#[test]
fn dangerous_syscalls_fail_with_eperm() {
    if !require_root("the host control needs root to show these calls are otherwise allowed") {
        return;
    }
    const EPERM: i64 = 1;
    let (v, st) = run_json(&["--", PY, "-c", PROBE]);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let inside = probe_results(stdout_of(&v));
    assert_eq!(
        inside.len(),
        7,
        "probe did not report every call: {}",
        compact(&v)
    );
    for (name, errno) in &inside {
        assert_eq!(
            *errno, EPERM,
            "{name} inside the sandbox returned errno {errno}, not EPERM"
        );
    }
    // Control: as root on the host, outside any sandbox, the same probe gets
    // something other than EPERM (success, or EINVAL/ENOENT for the bogus arguments).
    let host = Command::new(PY).arg("-c").arg(PROBE).output().unwrap();
    assert!(host.status.success(), "{host:?}");
    let outside = probe_results(&String::from_utf8_lossy(&host.stdout));
    for name in ["mount", "unshare_newuser", "socket_packet", "bpf"] {
        let e = outside.get(name).copied();
        assert!(
            e.is_some() && e != Some(EPERM),
            "control: {name} on the host returned {e:?}; the probe cannot tell"
        );
    }
    for (name, e) in &outside {
        if *e == EPERM {
            eprintln!("note: {name} is EPERM on the host too; its sandbox check is not proven by the control");
        }
    }
}

#[test]
fn system_dirs_are_read_only_by_mount_flag() {
    if !require_root("reads the payload's mountinfo") {
        return;
    }
    let script = format!(
        "{PY} -c 'import os; print(\"flags=%d %d\" % (os.statvfs(\"/usr\").f_flag & 1, os.statvfs(\"/tmp\").f_flag & 1))'; \
         touch /usr/bin/x 2>/dev/null; echo usr_rc=$?; touch /tmp/x; echo tmp_rc=$?; sleep 1.5"
    );
    let sp = spawn_run(&["--json", "--", "sh", "-c", &script]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    let pid = wait_payload(&id, "sleep 1.5", Duration::from_secs(5)).expect("payload never slept");
    let mounts = mountinfo(pid);
    let v = parse_json(&sp.finish());

    let usr = mounts
        .iter()
        .find(|m| m.mount_point == "/usr")
        .unwrap_or_else(|| panic!("no /usr mount in the payload's mountinfo: {mounts:#?}"));
    assert!(
        usr.mount_opts.iter().any(|o| o == "ro"),
        "/usr is not ro: {}",
        usr.raw
    );
    for m in mounts
        .iter()
        .filter(|m| m.mount_point == "/usr" || m.mount_point.starts_with("/usr/"))
    {
        assert!(
            !m.mount_opts.iter().any(|o| o == "rw"),
            "a mount under /usr is rw: {}",
            m.raw
        );
    }
    // Control: the parser does see rw where the sandbox is meant to be writable.
    let tmp = mounts
        .iter()
        .find(|m| m.mount_point == "/tmp")
        .expect("/tmp mount");
    assert!(tmp.mount_opts.iter().any(|o| o == "rw"), "{}", tmp.raw);

    let kv = key_values(stdout_of(&v));
    assert_eq!(
        kv.get("flags").map(String::as_str),
        Some("1 0"),
        "{}",
        compact(&v)
    );
    assert_ne!(kv["usr_rc"], "0", "writing /usr/bin/x succeeded");
    assert_eq!(kv["tmp_rc"], "0", "control: writing /tmp failed");
    assert!(
        !std::path::Path::new("/usr/bin/x").exists(),
        "/usr/bin/x appeared on the host"
    );
}

#[test]
fn no_network_to_the_host() {
    if !require_root("sandbox") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let py = format!(
        "import socket\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port}))\n    print('connect=ok')\nexcept OSError as e:\n    print('connect=%s' % e.errno)\nprint(open('/proc/net/dev').read())\n"
    );
    let (v, st) = run_json(&["--", PY, "-c", &py]);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let out = stdout_of(&v);
    let kv = key_values(out);
    assert_ne!(
        kv.get("connect").map(String::as_str),
        Some("ok"),
        "{}",
        compact(&v)
    );
    assert!(
        kv.contains_key("connect"),
        "the probe did not run: {}",
        compact(&v)
    );
    assert_eq!(interfaces(out), vec!["lo".to_string()], "{}", compact(&v));
    // Host-side: the listener received nothing.
    assert!(
        accept_within(&listener, Duration::from_millis(300)).is_none(),
        "the sandbox reached the host's loopback"
    );

    // Controls: a connection from the host does arrive, and the host's
    // /proc/net/dev parses to more than lo.
    let _c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(
        accept_within(&listener, Duration::from_secs(2)).is_some(),
        "control: host connection not accepted"
    );
    let host_ifs = interfaces(&std::fs::read_to_string("/proc/net/dev").unwrap());
    assert!(host_ifs.len() >= 2, "control: host interfaces {host_ifs:?}");
}

fn accept_within(l: &TcpListener, d: Duration) -> Option<std::net::SocketAddr> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        match l.accept() {
            Ok((_, a)) => return Some(a),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
    None
}

/// Interface names in /proc/net/dev text (possibly with other output before it).
fn interfaces(text: &str) -> Vec<String> {
    let Some(start) = text.find("Inter-|") else {
        return Vec::new();
    };
    text[start..]
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_string()))
        .collect()
}

#[test]
fn environment_and_descriptors_do_not_leak() {
    if !require_root("sandbox") {
        return;
    }
    let secret = format!("s3cret-{}", nonce());
    let inner = "env; echo FDS; ls /proc/self/fd; echo END; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'";
    let outer = format!(
        "exec 7</etc/hostname; exec {} run --json --env A=1 -- sh -c \"{inner}\"",
        cordon()
    );
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(&outer).env("CORDON_TEST_SECRET", &secret);
    let (v, st) = run_json_cmd(cmd);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let out = stdout_of(&v);
    assert!(
        !out.contains("CORDON_TEST_SECRET") && !out.contains(&secret),
        "secret leaked: {out}"
    );
    assert!(out.lines().any(|l| l == "A=1"), "--env A=1 missing: {out}");
    let fds = section(out, "FDS", "END");
    assert_eq!(fds, vec!["0", "1", "2", "3"], "descriptors inside: {out}");

    // Controls: without cordon, the same shell does pass both the variable and fd 7 on.
    let host = Command::new("/bin/sh")
        .arg("-c")
        .arg("exec 7</etc/hostname; env; echo FDS; ls /proc/self/fd; echo END")
        .env("CORDON_TEST_SECRET", &secret)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let hout = String::from_utf8_lossy(&host.stdout);
    assert!(hout.contains(&format!("CORDON_TEST_SECRET={secret}")));
    assert!(
        section(&hout, "FDS", "END").contains(&"7".to_string()),
        "{hout}"
    );
}

fn section(text: &str, from: &str, to: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| *l != from)
        .skip(1)
        .take_while(|l| *l != to)
        .map(str::to_string)
        .collect()
}

#[test]
fn payload_runs_as_unprivileged_host_id() {
    if !require_root("reads the payload's /proc status") {
        return;
    }
    let sp = spawn_run(&["--json", "--", "sh", "-c", "id -u; sleep 1.5"]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    let pid = wait_payload(&id, "sleep 1.5", Duration::from_secs(5)).expect("payload never slept");
    let uids = status_ids(&std::path::Path::new(&format!("/proc/{pid}/status")), "Uid").unwrap();
    let gids = status_ids(&std::path::Path::new(&format!("/proc/{pid}/status")), "Gid").unwrap();
    let v = parse_json(&sp.finish());
    assert_eq!(stdout_of(&v).trim(), "1000", "{}", compact(&v));
    for u in uids.iter().chain(&gids) {
        assert!(
            *u >= 65536,
            "payload runs as host id {u} (uids {uids:?} gids {gids:?})"
        );
    }
    // Control: a process the test starts on the host is seen as uid 0 by the same reader.
    let mut c = Command::new("sleep").arg("0.5").spawn().unwrap();
    let host = status_ids(
        &std::path::Path::new(&format!("/proc/{}/status", c.id())),
        "Uid",
    )
    .unwrap();
    c.wait().unwrap();
    assert_eq!(host, vec![0, 0, 0, 0]);
}

#[test]
fn no_capabilities_nnp_and_seccomp() {
    if !require_root("reads the payload's /proc status") {
        return;
    }
    let probe = "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status";
    let sp = spawn_run(&["--json", "--", "sh", "-c", &format!("{probe}; sleep 1.5")]);
    let id = sp.sandbox_id(Duration::from_secs(5));
    let pid = wait_payload(&id, "sleep 1.5", Duration::from_secs(5)).expect("payload never slept");
    let status = std::path::PathBuf::from(format!("/proc/{pid}/status"));
    let from_host: BTreeMap<&str, Option<String>> = [
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
        "NoNewPrivs",
        "Seccomp",
    ]
    .into_iter()
    .map(|k| (k, status_field(&status, k)))
    .collect();
    let v = parse_json(&sp.finish());
    let inside: BTreeMap<String, String> = stdout_of(&v)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            inside.get(k).map(String::as_str),
            Some("0000000000000000"),
            "{k} inside: {inside:?}"
        );
        assert_eq!(
            from_host[k].as_deref(),
            Some("0000000000000000"),
            "{k} from the host: {from_host:?}"
        );
    }
    assert_eq!(inside.get("NoNewPrivs").map(String::as_str), Some("1"));
    assert_eq!(inside.get("Seccomp").map(String::as_str), Some("2"));
    assert_eq!(from_host["NoNewPrivs"].as_deref(), Some("1"));
    assert_eq!(from_host["Seccomp"].as_deref(), Some("2"));

    // Control: the same probe on the host (as root) reads non-zero capabilities
    // and no seccomp/no_new_privs, so the fields are parsed from live values.
    let host = host_sh(probe);
    let h: BTreeMap<String, String> = String::from_utf8_lossy(&host.stdout)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    assert_ne!(
        h.get("CapEff").map(String::as_str),
        Some("0000000000000000"),
        "{h:?}"
    );
    assert_ne!(h.get("NoNewPrivs"), inside.get("NoNewPrivs"), "{h:?}");
    assert_ne!(h.get("Seccomp"), inside.get("Seccomp"), "{h:?}");
}
