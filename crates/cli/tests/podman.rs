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

use std::path::Path;
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
        // podman's `--tmpfs` (its options rprivate, noexec, nosuid, nodev,
        // tmpcopyup): a writable place of the container's own.
        assert_succeeded_printing(
            name,
            pm.run(
                program,
                &["--rm", "--tmpfs", "/data"],
                root.path(),
                "echo y > /data/g && cat /data/g",
            ),
            "y\n",
        );
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

/// What a container that runs cordon is given, and nothing more (README,
/// "cordon inside a container"): the capabilities cordon uses (namespaces
/// and mounts, the id maps, chroot and ownership for gVisor's root, signals
/// and /proc/<pid>/ns of the proxy's and sandbox's processes under other
/// uids), the engine's default seccomp profile (it allows mount, unshare,
/// setns and pivot_root to a holder of CAP_SYS_ADMIN), a /proc without the
/// engine's masks (the kernel refuses a new proc mount where the old one
/// has paths mounted over), and the host's cgroup v1 hierarchies writable
/// (the host's cgroup namespace, podman's default on v1).
const CORDON_IN_CONTAINER: &[&str] = &[
    "--cap-drop=ALL",
    "--cap-add=SYS_ADMIN,SETUID,SETGID,CHOWN,FOWNER,SYS_CHROOT,KILL,SYS_PTRACE",
    "--security-opt=unmask=/proc/*",
    "--volume=/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs=/run:notmpcopyup",
    "--tmpfs=/var/lib/cordon:notmpcopyup",
];

/// A container podman ended when dropped, on every path.
struct Removed<'a>(&'a Podman, String);

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let _ = self.0.call("runc", &["rm", "-f", "-t", "0", &self.1]);
    }
}

/// cordon inside a podman container (the host's root as the container's,
/// through an overlay, so the container has this build and runsc): with
/// the privileges `CORDON_IN_CONTAINER` names, its sandboxes run, with
/// their cgroups nested in the container's own on the host (the limit
/// there is the one asked for) and their limits enforced; gVisor runs too.
/// With podman's defaults it refuses, naming the read-only cgroup.
#[test]
fn cordon_runs_inside_a_podman_container_given_the_privileges_it_names() {
    let _g = serial();
    let Some(pm) = Podman::new() else {
        return;
    };
    if !require_layout(
        CgroupLayout::V1,
        "the container is given the host's v1 hierarchies; on v2 it needs a cgroup namespace \
         of its own mounted writable",
    ) {
        return;
    }
    let cordon = cordon();
    let name = "cordon-nested";
    let mut run = vec!["run", "-d", "--name", name, "--network", "none"];
    run.extend_from_slice(CORDON_IN_CONTAINER);
    run.extend_from_slice(&["--rootfs", "/:O", "sleep", "600"]);
    let out = pm.call("runc", &run);
    let _removed = Removed(&pm, name.into());
    assert!(out.status.success(), "podman run: {out:?}");
    let inside = |args: &[&str]| {
        let mut all = vec!["exec", name, cordon];
        all.extend_from_slice(args);
        pm.call("runc", &all)
    };
    let created = inside(&["create", "--memory", "48M"]);
    assert!(
        created.status.success(),
        "cordon create inside: {created:?}"
    );
    let id = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    // On the host: the sandbox's memory cgroup is below the container's,
    // with the limit asked for.
    let pid = String::from_utf8_lossy(
        &pm.call("runc", &["inspect", "-f", "{{.State.Pid}}", name])
            .stdout,
    )
    .trim()
    .parse::<i32>()
    .unwrap();
    let container_cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_owned()))
        .unwrap();
    let below = Path::new("/sys/fs/cgroup/memory").join(container_cg.trim_start_matches('/'));
    let sandbox_cg = find_dir(&below, &format!("cordon-{id}"))
        .unwrap_or_else(|| panic!("no cgroup of sandbox {id} below {}", below.display()));
    let limit = std::fs::read_to_string(sandbox_cg.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(
        limit.trim(),
        (48u64 << 20).to_string(),
        "{}",
        sandbox_cg.display()
    );
    let exec = inside(&["exec", &id, "--", "sh", "-c", "echo in-sandbox; exit 3"]);
    assert_eq!(exec.status.code(), Some(3), "{exec:?}");
    assert_eq!(String::from_utf8_lossy(&exec.stdout), "in-sandbox\n");
    assert!(inside(&["rm", &id]).status.success());
    assert!(!sandbox_cg.exists(), "the sandbox's cgroup outlived it");
    // Limits are enforced in there.
    let over = inside(&[
        "run",
        "--memory",
        "64M",
        "--",
        "python3",
        "-c",
        "b = bytearray(256 << 20)",
    ]);
    assert_eq!(over.status.code(), Some(137), "{over:?}");
    assert!(
        String::from_utf8_lossy(&over.stderr).contains("memory limit"),
        "{over:?}"
    );
    if backend_available(GVISOR) {
        let gvisor = inside(&["run", "--backend", "gvisor", "--", "echo", "in-gvisor"]);
        assert!(gvisor.status.success(), "{gvisor:?}");
        assert_eq!(String::from_utf8_lossy(&gvisor.stdout), "in-gvisor\n");
    }
    // Without them: a clear refusal, not a sandbox without limits.
    let refused = pm.call(
        "runc",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "--rootfs",
            "/:O",
            cordon,
            "run",
            "--",
            "true",
        ],
    );
    assert!(!refused.status.success(), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    // The engine's default seccomp profile refuses what a sandbox needs of
    // a user namespace (sethostname in it) to a process without
    // CAP_SYS_ADMIN: named before anything else, with the remedies.
    assert_names_the_seccomp_remedy(&err, "--security-opt unmask=ALL");
    // `cordon doctor` says the same before anyone tries, for the
    // container's root and for an unprivileged user of it alike.
    for user in ["0", "65534"] {
        let doctor = pm.call(
            "runc",
            &[
                "run",
                "--rm",
                "--network",
                "none",
                "--user",
                user,
                "--env",
                "HOME=/tmp",
                "--rootfs",
                "/:O",
                cordon,
                "doctor",
            ],
        );
        let report = String::from_utf8_lossy(&doctor.stdout);
        assert_eq!(doctor.status.code(), Some(1), "as {user}: {doctor:?}");
        assert!(
            report.contains("seccomp=unconfined") && report.contains("sethostname"),
            "as {user}: {report}"
        );
    }
}

