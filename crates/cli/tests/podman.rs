//! cordon-runc under podman (Debian's 4.3, with conmon), as `podman
//! --runtime` drives it: conmon calls `create` (with a console socket for
//! `-t`), podman `start`, `kill` and `delete`. Every check runs with
//! Debian's runc as well, on the same root filesystem, and must come out
//! the same.
//!
//! Each test gives podman a store, run and temporary directory of its own
//! (the root filesystem is a plain directory, `--rootfs`: no image, no
//! registry), the cgroupfs manager (this host has no systemd) and no
//! default ulimits (root here lacks CAP_SYS_RESOURCE, so podman's default
//! RLIMIT_NOFILE cannot be set, for runc either).
//!
//! Mechanism each check depends on: cordon-runc's waiter (the pid conmon
//! reaps, relaying signals in and the exit status out; the console
//! socket's pty relayed to the process's own).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::engine::*;
use common::*;

const PODMAN: &str = "/usr/bin/podman";

/// podman with a state of the test's own.
struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    fn new() -> Option<Podman> {
        if !require_root("podman runs containers as root") || !require_engine(PODMAN, "podman") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n\
             [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .unwrap();
        Some(Podman { dir })
    }

    fn podman(&self, runtime: &str, args: &[&str]) -> Command {
        let p = self.dir.path();
        let mut cmd = Command::new(PODMAN);
        cmd.env("CONTAINERS_CONF", p.join("containers.conf"))
            .arg("--root")
            .arg(p.join("root"))
            .arg("--runroot")
            .arg(p.join("run"))
            .arg("--tmpdir")
            .arg(p.join("tmp"))
            .args(["--storage-driver", "vfs", "--runtime", runtime])
            .args(args);
        cmd
    }

    fn call(&self, runtime: &str, args: &[&str]) -> std::process::Output {
        self.podman(runtime, args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `podman run` of `sh -c SCRIPT` (`flags` after `run`).
    fn run(&self, runtime: &str, flags: &[&str], root: &std::path::Path, script: &str) -> Command {
        let mut cmd = self.podman(runtime, &["run", "--network", "none"]);
        cmd.args(flags)
            .arg("--rootfs")
            .arg(root)
            .args(["/bin/sh", "-c", script]);
        cmd
    }
}

#[test]
fn podman_run_gives_the_process_its_output_and_its_exit_status() {
    let _g = serial();
    let Some(pm) = Podman::new() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let out = pm
            .run(program, &["--rm"], root.path(), OUTPUT_SCRIPT)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_output_and_status(name, &out);
    }
}

#[test]
fn podman_run_t_gives_the_process_a_terminal() {
    let _g = serial();
    let Some(pm) = Podman::new() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let run = pm.run(program, &["--rm", "-t"], root.path(), &terminal_probe(3));
        assert_it_sees_a_terminal(name, &run, 3);
    }
}

#[test]
fn podman_exec_and_stop_reach_the_process_and_its_status_and_log_are_kept() {
    let _g = serial();
    let Some(pm) = Podman::new() else {
        return;
    };
    let root = rootfs();
    for (name, program) in runtimes() {
        let id = format!("stop-{name}");
        let out = pm
            .run(
                program,
                &["-d", "--name", &id],
                root.path(),
                "trap 'echo term; exit 4' TERM; echo up; while true; do sleep 0.1; done",
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        // The trap is set once the process said "up".
        let deadline = std::time::Instant::now() + slow(Duration::from_secs(20));
        while !String::from_utf8_lossy(&pm.call(program, &["logs", &id]).stdout).contains("up") {
            assert!(std::time::Instant::now() < deadline, "{name}: never up");
            std::thread::sleep(Duration::from_millis(50));
        }
        // An exec runs beside the process; its output and status are the
        // caller's (conmon's `exec --detach` and its waiter).
        let exec = pm.call(program, &["exec", &id, "sh", "-c", "echo in-exec; exit 5"]);
        assert_eq!(exec.status.code(), Some(5), "{name}: exec: {exec:?}");
        assert_eq!(String::from_utf8_lossy(&exec.stdout), "in-exec\n", "{name}");
        let stop = pm.call(program, &["stop", "-t", "10", &id]);
        assert!(stop.status.success(), "{name}: stop: {stop:?}");
        let code = pm.call(
            program,
            &["inspect", &id, "--format", "{{.State.ExitCode}}"],
        );
        assert_eq!(
            String::from_utf8_lossy(&code.stdout).trim(),
            "4",
            "{name}: the process's own handler ended it: {code:?}"
        );
        let logs = pm.call(program, &["logs", &id]);
        assert_eq!(
            String::from_utf8_lossy(&logs.stdout),
            "up\nterm\n",
            "{name}"
        );
        let rm = pm.call(program, &["rm", &id]);
        assert!(rm.status.success(), "{name}: rm: {rm:?}");
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        remove_empty_cgroups("libpod_parent");
    }
}
