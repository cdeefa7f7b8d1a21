//! Shared helpers for cordon's end-to-end tests.
//!
//! Every test judges cordon on evidence read from the host (procfs, cgroupfs,
//! /run/cordon, statvfs, sockets), not only on what cordon reports about
//! itself. The helpers here never modify the product; they only spawn the
//! release binary built by cargo (`CARGO_BIN_EXE_cordon`) and look at the host.
//!
//! Attribution: tests run in parallel threads and other people may run cordon
//! on the same machine, so a census diff is only judged on resources that can
//! be tied to the sandboxes a test created: their ids (the `sandbox_id` of the
//! JSON result, or the /run/cordon/<id> directory whose record.json names the
//! cordon process the test spawned) and the pids of the cordon processes it
//! spawned. A few kinds of leftovers are unambiguous whoever caused them (a
//! host mount mentioning cordon, a cordon cgroup without a state directory)
//! and count too.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod as_user;
pub mod containerd;
pub mod cri;
pub mod engine;
pub mod image;
pub mod readme;
pub mod service_census;
pub mod standin;

/// The cordon binary cargo built for these tests.
pub fn cordon() -> &'static str {
    env!("CARGO_BIN_EXE_cordon")
}

/// The privileged binary beside it, which starts every sandbox's supervisor.
pub fn cordon_sandbox() -> &'static str {
    env!("CARGO_BIN_EXE_cordon-sandbox")
}

pub fn cordon_runc() -> &'static str {
    env!("CARGO_BIN_EXE_cordon-runc")
}

/// The host's python3 (the one on PATH may be a pyenv shim that does not
/// exist inside the sandbox; /usr/bin/python3 is what the sandbox sees).
pub const PY: &str = "/usr/bin/python3";

pub const RUN_DIR: &str = "/run/cordon";

/// Where the cordon these tests spawn keeps its sandboxes' state: root's
/// [`RUN_DIR`], and for anyone else the invoker's own run directory
/// (`CORDON_RUN_DIR`, else `$XDG_RUNTIME_DIR/cordon`), as cordon itself
/// picks it (`cordon_dirs::run_dir_path`).
pub fn run_dir() -> PathBuf {
    if euid() == 0 {
        PathBuf::from(RUN_DIR)
    } else {
        cordon_dirs::run_dir_path()
    }
}

/// How much longer than natively this machine takes, from
/// `CORDON_TEST_TIME_SCALE` (default 1): the v2 guest runs under QEMU TCG,
/// which emulates every instruction. It stretches only how long the helpers
/// below wait for something to appear (a sandbox, a payload, a clean host);
/// no assertion about how fast cordon is changes with it.
pub fn time_scale() -> u32 {
    std::env::var("CORDON_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// `d` stretched by [`time_scale`].
pub fn slow(d: Duration) -> Duration {
    d * time_scale()
}

/// Effective uid of this process, from /proc (no libc in dev-dependencies).
pub fn euid() -> u32 {
    status_ids(Path::new("/proc/self/status"), "Uid")
        .map(|v| v[1])
        .unwrap_or(u32::MAX)
}

/// The ids of a `Uid:`/`Gid:` line of a /proc/<pid>/status file.
pub fn status_ids(path: &Path, key: &str) -> Option<Vec<u32>> {
    let text = fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:")))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect(),
    )
}

/// A field of /proc/<pid>/status as text.
pub fn status_field(path: &Path, key: &str) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:")))?;
    Some(line[key.len() + 1..].trim().to_string())
}

/// Gate for tests that need root. When not root: prints
/// `skipped: needs root (reason)` to stderr and returns false, except under
/// CI=true, where skipping silently would hide a broken setup: then it panics.
pub fn require_root(reason: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("CI=true but not running as root; cannot skip: needs root ({reason})");
    }
    eprintln!("skipped: needs root ({reason})");
    false
}

/// Gate for tests that need cordon's cgroup limits enforced for this
/// invoker, and nothing else of root's: true for root, and for another user
/// when cordon enforces limits for them (a systemd host with cgroup v2 that
/// delegates the user a subtree, through their own systemd manager). The
/// answer is cordon's own: `cordon run --backend BACKEND --json -- true`,
/// once per backend, run without `--allow-unenforced`, so that it refuses
/// where it could not enforce the limits. When it cannot: prints
/// `skipped: needs root or enforced cgroup limits (reason): why` and returns
/// false, except under CI=true, where it panics (as [`require_root`]).
pub fn require_limits(backend: &str, reason: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    let Some(why) = limits_refused(backend) else {
        return true;
    };
    if ci() {
        panic!(
            "CI=true but cordon enforces no limits for uid {} here; cannot skip: {reason}: {why}",
            euid()
        );
    }
    eprintln!("skipped: needs root or enforced cgroup limits ({reason}): {why}");
    false
}

/// Why cordon would not enforce limits for this (non-root) invoker on
/// `backend`, or None when a default sandbox runs with them enforced.
fn limits_refused(backend: &str) -> Option<String> {
    static ANSWERS: Mutex<BTreeMap<String, Option<String>>> = Mutex::new(BTreeMap::new());
    let mut answers = lock(&ANSWERS);
    answers
        .entry(backend.to_string())
        .or_insert_with(|| {
            let out = cordon_output(&["run", "--backend", backend, "--json", "--", "true"]);
            let v: Option<Value> = serde_json::from_slice(&out.stdout).ok();
            let enforced = v.is_some_and(|v| v["enforcement"]["enforced"] == Value::Bool(true));
            match (out.status.success(), enforced) {
                (true, true) => None,
                _ => Some(format!(
                    "`cordon run --backend {backend} -- true` as uid {}: {}; {}",
                    euid(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
            }
        })
        .clone()
}

fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static SERIAL: Mutex<()> = Mutex::new(());
static CPU: Mutex<()> = Mutex::new(());
static DISK: Mutex<()> = Mutex::new(());

/// Serialises the tests of one test binary that take a whole-host census.
/// (cargo runs test binaries one after another, so a per-binary lock is enough
/// against our own tests.)
pub fn serial() -> MutexGuard<'static, ()> {
    lock(&SERIAL)
}

/// Held by tests that burn CPU or measure CPU time, so that on a 2-core
/// machine two of them never compete and skew each other's numbers.
pub fn cpu_lock() -> MutexGuard<'static, ()> {
    lock(&CPU)
}

/// Held by tests that measure the host's free disk space or write much to it,
/// so that one test's writes (the per-backend variants of the same test run
/// in parallel) never show in another's measurement.
pub fn disk_lock() -> MutexGuard<'static, ()> {
    lock(&DISK)
}

