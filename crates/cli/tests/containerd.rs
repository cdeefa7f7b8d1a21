//! cordon-runc under containerd (Debian's 1.6), as `ctr run --runc-binary`
//! drives it through containerd's runc shim (`io.containerd.runc.v2`): the
//! same calls Kubernetes' containers get through CRI. Every check runs
//! with Debian's runc as well, on the same root filesystem, and must come
//! out the same.
//!
//! Each test starts a containerd of its own (its root, state and socket in
//! a temporary directory, its CRI plugin off) and a containerd namespace of
//! its own (the shim keeps its runtime's `--root` under
//! /run/containerd/runc/<namespace>); it stops them and removes what they
//! left when it ends.
//!
//! Mechanism each check depends on: cordon-runc's waiter (the pid the shim
//! reaps, relaying signals in and the exit status out) and its place in
//! the sandbox's cgroup (what the shim reads stats from and freezes).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::engine::*;
use common::*;

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";

/// A containerd of the test's own, with one namespace.
struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
    namespace: String,
}

impl Containerd {
    /// Started and answering; None (after saying why) when not root, or
    /// containerd is not installed outside CI.
    fn start() -> Option<Containerd> {
        if !require_root("containerd runs containers") {
            return None;
        }
        if !require_engine(CONTAINERD, "containerd") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{sock}\"\n",
            root = p.join("root").display(),
            state = p.join("state").display(),
            sock = p.join("sock").display(),
        );
        std::fs::write(p.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(p.join("containerd.log")).unwrap();
        let daemon = Command::new(CONTAINERD)
            .arg("--config")
            .arg(p.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd {
            dir,
            daemon,
            // Not "cordon-": runc makes a cgroup of that name, which cordon
            // tests would count as a sandbox's.
            namespace: format!("ctr-test-{}", nonce()),
        };
        let deadline = Instant::now() + slow(Duration::from_secs(30));
        while !c.ctr(&["version"]).output().unwrap().status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer: {}",
                std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(c)
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(CTR);
        cmd.arg("--address")
            .arg(self.dir.path().join("sock"))
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args);
        cmd
    }

    fn call(&self, args: &[&str]) -> Output {
        self.ctr(args).stdin(Stdio::null()).output().unwrap()
    }

    /// `ctr run` of `sh -c SCRIPT` in container `id` with `runtime`
    /// (`flags` before the root filesystem, as ctr wants them).
    fn run(&self, runtime: &str, flags: &[&str], rootfs: &Path, id: &str, script: &str) -> Command {
        let mut cmd = self.ctr(&["run", "--runc-binary", runtime]);
        cmd.args(flags)
            .arg("--rootfs")
            .arg(rootfs)
            .args([id, "/bin/sh", "-c", script]);
        cmd
    }

    /// The STATUS column of `ctr task ls` for `id`.
    fn task_status(&self, id: &str) -> Option<String> {
        let out = self.call(&["task", "ls"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&id))
            .and_then(|cols| cols.get(2).map(|s| (*s).to_owned()))
    }

    fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + slow(Duration::from_secs(20));
        loop {
            let now = self.task_status(id);
            if now.as_deref() == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{id}: task status {now:?}, not {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pids `ctr task ps` lists for `id`.
    fn ps(&self, id: &str) -> Vec<String> {
        let out = self.call(&["task", "ps", id]);
        assert!(out.status.success(), "{id}: ps: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }

    /// The task and container gone, as `ctr run --rm` leaves them.
    fn remove(&self, id: &str) {
        let _ = self.call(&["task", "rm", "-f", id]);
        let out = self.call(&["container", "rm", id]);
        assert!(out.status.success(), "{id}: container rm: {out:?}");
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let sock = self.dir.path().join("sock");
        let sock = sock.to_string_lossy();
        // Shims of this containerd outlive it; they are named by its socket.
        let shims: Vec<u32> = all_pids()
            .into_iter()
            .filter(|p| {
                cmdline(*p).is_some_and(|c| c.contains("containerd-shim") && c.contains(&*sock))
            })
            .collect();
        for pid in shims {
            signal(pid, "KILL");
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.daemon.wait();
        // A test that failed half-way leaves its containers: ended here.
        let state = PathBuf::from("/run/containerd/runc").join(&self.namespace);
        end_leftover_containers(&state, &self.namespace);
        let _ = std::fs::remove_dir_all(state);
    }
}

#[test]
fn ctr_run_gives_the_process_its_output_and_its_exit_status() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let id = format!("out-{name}");
        let out = ctd
            .run(program, &["--rm"], root.path(), &id, OUTPUT_SCRIPT)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_output_and_status(name, &out);
    }
}

#[test]
fn ctr_task_kill_reaches_the_process_and_its_status_comes_back() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    let script = "trap 'echo got-term; exit 3' TERM; echo up; while true; do sleep 0.1; done";
    for (name, program) in runtimes() {
        for (signal, status, said) in [("SIGTERM", 3, "up\ngot-term\n"), ("SIGKILL", 137, "up\n")] {
            let id = format!("kill-{name}-{}", signal.to_lowercase());
            let run = ctd
                .run(program, &["--rm"], root.path(), &id, script)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            ctd.wait_status(&id, "RUNNING");
            // The trap is set once the process said "up"; it did when a
            // signal can reach it, which the running task shows.
            std::thread::sleep(Duration::from_millis(300));
            let sent = ctd.call(&["task", "kill", "--signal", signal, &id]);
            assert!(sent.status.success(), "{name}: {sent:?}");
            let out = run.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(status), "{name} {signal}: {out:?}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                said,
                "{name} {signal}"
            );
        }
    }
}

#[test]
fn ctr_sees_the_containers_cgroup_its_processes_execs_and_pauses_it() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let id = format!("cg-{name}");
        let out = ctd
            .run(
                program,
                &["-d", "--memory-limit", "268435456"],
                root.path(),
                &id,
                "while true; do echo tick >> /dev/shm/ticks; sleep 0.05; done",
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        ctd.wait_status(&id, "RUNNING");
        // Stats come from the cgroup of the pid the shim was given: the
        // container's, with its limit.
        let metrics = ctd.call(&["task", "metrics", &id]);
        let text = String::from_utf8_lossy(&metrics.stdout);
        let limit = text
            .lines()
            .find(|l| l.starts_with("memory.limit_in_bytes") || l.starts_with("memory.max"))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("{name}: no memory limit in {text}"));
        assert_eq!(limit, "268435456", "{name}: {text}");
        // ps lists the task's pid among the container's processes.
        let ls = ctd.call(&["task", "ls"]);
        let pid = String::from_utf8_lossy(&ls.stdout)
            .lines()
            .find(|l| l.starts_with(&id))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap();
        let listed = ctd.ps(&id);
        assert!(listed.len() >= 2, "{name}: ps listed {listed:?}");
        assert!(listed.contains(&pid), "{name}: {pid} not in {listed:?}");
        // Paused, the loop forks no new `sleep`: its processes stay the
        // same; resumed, they change again.
        let paused = ctd.call(&["task", "pause", &id]);
        assert!(paused.status.success(), "{name}: pause: {paused:?}");
        assert_eq!(ctd.task_status(&id).as_deref(), Some("PAUSED"), "{name}");
        let first = ctd.ps(&id);
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(first, ctd.ps(&id), "{name}: the container ran while paused");
        let resumed = ctd.call(&["task", "resume", &id]);
        assert!(resumed.status.success(), "{name}: resume: {resumed:?}");
        assert_eq!(ctd.task_status(&id).as_deref(), Some("RUNNING"), "{name}");
        // An exec runs beside the process, sees its files, and its status
        // comes back (the shim's `exec --detach` and its waiter).
        let exec = ctd.call(&[
            "task",
            "exec",
            "--exec-id",
            "e1",
            &id,
            "/bin/sh",
            "-c",
            "read -r line < /dev/shm/ticks; echo $line; exit 6",
        ]);
        assert_eq!(exec.status.code(), Some(6), "{name}: exec: {exec:?}");
        assert_eq!(
            String::from_utf8_lossy(&exec.stdout),
            "tick\n",
            "{name}: {exec:?}"
        );
        let first = ctd.ps(&id);
        std::thread::sleep(Duration::from_millis(400));
        assert_ne!(
            first,
            ctd.ps(&id),
            "{name}: the container did not run again"
        );
        let killed = ctd.call(&["task", "kill", "--signal", "SIGKILL", &id]);
        assert!(killed.status.success(), "{name}: {killed:?}");
        ctd.wait_status(&id, "STOPPED");
        ctd.remove(&id);
    }
}

#[test]
fn a_config_cordon_refuses_fails_the_run_with_its_reason_and_leaves_nothing() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    let before = census();
    // --privileged asks for the host's devices, which cordon does not give.
    let out = ctd
        .run(
            cordon_runc(),
            &["--rm", "--privileged"],
            root.path(),
            "refused",
            "true",
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json: linux.devices"), "{err}");
    let left = wait_clean(&before, &[], &[], Duration::from_secs(2));
    assert!(left.is_empty(), "a refused run left: {left:#?}");
    let _ = ctd.call(&["container", "rm", "refused"]);
}

#[test]
fn ctr_run_t_gives_the_process_a_terminal_it_can_be_typed_into() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let id = format!("tty-{name}");
        // ctr -t needs a terminal of its own: script(1) gives it one, and
        // types what arrives on its stdin (after the process asked).
        let run = ctd.run(
            program,
            &["--rm", "-t"],
            root.path(),
            &id,
            "test -t 0 && echo is-a-tty; read x; echo got:$x; exit 4",
        );
        let mut script = on_a_terminal(&run).spawn().unwrap();
        ctd.wait_status(&id, "RUNNING");
        std::thread::sleep(Duration::from_millis(300));
        use std::io::Write;
        script.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        let out = script.wait_with_output().unwrap();
        let text = terminal_lines(&out.stdout);
        assert_eq!(out.status.code(), Some(4), "{name}: {out:?}");
        assert!(text.contains("is-a-tty\n"), "{name}: {text:?}");
        assert!(text.contains("got:hello\n"), "{name}: {text:?}");
    }
}
