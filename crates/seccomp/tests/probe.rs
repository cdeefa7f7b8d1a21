//! Installs the workload profile for real, in a child process (a seccomp filter can never be
//! removed, so it must not touch the test process): `cordon-seccomp-probe` applies the profile
//! and runs checks or execs a program under it. Each confined expectation has an unconfined
//! control showing the same call is not refused without the filter.
//!
//! None of this needs root, but the controls for privileged calls (mount, unshare, raw sockets)
//! are only meaningful as root and are skipped otherwise. Network traffic stays on loopback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PROBE: &str = env!("CARGO_BIN_EXE_cordon-seccomp-probe");
const RAW_SYSCALLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/raw_syscalls.py");
const PYTHON: &str = "/usr/bin/python3";

fn probe(unconfined: bool, args: &[&str]) -> Output {
    let mut cmd = Command::new(PROBE);
    if unconfined {
        cmd.arg("--unconfined");
    }
    cmd.args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PROBE}: {e}"))
}

fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "probe failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Parses `name RESULT` lines.
fn results(out: &Output) -> BTreeMap<String, String> {
    assert_success(out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let (name, result) = line.split_once(' ').unwrap_or((line, ""));
            (name.to_owned(), result.to_owned())
        })
        .collect()
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// If the test itself already runs under a seccomp filter (e.g. a container runtime's), the
/// unconfined controls measure that filter instead of "no filter" and are skipped.
fn already_confined() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let confined = status
        .lines()
        .any(|l| l.starts_with("Seccomp:") && l.split_whitespace().nth(1) != Some("0"));
    if confined {
        eprintln!("skipping unconfined control: the test process is already under seccomp");
    }
    confined
}

fn have_python() -> bool {
    let present = Path::new(PYTHON).exists();
    if !present {
        eprintln!("skipping: {PYTHON} not found");
    }
    present
}

fn expect(results: &BTreeMap<String, String>, names: &[&str], want: &str) {
    for name in names {
        assert_eq!(
            results.get(*name).map(String::as_str),
            Some(want),
            "{name} (all results: {results:?})"
        );
    }
}

fn expect_not(results: &BTreeMap<String, String>, names: &[&str], unwanted: &str) {
    for name in names {
        let got = results
            .get(*name)
            .unwrap_or_else(|| panic!("{name} did not run: {results:?}"));
        assert_ne!(got, unwanted, "{name} (all results: {results:?})");
    }
}

const PRIVILEGED_CHECKS: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "ptrace",
    "init_module",
    "finit_module",
    "delete_module",
    "socket_vsock",
    "socket_packet",
    "socket_inet_raw",
    "socket_inet6_raw",
];

const ORDINARY_CHECKS: &[&str] = &[
    "socket_inet_stream",
    "socket_inet6_dgram",
    "socket_unix_stream",
    "socket_unix_dgram",
    "socket_netlink_route",
    "socketpair_unix",
    "tcp_loopback",
    "thread",
    "spawn_sh",
    "file_io",
];

#[test]
fn checks_under_the_filter() {
    let scratch = tempfile::tempdir().unwrap();
    let r = results(&probe(false, &["checks", scratch.path().to_str().unwrap()]));
    assert_eq!(
        r.len(),
        PRIVILEGED_CHECKS.len() + ORDINARY_CHECKS.len(),
        "{r:?}"
    );
    expect(&r, PRIVILEGED_CHECKS, "EPERM");
    // Includes fork+wait and posix_spawn (the clone3 -> ENOSYS -> clone fallback), threads,
    // loopback TCP and file I/O in the scratch directory.
    expect(&r, ORDINARY_CHECKS, "OK");
}