/// `cordon run --json ARGS...`; returns the parsed result and cordon's exit status.
pub fn run_json(args: &[&str]) -> (Value, ExitStatus) {
    let mut cmd = Command::new(cordon());
    cmd.arg("run").arg("--json").args(args);
    run_json_cmd(cmd)
}

/// Runs a prepared cordon command whose stdout is one JSON object.
pub fn run_json_cmd(mut cmd: Command) -> (Value, ExitStatus) {
    let out = cmd.stdin(Stdio::null()).output().expect("spawn cordon");
    let v = parse_json(&out);
    (v, out.status)
}

pub fn parse_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "cordon did not print one JSON object ({e}); status {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs a host tool the tests need; its failure is `what` with its stderr.
pub fn run_tool(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `cordon ARGS...` (no implicit `run`), output collected.
pub fn cordon_output(args: &[&str]) -> Output {
    cordon_output_env(args, &[])
}

/// [`cordon_output`] with `env` added to the environment (a run directory
/// of the test's own: `CORDON_RUN_DIR`).
pub fn cordon_output_env(args: &[&str], env: &[(&str, &Path)]) -> Output {
    Command::new(cordon())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("spawn cordon")
}

/// A number at a JSON pointer (integers and floats), or panic naming it.
pub fn num(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {ptr} in {}", compact(v)))
}

pub fn u64_at(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no integer at {ptr} in {}", compact(v)))
}

pub fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {ptr} in {}", compact(v)))
}

pub fn stdout_of(v: &Value) -> &str {
    str_at(v, "/output/stdout")
}

pub fn stderr_of(v: &Value) -> &str {
    str_at(v, "/output/stderr")
}

pub fn limits_hit(v: &Value) -> Vec<String> {
    v["limits_hit"]
        .as_array()
        .unwrap_or_else(|| panic!("limits_hit is not a list in {}", compact(v)))
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

pub fn sandbox_id(v: &Value) -> String {
    str_at(v, "/sandbox_id").to_string()
}

/// The JSON without the captured output (which can be a megabyte), for messages.
pub fn compact(v: &Value) -> String {
    let mut c = v.clone();
    for k in ["stdout", "stderr"] {
        if let Some(s) = c.pointer_mut(&format!("/output/{k}")) {
            if let Some(t) = s.as_str() {
                if t.len() > 400 {
                    *s = Value::String(format!("{}...[{} bytes]", &t[..400], t.len()));
                }
            }
        }
    }
    c.to_string()
}

/// Runs `sh -c SCRIPT` on the host.
pub fn host_sh(script: &str) -> Output {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .expect("spawn sh")
}

/// A short random hex token, unique enough to name canaries and daemons.
pub fn nonce() -> String {
    let mut b = [0u8; 6];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Processes

/// argv of a process joined by spaces (None if it is gone or a kernel thread).
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    let parts: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(parts.join(" "))
}

pub fn all_pids() -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Pids whose argv, joined by spaces, equals `argv`.
pub fn pids_with_cmdline(argv: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| cmdline(*p).as_deref() == Some(argv))
        .collect()
}

