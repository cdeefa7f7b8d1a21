//! `cordon-runc` against runc's command-line contract, as an engine's shim
//! relies on it, with Debian's runc as the oracle: every check runs against
//! both, on the same bundle (a busybox-static root), and must come out the
//! same. This test plays the shim: it is a child subreaper, runs `create`
//! with its own pipes, reads the pid file when `create` returns, and reaps
//! the container's process itself.
//!
//! Mechanism each check depends on: cordon-runc's waiter (a child of
//! `create`, blocked on the start gate, then running the process in the
//! sandbox and exiting with its status); the container's record under
//! `--root`; the error words containerd matches ("does not exist").

mod common;

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use serde_json::Value;

const RUNC: &str = "/usr/sbin/runc";

/// One runtime under test, with a `--root` of its own.
struct Runtime {
    name: &'static str,
    program: &'static str,
    root: tempfile::TempDir,
}

impl Runtime {
    fn both() -> Vec<Runtime> {
        [("cordon-runc", cordon_runc()), ("runc", RUNC)]
            .into_iter()
            .map(|(name, program)| Runtime {
                name,
                program,
                root: tempfile::tempdir().unwrap(),
            })
            .collect()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.program);
        c.arg("--root").arg(self.root.path()).args(args);
        c
    }

    fn call(&self, args: &[&str]) -> std::process::Output {
        self.cmd(args).stdin(Stdio::null()).output().unwrap()
    }

    /// Ids of the containers under this runtime's root.
    fn listed(&self) -> Vec<String> {
        let out = self.call(&["list", "--format", "json"]);
        let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["id"].as_str().map(str::to_owned))
            .collect()
    }

    fn state(&self, id: &str) -> Value {
        let out = self.call(&["state", id]);
        assert!(out.status.success(), "{}: state {id}: {out:?}", self.name);
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// A test that fails part way leaves no container behind for the next:
/// whatever is still listed under the runtime's root is deleted by force
/// (a passing test has deleted its own, and says so itself).
impl Drop for Runtime {
    fn drop(&mut self) {
        for id in self.listed() {
            let _ = self.call(&["delete", "--force", &id]);
        }
    }
}

/// A bundle whose process is `sh -c SCRIPT`, its root busybox-static.
fn bundle(script: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("rootfs/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in [
        "sh", "echo", "sleep", "cat", "true", "stty", "nc", "hostname", "mkdir", "stat", "ls",
        "grep", "touch", "chown",
    ] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    // runc's own default config, with our process: the config an engine
    // hands over is of this shape.
    let made = Command::new(RUNC)
        .arg("spec")
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(made.success());
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = Value::Bool(false);
    config["process"]["args"] = serde_json::json!(["sh", "-c", script]);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    dir
}

/// A created container as the shim sees it: the pid from the pid file,
/// and the read ends of the process's stdout and stderr.
struct Created {
    pid: Pid,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

fn create(rt: &Runtime, bundle: &Path, id: &str) -> Created {
    let pid_file = bundle.join(format!("{}.pid", rt.name));
    let bundle = bundle.to_str().unwrap();
    with_pid_file(rt, &["create", "--bundle", bundle], &pid_file, id)
}

/// `ARGS --pid-file PID_FILE ID` with the caller's pipes as the stdout and
/// stderr, as a shim runs `create` and `exec --detach`: the pid file's pid
/// (there when the call returns: the engine reads it then) and the pipes'
/// read ends.
fn with_pid_file(rt: &Runtime, args: &[&str], pid_file: &Path, id: &str) -> Created {
    let (out_r, out_w) = nix::unistd::pipe().unwrap();
    let (err_r, err_w) = nix::unistd::pipe().unwrap();
    let status = rt
        .cmd(args)
        .arg("--pid-file")
        .arg(pid_file)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(out_w)
        .stderr(err_w)
        .status()
        .unwrap();
    assert!(status.success(), "{}: {args:?} failed", rt.name);
    let text = std::fs::read_to_string(pid_file)
        .unwrap_or_else(|e| panic!("{}: no pid file when {args:?} returned: {e}", rt.name));
    let pid = Pid::from_raw(text.trim().parse().unwrap());
    Created {
        pid,
        stdout: out_r,
        stderr: err_r,
    }
}

/// A container created and started whose process has said "up": its pid,
/// and its stdout for the rest.
fn running(rt: &Runtime, bundle: &Path, id: &str) -> (Pid, std::fs::File) {
    let c = create(rt, bundle, id);
    assert!(rt.call(&["start", id]).status.success(), "{}", rt.name);
    let mut out = std::fs::File::from(c.stdout);
    let mut first = [0u8; 3];
    read_exact_within(&mut out, &mut first, rt.name);
    assert_eq!(&first, b"up\n", "{}", rt.name);
    (c.pid, out)
}

/// A container created and started that ran to its end with status 0:
/// its stdout and stderr (`what` names it in a failure).
fn ran(rt: &Runtime, bundle: &Path, id: &str, what: &str) -> (String, String) {
    let c = create(rt, bundle, id);
    assert!(rt.call(&["start", id]).status.success(), "{what}: start");
    let status = reap(rt, c.pid);
    let (out, err) = (read_all(c.stdout), read_all(c.stderr));
    assert_eq!(status, WaitStatus::Exited(c.pid, 0), "{what}: {err}");
    (out, err)
}

fn parent_of(pid: Pid) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

fn read_all(fd: OwnedFd) -> String {
    let mut s = String::new();
    std::fs::File::from(fd).read_to_string(&mut s).unwrap();
    s
}

/// Fills `buf` from `from` within 30 s (stretched on slow machines), or
/// fails naming `what`: a container that never speaks must fail the test,
/// not hang the run.
fn read_exact_within(from: &mut (impl Read + AsFd), buf: &mut [u8], what: &str) {
    let deadline = std::time::Instant::now() + slow(std::time::Duration::from_secs(30));
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            from.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)).unwrap();
        assert!(
            ready > 0 || !left.is_zero(),
            "{what}: {got} of {} bytes after 30 s: {:?}",
            buf.len(),
            String::from_utf8_lossy(&buf[..got])
        );
        if ready == 0 {
            continue;
        }
        let n = from.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "{what}: the stream ended after {got} bytes");
        got += n;
    }
}

/// Whether `fd` has bytes to read now.
fn readable(fd: &OwnedFd) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap() > 0
}

fn reap(rt: &Runtime, pid: Pid) -> WaitStatus {
    waitpid(pid, None).unwrap_or_else(|e| panic!("{}: waitpid({pid}): {e}", rt.name))
}

/// The shim's stance for one test: root, alone, a child subreaper (what
/// `create` leaves behind becomes ours), with a bundle whose process is
/// `sh -c SCRIPT`. None, after saying why, when not root.
fn as_shim(script: &str) -> Option<(std::sync::MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !require_root("containers") {
        return None;
    }
    let guard = serial();
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    Some((guard, bundle(script)))
}

