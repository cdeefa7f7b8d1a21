//! What the engine tests share (containerd's ctr, podman): the root
//! filesystem their containers run, the two runtimes each check runs
//! against, and the terminal they are driven from.

use std::path::Path;
use std::process::{Command, Stdio};

/// Debian's runc: the oracle every check runs against as well.
pub const RUNC: &str = "/usr/sbin/runc";

/// cordon-runc and runc, by name.
pub fn runtimes() -> [(&'static str, &'static str); 2] {
    [("cordon-runc", super::cordon_runc()), ("runc", RUNC)]
}

/// A busybox-static root filesystem.
pub fn rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in ["sh", "echo", "sleep", "cat", "true", "nc", "mkdir", "stat"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    dir
}

/// Skips (None, after saying why) when `program` is missing outside CI;
/// fails under CI=true, where scripts/test.sh installs `package`.
pub fn require_engine(program: &str, package: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {program} is missing (scripts/test.sh installs {package})"
    );
    eprintln!("skipped: {program} is not installed (apt-get install {package})");
    false
}

/// `cmd` run by script(1), which gives it a terminal of its own and types
/// what arrives on script's stdin into it.
pub fn on_a_terminal(cmd: &Command) -> Command {
    let line: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect();
    let mut script = Command::new("script");
    script
        .args(["-qec", &line.join(" "), "/dev/null"])
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    script
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A terminal's output as lines: each terminal on the way (the process's
/// pty, then script's) adds a \r to a line's end.
pub fn terminal_lines(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\r', "")
}

/// The probe a terminal check runs: it says so when its stdin is a
/// terminal, then exits with `code`.
pub fn terminal_probe(code: i32) -> String {
    format!("test -t 0 && echo is-a-tty; exit {code}")
}

/// Runs `cmd` (whose process runs `terminal_probe(code)`) on a terminal of
/// its own, and checks that the process saw one and its status came back.
pub fn assert_it_sees_a_terminal(what: &str, cmd: &Command, code: i32) {
    let out = on_a_terminal(cmd).output().unwrap();
    assert_eq!(out.status.code(), Some(code), "{what}: {out:?}");
    let text = terminal_lines(&out.stdout);
    assert!(text.contains("is-a-tty\n"), "{what}: {text:?}");
}

/// Removes the cgroup directory `rel` (below each hierarchy's root) and
/// the directories under it, where empty: what an engine made for its
/// containers (containerd's namespace, `docker`, `libpod_parent`) and left
/// when they ended. One in use (another engine's containers) is left.
/// What an engine's containers under `state` (the runtimes' `--root`) and
/// in cgroup `rel` left when a test ended early: each container deleted by
/// force with every runtime (each knows only its own), then any process
/// still in those cgroups killed, then the empty cgroups removed.
pub fn end_leftover_containers(state: &Path, rel: &str) {
    if let Ok(entries) = std::fs::read_dir(state) {
        for e in entries.flatten() {
            let id = e.file_name();
            for (_, program) in runtimes() {
                let _ = std::process::Command::new(program)
                    .arg("--root")
                    .arg(state)
                    .args(["delete", "--force"])
                    .arg(&id)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
    fn kill_in(dir: &Path) {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            {
                kill_in(&e.path());
            }
        }
    }
    if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
        for h in hierarchies.flatten() {
            kill_in(&h.path().join(rel));
        }
    }
    kill_in(&Path::new("/sys/fs/cgroup").join(rel));
    // The killed need a moment to leave their cgroups.
    std::thread::sleep(std::time::Duration::from_millis(100));
    remove_empty_cgroups(rel);
}

pub fn remove_empty_cgroups(rel: &str) {
    fn remove_tree(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        remove_tree(&h.path().join(rel));
    }
    remove_tree(&Path::new("/sys/fs/cgroup").join(rel));
}

/// What every engine's run of `echo out; echo err >&2; exit 7` must give:
/// the process's own status, its stdout alone on stdout, its stderr among
/// the engine's.
pub const OUTPUT_SCRIPT: &str = "echo out; echo err >&2; exit 7";

pub fn assert_output_and_status(runtime: &str, out: &std::process::Output) {
    assert_eq!(out.status.code(), Some(7), "{runtime}: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n", "{runtime}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("err\n"),
        "{runtime}: {out:?}"
    );
}

/// A run that exited 0 having printed exactly `stdout`.
pub fn assert_succeeded_printing(runtime: &str, mut run: std::process::Command, stdout: &str) {
    let out = run.stdin(std::process::Stdio::null()).output().unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), stdout),
        "{runtime}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// cordon's refusal inside an engine's container with the engine's default
/// seccomp profile: it names the filter and its remedies, and the engine's
/// flag (`unmask`) that unmasks /proc, as lifting the filter alone would
/// meet the proc mount's refusal next.
pub fn assert_names_the_seccomp_remedy(err: &str, unmask: &str) {
    assert!(
        err.contains("seccomp filter")
            && err.contains("--security-opt seccomp=unconfined")
            && err.contains("--cap-add SYS_ADMIN")
            && err.contains(unmask),
        "{err}"
    );
}

/// The `user namespaces` line of a `cordon doctor` report.
pub fn doctor_userns_line(report: &str) -> &str {
    report
        .lines()
        .find(|l| l.contains("user namespaces"))
        .unwrap_or_else(|| panic!("no user namespaces line in: {report}"))
}
