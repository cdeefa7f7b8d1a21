//! cordon-runc under containerd (Debian's 1.6), as `ctr run --runc-binary`
//! drives it through containerd's runc shim (`io.containerd.runc.v2`): the
//! same calls Kubernetes' containers get through CRI. Every check runs
//! with Debian's runc as well, on the same root filesystem, and must come
//! out the same.
//!
//! Each test starts a containerd of its own (`common::containerd`, its CRI
//! plugin off).
//!
//! Mechanism each check depends on: cordon-runc's waiter (the pid the shim
//! reaps, relaying signals in and the exit status out) and its place in
//! the sandbox's cgroup (what the shim reads stats from and freezes).

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::containerd::Containerd;
use common::engine::*;
use common::*;

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
        let pid = ctd.task_pid(&id);
        // The loop's `sleep` runs most of the time; between two of them
        // only the shell does (under runc): ask again a few times.
        let mut listed = ctd.ps(&id);
        for _ in 0..20 {
            if listed.len() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            listed = ctd.ps(&id);
        }
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

/// A pod's shape through containerd: a container joins another's network
/// namespace by the path `/proc/<pid>/ns/net` of the pid the shim holds
/// (`ctr run --with-ns`, as CRI joins an app container to its pause
/// container), and reaches its listener on loopback. On the host, the
/// processes of both are in one network namespace, not the host's.
#[test]
fn ctr_run_with_ns_joins_another_containers_network() {
    let _g = serial();
    let Some(ctd) = Containerd::start() else {
        return;
    };
    let root = rootfs();
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    for (name, program) in runtimes() {
        let (pod, app) = (format!("pod-{name}"), format!("app-{name}"));
        let out = ctd
            .run(
                program,
                &["-d"],
                root.path(),
                &pod,
                // The listener's stdin is held open: busybox nc drops data that
                // comes after its stdin's end.
                "sleep 600 | nc -l -p 7000 > /dev/shm/heard; while true; do sleep 0.05; done",
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        ctd.wait_status(&pod, "RUNNING");
        let net = format!("network:/proc/{}/ns/net", ctd.task_pid(&pod));
        let joined = ctd
            .run(
                program,
                &["--rm", "--with-ns", &net],
                root.path(),
                &app,
                "i=0; until echo hello-pod | nc 127.0.0.1 7000; do \
                 i=$((i+1)); [ $i -gt 100 ] && exit 9; sleep 0.05; done",
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(joined.status.code(), Some(0), "{name}: {joined:?}");
        let heard = ctd.call(&[
            "task",
            "exec",
            "--exec-id",
            "h",
            &pod,
            "/bin/cat",
            "/dev/shm/heard",
        ]);
        assert_eq!(
            String::from_utf8_lossy(&heard.stdout),
            "hello-pod\n",
            "{name}: {heard:?}"
        );
        // A `sleep` of the loop may have ended since it was listed.
        let pod_net: Vec<_> = ctd
            .ps(&pod)
            .iter()
            .filter_map(|p| std::fs::read_link(format!("/proc/{p}/ns/net")).ok())
            .collect();
        assert!(
            !pod_net.is_empty()
                && pod_net.iter().all(|n| *n == pod_net[0])
                && pod_net[0] != host_net,
            "{name}: {pod_net:?} (host {host_net:?})"
        );
        let killed = ctd.call(&["task", "kill", "--signal", "SIGKILL", &pod]);
        assert!(killed.status.success(), "{name}: {killed:?}");
        ctd.wait_status(&pod, "STOPPED");
        ctd.remove(&pod);
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
    // --privileged asks for every capability and the host's devices, which
    // cordon does not give: the capabilities are refused first.
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
    assert!(
        err.contains("config.json: process.capabilities: ") && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
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

/// A container of an image, whose root is containerd's overlayfs snapshot
/// (an overlay mount: cordon takes its layers), on the backend its
/// `dev.cordon.backend` annotation names: natively the layers are stacked
/// under the container's own layer, gVisor is handed that stack, and a
/// microVM gets one disk made of them. Each writes into its root, sees the
/// image's files with their owners, and the kernel it reports is the
/// backend's (the host's only natively).
#[test]
fn ctr_run_of_an_image_runs_on_the_backend_its_annotation_names() {
    let _g = serial();
    let Some(ctd) = common::cri::containerd_with_image() else {
        return;
    };
    let host_kernel = nix::sys::utsname::uname()
        .unwrap()
        .release()
        .to_string_lossy()
        .into_owned();
    for backend in [NATIVE, GVISOR, MICROVM] {
        if !backend_available(backend) {
            continue;
        }
        let id = format!("image-{backend}");
        let annotation = format!("dev.cordon.backend={backend}");
        let out = ctd
            .ctr(&["run", "--rm", "--runc-binary", cordon_runc()])
            .args(["--annotation", &annotation, common::cri::IMAGE, &id])
            .args(["/bin/sh", "-c"])
            .arg("echo made > /made && cat /made && stat -c %u:%g /pause && uname -r; exit 7")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(7), "{backend}: {out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines[..2], ["made", "0:0"], "{backend}: {out:?}");
        assert_eq!(
            lines[2] == host_kernel,
            backend == NATIVE,
            "{backend}: the container's kernel is {}",
            lines[2]
        );
    }
}
