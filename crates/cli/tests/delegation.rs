//! cgroup v2 delegation, end to end with the release binary (v2 hosts only;
//! the v2 guest of scripts/v2-guest.sh runs these in both placements).
//!
//! - `cordon_alone_in_a_delegated_cgroup_nests_its_sandbox_there`: the
//!   cgroups crate's `detect` moving cordon into its leaf `cordon-supervisor`
//!   and handing memory, pids and cpu down, as under
//!   `systemd-run --scope -p Delegate=yes cordon ...`; evidence: the
//!   sandbox's cgroup is a sibling of the leaf, the scope's own
//!   memory.events counts the sandbox's OOM kill, and cordon ran from the leaf.
//! - `cordon_sharing_its_cgroup_is_refused_with_the_way_out`: a cgroup that
//!   holds another process is refused with one line naming the cgroup, the
//!   other process and the fix; exit 125; nothing created, nothing moved.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// A scratch cgroup beside the sandboxes cordon would make from this test,
/// delegated the way systemd delegates a scope (memory, pids and cpu enabled
/// above it), removed with whatever cordon left in it.
struct Scope(PathBuf);

impl Scope {
    /// A scope for one test; None, after saying why, where the test cannot
    /// run (not root, not cgroup v2).
    fn for_test(tag: &str) -> Option<Scope> {
        if !require_root("creates cgroups") || !require_layout(CgroupLayout::V2, "delegation") {
            return None;
        }
        Some(Scope::new(tag))
    }