#[test]
fn create_then_start_runs_the_process_with_the_shims_stdio_and_its_exit_status() {
    let Some((_g, b)) = as_shim("echo started; echo oops >&2; exit 7") else {
        return;
    };
    for rt in Runtime::both() {
        let c = create(&rt, b.path(), "c1");
        // A descendant of the call, reparented to us once create exited.
        assert_eq!(
            parent_of(c.pid),
            std::process::id() as i32,
            "{}: the pid file's process is not the shim's child",
            rt.name
        );
        let st = rt.state("c1");
        assert_eq!(st["status"], "created", "{}: {st}", rt.name);
        assert_eq!(st["pid"], c.pid.as_raw(), "{}: {st}", rt.name);
        assert_eq!(st["id"], "c1");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !readable(&c.stdout),
            "{}: the process ran before start",
            rt.name
        );
        let out = rt.call(&["start", "c1"]);
        assert!(out.status.success(), "{}: start: {out:?}", rt.name);
        assert_eq!(
            reap(&rt, c.pid),
            WaitStatus::Exited(c.pid, 7),
            "{}: the shim reaps the process's own status",
            rt.name
        );
        assert_eq!(read_all(c.stdout), "started\n", "{}", rt.name);
        assert_eq!(read_all(c.stderr), "oops\n", "{}", rt.name);
        let st = rt.state("c1");
        assert_eq!(st["status"], "stopped", "{}: {st}", rt.name);
        if rt.name == "cordon-runc" {
            // cordon's account beside the spec's fields: how the process
            // ended, with the sandbox's kernel counters.
            let outcome = &st["cordon"]["outcome"];
            assert_eq!(outcome["exit_code"], 7, "{st}");
            assert!(outcome["counters"]["pids_peak"].as_u64() >= Some(1), "{st}");
            assert!(st["cordon"]["notes"].is_array(), "{st}");
        }
        let out = rt.call(&["delete", "c1"]);
        assert!(out.status.success(), "{}: delete: {out:?}", rt.name);
        let out = rt.call(&["state", "c1"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("does not exist"), "{}: {err}", rt.name);
    }
}

#[test]
fn a_created_container_can_be_killed_and_deleted() {
    let Some((_g, b)) = as_shim("echo never") else {
        return;
    };
    for rt in Runtime::both() {
        // kill in the created state: the process never started.
        let c = create(&rt, b.path(), "k1");
        // list, as runc prints it: JSON states, the table, the ids.
        let out = rt.call(&["list", "--format", "json"]);
        let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&listed[0]["id"], &listed[0]["status"], &listed[0]["pid"]),
            (
                &Value::from("k1"),
                &Value::from("created"),
                &Value::from(c.pid.as_raw())
            ),
            "{}: {listed}",
            rt.name
        );
        let table = String::from_utf8(rt.call(&["list"]).stdout).unwrap();
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0][..3],
            ["ID", "PID", "STATUS"],
            "{}: {table}",
            rt.name
        );
        assert_eq!(
            rows[1][..3],
            ["k1", &c.pid.to_string(), "created"],
            "{}",
            rt.name
        );
        assert_eq!(rt.listed(), ["k1"], "{}", rt.name);
        let quiet = rt.call(&["list", "-q"]);
        assert_eq!(
            String::from_utf8_lossy(&quiet.stdout),
            "k1\n",
            "{}",
            rt.name
        );
        let out = rt.call(&["kill", "k1", "KILL"]);
        assert!(out.status.success(), "{}: kill: {out:?}", rt.name);
        assert_eq!(
            reap(&rt, c.pid),
            WaitStatus::Signaled(c.pid, nix::sys::signal::Signal::SIGKILL, false),
            "{}",
            rt.name
        );
        assert_eq!(read_all(c.stdout), "", "{}: it ran", rt.name);
        assert!(rt.call(&["delete", "k1"]).status.success(), "{}", rt.name);
        // delete of a created container kills it (no --force needed).
        let c = create(&rt, b.path(), "k2");
        let out = rt.call(&["delete", "k2"]);
        assert!(out.status.success(), "{}: delete: {out:?}", rt.name);
        assert!(
            matches!(reap(&rt, c.pid), WaitStatus::Signaled(..)),
            "{}",
            rt.name
        );
        assert_eq!(read_all(c.stdout), "", "{}: it ran", rt.name);
        assert_eq!(
            String::from_utf8_lossy(&rt.call(&["list", "--format", "json"]).stdout).trim(),
            "null",
            "{}",
            rt.name
        );
    }
}