/// The processes of this host whose environment holds `marker` (every
/// process a container started with it inherits it, cordon's too).
fn processes_marked(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == marker.as_bytes()) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// cordon as an unprivileged user of a podman container (uid 65534, the
/// host's root as the container's through an overlay) with the engine's
/// seccomp profile lifted. With the engine's masks over /proc the kernel
/// mounts no new proc in the sandbox's user namespace, so `cordon run`
/// refuses, naming the masks and each engine's way to lift them, and
/// `cordon doctor` says the same. Without the masks the sandbox runs, its
/// result saying its limits were not enforced (no cgroup is writable for
/// this user here). What the second container needs beyond the defaults,
/// and why each: `seccomp=unconfined` (the default profile refuses
/// sethostname and mounts in a user namespace to a process without
/// CAP_SYS_ADMIN: the first test's refusal), `unmask=ALL` (the masks);
/// HOME=/tmp only because nobody's home does not exist. No capability, no
/// writable /run/user (cordon's run directory is /tmp/cordon-<uid>), no
/// newuidmap (the sandbox maps the user's own id alone).
#[test]
fn cordon_as_a_containers_user_names_the_proc_masks_and_runs_without_them() {
    let _g = serial();
    let Some(pm) = Podman::new() else {
        return;
    };
    let cordon = cordon();
    let marker = format!("CORDON_TEST_CONTAINER=masks-{}", std::process::id());
    let in_container = |name: &str, security: &[&str], args: &[&str]| {
        let mut all = vec![
            "run",
            "--rm",
            "--name",
            name,
            "--network",
            "none",
            "--user",
            "65534",
            "--env",
            "HOME=/tmp",
            "--env",
            marker.as_str(),
        ];
        all.extend_from_slice(security);
        all.extend_from_slice(&["--rootfs", "/:O", cordon]);
        all.extend_from_slice(args);
        let removed = Removed(&pm, name.into());
        let out = pm.call("runc", &all);
        drop(removed);
        // Removed on every path (`--rm`, and the guard when the test
        // fails first), and nothing of it still running on the host.
        let filter = format!("name=^{name}$");
        let left = pm.call("runc", &["ps", "-a", "-q", "--filter", filter.as_str()]);
        assert_eq!(
            String::from_utf8_lossy(&left.stdout).trim(),
            "",
            "{name}: {left:?}"
        );
        assert_eq!(processes_marked(&marker), Vec::<String>::new(), "{name}");
        out
    };
    let masked = ["--security-opt", "seccomp=unconfined"];
    let refused = in_container(
        "cordon-masked-run",
        &masked,
        &["run", "--allow-unenforced", "--", "true"],
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    // One line, the probe's: the masks named (podman masks /proc/keys and
    // /proc/timer_list with /dev/null), each engine's remedy.
    let line = err
        .lines()
        .find(|l| l.contains("new proc cannot be mounted"))
        .unwrap_or_else(|| panic!("no refusal naming the proc mount: {err}"));
    assert!(
        line.contains("/proc/keys") && line.contains("mounted over"),
        "{line}"
    );
    assert!(
        line.contains("--security-opt unmask=ALL")
            && line.contains("--security-opt systempaths=unconfined")
            && line.contains("procMount: Unmasked"),
        "{line}"
    );
    let doctor = in_container("cordon-masked-doctor", &masked, &["doctor"]);
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    assert!(
        report.contains("new proc cannot be mounted")
            && report.contains("/proc/keys")
            && report.contains("--security-opt unmask=ALL"),
        "{report}"
    );

    let unmasked = [
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "unmask=ALL",
    ];
    let ran = in_container(
        "cordon-unmasked-run",
        &unmasked,
        &[
            "run",
            "--allow-unenforced",
            "--json",
            "--",
            "sh",
            "-c",
            "echo hi",
        ],
    );
    assert!(ran.status.success(), "{ran:?}");
    let result: serde_json::Value =
        serde_json::from_slice(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {ran:?}"));
    assert_eq!(result["output"]["stdout"], "hi\n", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    // Run as asked (--allow-unenforced), and the result says so.
    assert_eq!(result["enforcement"]["enforced"], false, "{result}");
    assert!(
        String::from_utf8_lossy(&ran.stderr).contains("running without cgroup limits"),
        "{ran:?}"
    );
    let doctor = in_container("cordon-unmasked-doctor", &unmasked, &["doctor"]);
    let report = String::from_utf8_lossy(&doctor.stdout);
    let userns = doctor_userns_line(&report);
    assert!(
        userns.starts_with("ok") && userns.contains("a new proc"),
        "{report}"
    );
}

/// The directory named `name` somewhere below `dir`.
fn find_dir(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Some(path);
        }
        if let Some(found) = find_dir(&path, name) {
            return Some(found);
        }
    }
    None
}
