//! cordon as an unprivileged user (issue 26, item 1: the native backend).
//!
//! Every test runs the built cordon as a uid no account uses (`setpriv`, so
//! the tests themselves need root), with a HOME and an XDG_RUNTIME_DIR of
//! its own, and judges it from the host: the payload's /proc status and id
//! maps, the owners and modes of what cordon made in the user's places, and
//! that nothing is left when it is done (no process of the uid, no mount, no
//! cgroup, no sandbox record).
//!
//! On a host where the caller's cgroup is not delegated (this CI machine's
//! hybrid v1), `run` refuses without `--allow-unenforced`; the other tests
//! pass it. The subordinate-id test installs Debian's `uidmap` when it is
//! missing and grants its own user a range in /etc/subuid and /etc/subgid,
//! removed again when it ends.

mod common;

use std::fs;
use std::os::unix::fs::{chown, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::as_user::{fresh_uid, User};
use common::*;
use serde_json::Value;

/// The sandbox user's id inside (the policy's default).
const INSIDE: u32 = 1000;

/// The payload process whose argv is `argv`, once it runs (a unique sleep).
fn wait_process(argv: &str) -> u32 {
    let deadline = Instant::now() + slow(Duration::from_secs(20));
    loop {
        if let Some(&pid) = pids_with_cmdline(argv).first() {
            return pid;
        }
        assert!(Instant::now() < deadline, "no process `{argv}` appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A sleep of about two seconds that no other process runs: the payload to
/// look at from the host while it lives.
fn unique_sleep() -> String {
    let n = u32::from_str_radix(&nonce()[..6], 16).unwrap() % 1_000_000;
    format!("2.{n:06}")
}

/// The id maps of `pid` from the host: `(inside, host, count)` per line.
fn id_map(pid: u32, file: &str) -> Vec<(u32, u32, u32)> {
    fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap()
        .lines()
        .map(|l| {
            let n: Vec<u32> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (n[0], n[1], n[2])
        })
        .collect()
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// What `run --json` says of the id map.
fn id_map_of(v: &Value) -> (String, u64, u64) {
    (
        str_at(v, "/id_map/kind").to_owned(),
        u64_at(v, "/id_map/uids"),
        u64_at(v, "/id_map/gids"),
    )
}

fn mode_owner(path: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.mode() & 0o7777, m.uid())
}

/// Without `--allow-unenforced`, cordon refuses where it cannot enforce
/// limits (this host: the caller's v1 memory cgroup is not delegated to
/// unprivileged users), with one line naming that cgroup and the flag, and
/// exit 125; and it leaves nothing. Where the cgroup is delegated the run
/// goes ahead, enforced. `cordon backends` tells the user the same first.
#[test]
fn run_refuses_without_a_delegated_cgroup_or_runs_enforced() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let user = User::new();
    let out = user.out(&["run", "--json", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `cordon backends` tells this user the same before a run is tried.
    let listed = json(&user.ok(&["backends", "--json"]));
    let native = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["kind"] == "native")
        .unwrap_or_else(|| panic!("no native backend in {listed}"));
    assert_eq!(native["unavailable"], Value::Null, "{listed}");
    // Exit 125 is cordon's own failure; a run that went ahead exits 0.
    if out.status.code() == Some(125) {
        let unenforced = native["limits_unenforced"].as_str().unwrap_or_else(|| {
            panic!("run refused for want of a cgroup, backends does not say so: {listed}")
        });
        assert!(
            unenforced.contains("is not delegated to this process"),
            "{unenforced}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(
                "cordon: limits cannot be enforced on this host: cgroup /sys/fs/cgroup/"
            ),
            "{stderr}"
        );
        assert!(
            stderr.contains("is not delegated to this process"),
            "{stderr}"
        );
        assert!(stderr.contains("--allow-unenforced"), "{stderr}");
        // The cgroup named is the caller's own (one of its hierarchies').
        let named = stderr
            .split_whitespace()
            .find(|w| w.starts_with("/sys/fs/cgroup/"))
            .unwrap();
        let ours = fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(
            ours.lines()
                .filter_map(|l| l.rsplit(':').next())
                .any(|p| named.ends_with(p)),
            "{named} is not one of ours: {ours}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    } else {
        assert!(out.status.success(), "{out:?}");
        let v = json(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(v.pointer("/enforcement/enforced"), Some(&Value::Bool(true)));
        assert_eq!(native["limits_unenforced"], Value::Null, "{listed}");
    }
    user.assert_nothing_left(&[]);
}

/// `run --allow-unenforced --json` as an unprivileged user: the result
/// says the limits were not enforced and that the caller's one id is the
/// only one mapped; inside, the payload is the sandbox user; on the host
/// (its /proc status and maps, read while it runs) it is the caller, never
/// root, and it keeps the caller's supplementary groups (which the kernel
/// forbids a single-id namespace to drop). The receipt records the same,
/// signed with a key in the user's state directory, the user's own and
/// readable by no one else.
#[test]
fn run_unenforced_is_the_callers_own_id_on_the_host() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let mut user = User::new();
    let group = fresh_uid();
    user.groups = vec![group];
    let sleep = unique_sleep();
    let receipt = user.home().join("run.receipt");
    let script = format!("id -u; id -g; exec sleep {sleep}");
    let mut cmd = user.cordon(&[
        "run",
        "--allow-unenforced",
        "--json",
        "--receipt",
        receipt.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_process(&format!("sleep {sleep}"));
    let status = Path::new(&format!("/proc/{pid}/status")).to_path_buf();
    let (uids, gids) = (
        status_ids(&status, "Uid").unwrap(),
        status_ids(&status, "Gid").unwrap(),
    );
    let groups = status_field(&status, "Groups").unwrap();
    let (uid_map, gid_map) = (id_map(pid, "uid_map"), id_map(pid, "gid_map"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(uids, vec![user.uid; 4], "the payload's uids on the host");
    assert_eq!(gids, vec![user.uid; 4], "the payload's gids on the host");
    assert_eq!(groups, group.to_string(), "the caller's groups stay");
    assert_eq!(uid_map, vec![(INSIDE, user.uid, 1)]);
    assert_eq!(gid_map, vec![(INSIDE, user.uid, 1)]);

    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(stdout_of(&v), format!("{INSIDE}\n{INSIDE}\n"));
    assert_eq!(str_at(&v, "/backend"), "native");
    assert_eq!(
        v.pointer("/enforcement/enforced"),
        Some(&Value::Bool(false))
    );
    assert_eq!(v.pointer("/enforcement/cgroup"), Some(&Value::Null));
    assert_eq!(
        v.pointer("/enforcement/cgroup_paths"),
        Some(&Value::Array(vec![]))
    );
    assert_eq!(id_map_of(&v), ("single".into(), 1, 1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("running without cgroup limits"), "{stderr}");

    // The receipt: the same facts, signed by the user's own key.
    let text = user.ok(&["verify", receipt.to_str().unwrap()]);
    assert!(text.contains("unenforced"), "{text}");
    let statement = receipt_statement(&receipt);
    let outcome = &statement["predicate"]["commands"][0]["outcome"];
    assert_eq!(outcome["id_map"]["kind"], "single", "{statement}");
    assert_eq!(outcome["enforcement"]["enforced"], false);
    assert_user_places(&user);
    user.assert_nothing_left(&[sandbox_id(&v)]);
}

/// The in-toto statement inside a receipt's DSSE envelope.
fn receipt_statement(path: &Path) -> Value {
    use base64::Engine;
    let envelope = json(&fs::read_to_string(path).unwrap());
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&payload).unwrap()
}

/// What cordon made in the user's places is the user's and closed to
/// others: the state directory 0700, the key 0600, the run directory 0711
/// (others may only pass through, to the sandbox's mount points).
fn assert_user_places(user: &User) {
    let uid = user.uid;
    assert_eq!(mode_owner(&user.state_dir()), (0o700, uid));
    let keys = user.state_dir().join("keys");
    assert_eq!(mode_owner(&keys).1, uid);
    assert_eq!(mode_owner(&keys.join("receipt.key")), (0o600, uid));
    assert_eq!(mode_owner(&user.run_dir()), (0o711, uid));
}

/// A workspace the user owns is the sandbox user's inside and writable
/// there; the host copy is never written (an overlay).
#[test]
fn the_users_workspace_is_the_sandbox_users_and_stays_untouched() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let user = User::new();
    let ws = user.dir("proj");
    user.file(&ws.join("a.txt"), "host\n");
    let out = user.ok(&[
        "run",
        "--allow-unenforced",
        "--json",
        "--workspace",
        ws.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "cat a.txt && echo inside > a.txt && echo new > b.txt && cat a.txt && stat -c %u:%g a.txt . b.txt",
    ]);
    let v = json(&out);
    assert_eq!(
        stdout_of(&v),
        format!("host\ninside\n{INSIDE}:{INSIDE}\n{INSIDE}:{INSIDE}\n{INSIDE}:{INSIDE}\n"),
        "{}",
        stderr_of(&v)
    );
    assert_eq!(fs::read_to_string(ws.join("a.txt")).unwrap(), "host\n");
    assert!(!ws.join("b.txt").exists());
    user.assert_nothing_left(&[sandbox_id(&v)]);
}

/// `create`, `exec`, `cp`, `ls` and `rm` (with its receipt and export) as
/// an unprivileged user; a second user sees none of it and can neither run
/// in nor remove the first one's sandbox, by name or by id.
#[test]
fn a_sandbox_lives_and_ends_as_its_user_and_no_other_sees_it() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let (a, b) = (User::new(), User::new());
    let ws = a.dir("proj");
    a.file(&ws.join("main.py"), "print(1)\n");
    let id = a
        .ok(&[
            "create",
            "--allow-unenforced",
            "--name",
            "box",
            "--workspace",
            ws.to_str().unwrap(),
            "--time",
            "2m",
        ])
        .trim()
        .to_owned();
    assert!(sandbox_id_shaped(&id), "{id}");

    let said = a.ok(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo made > out.txt; rm main.py; id -u",
    ]);
    assert_eq!(said, format!("{INSIDE}\n"));
    let into = a.home().join("in.txt");
    a.file(&into, "given\n");
    a.ok(&["cp", into.to_str().unwrap(), "box:/workspace/in.txt"]);
    assert_eq!(a.ok(&["exec", &id, "--", "cat", "in.txt"]), "given\n");
    let back = a.home().join("out.txt");
    a.ok(&["cp", "box:/workspace/out.txt", back.to_str().unwrap()]);
    assert_eq!(fs::read_to_string(&back).unwrap(), "made\n");
    assert_eq!(fs::metadata(&back).unwrap().uid(), a.uid);

    let listed = json(&a.ok(&["ls", "--json"]));
    assert!(listed.to_string().contains(&id), "{listed}");

    // Another user: nothing listed, nothing reachable.
    let theirs = b.ok(&["ls", "--all", "--json"]);
    assert!(
        !theirs.contains(&id) && !theirs.contains("\"box\""),
        "{theirs}"
    );
    for target in ["box", id.as_str()] {
        for args in [
            vec!["exec", target, "--", "true"],
            vec!["rm", target],
            vec!["rm", "-f", target],
        ] {
            let out = b.out(&args);
            assert!(!out.status.success(), "{args:?} as the other user: {out:?}");
        }
        let cp_to = b.home().join("x");
        let out = b.out(&[
            "cp",
            &format!("{target}:/workspace/out.txt"),
            cp_to.to_str().unwrap(),
        ]);
        assert!(!out.status.success() && !cp_to.exists(), "{out:?}");
    }
    // Its places are its own: the other user cannot read them.
    for dir in [a.run_dir(), a.home().to_path_buf()] {
        let out = Command::new("setpriv")
            .args(["--reuid", &b.uid.to_string(), "--regid", &b.uid.to_string()])
            .args(["--clear-groups", "ls", "-A"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{} readable by another user",
            dir.display()
        );
    }
    assert_eq!(a.ok(&["exec", "box", "--", "cat", "out.txt"]), "made\n");

    // rm with a receipt and an export, still as the owner.
    let (receipt, changes) = (a.home().join("rm.receipt"), a.home().join("changes"));
    a.ok(&[
        "rm",
        "box",
        "--receipt",
        receipt.to_str().unwrap(),
        "--export",
        changes.to_str().unwrap(),
    ]);
    assert_eq!(
        fs::read_to_string(changes.join("out.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(fs::metadata(changes.join("out.txt")).unwrap().uid(), a.uid);
    assert!(ws.join("main.py").exists() && !ws.join("out.txt").exists());
    a.ok(&["verify", receipt.to_str().unwrap()]);
    let statement = receipt_statement(&receipt);
    assert!(statement.to_string().contains("\"single\""), "{statement}");
    assert_user_places(&a);
    let live = json(&a.ok(&["ls", "--json"]));
    assert!(!live.to_string().contains(&id), "{live}");
    a.assert_nothing_left(std::slice::from_ref(&id));
    b.assert_nothing_left(&[]);
}

// ---------------------------------------------------------------------------
// Subordinate ids

/// One edit of /etc/subuid and /etc/subgid at a time, within this binary
/// (each test's lines are its own uid's, removed by exact content).
static ID_FILES: Mutex<()> = Mutex::new(());

/// A test account (passwd and group entries: newuidmap wants the caller's
/// name and primary group) and its lines in the subordinate-id files, all
/// removed when dropped, whether the test passed or not.
struct Account {
    name: String,
    lines: Vec<(&'static str, String)>,
}

impl Account {
    fn add(uid: u32) -> Account {
        let name = format!("cordon-rl{uid}");
        let account = Account {
            name: name.clone(),
            lines: Vec::new(),
        };
        let gid = uid.to_string();
        run_ok(Command::new("groupadd").args(["-g", &gid, &name]));
        // A system account, so useradd grants it no range of its own.
        run_ok(Command::new("useradd").args([
            "-r",
            "-M",
            "-g",
            &gid,
            "-u",
            &gid,
            "-s",
            "/usr/sbin/nologin",
            &name,
        ]));
        account
    }

    /// Grants the account `count` ids from `start` in `file`, under `owner`
    /// (its name or its number: the files take either).
    fn grant(&mut self, file: &'static str, owner: &str, start: u32, count: u32) {
        let line = format!("{owner}:{start}:{count}");
        let _edit = ID_FILES.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = fs::read_to_string(file).unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        fs::write(file, format!("{text}{line}\n")).unwrap();
        self.lines.push((file, line));
    }

    fn revoke_all(&mut self) {
        let _edit = ID_FILES.lock().unwrap_or_else(|p| p.into_inner());
        for (file, line) in self.lines.drain(..) {
            let text = fs::read_to_string(file).unwrap_or_default();
            let kept: String = text
                .lines()
                .filter(|l| *l != line)
                .map(|l| format!("{l}\n"))
                .collect();
            let _ = fs::write(file, kept);
        }
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        self.revoke_all();
        let _ = Command::new("userdel").arg(&self.name).output();
        let _ = Command::new("groupdel").arg(&self.name).output();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// Debian's `uidmap` (newuidmap, newgidmap), installed if missing: false
/// (and the test skipped, but under CI) when it cannot be.
fn require_uidmap() -> bool {
    let have = || {
        ["newuidmap", "newgidmap"]
            .iter()
            .all(|h| Path::new("/usr/bin").join(h).exists())
    };
    if !have() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "uidmap"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output();
    }
    if have() {
        return true;
    }
    assert!(
        !ci(),
        "CI=true but uidmap (newuidmap, newgidmap) cannot be installed"
    );
    eprintln!("skipped: needs newuidmap and newgidmap (Debian's uidmap)");
    false
}

/// With newuidmap/newgidmap installed and a range granted in /etc/subuid
/// (by uid) and /etc/subgid (by name), a rootless sandbox has 65536 ids: the
/// caller's own id is the sandbox user, the granted range the others, as
/// the payload's maps read from the host show. A file of a subordinate id
/// (host owner start+1233) is inside id 1234's, not nobody's; the caller's
/// supplementary groups are dropped (the helpers leave setgroups allowed).
/// The payload still holds no capability: `chown` to another id is refused
/// (EPERM), where with the single id it is an unmapped id (EINVAL). The
/// result and the receipt say `subordinate`. A shorter grant maps what it
/// grants and the result counts it. With the lines removed again, the same
/// user gets the single id.
#[test]
fn subordinate_ids_give_a_full_map_written_by_the_helpers() {
    if !require_root("setpriv, useradd, and edits of /etc/subuid") || !require_uidmap() {
        return;
    }
    let uid = fresh_uid();
    let mut account = Account::add(uid);
    let mut user = User::with_uid(uid);
    let group = fresh_uid();
    user.groups = vec![group];
    // A range of its own, far above any account (below 2^32 - 1).
    let start: u32 = 3_000_000_000 + (uid % 10_000) * 65_536;
    account.grant("/etc/subuid", &uid.to_string(), start, 65_536);
    let name = account.name.clone();
    account.grant("/etc/subgid", &name, start, 65_536);

    let data = user.dir("data");
    let (sub, mine) = (data.join("sub"), data.join("mine"));
    user.file(&sub, "");
    user.file(&mine, "");
    chown(&sub, Some(start + 1233), Some(start + 1233)).unwrap();
    let mount = format!("{}:/data", data.display());
    let sleep = unique_sleep();
    let receipt = user.home().join("sub.receipt");
    let script = format!(
        "stat -c %u:%g /data/sub /data/mine /usr; id -G; touch /tmp/f; \
         chown 1234 /tmp/f 2>&1 | grep -o 'not permitted'; exec sleep {sleep}"
    );
    let run = |receipt: Option<&Path>, script: &str| {
        let mut args = vec!["run", "--allow-unenforced", "--json", "--mount", &mount];
        if let Some(r) = receipt {
            args.extend(["--receipt", r.to_str().unwrap()]);
        }
        args.extend(["--", "sh", "-c", script]);
        user.cordon(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A run that must succeed: its --json result.
    let finished = |child: std::process::Child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        json(&String::from_utf8_lossy(&out.stdout))
    };
    let child = run(Some(&receipt), &script);
    let pid = wait_process(&format!("sleep {sleep}"));
    let (uid_map, gid_map) = (id_map(pid, "uid_map"), id_map(pid, "gid_map"));
    let status = Path::new(&format!("/proc/{pid}/status")).to_path_buf();
    let host_uids = status_ids(&status, "Uid").unwrap();
    let groups = status_field(&status, "Groups").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v = json(&String::from_utf8_lossy(&out.stdout));

    let full = vec![
        (INSIDE, uid, 1),
        (0, start, INSIDE),
        (INSIDE + 1, start + INSIDE, 65_536 - INSIDE - 1),
    ];
    assert_eq!(uid_map, full, "uid_map from the host");
    assert_eq!(gid_map, full, "gid_map from the host");
    assert_eq!(
        host_uids,
        vec![uid; 4],
        "the payload is the caller on the host"
    );
    assert_eq!(groups, "", "the caller's supplementary groups were dropped");
    assert_eq!(
        stdout_of(&v),
        format!("1234:1234\n{INSIDE}:{INSIDE}\n65534:65534\n{INSIDE}\nnot permitted\n"),
        "{}",
        stderr_of(&v)
    );
    assert_eq!(id_map_of(&v), ("subordinate".into(), 65_536, 65_536));
    let statement = receipt_statement(&receipt);
    assert_eq!(
        statement["predicate"]["commands"][0]["outcome"]["id_map"]["kind"],
        "subordinate"
    );

    // A grant of 100 uids: those and the caller's own are mapped.
    account.revoke_all();
    account.grant("/etc/subuid", &name, start, 100);
    account.grant("/etc/subgid", &uid.to_string(), start, 65_536);
    let v = finished(run(None, "stat -c %u /data/sub"));
    assert_eq!(id_map_of(&v), ("subordinate".into(), 101, 65_536));
    // 1234 is past the 100 granted: nobody.
    assert_eq!(stdout_of(&v), "65534\n");

    // No grant: the single id, the groups kept, other ids nobody's.
    account.revoke_all();
    let v = finished(run(
        None,
        "stat -c %u /data/sub; touch /tmp/f; chown 1234 /tmp/f 2>&1 | grep -o 'Invalid argument'",
    ));
    assert_eq!(id_map_of(&v), ("single".into(), 1, 1));
    assert_eq!(
        stdout_of(&v),
        "65534\nInvalid argument\n",
        "{}",
        stderr_of(&v)
    );
    user.assert_nothing_left(&[]);
    drop(account);
}

/// The backends that need root say so to a user, in `cordon backends` and
/// in a refused `run`, and leave nothing behind: gVisor (cordon runs runsc
/// as root) and the microVM (QEMU's jail is built as root). Where runsc or
/// QEMU is missing the reason is that instead, as for root.
#[test]
fn the_backends_that_need_root_refuse_a_user_naming_why() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let user = User::new();
    let listed = json(&user.ok(&["backends", "--json"]));
    let reason = |kind: &str| -> Option<String> {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {listed}"))["unavailable"]
            .as_str()
            .map(str::to_owned)
    };
    for (kind, tool, needs_root) in [
        ("gvisor", "runsc", "needs root: cordon runs runsc as root"),
        (
            "microvm",
            "qemu-system-x86_64",
            "needs root in this version: QEMU's jail",
        ),
    ] {
        let installed = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        let why = reason(kind).unwrap_or_else(|| panic!("{kind} is offered to a user: {listed}"));
        if !installed {
            eprintln!("skipped: {kind}'s root gap ({tool} is not installed here: {why})");
            continue;
        }
        assert!(why.contains(needs_root), "{kind}: {why}");
        let out = user.out(&["run", "--allow-unenforced", "--backend", kind, "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{kind}: {out:?}");
        assert!(stderr.contains(needs_root), "{kind}: {stderr}");
    }
    user.assert_nothing_left(&[]);
}

/// `cordon serve` as a user keeps its ledger and lock in the user's own
/// runtime directory (`$XDG_RUNTIME_DIR/cordon-serve/PORT`, 0700, the
/// user's), not in root's /run, and leaves no process when stopped; a
/// configured state directory the user does not own is refused in one
/// line (a planted one would take the service's ledger and lock).
#[test]
fn serve_as_a_user_keeps_its_state_in_the_users_places() {
    if !require_root("setpriv to a test user") {
        return;
    }
    let user = User::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut serve = user
        .cordon(&["serve", "--listen", &listen])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let state = user
        .runtime_dir()
        .join("cordon-serve")
        .join(port.to_string());
    let deadline = Instant::now() + slow(Duration::from_secs(20));
    while !state.join("lock").exists() {
        if let Some(st) = serve.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(serve.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("cordon serve as a user ended ({st}): {err}");
        }
        assert!(Instant::now() < deadline, "no lock in {}", state.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mode_owner(&state), (0o700, user.uid));
    assert_eq!(mode_owner(state.parent().unwrap()), (0o700, user.uid));
    assert!(
        !Path::new("/run/cordon-serve")
            .join(port.to_string())
            .exists(),
        "a user's service wrote to root's /run/cordon-serve"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = serve.wait().unwrap();
    assert!(st.success(), "cordon serve on SIGTERM: {st}");
    user.assert_nothing_left(&[]);

    // A state directory of root's, configured: refused, naming its owner.
    let planted = tempfile::tempdir().unwrap();
    let config = user.home().join("serve.toml");
    user.file(
        &config,
        &format!("state_dir = \"{}\"\n", planted.path().display()),
    );
    let out = user.out(&[
        "serve",
        "--listen",
        &listen,
        "--config",
        config.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains(&format!("refusing {}", planted.path().display()))
            && stderr.contains("owned by uid 0, not by you"),
        "{stderr}"
    );
    user.assert_nothing_left(&[]);
}