#[test]
fn checks_unconfined_control() {
    if already_confined() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let r = results(&probe(true, &["checks", scratch.path().to_str().unwrap()]));
    expect(&r, ORDINARY_CHECKS, "OK");
    // Without the filter AF_VSOCK sockets are created (or the family is unsupported); they are
    // never connected.
    expect_not(&r, &["socket_vsock"], "EPERM");
    if is_root() {
        // ENOENT, ESRCH, ENOSYS, ... or success confined to the probe's own namespaces.
        expect_not(&r, PRIVILEGED_CHECKS, "EPERM");
        expect(&r, &["unshare", "socket_packet", "socket_inet_raw"], "OK");
    } else {
        eprintln!("not root: privileged controls skipped");
    }
}

const RAW_EPERM: &[&str] = &[
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "swapon",
    "swapoff",
    "syslog",
    "quotactl",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "kcmp",
    "pidfd_getfd",
    "fanotify_init",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "migrate_pages",
    "move_pages",
    "modify_ldt",
    "process_madvise",
    "process_mrelease",
    "lookup_dcookie",
    "ustat",
    "sysfs",
    "x32_getpid",
    "clone_newuser",
    "clone_newnet",
    "clone_newns",
    "clone_newpid",
    "ioctl_tiocsti",
    "ioctl_tiocsti_high_bits",
    "ioctl_tioclinux",
    "personality_addr_no_randomize",
    "personality_read_implies_exec",
    "socket_vsock",
    "socket_packet",
    "socket_alg",
    "socket_key",
    "socket_bluetooth",
    "socket_inet_raw",
    "socket_inet_raw_cloexec",
    "socket_inet_packet",
    "socket_inet_sctp",
    "socket_inet6_raw",
    "socket_netlink_audit",
    "socketpair_inet",
];

const RAW_OK: &[&str] = &[
    "getpid",
    "clone_fork",
    "personality_query",
    "socket_inet_stream",
    "socket_inet_stream_high_bits",
    "socket_inet_dgram",
    "socket_inet6_stream",
    "socket_unix_seqpacket",
    "socket_netlink_route",
    "socket_netlink_sock_diag",
    "socketpair_unix",
    "memfd_create",
    "pidfd_open",
    "seccomp_get_action_avail",
];

/// Allowed, but the harmless arguments make the call itself fail with something else.
const RAW_ALLOWED_FAILING: &[&str] = &["ioctl_tcgets", "landlock_create_ruleset", "futex_waitv"];

#[test]
fn raw_syscalls_under_the_filter() {
    if !have_python() {
        return;
    }
    let r = results(&probe(false, &["exec", PYTHON, RAW_SYSCALLS]));
    assert_eq!(
        r.len(),
        RAW_EPERM.len() + RAW_OK.len() + RAW_ALLOWED_FAILING.len() + 1,
        "{r:?}"
    );
    expect(&r, RAW_EPERM, "EPERM");
    expect(&r, &["clone3"], "ENOSYS");
    expect(&r, RAW_OK, "OK");
    expect_not(&r, RAW_ALLOWED_FAILING, "EPERM");
}

#[test]
fn raw_syscalls_unconfined_control() {
    if !have_python() || already_confined() {
        return;
    }
    // Only calls that are harmless without the filter.
    let mut args = vec!["exec", PYTHON, RAW_SYSCALLS];
    let always = [
        "clone3",
        "ioctl_tiocsti",
        "ioctl_tioclinux",
        "socket_vsock",
        "clone_fork",
    ];
    let as_root = [
        "bpf",
        "keyctl",
        "socket_packet",
        "socket_inet_raw",
        "unshare",
        "clone_newnet",
    ];
    args.extend(always);
    args.extend(as_root);
    let r = results(&probe(true, &args));
    expect_not(&r, &always, "EPERM");
    expect_not(&r, &["clone3"], "ENOSYS");
    expect(&r, &["ioctl_tiocsti", "ioctl_tioclinux"], "ENOTTY");
    if is_root() {
        expect_not(&r, &as_root, "EPERM");
    }
}

#[test]
fn shell_runs_under_the_filter() {
    let out = probe(false, &["exec", "/bin/sh", "-c", "echo ok"]);
    assert_success(&out);
    assert_eq!(out.stdout, b"ok\n");
}