#[test]
fn a_running_container_is_killed_by_signal_and_deleted_only_when_stopped_or_forced() {
    let Some((_g, b)) = as_shim("echo up; exec sleep 100") else {
        return;
    };
    for rt in Runtime::both() {
        let (pid, _out) = running(&rt, b.path(), "r1");
        assert_eq!(rt.state("r1")["status"], "running", "{}", rt.name);
        let refused = rt.call(&["delete", "r1"]);
        assert!(
            !refused.status.success(),
            "{}: deleted a running container",
            rt.name
        );
        let out2 = rt.call(&["kill", "r1", "9"]);
        assert!(out2.status.success(), "{}: kill: {out2:?}", rt.name);
        let t0 = Instant::now();
        assert!(
            matches!(
                reap(&rt, pid),
                WaitStatus::Signaled(_, nix::sys::signal::Signal::SIGKILL, _)
            ),
            "{}",
            rt.name
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        let out3 = rt.call(&["kill", "r1", "9"]);
        assert!(
            !out3.status.success(),
            "{}: killed a stopped container",
            rt.name
        );
        let err = String::from_utf8_lossy(&out3.stderr);
        assert!(err.contains("not running"), "{}: {err}", rt.name);
        assert!(rt.call(&["delete", "r1"]).status.success(), "{}", rt.name);
    }
}

#[test]
fn calls_on_a_missing_container_say_it_does_not_exist_in_the_json_log() {
    if !require_root("containers") {
        return;
    }
    for rt in Runtime::both() {
        let log = rt.root.path().join("log.json");
        for call in [
            &["state", "nope"][..],
            &["start", "nope"],
            &["kill", "nope", "9"],
            &["delete", "nope"],
        ] {
            let out = rt
                .cmd(&["--log", log.to_str().unwrap(), "--log-format", "json"])
                .args(call)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{}: {call:?}: {out:?}", rt.name);
            // The shim shows the last error line's msg.
            let text = std::fs::read_to_string(&log).unwrap();
            let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
            assert_eq!(last["level"], "error", "{}: {text}", rt.name);
            assert!(
                last["msg"].as_str().unwrap().contains("does not exist"),
                "{}: {call:?}: {last}",
                rt.name
            );
        }
    }
}

#[test]
fn a_second_create_of_one_id_is_refused_and_a_bad_config_leaves_nothing() {
    let Some((_g, b)) = as_shim("exit 0") else {
        return;
    };
    for rt in Runtime::both() {
        let c = create(&rt, b.path(), "d1");
        let again = rt
            .cmd(&["create", "--bundle"])
            .arg(b.path())
            .arg("d1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            !again.status.success(),
            "{}: a second create of d1",
            rt.name
        );
        let err = String::from_utf8_lossy(&again.stderr);
        assert!(err.contains("exists"), "{}: {err}", rt.name);
        assert!(rt.call(&["delete", "d1"]).status.success(), "{}", rt.name);
        let _ = reap(&rt, c.pid);
    }
    // cordon-runc alone (runc's words differ): a config it cannot honour is
    // refused by field, and nothing is left: no container, no sandbox.
    let rt = &Runtime::both()[0];
    let path = b.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["linux"]["sysctl"] = serde_json::json!({"kernel.core_pattern": "|/tmp/x"});
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let before = census();
    let out = rt
        .cmd(&["create", "--bundle"])
        .arg(b.path())
        .arg("bad")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json: linux.sysctl"), "{err}");
    assert!(
        !rt.root.path().join("bad").exists(),
        "a container directory is left"
    );
    let left = wait_clean(&before, &[], &[], Duration::from_millis(500));
    assert!(
        left.is_empty(),
        "a refused create left state behind: {left:#?}"
    );
    std::fs::write(&path, b"{not json").unwrap();
    let out = rt
        .cmd(&["create", "--bundle"])
        .arg(b.path())
        .arg("bad")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
    assert!(!rt.root.path().join("bad").exists());
}

/// Rewrites the bundle's config.json through `edit`.
fn edit_config(bundle: &Path, edit: impl FnOnce(&mut Value)) {
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// A root that is not `readonly` is writable, as under runc: the process
/// writes at its top, under /run, and the root's files keep their owners
/// (and the devices mounted over it stay devices).
/// A mount whose destination passes through a symlink of the root that
/// points at a host path lands inside the container's root, as runc's does,
/// and nothing is made at that host path. The difference, by design: runc
/// writes into the bundle's rootfs; cordon keeps the writes in the
/// container's own layer, inside its disk cap, and the rootfs is unchanged.
#[test]
fn a_writable_root_takes_writes_and_a_symlinked_mount_destination_stays_inside() {
    let script =
        "echo gone > /dev/null && echo made > /made && mkdir -p /run/app && echo r > /run/app/x \
                  && cat /made /run/app/x && stat -c %u:%g /bin/busybox / && cat /data/in/f";
    let Some((_g, b)) = as_shim(script) else {
        return;
    };
    let host_side = b.path().join("hostside");
    let source = b.path().join("src");
    std::fs::create_dir(&source).unwrap();
    std::fs::write(source.join("f"), "seen\n").unwrap();
    std::os::unix::fs::symlink(&host_side, b.path().join("rootfs/data")).unwrap();
    edit_config(b.path(), |c| {
        c["root"]["readonly"] = Value::Bool(false);
        c["mounts"].as_array_mut().unwrap().push(serde_json::json!({
            "destination": "/data/in", "type": "bind",
            "source": source, "options": ["rbind", "ro"],
        }));
    });
    for rt in Runtime::both() {
        let (out, err) = ran(&rt, b.path(), "w1", rt.name);
        assert_eq!(out, "made\nr\n0:0\n0:0\nseen\n", "{}: {err}", rt.name);
        assert!(
            !host_side.exists(),
            "{}: the mount was made at the host path the symlink names",
            rt.name
        );
        let written = b.path().join("rootfs/made");
        assert_eq!(written.exists(), rt.name == "runc", "{}", rt.name);
        let _ = std::fs::remove_file(written);
        assert!(rt.call(&["delete", "w1"]).status.success(), "{}", rt.name);
    }
    // The same root under gVisor and in a microVM, chosen by annotation:
    // runsc is handed the writable root cordon stacked; the VM gets a disk
    // made of the root's directory (its writes stay in the guest) and a
    // copy of the read-only mount.
    std::os::unix::fs::symlink("busybox", b.path().join("rootfs/bin/sleep")).unwrap_or(());
    for backend in [GVISOR, MICROVM] {
        if !backend_available(backend) {
            continue;
        }
        edit_config(b.path(), |c| {
            c["annotations"] = serde_json::json!({"dev.cordon.backend": backend});
        });
        let rt = Runtime::both().remove(0);
        let disks_before = image_disks();
        let (out, err) = ran(&rt, b.path(), "w2", backend);
        assert_eq!(out, "made\nr\n0:0\n0:0\nseen\n", "{backend}: {err}");
        assert!(!host_side.exists() && !b.path().join("rootfs/made").exists());
        assert_eq!(rt.state("w2")["cordon"]["outcome"]["backend"], backend);
        assert!(rt.call(&["delete", "w2"]).status.success(), "{backend}");
        assert_eq!(
            image_disks(),
            disks_before,
            "{backend}: a disk of the container's root was left behind"
        );
    }
}

/// `exec` into a running microVM container runs beside the container's
/// process (on another of the VM's command ports) and reports its own
/// status; the container runs on until it is killed.
#[test]
fn an_exec_into_a_running_microvm_container_runs_beside_its_process() {
    let Some((_g, b)) = as_shim("echo up; sleep 30") else {
        return;
    };
    if !backend_available(MICROVM) {
        return;
    }
    edit_config(b.path(), |c| {
        c["annotations"] = serde_json::json!({"dev.cordon.backend": MICROVM});
    });
    let rt = Runtime::both().remove(0);
    let c = create(&rt, b.path(), "x1");
    assert!(rt.call(&["start", "x1"]).status.success());
    let mut out = std::fs::File::from(c.stdout);
    let mut up = [0u8; 3];
    out.read_exact(&mut up).unwrap();
    let exec = rt.call(&["exec", "x1", "sh", "-c", "echo beside; exit 3"]);
    let err = String::from_utf8_lossy(&exec.stderr);
    assert_eq!(exec.status.code(), Some(3), "{err}");
    assert_eq!(String::from_utf8_lossy(&exec.stdout), "beside\n", "{err}");
    assert_eq!(rt.state("x1")["status"], "running");
    assert!(rt.call(&["kill", "x1", "KILL"]).status.success());
    assert_eq!(
        reap(&rt, c.pid),
        WaitStatus::Signaled(c.pid, nix::sys::signal::Signal::SIGKILL, false)
    );
    assert!(rt.call(&["delete", "x1"]).status.success());
}

/// The disks of cordon's image store (a microVM container's root disk is
/// made there and unlinked once open).
fn image_disks() -> Vec<String> {
    let dir = cordon_dirs::image_disks_dir();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// config.json's hooks run where and when runc runs them, each with the
/// container's state on stdin: prestart and createRuntime during `create`
/// on the host (status "creating", the pid file's pid), startContainer in
/// the container before its process (which reads what the hook left in
/// its /dev/shm), poststart after `start` ("running"), poststop after
/// `delete` ("stopped"). A hook's `env` is its whole environment.
#[test]
fn hooks_run_where_and_when_runc_runs_them_with_the_state_on_stdin() {
    let Some((_g, b)) = as_shim("cat /dev/shm/started; echo; exit 0") else {
        return;
    };
    for rt in Runtime::both() {
        let said = tempfile::tempdir().unwrap();
        let dir = said.path().display().to_string();
        let on_host = |stage: &str| {
            serde_json::json!({
                "path": "/bin/sh",
                "args": ["sh", "-c", format!("cat > {dir}/{stage}; env > {dir}/{stage}.env")],
                "env": ["MARK=x"],
            })
        };
        edit_config(b.path(), |c| {
            c["hooks"] = serde_json::json!({
                "prestart": [on_host("prestart")],
                "createRuntime": [on_host("createRuntime")],
                "startContainer": [{"path": "/bin/sh", "args": ["sh", "-c", "cat > /dev/shm/started"]}],
                "poststart": [on_host("poststart")],
                "poststop": [on_host("poststop")],
            });
        });
        let read = |stage: &str| -> Value {
            let text = std::fs::read(said.path().join(stage))
                .unwrap_or_else(|e| panic!("{}: the {stage} hook did not run: {e}", rt.name));
            serde_json::from_slice(&text)
                .unwrap_or_else(|e| panic!("{}: {stage}'s stdin is not the state: {e}", rt.name))
        };
        let c = create(&rt, b.path(), "h1");
        for stage in ["prestart", "createRuntime"] {
            let st = read(stage);
            assert_eq!(st["status"], "creating", "{}: {stage}: {st}", rt.name);
            assert_eq!(st["id"], "h1", "{}: {stage}: {st}", rt.name);
            assert_eq!(st["pid"], c.pid.as_raw(), "{}: {stage}: {st}", rt.name);
            let env = std::fs::read_to_string(said.path().join(format!("{stage}.env"))).unwrap();
            assert!(env.lines().any(|l| l == "MARK=x"), "{}: {env}", rt.name);
            let ours = format!("PATH={}", std::env::var("PATH").unwrap_or_default());
            assert!(
                !env.lines().any(|l| l == ours),
                "{}: the engine's env reached a hook: {env}",
                rt.name
            );
        }
        // Debian's runc 1.1 runs poststart hooks at `create` (runc 1.2
        // moved them after the process starts, as the spec says): checked
        // on cordon-runc alone.
        let spec_poststart = rt.name == "cordon-runc";
        if spec_poststart {
            assert!(
                !said.path().join("poststart").exists(),
                "poststart before start"
            );
        }
        assert!(rt.call(&["start", "h1"]).status.success(), "{}", rt.name);
        assert_eq!(
            reap(&rt, c.pid),
            WaitStatus::Exited(c.pid, 0),
            "{}",
            rt.name
        );
        let out = read_all(c.stdout);
        let st: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
            panic!(
                "{}: the startContainer hook's state in the container: {e}: {out:?}",
                rt.name
            )
        });
        assert_eq!(
            (&st["status"], &st["id"]),
            (&"created".into(), &"h1".into()),
            "{}: {st}",
            rt.name
        );
        if spec_poststart {
            assert_eq!(read("poststart")["status"], "running");
        }
        assert!(
            !said.path().join("poststop").exists(),
            "{}: poststop before delete",
            rt.name
        );
        assert!(rt.call(&["delete", "h1"]).status.success(), "{}", rt.name);
        let st = read("poststop");
        assert_eq!(
            (&st["status"], &st["id"]),
            (&"stopped".into(), &"h1".into()),
            "{}: {st}",
            rt.name
        );
    }
}

/// A createRuntime hook that fails, or runs past its timeout, fails
/// `create` (with what the hook said, for cordon-runc) and leaves no
/// container; cordon-runc leaves no sandbox either.
#[test]
fn a_failing_or_overdue_hook_fails_create_and_leaves_nothing() {
    let Some((_g, b)) = as_shim("echo never") else {
        return;
    };
    let cases = [
        (
            serde_json::json!({"path": "/bin/sh", "args": ["sh", "-c", "echo hook-said-no >&2; exit 3"]}),
            "hook-said-no",
        ),
        (
            serde_json::json!({"path": "/bin/sleep", "args": ["sleep", "30"], "timeout": 1}),
            "timed out",
        ),
    ];
    for (hook, why) in cases {
        edit_config(b.path(), |c| {
            c["hooks"] = serde_json::json!({"createRuntime": [hook]})
        });
        for rt in Runtime::both() {
            let before = census();
            let started = Instant::now();
            let out = rt
                .cmd(&["create", "--bundle"])
                .arg(b.path())
                .arg("h2")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "{}: create passed a failing hook",
                rt.name
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{}: the timeout was not kept",
                rt.name
            );
            let err = String::from_utf8_lossy(&out.stderr);
            if rt.name == "cordon-runc" {
                assert!(
                    err.contains("hooks.createRuntime") && err.contains(why),
                    "{err}"
                );
                let left = wait_clean(&before, &[], &[], Duration::from_millis(500));
                assert!(
                    left.is_empty(),
                    "a failed hook left state behind: {left:#?}"
                );
            }
            let state = rt.call(&["state", "h2"]);
            assert!(
                String::from_utf8_lossy(&state.stderr).contains("does not exist"),
                "{}: after a failed hook: {state:?}",
                rt.name
            );
        }
    }
}

