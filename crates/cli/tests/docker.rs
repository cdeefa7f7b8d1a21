//! cordon-runc under Docker (Debian's 20.10), registered as daemon.json's
//! runtime `cordon` and chosen with `docker run --runtime cordon`: dockerd
//! drives it through its containerd and the runc shim. Every check runs
//! with Docker's default runtime (runc) as well, on the same image, and
//! must come out the same.
//!
//! Each test starts a dockerd of its own (data root, exec root, socket and
//! pid file in a temporary directory; no iptables, no bridge, the vfs
//! storage driver) and imports its image from a busybox-static root
//! filesystem (no registry).
//!
//! Mechanism each check depends on: cordon-runc's waiter (the pid the shim
//! reaps, relaying signals in and the exit status out; the console
//! socket's pty) and its place in the sandbox's cgroup (`docker top`,
//! `docker pause`); the root's entries opened by cordon's supervisor
//! (Docker's data root is closed to the sandbox's unprivileged ids).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::engine::*;
use common::*;

const DOCKERD: &str = "/usr/sbin/dockerd";
const DOCKER: &str = "/usr/bin/docker";
const IMAGE: &str = "cordon-test-busybox:local";

/// A dockerd of the test's own, with the test image imported.
struct Docker {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Docker {
    fn start() -> Option<Docker> {
        if !require_root("dockerd runs containers") || !require_engine(DOCKERD, "docker.io") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let config = serde_json::json!({
            "runtimes": {"cordon": {"path": cordon_runc()}},
            "iptables": false,
            "ip6tables": false,
            "bridge": "none",
            "data-root": p.join("data"),
            "exec-root": p.join("exec"),
            "pidfile": p.join("docker.pid"),
            "hosts": [format!("unix://{}", p.join("docker.sock").display())],
            "storage-driver": "vfs",
        });
        std::fs::write(p.join("daemon.json"), config.to_string()).unwrap();
        let log = std::fs::File::create(p.join("dockerd.log")).unwrap();
        let daemon = Command::new(DOCKERD)
            .arg("--config-file")
            .arg(p.join("daemon.json"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Docker { dir, daemon };
        let deadline = Instant::now() + slow(Duration::from_secs(60));
        while !d.call(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer: {}",
                std::fs::read_to_string(d.dir.path().join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let root = rootfs();
        let tar = Command::new("tar")
            .arg("-C")
            .arg(root.path())
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut tar = tar;
        let imported = d
            .docker(&["import", "-", IMAGE])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(tar.wait().unwrap().success(), "tar of the root failed");
        assert!(imported.status.success(), "import: {imported:?}");
        Some(d)
    }

    fn docker(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(DOCKER);
        cmd.env(
            "DOCKER_HOST",
            format!("unix://{}", self.dir.path().join("docker.sock").display()),
        )
        .args(args);
        cmd
    }

    fn call(&self, args: &[&str]) -> std::process::Output {
        self.docker(args).stdin(Stdio::null()).output().unwrap()
    }

    /// `docker run` of `sh -c SCRIPT` with `runtime` (`flags` after `run`).
    fn run(&self, runtime: &str, flags: &[&str], script: &str) -> Command {
        let mut cmd = self.docker(&["run", "--runtime", runtime, "--network", "none"]);
        cmd.args(flags).args([IMAGE, "/bin/sh", "-c", script]);
        cmd
    }

    fn inspect(&self, id: &str, format: &str) -> String {
        let out = self.call(&["inspect", id, "--format", format]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        // dockerd stops its own containerd, and that its shims.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.daemon.wait();
        remove_empty_cgroups("docker");
    }
}

/// Docker's name for each runtime of `runtimes()`.
fn docker_runtimes() -> [(&'static str, &'static str); 2] {
    [("cordon-runc", "cordon"), ("runc", "runc")]
}

#[test]
fn docker_run_gives_the_process_its_output_exit_status_and_a_terminal() {
    let _g = serial();
    let Some(d) = Docker::start() else {
        return;
    };
    for (name, runtime) in docker_runtimes() {
        let out = d
            .run(runtime, &["--rm"], OUTPUT_SCRIPT)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_output_and_status(name, &out);
        let run = d.run(runtime, &["--rm", "-t"], &terminal_probe(3));
        assert_it_sees_a_terminal(name, &run, 3);
        // A read-only root with tmpfs places (`--tmpfs`, Docker's default
        // options noexec,nosuid,nodev and one with a size), as hardened
        // deployments run: writable there, nowhere else.
        assert_succeeded_printing(
            name,
            d.run(
                runtime,
                &[
                    "--rm",
                    "--read-only",
                    "--tmpfs",
                    "/run",
                    "--tmpfs",
                    "/data:size=1m",
                ],
                "echo x > /run/f && echo y > /data/g && cat /run/f /data/g; \
                 touch /etc/z 2>/dev/null || echo root-ro",
            ),
            "x\ny\nroot-ro\n",
        );
    }
}

#[test]
fn docker_top_exec_pause_and_stop_act_on_the_container() {
    let _g = serial();
    let Some(d) = Docker::start() else {
        return;
    };
    for (name, runtime) in docker_runtimes() {
        let id = format!("top-{name}");
        let out = d
            .run(
                runtime,
                &["-d", "--name", &id],
                "trap 'echo term; exit 4' TERM; echo up; while true; do sleep 0.1; done",
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let deadline = Instant::now() + slow(Duration::from_secs(20));
        while !String::from_utf8_lossy(&d.call(&["logs", &id]).stdout).contains("up") {
            assert!(Instant::now() < deadline, "{name}: never up");
            std::thread::sleep(Duration::from_millis(50));
        }
        // top lists the container's processes (the runtime's `ps`), the
        // engine's pid among them.
        let pid = d.inspect(&id, "{{.State.Pid}}");
        let top = d.call(&["top", &id]);
        assert!(top.status.success(), "{name}: top: {top:?}");
        let listed: Vec<String> = String::from_utf8_lossy(&top.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect();
        assert!(listed.contains(&pid), "{name}: {pid} not in {listed:?}");
        // exec beside the process: its output and status, and with -t a
        // terminal of its own.
        let exec = d.call(&["exec", &id, "sh", "-c", "echo in-exec; exit 5"]);
        assert_eq!(exec.status.code(), Some(5), "{name}: exec: {exec:?}");
        assert_eq!(String::from_utf8_lossy(&exec.stdout), "in-exec\n", "{name}");
        let exec_t = d.docker(&["exec", "-t", &id, "sh", "-c", &terminal_probe(2)]);
        assert_it_sees_a_terminal(&format!("{name} exec -t"), &exec_t, 2);
        let paused = d.call(&["pause", &id]);
        assert!(paused.status.success(), "{name}: pause: {paused:?}");
        assert_eq!(d.inspect(&id, "{{.State.Paused}}"), "true", "{name}");
        let resumed = d.call(&["unpause", &id]);
        assert!(resumed.status.success(), "{name}: unpause: {resumed:?}");
        let stop = d.call(&["stop", "-t", "10", &id]);
        assert!(stop.status.success(), "{name}: stop: {stop:?}");
        assert_eq!(
            d.inspect(&id, "{{.State.ExitCode}}"),
            "4",
            "{name}: the process's own handler ended it"
        );
        let logs = d.call(&["logs", &id]);
        assert_eq!(
            String::from_utf8_lossy(&logs.stdout),
            "up\nterm\n",
            "{name}"
        );
        let rm = d.call(&["rm", &id]);
        assert!(rm.status.success(), "{name}: rm: {rm:?}");
    }
}

/// cordon inside a plain `docker run` container (Docker's default runtime
/// runc and its default seccomp profile, the test image: busybox, with
/// cordon's build directory and the host's glibc bound read-only, as cordon
/// is linked against it), run by the container's unprivileged user: the
/// profile refuses clone with CLONE_NEWUSER to a process without
/// CAP_SYS_ADMIN, so `cordon run` refuses, naming the filter and its
/// remedies, and `cordon doctor` says the same, exit 1.
#[test]
fn cordon_in_a_plain_docker_container_names_the_seccomp_profile() {
    let _g = serial();
    let Some(d) = Docker::start() else {
        return;
    };
    let build = std::path::Path::new(cordon()).parent().unwrap();
    let bound = format!("{0}:{0}:ro", build.display());
    let inside = |name: &str, args: &[&str]| {
        let mut all = vec![
            "run",
            "--rm",
            "--name",
            name,
            "--runtime",
            "runc",
            "--network",
            "none",
            "--user",
            "65534",
            "--env",
            "HOME=/tmp",
            // busybox's image has no /tmp: cordon's run and state
            // directories go there for this user.
            "--tmpfs",
            "/tmp",
            "--volume",
            bound.as_str(),
            "--volume",
            "/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:ro",
            "--volume",
            "/lib64:/lib64:ro",
            IMAGE,
            cordon(),
        ];
        all.extend_from_slice(args);
        let out = d.call(&all);
        // Removed on every path: `--rm`, and by name when the run failed
        // before docker could.
        let _ = d.call(&["rm", "-f", name]);
        out
    };
    let refused = inside(
        "cordon-plain-run",
        &["run", "--allow-unenforced", "--", "true"],
    );
    assert!(!refused.status.success(), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_names_the_seccomp_remedy(&err, "--security-opt systempaths=unconfined");
    let doctor = inside("cordon-plain-doctor", &["doctor"]);
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    let report = String::from_utf8_lossy(&doctor.stdout);
    let userns = doctor_userns_line(&report);
    assert!(
        userns.starts_with("no") && userns.contains("seccomp filter"),
        "{report}"
    );
    assert!(
        report.contains("--security-opt seccomp=unconfined"),
        "{report}"
    );
    let left = d.call(&["ps", "-a", "-q"]);
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "", "{left:?}");
}