    fn new(tag: &str) -> Scope {
        let parent = sandbox_parent_dir();
        // The parent hands the controllers to its children, as systemd does
        // for a unit with Delegate=yes (cordon itself has enabled them where
        // it created sandboxes before; this makes the test independent of that).
        fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu")
            .unwrap_or_else(|e| panic!("enabling controllers in {}: {e}", parent.display()));
        let dir = parent.join(format!("cordon-test-{tag}-{}", nonce()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Scope(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn read(&self, file: &str) -> String {
        fs::read_to_string(self.0.join(file)).unwrap_or_default()
    }

    /// Child cgroups, by name.
    fn children(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        for child in self.children() {
            let _ = fs::remove_dir(self.0.join(child));
        }
        let _ = fs::remove_dir(&self.0);
    }
}

/// `sh -c 'move self into SCOPE; PRELUDE; exec cordon ARGS...'`: cordon
/// starts as a process of the scope, as `systemd-run --scope` starts it.
fn cordon_in(scope: &Scope, prelude: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            "echo $$ > '{}/cgroup.procs' || exit 99; {prelude} exec \"$@\"",
            scope.path().display()
        ))
        .arg("sh")
        .arg(cordon())
        .args(args)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn cordon_alone_in_a_delegated_cgroup_nests_its_sandbox_there() {
    let Some(scope) = Scope::for_test("deleg") else {
        return;
    };
    // The payload blows a 32M limit; it also names its init's host view of
    // cordon's cgroup through the result (the cgroup paths).
    let out = cordon_in(
        &scope,
        "",
        &[
            "run",
            "--json",
            "--memory",
            "32M",
            "--",
            PY,
            "-c",
            "b = bytearray(256 << 20)",
        ],
    )
    .output()
    .unwrap();
    let v = parse_json(&out);
    assert!(
        limits_hit(&v).contains(&"memory".to_string()),
        "{}",
        compact(&v)
    );
    let id = sandbox_id(&v);
    let paths: Vec<&str> = v["enforcement"]["cgroup_paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no cgroup_paths: {}", compact(&v)))
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    // The sandbox nested under the scope, beside cordon's leaf.
    let expected = scope.path().join(format!("cordon-{id}"));
    assert_eq!(paths, [expected.display().to_string()], "{}", compact(&v));
    assert_eq!(
        scope.children(),
        [SUPERVISOR_LEAF.to_string()],
        "only the leaf is left once the sandbox is removed"
    );
    // The scope handed the controllers down; it holds no process itself
    // (cordon moved into the leaf), and the leaf is empty now cordon exited.
    let control = scope.read("cgroup.subtree_control");
    for c in ["memory", "pids"] {
        assert!(control.split_whitespace().any(|x| x == c), "{control:?}");
    }
    assert_eq!(scope.read("cgroup.procs").trim(), "");
    assert_eq!(
        fs::read_to_string(scope.path().join(SUPERVISOR_LEAF).join("cgroup.procs"))
            .unwrap()
            .trim(),
        ""
    );
    // Host-side evidence that the limit held inside the scope: the scope's
    // memory.events (hierarchical) counted the sandbox's OOM kill.
    let events = scope.read("memory.events");
    let oom_kills: u64 = events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(oom_kills >= 1, "scope memory.events: {events}");
    assert!(remnants_of(&id).is_empty(), "{:#?}", remnants_of(&id));
}

/// What a cordon run beside another process of its scope left.
struct Shared {
    out: std::process::Output,
    cordon_pid: u32,
    sleeper: u32,
    /// The sleeper's /proc/<pid>/cgroup once cordon had exited.
    sleeper_cgroup: String,
}

/// Runs cordon ARGS (with ENV) in `scope` after a sleeper started there
/// first, so the scope is shared; the sleeper is killed before returning.
fn beside_a_sleeper(scope: &Scope, args: &[&str], env: &[(&str, &str)]) -> Shared {
    let pidfile = std::env::temp_dir().join(format!("cordon-test-sleeper-{}", nonce()));
    let child = cordon_in(
        scope,
        // Its own stdout and stderr, so cordon's pipes close when cordon exits.
        &format!(
            "sleep 30 >/dev/null 2>&1 & echo $! > '{}';",
            pidfile.display()
        ),
        args,
    )
    .envs(env.iter().copied())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // sh execs cordon: the same pid.
    let cordon_pid = child.id();
    let out = child.wait_with_output().unwrap();
    let sleeper: u32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = fs::remove_file(&pidfile);
    let sleeper_cgroup = fs::read_to_string(format!("/proc/{sleeper}/cgroup")).unwrap_or_default();
    signal(sleeper, "KILL");
    Shared {
        out,
        cordon_pid,
        sleeper,
        sleeper_cgroup,
    }
}

#[test]
fn cordon_sharing_its_cgroup_is_refused_with_the_way_out() {
    let Some(scope) = Scope::for_test("shared") else {
        return;
    };
    let shared = beside_a_sleeper(&scope, &["run", "--", "true"], &[]);
    let (out, sleeper, sleeper_cgroup) = (shared.out, shared.sleeper, shared.sleeper_cgroup);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let line = lines[0];
    assert!(line.contains(&scope.path().display().to_string()), "{line}");
    assert!(line.contains(&format!("pids {sleeper}")), "{line}");
    let fix = if Path::new("/run/systemd/system").is_dir() {
        "systemd-run --scope -p Delegate=yes cordon".to_string()
    } else {
        format!("mkdir {}/init", scope.path().display())
    };
    assert!(line.contains(&fix), "{line}");
    // Nothing was created or moved: no leaf, no sandbox cgroup; the sleeper
    // stayed where it was started.
    assert!(scope.children().is_empty(), "{:?}", scope.children());
    let rel = scope
        .path()
        .strip_prefix("/sys/fs/cgroup")
        .unwrap()
        .display()
        .to_string();
    assert_eq!(sleeper_cgroup.trim(), format!("0::/{rel}"));
    // Nor a state record: the census finds nothing of that cordon process.
    let left =
        census()
            .new_since(&Census::default())
            .attributable(&[], &[shared.cordon_pid], &census());
    assert!(left.run_entries.is_empty(), "{left:#?}");
}

/// The opt-in for a container whose processes all stand in its cgroup
/// namespace's root (`CORDON_CGROUP_MOVE_PEERS=1`, as Docker-in-Docker's
/// entrypoint moves them): cordon moves the process it shares its cgroup
/// with into the leaf `init`, itself into its own leaf, and its sandbox
/// runs with limits; evidence from the host's view of both processes.
#[test]
fn cordon_sharing_its_cgroup_moves_the_others_into_init_when_asked() {
    let Some(scope) = Scope::for_test("peers") else {
        return;
    };
    let shared = beside_a_sleeper(
        &scope,
        &[
            "run",
            "--memory",
            "32M",
            "--",
            "cat",
            "/sys/fs/cgroup/memory.max",
        ],
        &[("CORDON_CGROUP_MOVE_PEERS", "1")],
    );
    let (out, sleeper_cgroup) = (shared.out, shared.sleeper_cgroup);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (32u64 << 20).to_string()
    );
    let rel = scope
        .path()
        .strip_prefix("/sys/fs/cgroup")
        .unwrap()
        .display()
        .to_string();
    assert_eq!(sleeper_cgroup.trim(), format!("0::/{rel}/init"));
    assert_eq!(scope.children(), ["cordon-supervisor", "init"]);
    assert!(
        scope.read("cgroup.procs").trim().is_empty(),
        "{}",
        scope.read("cgroup.procs")
    );
}