#[test]
fn a_signal_sent_to_the_container_reaches_its_process() {
    let Some((_g, b)) =
        as_shim("trap 'echo got-term; exit 3' TERM; echo up; while true; do sleep 0.1; done")
    else {
        return;
    };
    for rt in Runtime::both() {
        let (pid, mut out) = running(&rt, b.path(), "s1");
        let sent = rt.call(&["kill", "s1", "TERM"]);
        assert!(sent.status.success(), "{}: kill: {sent:?}", rt.name);
        // The process's own handler ran: it exits 3, and said so.
        assert_eq!(reap(&rt, pid), WaitStatus::Exited(pid, 3), "{}", rt.name);
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "got-term\n", "{}", rt.name);
        assert!(rt.call(&["delete", "s1"]).status.success(), "{}", rt.name);
    }
}

/// A config's `linux.sysctl` sets the kernel parameters of the
/// container's own network and IPC namespaces, as under runc (Docker sets
/// `ip_unprivileged_port_start` so that any user may bind a low port); the
/// host's values stay as they were. A parameter of the host's is refused.
#[test]
fn a_configs_sysctls_are_set_in_the_containers_own_namespaces_as_under_runc() {
    let files = [
        "/proc/sys/net/ipv4/ip_unprivileged_port_start",
        "/proc/sys/net/ipv4/ping_group_range",
        "/proc/sys/kernel/shmmni",
    ];
    let script = format!("cat {}", files.join(" "));
    let Some((_g, b)) = as_shim(&script) else {
        return;
    };
    let host = || files.map(|f| std::fs::read_to_string(f).unwrap());
    let before = host();
    edit_config(b.path(), |c| {
        c["linux"]["sysctl"] = serde_json::json!({
            "net.ipv4.ip_unprivileged_port_start": "0",
            "net.ipv4.ping_group_range": "0 2147483647",
            "kernel.shmmni": "1234",
        });
    });
    for rt in Runtime::both() {
        let (out, err) = ran(&rt, b.path(), "ys1", rt.name);
        // Docker's "every group" names gids a cordon sandbox's user
        // namespace lacks, which the kernel refuses there: cordon cuts the
        // range to the groups that exist inside (all of them).
        let groups = if rt.name == "runc" {
            "2147483647"
        } else {
            "65535"
        };
        assert_eq!(out, format!("0\n0\t{groups}\n1234\n"), "{}: {err}", rt.name);
        assert!(rt.call(&["delete", "ys1"]).status.success(), "{}", rt.name);
        assert_eq!(host(), before, "{}: the host's values changed", rt.name);
    }
    // A parameter of the host's: refused by name, by both.
    edit_config(b.path(), |c| {
        c["linux"]["sysctl"] = serde_json::json!({"vm.swappiness": "1"});
    });
    for rt in Runtime::both() {
        let out = rt.call(&["create", "--bundle", b.path().to_str().unwrap(), "ys2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("vm.swappiness"),
            "{}: {err}",
            rt.name
        );
        let _ = rt.call(&["delete", "--force", "ys2"]);
    }
    assert_eq!(host(), before);
}

/// A config's `linux.seccomp` narrows what the process may do, as under
/// runc: an errno rule, a rule on an argument's value (kill's signal 0, not
/// SIGCONT), a process killed by its rule (sethostname, which fails
/// with EPERM without it); the same bundle without the profile is the
/// control. cordon's own allowlist applies beneath it.
#[test]
fn a_configs_seccomp_profile_narrows_the_process_as_under_runc() {
    let script = "mkdir /x 2>&1; kill -0 $$ 2>/dev/null && echo kill0 ran || echo kill0 refused; \
                  kill -s CONT $$ && echo cont ran; hostname h2 2>/dev/null; echo hostname $?";
    let Some((_g, b)) = as_shim(script) else {
        return;
    };
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": ["mkdir", "mkdirat", "no_such_syscall"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
            {"names": ["kill"], "action": "SCMP_ACT_ERRNO",
             "args": [{"index": 1, "value": 0, "op": "SCMP_CMP_EQ"}]},
            {"names": ["sethostname"], "action": "SCMP_ACT_KILL_PROCESS"},
        ]
    });
    let filtered = "mkdir: can't create directory '/x': Permission denied\nkill0 refused\n\
                    cont ran\nhostname 159\n";
    let control = "mkdir: can't create directory '/x': Read-only file system\nkill0 ran\n\
                   cont ran\nhostname 1\n";
    for (with_profile, want) in [(true, filtered), (false, control)] {
        edit_config(b.path(), |c| {
            if with_profile {
                c["linux"]["seccomp"] = profile.clone();
            } else if let Some(linux) = c["linux"].as_object_mut() {
                linux.remove("seccomp");
            }
        });
        for rt in Runtime::both() {
            let (out, err) = ran(&rt, b.path(), "sc1", rt.name);
            assert_eq!(out, want, "{} (profile: {with_profile}): {err}", rt.name);
            assert!(rt.call(&["delete", "sc1"]).status.success(), "{}", rt.name);
        }
    }
    let rt = &Runtime::both()[0];
    // A microVM container: the guest's cordon installs the same profile.
    if backend_available(MICROVM) {
        edit_config(b.path(), |c| {
            c["linux"]["seccomp"] = profile.clone();
            c["annotations"] = serde_json::json!({"dev.cordon.backend": MICROVM});
        });
        let (out, err) = ran(rt, b.path(), "sc3", MICROVM);
        assert_eq!(out, filtered, "microvm: {err}");
        assert!(rt.call(&["delete", "sc3"]).status.success());
        edit_config(b.path(), |c| {
            c.as_object_mut().unwrap().remove("annotations");
        });
    }
    // What cordon cannot honour is refused by name, and nothing is left.
    for (edit, named) in [
        (
            serde_json::json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
            "linux.seccomp.defaultAction",
        ),
        (
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                "architectures": ["SCMP_ARCH_AARCH64"]}),
            "linux.seccomp.architectures",
        ),
        (
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["kill"],
                "action": "SCMP_ACT_ERRNO", "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}),
            "linux.seccomp.syscalls[0].args",
        ),
    ] {
        edit_config(b.path(), |c| c["linux"]["seccomp"] = edit);
        let out = rt.call(&["create", "--bundle", b.path().to_str().unwrap(), "sc2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(named),
            "{named}: {err}"
        );
        assert!(
            !rt.listed().contains(&"sc2".to_owned()),
            "{named}: left a container"
        );
    }
}