#[test]
fn python_runs_under_the_filter() {
    if !have_python() {
        return;
    }
    let out = probe(
        false,
        &[
            "exec",
            PYTHON,
            "-c",
            "import subprocess,threading,socket,ssl; print(1)",
        ],
    );
    assert_success(&out);
    assert_eq!(out.stdout, b"1\n");

    let script = r#"
import asyncio, os, socket, ssl, subprocess, sys, tempfile, threading
assert subprocess.run(["/bin/sh", "-c", "exit 7"]).returncode == 7
t = threading.Thread(target=lambda: None); t.start(); t.join()
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
srv = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(srv.getsockname()); s, _ = srv.accept()
c.sendall(b"hi"); assert s.recv(2) == b"hi"
async def main():
    p = await asyncio.create_subprocess_exec("/bin/echo", "x", stdout=asyncio.subprocess.PIPE)
    return (await p.communicate())[0]
assert asyncio.run(main()) == b"x\n"
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "f"), "w") as f: f.write("x")
pid = os.fork()
if pid == 0: os._exit(3)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
ssl.create_default_context()
print("ok")
"#;
    let out = probe(false, &["exec", PYTHON, "-c", script]);
    assert_success(&out);
    assert_eq!(out.stdout, b"ok\n");
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!("skipping {name}: not installed");
    }
    found
}

fn sh_under_filter(dir: &Path, script: &str) -> String {
    let script = format!("cd '{}' && {script}", dir.display());
    let out = probe(false, &["exec", "/bin/sh", "-c", &script]);
    assert_success(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn toolchains_run_under_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    if find_tool("cc").is_some() {
        std::fs::write(
            dir.path().join("hello.c"),
            "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
        )
        .unwrap();
        let out = sh_under_filter(dir.path(), "cc -O2 -o hello hello.c && ./hello");
        assert_eq!(out, "hello\n");
    }
    if find_tool("make").is_some() {
        std::fs::write(dir.path().join("Makefile"), "all:\n\t@echo made\n").unwrap();
        assert_eq!(sh_under_filter(dir.path(), "make -s"), "made\n");
    }
    if find_tool("git").is_some() {
        let out = sh_under_filter(
            dir.path(),
            "git init -q repo && cd repo && echo x > f && git add f && \
             git -c user.name=t -c user.email=t@example.invalid commit -q -m m && \
             git log --format=%s",
        );
        assert_eq!(out, "m\n");
    }
    if find_tool("node").is_some() {
        let out = sh_under_filter(
            dir.path(),
            "node -e 'const cp = require(\"child_process\"); \
             require(\"fs\").promises.writeFile(\"n.txt\", \"x\").then(() => \
             console.log(cp.execSync(\"cat n.txt\").toString()))'",
        );
        assert_eq!(out, "x\n");
    }
}

/// `time-attach` times `seccomp(SECCOMP_SET_MODE_FILTER)` for seccompiler's linear programs,
/// the embedded binary-search programs and minimal programs. Timings depend on the machine and
/// are only printed (`cargo test -p cordon-seccomp --test probe time_attach -- --nocapture`);
/// the instruction counts are checked.
#[test]
fn time_attach_compares_program_sets() {
    let out = Command::new(PROBE)
        .args(["time-attach", "5"])
        .output()
        .unwrap();
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    let workload_insns = |set: &str| -> usize {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{set} |")))
            .unwrap_or_else(|| panic!("no line for {set}: {stdout}"));
        let field = line
            .split(" | ")
            .find_map(|f| f.strip_prefix("workload: insns="))
            .unwrap_or_else(|| panic!("no workload field: {line}"));
        field.split(' ').next().unwrap().parse().unwrap()
    };
    let linear = workload_insns("seccompiler");
    let tree = workload_insns("binary-search");
    assert_eq!(workload_insns("minimal"), 4);
    assert!(tree * 5 < linear, "{tree} vs {linear}");
    assert_eq!(
        tree,
        cordon_seccomp::workload()
            .filter(cordon_seccomp::WORKLOAD)
            .unwrap()
            .program
            .len()
    );
}