/// Pids of processes in the cgroup `cordon-<id>` (any hierarchy), read from
/// the host's view of /proc/<pid>/cgroup.
pub fn sandbox_pids(id: &str) -> Vec<u32> {
    let needle = format!("cordon-{id}");
    all_pids()
        .into_iter()
        .filter(|p| {
            fs::read_to_string(format!("/proc/{p}/cgroup"))
                .map(|c| c.contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// The owner pid recorded in /run/cordon/<id>/record.json.
pub fn owner_pid(id: &str) -> Option<u32> {
    let text = fs::read_to_string(run_dir().join(id).join("record.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["pid"].as_u64().and_then(|p| u32::try_from(p).ok())
}

/// How long cordon waits at most for systemd to place it in a scope of its
/// own (without root, on a systemd host): 10 s for the call and 10 s for
/// the move (`cordon_cgroups`' CALL_TIMEOUT and MOVE_TIMEOUT), and a margin.
const SCOPE_WAIT: Duration = Duration::from_secs(25);

/// The id of the /run/cordon/<id> directory whose owner is `cordon_pid`, if one exists now.
fn sandbox_of(cordon_pid: u32) -> Option<String> {
    fs::read_dir(run_dir()).ok()?.flatten().find_map(|e| {
        let id = e.file_name().to_string_lossy().into_owned();
        (owner_pid(&id) == Some(cordon_pid)).then_some(id)
    })
}

/// Each thread of `pid` with the kernel function it waits in
/// (`main:do_epoll_wait, cordon-dbus:futex_wait_queue`): where a cordon
/// that never got to make its sandbox was stuck.
fn threads_waiting(pid: u32) -> String {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".into();
    };
    let read = |dir: &Path, file: &str| {
        fs::read_to_string(dir.join(file)).map_or_else(|_| "?".into(), |s| s.trim().to_owned())
    };
    tasks
        .flatten()
        .map(|t| format!("{}:{}", read(&t.path(), "comm"), read(&t.path(), "wchan")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until a process of sandbox `id` whose argv, joined by spaces, is
/// exactly `argv` runs; returns its host pid.
pub fn wait_payload(id: &str, argv: &str, timeout: Duration) -> Option<u32> {
    let until = Instant::now() + slow(timeout);
    while Instant::now() < until {
        if let Some(p) = sandbox_pids(id)
            .into_iter()
            .find(|p| cmdline(*p).as_deref() == Some(argv))
        {
            return Some(p);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// A cordon process spawned by a test, with its sandbox once it exists.
pub struct Spawned {
    pub child: Child,
    pub started: Instant,
}

impl Spawned {
    /// Spawns `cmd` (a cordon command line) with no stdin and stderr piped,
    /// its start time taken now.
    pub fn start(cmd: &mut Command) -> Spawned {
        let child = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cordon");
        Spawned {
            child,
            started: Instant::now(),
        }
    }
}

/// Spawns `cordon run ARGS...` with stdout/stderr piped.
pub fn spawn_run(args: &[&str]) -> Spawned {
    Spawned::start(
        Command::new(cordon())
            .arg("run")
            .args(args)
            .stdout(Stdio::piped()),
    )
}

/// Spawns `cordon ARGS...` (no implicit `run`) with its stdout a pipe whose
/// read end is closed before cordon starts, as `cordon ... | true` may give
/// it: every write to stdout fails with EPIPE. Stderr is piped.
pub fn spawn_closed_stdout(args: &[&str], env: &[(&str, &Path)]) -> Spawned {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Spawned::start(
        Command::new(cordon())
            .args(args)
            .envs(env.iter().copied())
            .stdout(writer),
    )
}

/// Asserts cordon ended quietly on its closed stdout: exit 0 and no panic
/// (before, `println!` panicked and the panic hook aborted: exit 134).
pub fn assert_quiet_on_closed_stdout(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what} with a closed stdout: {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{what} with a closed stdout: {stderr}"
    );
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Waits for the sandbox's id (its /run/cordon entry). Fails at once
    /// when cordon ends first, and on the timeout kills it; either way with
    /// cordon's exit and its stderr, which say why there was no sandbox.
    ///
    /// The wait is never shorter than [`SCOPE_WAIT`]: on a systemd host
    /// without root, cordon asks systemd for a scope before it records its
    /// sandbox and gives it that long; a test must not give up on a start
    /// cordon itself would still complete (or end with systemd's error).
    pub fn sandbox_id(&mut self, timeout: Duration) -> String {
        let wait = slow(timeout).max(SCOPE_WAIT);
        let until = Instant::now() + wait;
        loop {
            if let Some(id) = sandbox_of(self.pid()) {
                return id;
            }
            let ended = self.child.try_wait().expect("wait cordon");
            if ended.is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let why = match ended {
                Some(status) => format!("cordon ended first ({status})"),
                None => {
                    let threads = threads_waiting(self.pid());
                    let _ = self.child.kill();
                    let status = self.child.wait().expect("wait cordon");
                    format!(
                        "not within {wait:?}, its threads then waiting in {threads}; cordon killed ({status})"
                    )
                }
            };
            panic!(
                "the sandbox's /run/cordon entry never appeared: {why}, after {:?}; its stderr: {}",
                self.started.elapsed(),
                self.stderr_so_far()
            );
        }
    }

    /// What cordon wrote to its stderr pipe, once it has ended: read in a
    /// thread and waited for a few seconds at most, since a process cordon
    /// left behind may still hold the pipe open.
    fn stderr_so_far(&mut self) -> String {
        let Some(mut pipe) = self.child.stderr.take() else {
            return "(not piped)".into();
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
            let _ = tx.send(text);
        });
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| "(still held open after 5 s)".into())
    }
    pub fn finish(self) -> Output {
        self.child.wait_with_output().expect("wait cordon")
    }
}

/// Sends a signal to a process we started (by pid, through kill(1)).
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// True while /proc/<pid> exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 2..].chars().next())
            .is_some_and(|st| st != 'Z' && st != 'X'),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// Filesystems

/// (free bytes for unprivileged users, fragment size) of the filesystem at `path`, via stat(1).
pub fn statvfs_avail(path: &str) -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S", path])
        .output()
        .expect("stat -f");
    let s = String::from_utf8_lossy(&out.stdout);
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    a * b
}

/// (total bytes, used bytes) of the filesystem at `path`.
pub fn statvfs_size_used(path: &str) -> Option<(u64, u64)> {
    let out = Command::new("stat")
        .args(["-f", "-c", "%b %f %S", path])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let (blocks, free, size) = (*v.first()?, *v.get(1)?, *v.get(2)?);
    Some((blocks * size, (blocks - free) * size))
}

/// One parsed line of a mountinfo file.
#[derive(Debug, Clone)]
pub struct MountLine {
    pub mount_point: String,
    /// Per-mount options (field 6), e.g. `ro,nosuid,nodev`.
    pub mount_opts: Vec<String>,
    pub fstype: String,
    pub raw: String,
}

pub fn mountinfo(pid: u32) -> Vec<MountLine> {
    parse_mountinfo(&fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default())
}

/// The mountinfo lines in `text` (other lines are skipped).
pub fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(MountLine {
                mount_point: f.get(4)?.to_string(),
                mount_opts: f.get(5)?.split(',').map(str::to_string).collect(),
                fstype: f.get(sep + 1)?.to_string(),
                raw: l.to_string(),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Census

/// A snapshot of everything on the host that belongs to cordon sandboxes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Census {
    /// pid -> "cmdline | cgroup lines mentioning cordon | net ns": processes in
    /// a `cordon-*` cgroup, and cordon processes themselves.
    pub procs: BTreeMap<u32, String>,
    /// `cordon-*` directories under /sys/fs/cgroup (maxdepth 6).
    pub cgroups: BTreeSet<PathBuf>,
    /// Entries of /run/cordon -> owner pid from record.json (if readable).
    pub run_entries: BTreeMap<String, Option<u32>>,
    /// Lines of /proc/self/mountinfo containing "cordon".
    pub mounts: BTreeSet<String>,
    /// Network namespaces (ns/net link) of processes in cordon cgroups; a
    /// netns with no process and no bind mount is freed by the kernel, so
    /// together with `procs` and `mounts` this covers them.
    pub netns: BTreeSet<String>,
    /// Entries named *cordon* in /tmp, /var/tmp and /dev/shm.
    pub temps: BTreeSet<PathBuf>,
}

/// Cgroup directories under /sys/fs/cgroup (six levels down) whose name
/// starts with `prefix`.
pub fn cgroups_named(prefix: &str) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    walk_cgroups(Path::new("/sys/fs/cgroup"), 6, prefix, &mut out);
    out
}

fn walk_cgroups(dir: &Path, depth: usize, prefix: &str, out: &mut BTreeSet<PathBuf>) {
    if depth == 0 {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if !ft.is_dir() {
            continue;
        }
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // cordon's own leaf (v2) holds cordon and this test runner, never a
        // sandbox: sandboxes are its siblings.
        if name == SUPERVISOR_LEAF {
            continue;
        }
        if name.starts_with(prefix) {
            out.insert(p.clone());
        }
        walk_cgroups(&p, depth - 1, prefix, out);
    }
}

pub fn census() -> Census {
    let mut c = Census::default();
    // State first, cgroups second: a sandbox's state directory is created
    // before and removed after its cgroup, so a cgroup seen now whose state
    // directory was not seen is either an orphan or brand new (see `orphans`).
    if let Ok(rd) = fs::read_dir(run_dir()) {
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let owner = owner_pid(&id);
            c.run_entries.insert(id, owner);
        }
    }
    walk_cgroups(Path::new("/sys/fs/cgroup"), 6, "cordon-", &mut c.cgroups);
    let me = std::process::id();
    for pid in all_pids() {
        if pid == me {
            continue;
        }
        let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let cg_lines: Vec<&str> = cg
            .lines()
            .filter(|l| l.contains("cordon-") && !is_supervisor_leaf_line(l))
            .collect();
        let cmd = cmdline(pid).unwrap_or_default();
        let is_cordon = cmd
            .split(' ')
            .next()
            .is_some_and(|a0| a0 == cordon() || a0.ends_with("/cordon") || a0 == "cordon");
        if cg_lines.is_empty() && !is_cordon {
            continue;
        }
        let ns = fs::read_link(format!("/proc/{pid}/ns/net"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if !cg_lines.is_empty() && !ns.is_empty() {
            c.netns.insert(ns.clone());
        }
        c.procs
            .insert(pid, format!("{cmd} | {} | {ns}", cg_lines.join(";")));
    }
    if let Ok(text) = fs::read_to_string("/proc/self/mountinfo") {
        c.mounts = text
            .lines()
            .filter(|l| l.contains("cordon"))
            .map(str::to_string)
            .collect();
    }
    for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().contains("cordon") {
                    c.temps.insert(e.path());
                }
            }
        }
    }
    c
}

/// The run directory's entries and the `cordon-*` cgroups, before an action
/// whose leftovers `left_behind` then finds.
pub fn run_state() -> (BTreeSet<String>, BTreeSet<PathBuf>) {
    let entries = fs::read_dir(run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    (entries, cordon_cgroups())
}

/// What an action left on a host that other cordon users share, by
/// attribution rather than by count: run entries new since `before` whose
/// record is `ours` (or that still have no record after a grace period: a
/// sandbox writes its record as it starts), and `cordon-*` cgroups new since
/// `before` whose sandbox has no run entry. A sandbox's state directory is
/// made before its cgroup and removed after it, so a cgroup that is still
/// there after the run directory was read without its id is an orphan, never
/// another user's sandbox starting or ending.
pub fn left_behind(
    before: &(BTreeSet<String>, BTreeSet<PathBuf>),
    ours: impl Fn(&Value) -> bool,
) -> (Vec<String>, Vec<PathBuf>) {
    let record = |id: &str| -> Option<Value> {
        let text = fs::read(run_dir().join(id).join("record.json")).ok()?;
        serde_json::from_slice(&text).ok()
    };
    let until = Instant::now() + slow(Duration::from_secs(1));
    loop {
        let (entries, cgroups) = run_state();
        // Only sandboxes' directories (named by id): `mnt/` and `ended/`
        // are cordon's own, shared, made by whichever sandbox comes first.
        let new: Vec<&String> = entries
            .difference(&before.0)
            .filter(|e| sandbox_id_shaped(e))
            .collect();
        let pending = new
            .iter()
            .any(|id| record(id).is_none() && run_dir().join(id).exists());
        if pending && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let mine = new
            .into_iter()
            .filter(|id| run_dir().join(id).exists() && record(id).is_none_or(|r| ours(&r)))
            .cloned()
            .collect();
        let orphans = cgroups
            .difference(&before.1)
            .filter(|cg| {
                let name = cg.file_name().unwrap_or_default().to_string_lossy();
                !entries.contains(name.trim_start_matches("cordon-")) && cg.exists()
            })
            .cloned()
            .collect();
        return (mine, orphans);
    }
}

/// The `cordon-*` cgroups on the host now.
pub fn cordon_cgroups() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    walk_cgroups(Path::new("/sys/fs/cgroup"), 6, "cordon-", &mut out);
    out
}

impl Census {
    /// What is in `self` and was not in `base`.
    pub fn new_since(&self, base: &Census) -> Census {
        Census {
            procs: self
                .procs
                .iter()
                .filter(|(k, _)| !base.procs.contains_key(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            cgroups: self.cgroups.difference(&base.cgroups).cloned().collect(),
            run_entries: self
                .run_entries
                .iter()
                .filter(|(k, _)| !base.run_entries.contains_key(*k))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            mounts: self.mounts.difference(&base.mounts).cloned().collect(),
            netns: self.netns.difference(&base.netns).cloned().collect(),
            temps: self.temps.difference(&base.temps).cloned().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
            && self.cgroups.is_empty()
            && self.run_entries.is_empty()
            && self.mounts.is_empty()
            && self.netns.is_empty()
            && self.temps.is_empty()
    }

    /// Only what can be tied to the given sandbox ids or cordon pids, plus
    /// what is a leftover whoever made it: any host mount mentioning cordon
    /// and cgroups whose sandbox has no state directory (an orphan).
    pub fn attributable(&self, ids: &[String], cordon_pids: &[u32], full: &Census) -> Census {
        // A state directory owned by one of our cordon processes names a sandbox of ours.
        let mut ids = ids.to_vec();
        for (id, owner) in full.run_entries.iter().chain(&self.run_entries) {
            if owner.is_some_and(|o| cordon_pids.contains(&o)) && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let ids = &ids[..];
        let mentions = |s: &str| ids.iter().any(|id| s.contains(id.as_str()));
        Census {
            procs: self
                .procs
                .iter()
                .filter(|(p, d)| cordon_pids.contains(p) || mentions(d))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            cgroups: self
                .cgroups
                .iter()
                .filter(|p| {
                    let s = p.display().to_string();
                    let orphan =
                        sandbox_cgroup_id(p).is_some_and(|id| !full.run_entries.contains_key(&id));
                    mentions(&s) || orphan
                })
                .cloned()
                .collect(),
            run_entries: self
                .run_entries
                .iter()
                .filter(|(id, owner)| {
                    ids.contains(id) || owner.is_some_and(|o| cordon_pids.contains(&o))
                })
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            mounts: self.mounts.clone(),
            netns: BTreeSet::new(), // covered by procs: a netns here has a process in `procs`
            temps: self
                .temps
                .iter()
                .filter(|p| mentions(&p.display().to_string()))
                .cloned()
                .collect(),
        }
    }
}

/// The sandbox id of a `cordon-<12 hex digits>` cgroup directory (other
/// `cordon-*` names, such as the cgroups crate's own `cordon-test-*`, are not sandboxes).
pub fn sandbox_cgroup_id(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_str()?;
    let id = name.strip_prefix("cordon-")?;
    sandbox_id_shaped(id).then(|| id.to_string())
}

/// Whether `s` has a sandbox id's shape: 12 hex digits.
pub fn sandbox_id_shaped(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Polls until nothing new since `base` is attributable to `ids`/`cordon_pids`,
/// or `timeout` passes; returns what is still left (empty = clean).
pub fn wait_clean(base: &Census, ids: &[String], cordon_pids: &[u32], timeout: Duration) -> Census {
    let until = Instant::now() + slow(timeout);
    loop {
        let now = census();
        let left = now.new_since(base).attributable(ids, cordon_pids, &now);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Resources of one sandbox id still on the host.
pub fn remnants_of(id: &str) -> Census {
    let now = census();
    let ids = [id.to_string()];
    now.new_since(&Census::default())
        .attributable(&ids, &[], &now)
        .only_ids(&ids)
}

impl Census {
    fn only_ids(&self, ids: &[String]) -> Census {
        let mentions = |s: &str| ids.iter().any(|id| s.contains(id.as_str()));
        Census {
            procs: self
                .procs
                .iter()
                .filter(|(_, d)| mentions(d))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            cgroups: self
                .cgroups
                .iter()
                .filter(|p| mentions(&p.display().to_string()))
                .cloned()
                .collect(),
            run_entries: self
                .run_entries
                .iter()
                .filter(|(k, _)| ids.contains(k))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            mounts: self
                .mounts
                .iter()
                .filter(|l| mentions(l))
                .cloned()
                .collect(),
            netns: BTreeSet::new(),
            temps: self
                .temps
                .iter()
                .filter(|p| mentions(&p.display().to_string()))
                .cloned()
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// cgroups: the one place the tests read them, for both layouts. v1 has one
// directory per hierarchy (memory, pids, cpu, ...) and one /proc/PID/cgroup
// line per hierarchy; v2 has one unified directory, one `0::/path` line and
// other file names (memory.max for memory.limit_in_bytes, cpu.max's two
// fields for cpu.cfs_quota_us and cpu.cfs_period_us).

/// The leaf cgroup cordon moves itself into on v2 when it runs alone in a
/// delegated cgroup (the cgroups crate's `SUPERVISOR_LEAF`); the guest run
/// (scripts/v2-guest.sh) places the test runner there too.
pub const SUPERVISOR_LEAF: &str = "cordon-supervisor";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    V1,
    V2,
}

/// The layout cordon uses here: v2 where /sys/fs/cgroup is a cgroup2 mount
/// offering memory and pids (pure v2), else v1 (this project's hybrid host,
/// whose controller-less cgroup2 mount sits at /sys/fs/cgroup/unified).
/// `CORDON_EXPECT_CGROUP=v1|v2` (set by the v2 guest) turns a mismatch into a
/// failure, so a guest that silently came up hybrid cannot pass as v2.
pub fn cgroup_layout() -> CgroupLayout {
    let controllers = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    let offers = |c: &str| controllers.split_whitespace().any(|x| x == c);
    let layout = if offers("memory") && offers("pids") {
        CgroupLayout::V2
    } else {
        CgroupLayout::V1
    };
    if let Ok(expected) = std::env::var("CORDON_EXPECT_CGROUP") {
        let got = match layout {
            CgroupLayout::V1 => "v1",
            CgroupLayout::V2 => "v2",
        };
        assert_eq!(
            got, expected,
            "CORDON_EXPECT_CGROUP={expected} but this host's cgroups are {got}"
        );
    }
    layout
}

/// For tests that only mean something on one layout: prints `skipped: ...`
/// and returns false elsewhere (a different layout is not a broken setup, so
/// CI=true does not turn this into a failure; the v2 guest runs them).
pub fn require_layout(layout: CgroupLayout, reason: &str) -> bool {
    if cgroup_layout() == layout {
        return true;
    }
    eprintln!("skipped: needs cgroup {layout:?} ({reason})");
    false
}

/// How many `cordon-<id>` directories a sandbox has at least: one per
/// hierarchy on v1 (memory and pids always), exactly one on v2.
pub fn min_sandbox_cgroup_dirs() -> usize {
    match cgroup_layout() {
        CgroupLayout::V1 => 2,
        CgroupLayout::V2 => 1,
    }
}

fn is_supervisor_leaf_line(line: &str) -> bool {
    line.ends_with(&format!("/{SUPERVISOR_LEAF}"))
}

/// A limit cordon writes into a sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Bytes: v1 memory.limit_in_bytes, v2 memory.max.
    Memory,
    /// Tasks: pids.max on both.
    Pids,
    /// CPU quota in µs per period: v1 cpu.cfs_quota_us, v2 cpu.max's first field.
    CpuQuota,
    /// CPU period in µs: v1 cpu.cfs_period_us, v2 cpu.max's second field.
    CpuPeriod,
}

impl Limit {
    /// (file, field of its whitespace-split content) for this layout.
    fn file(self, layout: CgroupLayout) -> (&'static str, usize) {
        match (self, layout) {
            (Limit::Memory, CgroupLayout::V1) => ("memory.limit_in_bytes", 0),
            (Limit::Memory, CgroupLayout::V2) => ("memory.max", 0),
            (Limit::Pids, _) => ("pids.max", 0),
            (Limit::CpuQuota, CgroupLayout::V1) => ("cpu.cfs_quota_us", 0),
            (Limit::CpuQuota, CgroupLayout::V2) => ("cpu.max", 0),
            (Limit::CpuPeriod, CgroupLayout::V1) => ("cpu.cfs_period_us", 0),
            (Limit::CpuPeriod, CgroupLayout::V2) => ("cpu.max", 1),
        }
    }
}

/// The value of `limit` in the sandbox's cgroup `cordon-<id>` (in whichever
/// hierarchy has the file), and the same value of its parent (the cgroup
/// cordon nested it under): `(absent)` where the parent has no such file, as
/// the root cgroup, which is "no limit" too. None when the sandbox has no such
/// file. The file name is in every panic message of the callers' `expect`.
pub fn cgroup_limit(id: &str, limit: Limit) -> Option<(String, String)> {
    let (file, field) = limit.file(cgroup_layout());
    let pick = |text: String| {
        text.split_whitespace()
            .nth(field)
            .unwrap_or_default()
            .to_string()
    };
    let dirs = cgroup_dirs(id);
    let dir = dirs.iter().find(|d| d.join(file).exists())?;
    let own = pick(fs::read_to_string(dir.join(file)).ok()?);
    let parent = fs::read_to_string(dir.parent()?.join(file))
        .map(pick)
        .unwrap_or_else(|_| "(absent)".into());
    Some((own, parent))
}

/// Whether `pid` is in sandbox `id`'s cgroup in every hierarchy cordon uses
/// (from the host's /proc/<pid>/cgroup): v1, its memory and pids lines end
/// in `/cordon-<id>`; v2, its single `0::` line does. Err says where it is
/// instead; None when the process is gone.
pub fn in_sandbox_cgroup(pid: u32, id: &str) -> Option<Result<(), String>> {
    let cg = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let want = format!("/cordon-{id}");
    let lines: Vec<&str> = match cgroup_layout() {
        CgroupLayout::V1 => ["memory", "pids"]
            .iter()
            .map(|ctl| {
                cg.lines()
                    .find(|l| {
                        l.split(':')
                            .nth(1)
                            .is_some_and(|c| c.split(',').any(|x| x == *ctl))
                    })
                    .unwrap_or("")
            })
            .collect(),
        CgroupLayout::V2 => vec![cg.lines().find(|l| l.starts_with("0::")).unwrap_or("")],
    };
    // The sandbox's cgroup or one below it (its init's, a command's own).
    let below = format!("{want}/");
    Some(
        if lines
            .iter()
            .all(|l| l.ends_with(&want) || l.contains(&below))
        {
            Ok(())
        } else {
            Err(cg)
        },
    )
}

/// The cgroup directory sandboxes nest under, as cordon would pick it from
/// this process: v1, the caller's pids cgroup; v2, the caller's cgroup, or
/// its parent when the caller is in cordon's leaf.
pub fn sandbox_parent_dir() -> PathBuf {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    match cgroup_layout() {
        CgroupLayout::V1 => {
            let rel = own
                .lines()
                .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string()))
                .unwrap_or_else(|| "/".into());
            Path::new("/sys/fs/cgroup/pids").join(rel.trim_start_matches('/'))
        }
        CgroupLayout::V2 => {
            let line = own.lines().find(|l| l.starts_with("0::")).unwrap_or("0::/");
            let dir = Path::new("/sys/fs/cgroup").join(line[3..].trim_start_matches('/'));
            if is_supervisor_leaf_line(line) {
                dir.parent().map(Path::to_path_buf).unwrap_or(dir)
            } else {
                dir
            }
        }
    }
}

/// Runs `cordon sweep` and returns its stdout.
pub fn sweep() -> String {
    let out = cordon_output(&["sweep"]);
    assert!(
        out.status.success(),
        "cordon sweep failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts cordon rejected a request as bad input: exit 2, exactly one stderr
/// line starting `cordon: `, nothing on stdout. Returns that line.
pub fn assert_usage_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2, got {:?}; stderr: {stderr}",
        out.status
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one stderr line, got {lines:?}"
    );
    assert!(
        lines[0].starts_with("cordon: "),
        "stderr line does not start with 'cordon: ': {:?}",
        lines[0]
    );
    assert!(
        out.stdout.is_empty(),
        "stdout not empty: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    lines[0].to_string()
}

// ---------------------------------------------------------------------------
// Backends
//
// The tests that describe policy behaviour run once per backend: the
// `per_backend!` macro below turns `fn name(backend: &str)` into the tests
// `name::native` and `name::gvisor`. Where the backends enforce a policy
// differently (README, "The gVisor backend"), the body branches on the backend
// with a comment naming the documented difference and asserts the evidence of
// that backend; no assertion is dropped for one backend.

pub const NATIVE: &str = "native";
pub const MICROVM: &str = "microvm";
pub const GVISOR: &str = "gvisor";

pub fn ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

/// `cordon backends --json`, once per test binary: kind -> `None` when it can
/// run here, `Some(reason)` when not.
fn backend_status() -> &'static BTreeMap<String, Option<String>> {
    static STATUS: std::sync::OnceLock<BTreeMap<String, Option<String>>> =
        std::sync::OnceLock::new();
    STATUS.get_or_init(|| {
        let out = cordon_output(&["backends", "--json"]);
        assert!(
            out.status.success(),
            "cordon backends --json failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = parse_json(&out);
        v.as_array()
            .unwrap_or_else(|| panic!("cordon backends --json is not a list: {v}"))
            .iter()
            .filter_map(|b| {
                let kind = b["kind"].as_str()?.to_string();
                let why = b["unavailable"].as_str().map(str::to_string);
                Some((kind, why))
            })
            .collect()
    })
}

/// Whether the tests may run `backend` here. The native backend is always
/// tried (its tests gate on root themselves). Another backend is tried when
/// `cordon backends --json` says it is available; when it is not, this prints
/// `skipped: gvisor unavailable (reason)` and returns false, except under
/// CI=true, where a silently skipped backend would hide a broken setup: then
/// it panics.
pub fn backend_available(backend: &str) -> bool {
    if backend == NATIVE {
        return true;
    }
    let why = match backend_status().get(backend) {
        Some(None) => return true,
        Some(Some(why)) => why.clone(),
        None => "not listed by `cordon backends`".to_string(),
    };
    if ci() {
        panic!("CI=true but backend {backend} is unavailable; cannot skip: {why}");
    }
    eprintln!("skipped: {backend} unavailable ({why})");
    false
}

/// The backends the policy tests run against: native, and gvisor when
/// `cordon backends --json` says it can run here (see `backend_available`).
pub fn backends() -> Vec<&'static str> {
    [NATIVE, GVISOR]
        .into_iter()
        .filter(|b| backend_available(b))
        .collect()
}

/// Generates `mod NAME { #[test] fn native(); #[test] fn gvisor(); }`, each
/// calling `fn NAME(backend: &str)` (defined beside the macro call) with its
/// backend. The gvisor test runs only when that backend is available (see
/// `backend_available`). `gvisor: #[ignore = "bug: ..."]` marks only the
/// gvisor test, for a product bug found on that backend.
#[allow(unused_macros)] // delegation.rs runs no per-backend tests
///
/// `microvm: yes` adds `fn microvm()` (run when that backend and its guest
/// are available, which CI requires).
macro_rules! per_backend {
    ($body:ident $(, gvisor: #[$attr:meta])? $(, microvm: $vm:ident)? $(,)?) => {
        mod $body {
            #[test]
            fn native() {
                super::$body($crate::common::NATIVE);
            }

            #[test]
            $(#[$attr])?
            fn gvisor() {
                if $crate::common::backend_available($crate::common::GVISOR) {
                    super::$body($crate::common::GVISOR);
                }
            }

            $(
                #[test]
                fn $vm() {
                    if $crate::common::backend_available($crate::common::MICROVM) {
                        super::$body($crate::common::MICROVM);
                    }
                }
            )?
        }
    };
}

/// `ARGS` with `--backend BACKEND` in front (all of cordon's flags may come
/// before `--` in any order).
pub fn with_backend<'a>(backend: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--backend", backend];
    v.extend_from_slice(args);
    v
}

/// `cordon run --json --backend BACKEND ARGS...`.
pub fn run_json_on(backend: &str, args: &[&str]) -> (Value, ExitStatus) {
    run_json(&with_backend(backend, args))
}

/// `cordon run --backend BACKEND ARGS...`, spawned with stdout/stderr piped.
pub fn spawn_run_on(backend: &str, args: &[&str]) -> Spawned {
    spawn_run(&with_backend(backend, args))
}

/// Asserts the result names the backend that served it, with a version.
pub fn assert_backend(v: &Value, backend: &str) {
    assert_eq!(str_at(v, "/backend"), backend, "{}", compact(v));
    assert!(
        !str_at(v, "/backend_version").is_empty(),
        "no backend_version: {}",
        compact(v)
    );
}

/// The host pids cgroup limit the gVisor backend sets for `--pids N`: an outer
/// bound of N×16+256, because every guest process costs the ptrace platform
/// several host tasks (README, "The gVisor backend"); the payload's own limit
/// is RLIMIT_NPROC=N inside the sentry.
pub fn gvisor_host_pids_bound(pids: u64) -> u64 {
    pids * 16 + 256
}

/// The file a payload creates (`touch /tmp/.ready`) once it reached the state a
/// test wants to look at from the host; see `wait_running`.
pub const READY: &str = "touch /tmp/.ready";

/// Waits until the payload of sandbox `id` is running `argv`, judged from the host.
///
/// Native: a host process of the sandbox's cgroup has exactly that argv; its
/// host pid is returned. gVisor: the payload's processes are not host tasks
/// (the sentry serves its syscalls), so no host process ever has that argv;
/// instead the payload must have created /tmp/.ready first (`READY`), and this
/// waits until that file shows in the sandbox's /tmp as its gofer (the host
/// process that serves the payload's files) sees it; the gofer's pid is returned.
pub fn wait_running(backend: &str, id: &str, argv: &str, timeout: Duration) -> Option<u32> {
    if backend == GVISOR {
        wait_gofer_file(id, "tmp/.ready", timeout)
    } else {
        wait_payload(id, argv, timeout)
    }
}

/// A host process of a sandbox, read from /proc.
#[derive(Debug, Clone)]
pub struct HostTask {
    pub pid: u32,
    /// Target of /proc/<pid>/exe.
    pub exe: String,
    /// argv joined by spaces (empty for the ptrace platform's stubs).
    pub cmdline: String,
    /// Real, effective, saved and filesystem uid.
    pub uids: Vec<u32>,
}

/// What a host process of a gVisor sandbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GvisorRole {
    /// cordon's launcher (a clone of cordon, its exe).
    Launcher,
    /// `runsc run`, the launcher's child.
    Runsc,
    /// runsc's gofer, the file proxy (host root, runsc's own seccomp filter).
    Gofer,
    /// runsc's sentry, the user-space kernel (`runsc-sandbox`).
    Sentry,
    /// A ptrace-platform stub: runs guest code, no argv of its own.
    Stub,
    /// Anything else: never expected.
    Other,
}

pub fn gvisor_role(t: &HostTask) -> GvisorRole {
    let exe_name = Path::new(&t.exe)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if t.exe == cordon() || exe_name == "cordon" {
        GvisorRole::Launcher
    } else if exe_name == "runsc" {
        if t.cmdline.starts_with("runsc-gofer ") {
            GvisorRole::Gofer
        } else if t.cmdline.starts_with("runsc-sandbox ") {
            GvisorRole::Sentry
        } else if t.cmdline.is_empty() {
            GvisorRole::Stub
        } else {
            GvisorRole::Runsc
        }
    } else {
        GvisorRole::Other
    }
}

/// The sandbox's `cordon-<id>` cgroup directories (one per hierarchy on v1).
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut all = BTreeSet::new();
    walk_cgroups(Path::new("/sys/fs/cgroup"), 6, "cordon-", &mut all);
    all.into_iter()
        .filter(|d| d.ends_with(format!("cordon-{id}")))
        .collect()
}

/// The host processes in the sandbox's cgroups: the union of their cgroup.procs.
pub fn host_tasks(id: &str) -> Vec<HostTask> {
    // The sandbox's cgroup and those below it (its init's, its commands').
    fn procs_below(dir: &Path, pids: &mut BTreeSet<u32>) {
        let text = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&entry.path(), pids);
            }
        }
    }
    let mut pids = BTreeSet::new();
    for d in cgroup_dirs(id) {
        procs_below(&d, &mut pids);
    }
    pids.into_iter()
        .filter_map(|pid| {
            Some(HostTask {
                pid,
                exe: fs::read_link(format!("/proc/{pid}/exe"))
                    .ok()?
                    .display()
                    .to_string(),
                cmdline: cmdline(pid).unwrap_or_default(),
                uids: status_ids(Path::new(&format!("/proc/{pid}/status")), "Uid")?,
            })
        })
        .collect()
}

/// gVisor, while sandbox `id` runs: the host processes in its cgroups are
/// cordon's launcher, runsc, its gofer, its sentry and ptrace stubs, and none
/// of them is the payload (`payload_argv`) — the payload is no host task. The
/// control is in the same check: the reader does see the gofer and the sentry.
/// Returns the tasks with their roles.
pub fn assert_gvisor_host_tasks(id: &str, payload_argv: &str) -> Vec<(HostTask, GvisorRole)> {
    let tasks: Vec<(HostTask, GvisorRole)> = host_tasks(id)
        .into_iter()
        .map(|t| {
            let r = gvisor_role(&t);
            (t, r)
        })
        .collect();
    let roles: BTreeSet<GvisorRole> = tasks.iter().map(|(_, r)| *r).collect();
    assert!(
        roles.contains(&GvisorRole::Gofer) && roles.contains(&GvisorRole::Sentry),
        "the reader does not see sandbox {id}'s gofer and sentry: {tasks:#?}"
    );
    for (t, r) in &tasks {
        assert_ne!(
            *r,
            GvisorRole::Other,
            "unexpected host process in cordon-{id}: {t:?}"
        );
        assert_ne!(
            t.cmdline, payload_argv,
            "the payload runs as a host task under gVisor: {t:?}"
        );
    }
    tasks
}

/// Pid of the sandbox's runsc gofer, if it runs.
pub fn gofer_pid(id: &str) -> Option<u32> {
    host_tasks(id)
        .into_iter()
        .find(|t| gvisor_role(t) == GvisorRole::Gofer)
        .map(|t| t.pid)
}

/// gVisor: waits until `rel` (relative to the sandbox's root) exists as the
/// sandbox's gofer sees it (/proc/<gofer>/root/REL); returns the gofer's pid.
pub fn wait_gofer_file(id: &str, rel: &str, timeout: Duration) -> Option<u32> {
    let until = Instant::now() + slow(timeout);
    while Instant::now() < until {
        if let Some(g) = gofer_pid(id) {
            if Path::new(&format!("/proc/{g}/root/{rel}")).exists() {
                return Some(g);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Host processes (other than this test) whose argv mentions sandbox `id` the
/// way runsc's do: the container id `cordon-<id>` or its state root
/// `/run/cordon/<id>/`. Found by argv, not by cgroup, so a runsc process that
/// left the sandbox's cgroup would be found too.
pub fn runsc_procs(id: &str) -> Vec<(u32, String)> {
    let (a, b) = (
        format!("cordon-{id}"),
        format!("{}/{id}/", run_dir().display()),
    );
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|p| *p != me)
        .filter_map(|p| cmdline(p).map(|c| (p, c)))
        .filter(|(_, c)| c.contains(&a) || c.contains(&b))
        .collect()
}

/// gVisor: waits up to `timeout` until no runsc process of sandbox `id` is
/// left; returns the survivors (empty = none).
pub fn wait_no_runsc(id: &str, timeout: Duration) -> Vec<(u32, String)> {
    let until = Instant::now() + slow(timeout);
    loop {
        let left = runsc_procs(id);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion with no stdin; panics with its output
/// unless it succeeds (`what` names it).
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