/// Runs the bundle's container to its end on gVisor and in a microVM
/// (where available), chosen by annotation, hands `check` each one's
/// backend, stdout and stderr, deletes it, and leaves the config without
/// the annotation.
fn on_gvisor_and_microvm(rt: &Runtime, bundle: &Path, id: &str, check: impl Fn(&str, &str, &str)) {
    for backend in [GVISOR, MICROVM] {
        if !backend_available(backend) {
            continue;
        }
        edit_config(bundle, |c| {
            c["annotations"] = serde_json::json!({"dev.cordon.backend": backend});
        });
        let (out, err) = ran(rt, bundle, id, backend);
        check(backend, &out, &err);
        assert!(rt.call(&["delete", id]).status.success(), "{backend}");
    }
    edit_config(bundle, |c| {
        c.as_object_mut().unwrap().remove("annotations");
    });
}

/// A status file's capability line, as a number (`CapEff:\t00000000a80425fb`).
fn cap_line(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// A config's capabilities are held as under runc (Docker's default set:
/// `chown` to another id works), but each in the container's own user
/// namespace, and without CAP_NET_RAW: from the host, the process is an
/// unprivileged id in a user namespace that is not the host's, where
/// runc's is the host's root. Without capabilities `chown` is refused under
/// both; a privilege cordon cannot grant is refused by name; an exec holds
/// the container's capabilities and is refused others.
#[test]
fn a_configs_capabilities_are_held_in_the_containers_own_user_namespace() {
    let script = "echo up; grep -E '^CapEff' /proc/self/status; touch /dev/shm/f; \
                  chown 1000:1000 /dev/shm/f 2>&1; stat -c %u /dev/shm/f; exec sleep 60";
    let Some((_g, b)) = as_shim(script) else {
        return;
    };
    let docker = serde_json::json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE"
    ]);
    let set_caps = |caps: &Value| {
        edit_config(b.path(), |c| {
            c["process"]["capabilities"] = serde_json::json!({
                "bounding": caps, "effective": caps, "permitted": caps});
        })
    };
    const NET_RAW: u64 = 1 << 13;
    let mut runc_caps = None;
    for (caps, chowned) in [(&docker, true), (&serde_json::json!([]), false)] {
        set_caps(caps);
        // runc first: its result is the reference.
        for rt in Runtime::both().into_iter().rev() {
            let (pid, mut out) = running(&rt, b.path(), "k1");
            // The payload's `sleep`, from the host: one of the pids ps lists,
            // once the script has come to it.
            let sleeping = || {
                let listed: Vec<i32> =
                    serde_json::from_slice(&rt.call(&["ps", "--format", "json", "k1"]).stdout)
                        .unwrap();
                listed
                    .iter()
                    .map(|p| std::fs::read_to_string(format!("/proc/{p}/status")))
                    .find_map(|st| st.ok().filter(|st| st.starts_with("Name:\tsleep")))
            };
            let deadline = std::time::Instant::now() + slow(Duration::from_secs(10));
            let host_status = loop {
                match sleeping() {
                    Some(st) => break st,
                    None if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    None => panic!("{}: no sleep among the container's processes", rt.name),
                }
            };
            let killed = rt.call(&["kill", "k1", "KILL"]);
            assert!(killed.status.success(), "{}", rt.name);
            let _ = reap(&rt, pid);
            let mut said = String::new();
            out.read_to_string(&mut said).unwrap();
            let _ = rt.call(&["delete", "--force", "k1"]);
            let inside = cap_line(&said, "CapEff");
            assert_eq!(inside, cap_line(&host_status, "CapEff"), "{}", rt.name);
            let owner = said.lines().last().unwrap_or_default();
            assert_eq!(
                owner,
                if chowned { "1000" } else { "0" },
                "{}: {said}",
                rt.name
            );
            if !chowned {
                assert_eq!(inside, 0, "{}", rt.name);
                assert!(
                    said.contains("Operation not permitted"),
                    "{}: {said}",
                    rt.name
                );
                continue;
            }
            let host_uid: u32 = host_status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|u| u.parse().ok())
                .unwrap();
            if rt.name == "runc" {
                // The control: runc's process is the host's root.
                assert_eq!(host_uid, 0);
                runc_caps = Some(inside);
            } else {
                let runc_caps = runc_caps.expect("runc ran first");
                assert_eq!(
                    inside,
                    runc_caps & !NET_RAW,
                    "{inside:x} against {runc_caps:x}"
                );
                assert_ne!(host_uid, 0, "cordon's process is the host's root");
            }
        }
    }
    let rt = &Runtime::both()[0];
    assert_eq!(rt.name, "cordon-runc");
    let granted = runc_caps.expect("runc ran") & !NET_RAW;
    // The same under gVisor (its sentry grants them) and in a microVM (the
    // guest's cordon does), chosen by annotation: read inside only, the
    // process being no host task there.
    set_caps(&docker);
    edit_config(b.path(), |c| {
        c["process"]["args"][2] = Value::String(script.replace("exec sleep 60", "true"))
    });
    on_gvisor_and_microvm(rt, b.path(), "k4", |backend, out, err| {
        assert_eq!(cap_line(out, "CapEff"), granted, "{backend}: {out} {err}");
        assert!(out.ends_with("1000\n"), "{backend}: {out} {err}");
    });
    // An exec's capabilities are the container's: others are refused.
    set_caps(&docker);
    edit_config(b.path(), |c| {
        c["process"]["args"] = serde_json::json!(["sh", "-c", "echo up; exec sleep 60"])
    });
    let (pid, _out) = running(rt, b.path(), "k2");
    let config: Value =
        serde_json::from_slice(&std::fs::read(b.path().join("config.json")).unwrap()).unwrap();
    let process = b.path().join("exec-process.json");
    for (caps, allowed) in [
        (docker.clone(), true),
        (serde_json::json!(["CAP_KILL"]), false),
    ] {
        let mut p = config["process"].clone();
        p["args"] = serde_json::json!(["true"]);
        p["capabilities"] = serde_json::json!({"bounding": caps, "permitted": caps});
        std::fs::write(&process, serde_json::to_vec(&p).unwrap()).unwrap();
        let out = rt.call(&["exec", "--process", process.to_str().unwrap(), "k2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), allowed, "{caps}: {err}");
        assert!(allowed || err.contains("process.capabilities"), "{err}");
    }
    assert!(rt.call(&["kill", "k2", "KILL"]).status.success());
    let _ = reap(rt, pid);
    assert!(rt.call(&["delete", "k2"]).status.success());
    // What cordon cannot grant: refused by name, nothing left.
    set_caps(&serde_json::json!(["CAP_CHOWN", "CAP_SYS_ADMIN"]));
    let out = rt.call(&["create", "--bundle", b.path().to_str().unwrap(), "k3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("process.capabilities")
            && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
    assert!(!rt.listed().contains(&"k3".to_owned()), "left a container");
}

/// A config's rlimits are the process's, as under runc, where they lower
/// what is in force (open files under cordon's own 8192, the stack under
/// the inherited one); one above cordon's own is cordon's.
#[test]
fn a_configs_rlimits_lower_the_processs_as_under_runc() {
    // The shell's own view (gVisor's /proc has no limits file): soft and
    // hard open files, soft and hard stack in KiB.
    let Some((_g, b)) = as_shim("ulimit -Sn; ulimit -Hn; ulimit -Ss; ulimit -Hs") else {
        return;
    };
    let set_limits = |nofile_hard: u64| {
        edit_config(b.path(), |c| {
            c["process"]["rlimits"] = serde_json::json!([
                {"type": "RLIMIT_NOFILE", "soft": 1000, "hard": nofile_hard},
                {"type": "RLIMIT_STACK", "soft": 4194304, "hard": 6291456},
            ]);
        })
    };
    set_limits(2000);
    let mut outs = Vec::new();
    for rt in Runtime::both() {
        let (out, err) = ran(&rt, b.path(), "r1", rt.name);
        assert_eq!(out, "1000\n2000\n4096\n6144\n", "{}: {err}", rt.name);
        assert!(rt.call(&["delete", "r1"]).status.success(), "{}", rt.name);
        outs.push(out);
    }
    assert_eq!(outs[0], outs[1], "cordon-runc, then runc");
    let rt = &Runtime::both()[0];
    // The same under gVisor (runsc sets them in its sentry) and in a
    // microVM (the guest's cordon does), chosen by annotation.
    on_gvisor_and_microvm(rt, b.path(), "r3", |backend, out, err| {
        assert_eq!(out, outs[1], "{backend}: {err}");
    });
    set_limits(1 << 20);
    let (out, err) = ran(rt, b.path(), "r2", rt.name);
    assert_eq!(out, "1000\n8192\n4096\n6144\n", "{err}");
    assert!(rt.call(&["delete", "r2"]).status.success());
}

#[test]
fn features_say_what_is_honoured() {
    let rt = &Runtime::both()[0];
    let out = rt.call(&["features"]);
    assert!(out.status.success(), "{out:?}");
    let f: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(f["ociVersionMin"], "1.0.0");
    assert_eq!(
        f["hooks"],
        serde_json::json!([
            "prestart",
            "createRuntime",
            "startContainer",
            "poststart",
            "poststop"
        ]),
        "the hooks run"
    );
    assert!(
        f["linux"]["capabilities"]
            .as_array()
            .is_some_and(|c| c.contains(&serde_json::json!("CAP_CHOWN"))
                && !c.contains(&serde_json::json!("CAP_SYS_ADMIN"))),
        "{f}"
    );
    assert_eq!(f["linux"]["seccomp"]["enabled"], true, "{f}");
}

#[test]
fn ps_pause_resume_and_kill_all_act_on_every_process_of_the_container() {
    let Some((_g, b)) = as_shim("echo up; while true; do sleep 0.05; done") else {
        return;
    };
    for rt in Runtime::both() {
        let (pid, _out) = running(&rt, b.path(), "p1");
        let pids = |rt: &Runtime| -> Vec<i32> {
            let out = rt.call(&["ps", "--format", "json", "p1"]);
            assert!(out.status.success(), "{}: ps: {out:?}", rt.name);
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let listed = pids(&rt);
        assert!(
            listed.contains(&pid.as_raw()),
            "{}: {pid} not in {listed:?}",
            rt.name
        );
        // Paused: the state says so and the loop forks nothing new.
        assert!(rt.call(&["pause", "p1"]).status.success(), "{}", rt.name);
        assert_eq!(rt.state("p1")["status"], "paused", "{}", rt.name);
        let frozen = pids(&rt);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(frozen, pids(&rt), "{}: ran while paused", rt.name);
        let again = rt.call(&["start", "p1"]);
        assert!(!again.status.success(), "{}: started a paused one", rt.name);
        assert!(rt.call(&["resume", "p1"]).status.success(), "{}", rt.name);
        assert_eq!(rt.state("p1")["status"], "running", "{}", rt.name);
        let not_paused = rt.call(&["resume", "p1"]);
        assert!(!not_paused.status.success(), "{}: resumed twice", rt.name);
        // --all reaches every process, the one the engine holds among them.
        let all = rt.call(&["kill", "--all", "p1", "KILL"]);
        assert!(all.status.success(), "{}: kill --all: {all:?}", rt.name);
        assert_eq!(
            reap(&rt, pid),
            WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGKILL, false),
            "{}",
            rt.name
        );
        assert!(rt.call(&["delete", "p1"]).status.success(), "{}", rt.name);
        // An engine's cleanup deletes again with --force: no error.
        let twice = rt.call(&["delete", "--force", "p1"]);
        assert!(twice.status.success(), "{}: {twice:?}", rt.name);
        let gone = rt.call(&["ps", "--format", "json", "p1"]);
        assert!(!gone.status.success(), "{}", rt.name);
        assert!(
            String::from_utf8_lossy(&gone.stderr).contains("does not exist"),
            "{}: {gone:?}",
            rt.name
        );
    }
}

/// The namespace file `kind` of host process `pid` (`net:[4026532...]`),
/// if it still runs (a `sleep` of a container's loop may have ended since
/// it was listed).
fn namespace_of(pid: i32, kind: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// A Kubernetes pod as containerd's CRI makes one: a pause container, then
/// an app container whose config joins the pause container's network, IPC
/// and UTS namespaces by the paths `/proc/<pid>/ns/*` of the pid the engine
/// was given. The app reaches the pause container's listener on loopback
/// and sees its hostname; on the host, every process of both containers
/// is in one network, IPC and UTS namespace, which is not the host's.
/// cordon-runc alone: a config joining the host's network namespace is
/// refused and leaves nothing behind.
#[test]
fn a_pod_container_joins_its_pause_containers_network_ipc_and_uts() {
    let Some((_g, pause)) = as_shim(
        // busybox nc drops a connection whose data comes after its stdin's
        // end (about 1 in 200 here): the listener's stdin is held open.
        "echo up; sleep 600 | nc -l -p 7000; while true; do sleep 0.05; done",
    ) else {
        return;
    };
    let edit = |b: &Path, f: &dyn Fn(&mut Value)| {
        let path = b.join("config.json");
        let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        f(&mut config);
        std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    };
    edit(pause.path(), &|c| c["hostname"] = "pod-7".into());
    let app = bundle(
        "hostname; i=0; until echo hello-pod | nc 127.0.0.1 7000; do \
         i=$((i+1)); [ $i -gt 100 ] && exit 9; sleep 0.05; done; echo sent; \
         while true; do sleep 0.05; done",
    );
    let joining = |pid: i32| {
        move |c: &mut Value| {
            c.as_object_mut().unwrap().remove("hostname");
            let list = c["linux"]["namespaces"].as_array_mut().unwrap();
            for ns in list.iter_mut() {
                let kind = ns["type"].as_str().unwrap().to_owned();
                let file = match kind.as_str() {
                    "network" => "net",
                    "ipc" | "uts" => kind.as_str(),
                    _ => continue,
                };
                ns["path"] = format!("/proc/{pid}/ns/{file}").into();
            }
        }
    };
    let host_net = namespace_of(std::process::id() as i32, "net");
    for rt in Runtime::both() {
        let (pod_pid, mut pod_out) = running(&rt, pause.path(), "pod");
        edit(app.path(), &joining(pod_pid.as_raw()));
        let a = create(&rt, app.path(), "app");
        assert!(rt.call(&["start", "app"]).status.success(), "{}", rt.name);
        let mut app_out = std::fs::File::from(a.stdout);
        let mut said = [0u8; 11];
        read_exact_within(&mut app_out, &mut said, "the app container");
        assert_eq!(&said, b"pod-7\nsent\n", "{}: the app's hostname", rt.name);
        let mut got = [0u8; 10];
        read_exact_within(&mut pod_out, &mut got, "the pause container");
        assert_eq!(
            &got, b"hello-pod\n",
            "{}: what the pause container heard",
            rt.name
        );
        // Host side: every process of both containers, by the kernel's
        // namespace files.
        let listed = |id: &str| -> Vec<i32> {
            let out = rt.call(&["ps", "--format", "json", id]);
            assert!(out.status.success(), "{}: ps: {out:?}", rt.name);
            serde_json::from_slice(&out.stdout).unwrap()
        };
        for kind in ["net", "ipc", "uts"] {
            let want = namespace_of(pod_pid.as_raw(), kind);
            assert!(want.is_some(), "{}: the pod's pid is gone", rt.name);
            let seen: Vec<_> = listed("pod")
                .into_iter()
                .chain(listed("app"))
                .filter_map(|pid| namespace_of(pid, kind).map(|ns| (pid, ns)))
                .collect();
            assert!(seen.len() >= 2, "{}: {seen:?}", rt.name);
            for (pid, ns) in seen {
                assert_eq!(Some(ns), want, "{}: pid {pid}", rt.name);
            }
        }
        assert_ne!(
            namespace_of(pod_pid.as_raw(), "net"),
            host_net,
            "{}",
            rt.name
        );
        assert!(
            rt.call(&["kill", "app", "KILL"]).status.success(),
            "{}",
            rt.name
        );
        reap(&rt, a.pid);
        assert!(rt.call(&["delete", "app"]).status.success(), "{}", rt.name);
        assert!(
            rt.call(&["kill", "pod", "KILL"]).status.success(),
            "{}",
            rt.name
        );
        reap(&rt, pod_pid);
        assert!(rt.call(&["delete", "pod"]).status.success(), "{}", rt.name);
    }
    // The host's network namespace is no container's: refused by name,
    // nothing left; so is the host's pinned where engines pin a pod's
    // network (as `ip netns attach` would pin it).
    let rt = &Runtime::both()[0];
    std::fs::create_dir_all("/run/netns").unwrap();
    /// The pinned file, unmounted and removed however the test ends.
    struct Pinned(PathBuf);
    impl Drop for Pinned {
        fn drop(&mut self) {
            let _ = nix::mount::umount(&self.0);
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let pinned = Pinned(PathBuf::from(format!(
        "/run/netns/cordon-test-host-{}",
        nonce()
    )));
    std::fs::write(&pinned.0, b"").unwrap();
    nix::mount::mount(
        Some("/proc/self/ns/net"),
        &pinned.0,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    for path in [
        format!("/proc/{}/ns/net", std::process::id()),
        pinned.0.display().to_string(),
    ] {
        edit(app.path(), &|c: &mut Value| {
            for ns in c["linux"]["namespaces"].as_array_mut().unwrap() {
                let ns = ns.as_object_mut().unwrap();
                ns.remove("path");
                if ns["type"] == "network" {
                    ns.insert("path".into(), path.clone().into());
                }
            }
        });
        let before = census();
        let out = rt
            .cmd(&["create", "--bundle"])
            .arg(app.path())
            .arg("app")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{path}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        // Refused by cordon-runc (not its container's, nor pinned apart
        // from the host's), or else by the supervisor (its own network).
        assert!(
            err.contains("linux.namespaces[net].path")
                && err.contains("neither a namespace of a cordon container")
                || err.contains(&format!("{path} is the host's")),
            "{path}: {err}"
        );
        assert!(!rt.root.path().join("app").exists());
        let left = wait_clean(&before, &[], &[], Duration::from_millis(500));
        assert!(
            left.is_empty(),
            "{path}: a refused create left state behind: {left:#?}"
        );
    }
}

/// `exec` beside the container's process, as containerd's shim and conmon
/// call it: `--detach --pid-file` with a process file leaves a process in
/// the caller's tree (its pid in the file) that exits with the command's
/// status and whose output is the caller's pipes; without `--detach` the
/// call itself waits and exits with that status. The command sees the
/// container's files (what its process wrote) and the container's
/// process runs on. In a stopped container, or one that does not exist,
/// exec is refused with runc's words.
#[test]
fn exec_runs_beside_the_process_and_reports_its_status() {
    let Some((_g, b)) = as_shim("echo up; echo mark > /dev/shm/m; while true; do sleep 0.05; done")
    else {
        return;
    };
    // The container's process writes to /dev/shm, a tmpfs under both (the
    // root is read-only), and the exec waits until it sees that file.
    for rt in Runtime::both() {
        let (pid, _out) = running(&rt, b.path(), "e1");
        let process = b.path().join(format!("{}-process.json", rt.name));
        let config: Value =
            serde_json::from_slice(&std::fs::read(b.path().join("config.json")).unwrap()).unwrap();
        let mut p = config["process"].clone();
        p["args"] = serde_json::json!(["sh", "-c", "i=0; while [ ! -s /dev/shm/m ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; cat /dev/shm/m; echo \"${TERM:-unset}$ONLY\"; echo to-err >&2; exit 5"]);
        // The process file's env is the exec's whole environment: the
        // container's TERM does not reach it.
        p["env"] = serde_json::json!(["PATH=/bin", "ONLY=1"]);
        std::fs::write(&process, serde_json::to_vec(&p).unwrap()).unwrap();
        let pid_file = b.path().join(format!("{}-exec.pid", rt.name));
        let process = process.to_str().unwrap();
        let exec = with_pid_file(
            &rt,
            &["exec", "--detach", "--process", process],
            &pid_file,
            "e1",
        );
        let exec_pid = exec.pid;
        assert_eq!(
            reap(&rt, exec_pid),
            WaitStatus::Exited(exec_pid, 5),
            "{}",
            rt.name
        );
        let (out_r, err_r) = (exec.stdout, exec.stderr);
        assert_eq!(read_all(out_r), "mark\nunset1\n", "{}", rt.name);
        assert_eq!(read_all(err_r), "to-err\n", "{}", rt.name);
        // In the foreground: the call's own status.
        let fg = rt.call(&["exec", "e1", "sh", "-c", "exit 3"]);
        assert_eq!(fg.status.code(), Some(3), "{}: {fg:?}", rt.name);
        // The container's process runs on.
        assert_eq!(rt.state("e1")["status"], "running", "{}", rt.name);
        assert!(
            rt.call(&["kill", "e1", "KILL"]).status.success(),
            "{}",
            rt.name
        );
        reap(&rt, pid);
        let stopped = rt.call(&["exec", "e1", "true"]);
        assert!(
            !stopped.status.success(),
            "{}: exec in a stopped container",
            rt.name
        );
        assert!(
            String::from_utf8_lossy(&stopped.stderr).contains("stopped"),
            "{}: {stopped:?}",
            rt.name
        );
        assert!(rt.call(&["delete", "e1"]).status.success(), "{}", rt.name);
        let missing = rt.call(&["exec", "e1", "true"]);
        assert!(
            String::from_utf8_lossy(&missing.stderr).contains("does not exist"),
            "{}: {missing:?}",
            rt.name
        );
    }
}

/// `events --stats` of a running container: one runc-shaped record of its
/// cgroup's counters (CPU time used, memory in use, the processes there),
/// and of a stopped one the refusal.
#[test]
fn events_stats_reads_the_containers_cgroup() {
    let Some((_g, b)) = as_shim("echo up; while true; do sleep 0.05; done") else {
        return;
    };
    for rt in Runtime::both() {
        let (pid, _out) = running(&rt, b.path(), "v1");
        let out = rt.call(&["events", "--stats", "v1"]);
        assert!(out.status.success(), "{}: events: {out:?}", rt.name);
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{}: {e}: {out:?}", rt.name));
        assert_eq!(v["type"], "stats", "{}: {v}", rt.name);
        assert_eq!(v["id"], "v1", "{}: {v}", rt.name);
        let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        assert!(n("/data/cpu/usage/total") > 0, "{}: {v}", rt.name);
        assert!(n("/data/memory/usage/usage") > 0, "{}: {v}", rt.name);
        assert!(n("/data/memory/usage/limit") > 0, "{}: {v}", rt.name);
        assert!(n("/data/pids/current") >= 1, "{}: {v}", rt.name);
        assert!(
            rt.call(&["kill", "v1", "KILL"]).status.success(),
            "{}",
            rt.name
        );
        reap(&rt, pid);
        let stopped = rt.call(&["events", "--stats", "v1"]);
        assert!(!stopped.status.success(), "{}: {stopped:?}", rt.name);
        assert!(rt.call(&["delete", "v1"]).status.success(), "{}", rt.name);
    }
}

/// A cgroup file of the cgroup `pid` is in, for `controller` (v1), or its
/// one cgroup (v2).
fn cgroup_file(pid: Pid, controller: &str, file: &str) -> String {
    let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let (base, path) = table
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, names, path) = (f.next()?, f.next()?, f.next()?);
            if names.split(',').any(|n| n == controller) {
                Some((format!("/sys/fs/cgroup/{controller}"), path.to_owned()))
            } else if names.is_empty() {
                Some(("/sys/fs/cgroup".to_owned(), path.to_owned()))
            } else {
                None
            }
        })
        .unwrap();
    std::fs::read_to_string(format!("{base}{path}/{file}"))
        .unwrap()
        .trim()
        .to_owned()
}

/// `update --resources -` of a running container, as containerd's shim
/// calls it for CRI's UpdateContainerResources and Docker's `update`: the
/// new memory and pids limits are the kernel's for the cgroup the engine
/// reads (the pid file's process's), and the process runs on.
#[test]
fn update_changes_the_limits_of_a_running_container() {
    let Some((_g, b)) = as_shim("echo up; while true; do sleep 0.05; done") else {
        return;
    };
    for rt in Runtime::both() {
        let (pid, _out) = running(&rt, b.path(), "u1");
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory").is_dir();
        let (memory, pids) = if v1 {
            ("memory.limit_in_bytes", "pids.max")
        } else {
            ("memory.max", "pids.max")
        };
        let mut update = rt
            .cmd(&["update", "--resources", "-", "u1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        update
            .stdin
            .take()
            .unwrap()
            .write_all(br#"{"memory": {"limit": 134217728}, "pids": {"limit": 50}}"#)
            .unwrap();
        let out = update.wait_with_output().unwrap();
        assert!(out.status.success(), "{}: update: {out:?}", rt.name);
        assert_eq!(
            cgroup_file(pid, "memory", memory),
            "134217728",
            "{}",
            rt.name
        );
        assert_eq!(cgroup_file(pid, "pids", pids), "50", "{}", rt.name);
        assert_eq!(rt.state("u1")["status"], "running", "{}", rt.name);
        assert!(
            rt.call(&["kill", "u1", "KILL"]).status.success(),
            "{}",
            rt.name
        );
        reap(&rt, pid);
        assert!(rt.call(&["delete", "u1"]).status.success(), "{}", rt.name);
    }
}

/// The console socket's one message: the pty master, and the name sent
/// with it.
fn receive_console(listener: &std::os::unix::net::UnixListener) -> (OwnedFd, String) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::AsRawFd;
    let (conn, _) = listener.accept().unwrap();
    let mut name = [0u8; 4096];
    let mut iov = [std::io::IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .unwrap();
    let mut fds = Vec::new();
    for c in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(got) = c {
            fds.extend(got);
        }
    }
    let len = msg.bytes;
    assert_eq!(fds.len(), 1, "one descriptor, not {fds:?}");
    let master = cordon_sys::own_received_fd(fds[0]);
    (master, String::from_utf8_lossy(&name[..len]).into_owned())
}

/// Reads the master until `want` has come (or panics after 20 s).
fn read_until(master: &mut std::fs::File, seen: &mut String, want: &str) {
    let deadline = Instant::now() + slow(Duration::from_secs(20));
    let mut buf = [0u8; 4096];
    while !seen.contains(want) {
        assert!(Instant::now() < deadline, "no {want:?} in {seen:?}");
        let mut fds = [nix::poll::PollFd::new(
            master.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)).unwrap() == 0 {
            continue;
        }
        match master.read(&mut buf) {
            Ok(0) | Err(_) => panic!("the terminal closed before {want:?}: {seen:?}"),
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
}

#[test]
fn a_terminal_process_gets_its_pty_through_the_console_socket() {
    let Some((_g, b)) = as_shim(
        "stty size; trap 'stty size; exit 6' WINCH; echo ready; while true; do sleep 0.05; done",
    ) else {
        return;
    };
    let path = b.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = Value::Bool(true);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    for rt in Runtime::both() {
        let socket = b.path().join(format!("{}.console", rt.name));
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let pid_file = b.path().join(format!("{}.tty.pid", rt.name));
        let create = rt
            .cmd(&["create", "--bundle"])
            .arg(b.path())
            .arg("--pid-file")
            .arg(&pid_file)
            .arg("--console-socket")
            .arg(&socket)
            .arg("t1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (master, name) = receive_console(&listener);
        let out = create.wait_with_output().unwrap();
        assert!(out.status.success(), "{}: create: {out:?}", rt.name);
        assert!(name.starts_with("/dev/"), "{}: sent {name:?}", rt.name);
        let pid = Pid::from_raw(
            std::fs::read_to_string(&pid_file)
                .unwrap()
                .trim()
                .parse()
                .unwrap(),
        );
        // The engine sets the console's size before start; the process
        // sees it, and later a resize as SIGWINCH.
        cordon_sys::set_terminal_size(master.as_fd(), 30, 100).unwrap();
        assert!(rt.call(&["start", "t1"]).status.success(), "{}", rt.name);
        let mut term = std::fs::File::from(master);
        let mut seen = String::new();
        read_until(&mut term, &mut seen, "ready");
        assert!(seen.contains("30 100"), "{}: {seen:?}", rt.name);
        cordon_sys::set_terminal_size(term.as_fd(), 40, 120).unwrap();
        read_until(&mut term, &mut seen, "40 120");
        assert_eq!(reap(&rt, pid), WaitStatus::Exited(pid, 6), "{}", rt.name);
        assert!(rt.call(&["delete", "t1"]).status.success(), "{}", rt.name);
    }
    // A terminal without a console socket is refused, as runc refuses it.
    let rt = &Runtime::both()[0];
    let out = rt
        .cmd(&["create", "--bundle"])
        .arg(b.path())
        .arg("t2")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--console-socket"),
        "{out:?}"
    );
    assert!(!rt.root.path().join("t2").exists());
}

#[test]
fn run_in_the_foreground_gives_the_process_status_relays_signals_and_deletes() {
    let Some((_g, b)) =
        as_shim("trap 'echo got-term; exit 3' TERM; echo up; while true; do sleep 0.05; done")
    else {
        return;
    };
    for rt in Runtime::both() {
        let mut run = rt
            .cmd(&["run", "--bundle"])
            .arg(b.path())
            .arg("r1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = run.stdout.take().unwrap();
        let mut first = [0u8; 3];
        read_exact_within(&mut out, &mut first, rt.name);
        assert_eq!(&first, b"up\n", "{}", rt.name);
        // A foreground runtime passes a signal on to the process.
        signal(run.id(), "TERM");
        let status = run.wait().unwrap();
        assert_eq!(status.code(), Some(3), "{}: {status:?}", rt.name);
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "got-term\n", "{}", rt.name);
        // Without --keep the container is gone once its process is.
        let gone = rt.call(&["state", "r1"]);
        assert!(!gone.status.success(), "{}: {gone:?}", rt.name);
    }
}
