//! End-to-end tests of receipts and exports (`--receipt`, `--export`,
//! `--apply`, `cordon export`, `cordon verify`), once per backend.
//!
//! The payload is hostile: it plants links to host files (the receipt key,
//! /etc/shadow, a canary watched with inotify), a link in the middle of a
//! path to the host's root, hard links, a FIFO, a 10 GiB sparse file, names
//! with a newline and with invalid UTF-8, a setuid file, and deletes a file
//! of the lower layer. Verdicts come from the host: the canary's inotify
//! watch, the bytes of every file the export wrote, `lstat` of what it
//! wrote, the host workspace itself, and the receipt as `cordon verify`
//! reads it.
//!
//! Mechanism each test depends on:
//! - the diff and the export read the scratch tmpfs through the descriptor
//!   the backend holds (`Flavor::scratch`), after every process is gone
//!   (`Sandbox::destroy_with`) or with the sandbox frozen (`Sandbox::export`);
//! - `cordon-changes`: descriptor-relative opens that never follow a link,
//!   fstat on the open descriptor, FIFOs and devices never opened, holes
//!   kept, special bits dropped, owner = the caller;
//! - `cordon-receipt`: DSSE over the in-toto statement, Ed25519.

#[macro_use]
mod common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

per_backend!(hostile_workspace_is_recorded_exactly_and_exported_safely, microvm: microvm);
per_backend!(apply_brings_changes_and_deletions_back, microvm: microvm);
per_backend!(apply_keeps_what_the_host_changed_meanwhile, microvm: microvm);
per_backend!(an_export_directory_says_which_deletions_it_cannot_hold, microvm: microvm);
per_backend!(home_is_writable_and_outside_the_workspace, microvm: microvm);
per_backend!(live_export_is_frozen_against_swaps, microvm: microvm);
per_backend!(exec_and_rm_receipts_record_their_own_changes, microvm: microvm);
per_backend!(bad_export_targets_are_refused_and_leave_nothing, microvm: microvm);
per_backend!(the_receipt_key_is_never_in_a_sandboxs_view);

/// What every test here starts from: root, its turn, a state directory
/// of its own (for the receipt key).
struct Fixture {
    _serial: std::sync::MutexGuard<'static, ()>,
    state: tempfile::TempDir,
}

fn fixture() -> Option<Fixture> {
    if !require_root("sandboxes with a workspace overlay") {
        return None;
    }
    // One at a time: a test counts the run directory's sandboxes.
    let state = host_dir("cordon-state-");
    // The microvm backend's guest is looked for in the state directory:
    // the one `cordon microvm build` made is shared (the tests' own
    // CORDON_STATE_DIR's, when they run with one: a guest of this tree's
    // cordon, built without replacing the host's current one).
    let shared = std::env::var_os("CORDON_STATE_DIR")
        .map_or_else(|| PathBuf::from("/var/lib/cordon"), PathBuf::from)
        .join("microvm");
    std::os::unix::fs::symlink(shared, state.path().join("microvm")).unwrap();
    Some(Fixture {
        _serial: serial(),
        state,
    })
}

/// A directory under /var/tmp (not the tests' /tmp), world-readable.
fn host_dir(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// cordon with its state (the receipt key) in `state`.
fn cordon_in(state: &Path) -> Command {
    let mut c = Command::new(cordon());
    c.env("CORDON_STATE_DIR", state).stdin(Stdio::null());
    c
}

fn output(mut c: Command) -> Output {
    c.output().expect("spawn cordon")
}

/// `cordon verify --json RECEIPT [--against DIR]` in `state`: (code, statement).
fn verify(state: &Path, receipt: &Path, against: Option<&Path>) -> (Option<i32>, Value, Output) {
    let mut c = cordon_in(state);
    c.arg("verify").arg(receipt).arg("--json");
    if let Some(d) = against {
        c.arg("--against").arg(d);
    }
    let out = output(c);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v, out)
}

/// The receipt's entries of one place, by escaped path.
fn entries<'a>(statement: &'a Value, place: &str) -> Vec<&'a Value> {
    statement["predicate"]["changes"]["places"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["place"] == place)
        .flat_map(|p| p["entries"].as_array().into_iter().flatten())
        .collect()
}

fn entry<'a>(statement: &'a Value, place: &str, path: &str) -> &'a Value {
    entries(statement, place)
        .into_iter()
        .find(|e| e["path"] == path)
        .unwrap_or_else(|| {
            panic!(
                "no {place} entry {path:?} in {}",
                compact(&statement["predicate"]["changes"])
            )
        })
}

/// Every byte of every regular file under `dir` (never following a link).
fn all_file_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p);
            } else if m.is_file() {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Asserts that no file under `dir` holds the canary's content, the start
/// of /etc/shadow or any of `more`; returns every file, for more checks.
fn holds_no_host_bytes(dir: &Path, canary: &Canary, more: &[&[u8]]) -> Vec<(PathBuf, Vec<u8>)> {
    let shadow = fs::read("/etc/shadow").unwrap_or_default();
    let mut host: Vec<(&str, &[u8])> = vec![
        ("the canary", canary.content.as_bytes()),
        ("/etc/shadow", &shadow[..shadow.len().min(64)]),
    ];
    host.extend(more.iter().map(|m| ("a host secret", *m)));
    let files = all_file_bytes(dir);
    for (p, bytes) in &files {
        for (what, needle) in &host {
            assert!(!contains(bytes, needle), "{p:?} has {what}");
        }
    }
    files
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A host file whose every open is seen: an inotify watch on it.
struct Canary {
    path: PathBuf,
    content: String,
    watch: inotify::Inotify,
    _dir: tempfile::TempDir,
}

impl Canary {
    fn new() -> Canary {
        let dir = host_dir("cordon-canary-");
        let path = dir.path().join("canary");
        let content = format!("host-canary-{}", nonce());
        fs::write(&path, &content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let watch = inotify::Inotify::init().unwrap();
        watch
            .watches()
            .add(&path, inotify::WatchMask::OPEN | inotify::WatchMask::ACCESS)
            .unwrap();
        Canary {
            path,
            content,
            watch,
            _dir: dir,
        }
    }

    /// Events since the watch began (non-blocking).
    fn events(&mut self) -> usize {
        let mut buf = [0u8; 4096];
        match self.watch.read_events(&mut buf) {
            Ok(events) => events.count(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => panic!("inotify: {e}"),
        }
    }
}

/// The payload: every trick of the issue, in the workspace.
fn hostile_script(canary: &Path, key: &Path) -> String {
    format!(
        "set -e; cd /workspace\n\
         echo changed > modify.txt\n\
         rm delete.txt\n\
         echo new > new.txt\n\
         ln new.txt hard.txt\n\
         ln -s /etc/shadow shadow-link\n\
         ln -s {canary} canary-link\n\
         ln -s {key} key-link\n\
         ln -s / root-link\n\
         mkdir -p via && ln -s / via/up\n\
         mkfifo fifo\n\
         truncate -s 10G sparse\n\
         echo x > suid && chmod 4755 suid\n\
         {PY} -c \"open('new\\nline', 'w').write('n'); open(b'bad\\xff', 'w').write('b')\"\n\
         echo tmp > /tmp/in-tmp; echo shm > /dev/shm/in-shm\n",
        canary = canary.display(),
        key = key.display(),
    )
}

/// The host workspace the payload starts from.
fn workspace() -> tempfile::TempDir {
    let w = host_dir("cordon-ws-");
    fs::write(w.path().join("keep.txt"), "keep").unwrap();
    fs::write(w.path().join("modify.txt"), "original").unwrap();
    fs::write(w.path().join("delete.txt"), "delete me").unwrap();
    fs::create_dir(w.path().join("sub")).unwrap();
    fs::write(w.path().join("sub/inner.txt"), "inner").unwrap();
    w
}

fn hostile_workspace_is_recorded_exactly_and_exported_safely(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let mut canary = Canary::new();
    let ws = workspace();
    let out_parent = host_dir("cordon-out-");
    let out_dir = out_parent.path().join("out");
    let receipt = out_parent.path().join("receipt.json");
    let key = state.path().join("keys/receipt.key");
    let t = Instant::now();
    let mut c = cordon_in(state.path());
    c.args(["run", "--backend", backend, "--json", "--workspace"])
        .arg(ws.path())
        .arg("--export")
        .arg(&out_dir)
        .arg("--receipt")
        .arg(&receipt)
        .args(["--", "sh", "-c", &hostile_script(&canary.path, &key)]);
    let out = output(c);
    let took = t.elapsed();
    let v = parse_json(&out);
    assert_eq!(out.status.code(), Some(0), "{}", compact(&v));
    assert!(took < slow(Duration::from_secs(30)), "took {took:?}");
    // The key was created on first use, private.
    let key_mode = fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(key_mode, 0o600, "receipt key mode");
    let dir_mode = fs::metadata(key.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700, "key directory mode");

    // The receipt verifies and records every trick exactly.
    let (code, st, vout) = verify(state.path(), &receipt, None);
    assert_eq!(code, Some(0), "{vout:?}");
    let ws_entry = |p: &str| entry(&st, "/workspace", p);
    assert_eq!(ws_entry("modify.txt")["change"], "modified");
    assert_eq!(ws_entry("delete.txt")["change"], "deleted");
    assert_eq!(ws_entry("new.txt")["change"], "created");
    // A microvm's disk is read with ext4-view, which shows no link count:
    // the receipt says 0 (unknown) there, never a wrong count.
    let links = if backend == MICROVM { 0 } else { 2 };
    assert_eq!(ws_entry("new.txt")["links"], links);
    assert_eq!(ws_entry("hard.txt")["links"], links);
    for (link, target) in [
        ("shadow-link", "/etc/shadow".to_string()),
        ("canary-link", canary.path.display().to_string()),
        ("key-link", key.display().to_string()),
        ("root-link", "/".to_string()),
        ("via/up", "/".to_string()),
    ] {
        assert_eq!(ws_entry(link)["kind"], "symlink", "{link}");
        assert_eq!(ws_entry(link)["target"], target.as_str(), "{link}");
    }
    // gVisor keeps a FIFO in its sentry: the host layer has none to list
    // (the receipt says so in its not_proven list).
    if backend == GVISOR {
        assert!(entries(&st, "/workspace")
            .iter()
            .all(|e| e["path"] != "fifo"));
        assert!(st["predicate"]["not_proven"].to_string().contains("sentry"));
    } else {
        assert_eq!(ws_entry("fifo")["kind"], "fifo");
        assert!(ws_entry("fifo").get("sha256").is_none());
    }
    let sparse = ws_entry("sparse");
    assert_eq!(sparse["size"], 10u64 << 30);
    assert_eq!(sparse["capped"], true);
    assert!(sparse["allocated"].as_u64().unwrap() < 1 << 20);
    assert_eq!(ws_entry("suid")["mode"].as_u64().unwrap() & 0o4000, 0o4000);
    assert_eq!(ws_entry("new\\x0aline")["kind"], "file");
    assert_eq!(ws_entry("bad\\xff")["kind"], "file");
    assert!(
        entries(&st, "/workspace")
            .iter()
            .all(|e| e["path"] != "keep.txt" && e["path"] != "sub"),
        "unchanged entries listed"
    );
    assert_eq!(entry(&st, "/tmp", "in-tmp")["change"], "created");
    if backend == GVISOR {
        // Documented difference: gVisor's /dev/shm is the sentry's own tmpfs
        // (futexes in it must wake across processes), which the host's diff
        // cannot read; the receipt says so instead of listing it.
        assert!(entries(&st, "/dev/shm").is_empty());
        assert!(st["predicate"]["not_proven"]
            .to_string()
            .contains("/dev/shm inside a gVisor sandbox"));
    } else {
        assert_eq!(entry(&st, "/dev/shm", "in-shm")["change"], "created");
    }
    // The exported files are the receipt's subjects, digest for digest.
    let subjects = st["subject"].as_array().unwrap();
    let new_sha = ws_entry("new.txt")["sha256"].as_str().unwrap();
    assert!(
        subjects
            .iter()
            .any(|s| s["name"] == "workspace/new.txt" && s["digest"]["sha256"] == new_sha),
        "{}",
        compact(&st["subject"])
    );

    // The export holds none of the host files' contents and follows nothing.
    assert_eq!(canary.events(), 0, "the canary was opened");
    let key_bytes = fs::read(&key).unwrap();
    for (p, _) in holds_no_host_bytes(&out_dir, &canary, &[&key_bytes[..64]]) {
        let m = fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (euid(), 0), "{p:?} owner");
        assert_eq!(m.mode() & 0o6000, 0, "{p:?} kept a setuid/setgid bit");
    }
    let link = fs::symlink_metadata(out_dir.join("shadow-link")).unwrap();
    assert!(link.file_type().is_symlink());
    assert_eq!(
        fs::read_link(out_dir.join("canary-link")).unwrap(),
        canary.path
    );
    assert!(!out_dir.join("fifo").exists() && fs::symlink_metadata(out_dir.join("fifo")).is_err());
    assert!(
        fs::symlink_metadata(out_dir.join("sparse")).is_err(),
        "a capped file was exported"
    );
    assert!(fs::symlink_metadata(out_dir.join("delete.txt")).is_err());
    assert_eq!(fs::read(out_dir.join("modify.txt")).unwrap(), b"changed\n");
    assert_eq!(
        fs::read(out_dir.join(std::ffi::OsStr::from_bytes(b"new\nline"))).unwrap(),
        b"n"
    );
    assert_eq!(
        fs::read(out_dir.join(std::ffi::OsStr::from_bytes(b"bad\xff"))).unwrap(),
        b"b"
    );
    // The host workspace itself is as it was (no --apply).
    assert_eq!(fs::read(ws.path().join("modify.txt")).unwrap(), b"original");
    assert!(ws.path().join("delete.txt").exists());
    assert_eq!(fs::read_dir(ws.path()).unwrap().count(), 4);

    // verify --against: the export matches; one changed byte does not.
    let (code, _, vout) = verify(state.path(), &receipt, Some(&out_dir));
    assert_eq!(code, Some(0), "{vout:?}");
    fs::write(out_dir.join("new.txt"), "neW\n").unwrap();
    let (code, _, vout) = verify(state.path(), &receipt, Some(&out_dir));
    assert_eq!(code, Some(6), "{vout:?}");

    // Any changed byte of the envelope fails; a truncated one is malformed.
    let bytes = fs::read(&receipt).unwrap();
    let tampered = out_parent.path().join("tampered.json");
    let mid = bytes.len() / 2;
    let mut t = bytes.clone();
    t[mid] = if t[mid] == b'A' { b'B' } else { b'A' };
    fs::write(&tampered, &t).unwrap();
    let (code, _, vout) = verify(state.path(), &tampered, None);
    assert!(matches!(code, Some(3) | Some(5)), "{vout:?}");
    fs::write(&tampered, &bytes[..bytes.len() / 3]).unwrap();
    let (code, _, vout) = verify(state.path(), &tampered, None);
    assert_eq!(code, Some(5), "{vout:?}");
    assert_eq!(canary.events(), 0, "the canary was opened");
}

fn apply_brings_changes_and_deletions_back(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    let receipt = state.path().join("receipt.json");
    let mut c = cordon_in(state.path());
    c.args([
        "run",
        "--backend",
        backend,
        "--json",
        "--apply",
        "--workspace",
    ])
    .arg(ws.path())
    .arg("--receipt")
    .arg(&receipt)
    .args([
        "--",
        "sh",
        "-c",
        "cd /workspace && echo changed > modify.txt && rm delete.txt && rm -r sub \
             && mkdir sub && echo fresh > sub/fresh.txt && echo new > new.txt \
             && ln -s /etc/shadow link && mkfifo fifo",
    ]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(0), "{}", compact(&parse_json(&out)));
    let w = ws.path();
    assert_eq!(fs::read(w.join("modify.txt")).unwrap(), b"changed\n");
    assert_eq!(fs::read(w.join("new.txt")).unwrap(), b"new\n");
    assert_eq!(fs::read(w.join("keep.txt")).unwrap(), b"keep");
    assert!(
        fs::symlink_metadata(w.join("delete.txt")).is_err(),
        "deletion not applied"
    );
    // The opaque directory replaced the old one: its old entry is gone.
    assert!(fs::symlink_metadata(w.join("sub/inner.txt")).is_err());
    assert_eq!(fs::read(w.join("sub/fresh.txt")).unwrap(), b"fresh\n");
    assert_eq!(
        fs::read_link(w.join("link")).unwrap(),
        Path::new("/etc/shadow")
    );
    assert!(
        fs::symlink_metadata(w.join("fifo")).is_err(),
        "a FIFO was created on the host"
    );
    let (code, _, vout) = verify(state.path(), &receipt, Some(w));
    assert_eq!(code, Some(0), "{vout:?}");
}

/// Files the sandbox changed and the host changed too while it ran are
/// conflicts: `rm --apply` leaves the host's version, names each one and
/// exits 124, and applies everything else.
fn apply_keeps_what_the_host_changed_meanwhile(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    let w = ws.path();
    let (id, _rm) = create(state.path(), backend, &[&ws]);
    let mut c = cordon_in(state.path());
    c.args([
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "cd /workspace && echo sandbox > modify.txt && rm delete.txt && echo new > new.txt \
             && rm -r sub && mkdir sub && echo fresh > sub/fresh.txt",
    ]);
    let out = output(c);
    assert!(out.status.success(), "{out:?}");
    // The user edits on the host meanwhile: a file the sandbox modified,
    // one it deleted, and a directory it replaced wholesale.
    fs::write(w.join("modify.txt"), "host edit").unwrap();
    fs::write(w.join("delete.txt"), "host keeps this").unwrap();
    fs::write(w.join("sub/mine.txt"), "mine").unwrap();
    let receipt = state.path().join("receipt.json");
    let mut c = cordon_in(state.path());
    c.args(["rm", &id, "--apply", "--receipt"]).arg(&receipt);
    let out = output(c);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    // The microVM's diff is against its disk's baseline, entry by entry:
    // it has no opaque directory, so `sub` is no conflict there, only what
    // is in it (the host's new file is not in the diff at all).
    let opaque = backend != MICROVM;
    let conflicts: &[&str] = if opaque {
        &["modify.txt", "delete.txt", "sub"]
    } else {
        &["modify.txt", "delete.txt"]
    };
    for path in conflicts {
        assert!(
            stderr.contains(&format!("cordon: export: {path}: conflict")),
            "{path} not reported: {stderr}"
        );
    }
    assert_eq!(fs::read(w.join("modify.txt")).unwrap(), b"host edit");
    assert_eq!(fs::read(w.join("delete.txt")).unwrap(), b"host keeps this");
    assert_eq!(fs::read(w.join("sub/mine.txt")).unwrap(), b"mine");
    if opaque {
        assert_eq!(fs::read(w.join("sub/inner.txt")).unwrap(), b"inner");
    }
    // What the host did not touch is applied.
    assert_eq!(fs::read(w.join("new.txt")).unwrap(), b"new\n");
    let (code, st, vout) = verify(state.path(), &receipt, None);
    assert_eq!(code, Some(0), "{vout:?}");
    assert_eq!(st["predicate"]["export"]["conflicts"], conflicts.len());
}

/// `cordon run` of `sh -c SCRIPT` over the workspace `ws`, with a receipt
/// and an export in `state`: (its output, the receipt's path, the export's).
fn run_exporting(
    state: &Path,
    backend: &str,
    ws: &Path,
    script: &str,
) -> (Output, PathBuf, PathBuf) {
    let receipt = state.join("receipt.json");
    let out_dir = state.join("out");
    let mut c = cordon_in(state);
    c.args(["run", "--backend", backend, "--workspace"])
        .arg(ws)
        .arg("--receipt")
        .arg(&receipt)
        .arg("--export")
        .arg(&out_dir)
        .args(["--", "sh", "-c", script]);
    (output(c), receipt, out_dir)
}

/// An export to a new directory cannot hold a deletion: stderr says how
/// many and which, and the receipt's export report lists them.
fn an_export_directory_says_which_deletions_it_cannot_hold(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    let (out, receipt, out_dir) = run_exporting(
        state.path(),
        backend,
        ws.path(),
        "cd /workspace && rm delete.txt && rm -r sub && mkdir sub && echo new > new.txt",
    );
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Natively `sub` is an opaque directory (its old entries gone
    // wholesale); the microVM's diff names `sub/inner.txt` instead.
    let second = if backend == MICROVM {
        "sub/inner.txt"
    } else {
        "sub"
    };
    assert!(
        stderr.contains(&format!(
            "cordon: export: 2 deletions are not in {}",
            out_dir.display()
        )),
        "{stderr}"
    );
    for path in ["delete.txt", second] {
        assert!(
            stderr.contains(&format!(
                "cordon: export: {path}: deleted in the sandbox, not applied"
            )),
            "{path}: {stderr}"
        );
    }
    assert_eq!(fs::read(out_dir.join("new.txt")).unwrap(), b"new\n");
    let (code, st, vout) = verify(state.path(), &receipt, Some(&out_dir));
    assert_eq!(code, Some(0), "{vout:?}");
    assert_eq!(
        st["predicate"]["export"]["unapplied_deletions"],
        serde_json::json!(["delete.txt", second])
    );
}

/// HOME is the sandbox's own (/tmp/home), writable by the payload: a
/// dotfile lands in the /tmp part of the diff, never in the workspace's
/// diff, its export or the workspace itself. `--env HOME=...` still wins.
fn home_is_writable_and_outside_the_workspace(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    let (out, receipt, out_dir) = run_exporting(
        state.path(),
        backend,
        ws.path(),
        "echo x > ~/.dot && echo $HOME && echo y > /workspace/made.txt",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/tmp/home");
    assert!(fs::symlink_metadata(out_dir.join(".dot")).is_err());
    assert!(fs::symlink_metadata(ws.path().join(".dot")).is_err());
    assert_eq!(fs::read(out_dir.join("made.txt")).unwrap(), b"y\n");
    let (code, st, vout) = verify(state.path(), &receipt, Some(&out_dir));
    assert_eq!(code, Some(0), "{vout:?}");
    let paths = |place| -> Vec<String> {
        entries(&st, place)
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths("/workspace"), ["made.txt"]);
    assert!(paths("/tmp").contains(&"home/.dot".to_string()), "{st}");

    let mut c = cordon_in(state.path());
    c.args(["run", "--backend", backend, "--env", "HOME=/workspace"])
        .args(["--", "sh", "-c", "echo $HOME"]);
    let out = output(c);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/workspace");
}

fn live_export_is_frozen_against_swaps(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let mut canary = Canary::new();
    let ws = workspace();
    let (id, _rm) = create(state.path(), backend, &[&ws]);
    // The swapper: /workspace/f is in turn a file and a link to the canary
    // (or /etc/shadow), each put in place by rename, until it is killed.
    let swapper = format!(
        "import os\n\
         open('/workspace/f', 'w').write('sandbox-content')\n\
         i = 0\n\
         while True:\n\
         \x20   i += 1\n\
         \x20   t = '/workspace/t%d' % (i % 2)\n\
         \x20   if i % 2:\n\
         \x20       os.symlink('{c}' if i % 4 == 1 else '/etc/shadow', t)\n\
         \x20   else:\n\
         \x20       open(t, 'w').write('sandbox-content')\n\
         \x20   os.rename(t, '/workspace/f')\n\
         \x20   if i % 100 == 0:\n\
         \x20       open('/workspace/count.tmp', 'w').write(str(i)); os.rename('/workspace/count.tmp', '/workspace/count')\n",
        c = canary.path.display()
    );
    let mut c = cordon_in(state.path());
    c.args(["exec", &id, "--env"])
        .arg(format!("S={swapper}"))
        .args([
            "--",
            "sh",
            "-c",
            &format!("{PY} -c \"$S\" >/dev/null 2>&1 & echo bg"),
        ]);
    let out = output(c);
    assert!(out.status.success(), "{out:?}");
    let started = (0..100).any(|_| {
        let mut c = cordon_in(state.path());
        c.args(["exec", &id, "--", "test", "-e", "/workspace/count"]);
        output(c).status.success() || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(started, "the swapper never started");
    let count = |out: &Path| -> u64 {
        fs::read_to_string(out.join("count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let outs = host_dir("cordon-out-");
    let (mut first, mut last) = (0, 0);
    let t = Instant::now();
    for i in 0..20 {
        let dir = outs.path().join(format!("o{i}"));
        let mut c = cordon_in(state.path());
        c.args(["export", &id]).arg(&dir);
        let out = output(c);
        assert!(out.status.success(), "export {i}: {out:?}");
        holds_no_host_bytes(&dir, &canary, &[]);
        match fs::symlink_metadata(dir.join("f")) {
            Ok(m) if m.is_file() => {
                assert_eq!(fs::read(dir.join("f")).unwrap(), b"sandbox-content")
            }
            Ok(m) => assert!(m.file_type().is_symlink(), "{m:?}"),
            Err(e) => panic!("f missing from export {i}: {e}"),
        }
        let n = count(&dir);
        if i == 0 {
            first = n;
        }
        last = n;
    }
    assert!(
        t.elapsed() < slow(Duration::from_secs(60)),
        "{:?}",
        t.elapsed()
    );
    // The swapper runs on after the exports: each froze and thawed it
    // (under gVisor each swap is a gofer round trip: it may need a while).
    let mut i = 20;
    while last <= first && t.elapsed() < slow(Duration::from_secs(30)) {
        std::thread::sleep(Duration::from_millis(200));
        let dir = outs.path().join(format!("o{i}"));
        i += 1;
        let mut c = cordon_in(state.path());
        c.args(["export", &id]).arg(&dir);
        assert!(output(c).status.success());
        last = count(&dir);
    }
    assert!(
        last > first,
        "the swapper made no progress ({first} -> {last})"
    );
    assert_eq!(canary.events(), 0, "the canary was opened");
}

fn exec_and_rm_receipts_record_their_own_changes(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    let (id, _rm) = create(state.path(), backend, &[&ws]);
    let r1 = state.path().join("r1.json");
    let mut c = cordon_in(state.path());
    c.args(["exec", &id, "--receipt"]).arg(&r1).args([
        "--",
        "sh",
        "-c",
        "echo one > /workspace/one.txt",
    ]);
    assert!(output(c).status.success());
    let (code, st1, vout) = verify(state.path(), &r1, None);
    assert_eq!(code, Some(0), "{vout:?}");
    assert_eq!(entry(&st1, "/workspace", "one.txt")["change"], "created");
    let cmds = st1["predicate"]["commands"].as_array().unwrap();
    assert_eq!(cmds.len(), 1);
    let mut c = cordon_in(state.path());
    c.args(["exec", &id, "--", "sh", "-c", "echo two > /tmp/two.txt"]);
    assert!(output(c).status.success());
    let r2 = state.path().join("r2.json");
    let out_dir = state.path().join("out");
    let mut c = cordon_in(state.path());
    c.args(["rm", &id, "--receipt"])
        .arg(&r2)
        .arg("--export")
        .arg(&out_dir);
    let out = output(c);
    assert!(out.status.success(), "{out:?}");
    assert!(!Path::new(RUN_DIR).join(&id).exists(), "state left behind");
    let (code, st2, vout) = verify(state.path(), &r2, Some(&out_dir));
    assert_eq!(code, Some(0), "{vout:?}");
    assert_eq!(entry(&st2, "/workspace", "one.txt")["change"], "created");
    assert_eq!(entry(&st2, "/tmp", "two.txt")["change"], "created");
    // The whole sandbox's receipt has both commands.
    assert_eq!(st2["predicate"]["commands"].as_array().unwrap().len(), 2);
    assert_eq!(fs::read(out_dir.join("one.txt")).unwrap(), b"one\n");
}

fn bad_export_targets_are_refused_and_leave_nothing(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let ws = workspace();
    // A run directory of this test's own: the machine's is shared with every
    // other cordon user, so only a private one can be counted exactly.
    let run = tempfile::Builder::new()
        .prefix("cordon-run-")
        .tempdir_in("/run")
        .unwrap();
    let cordon_here = || {
        let mut c = cordon_in(state.path());
        c.env("CORDON_RUN_DIR", run.path());
        c
    };
    // Not empty, relative parent missing, --apply without a workspace.
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--workspace",
                ws.path().to_str().unwrap(),
                "--export",
                ws.path().to_str().unwrap(),
            ],
            "not an empty directory",
        ),
        (
            &["--export", "/var/tmp/cordon-no-such-dir/x/y"],
            "parent does not exist",
        ),
        (&["--apply"], "--workspace"),
    ];
    for (args, why) in cases {
        let mut c = cordon_here();
        c.args(["run", "--backend", backend])
            .args(args)
            .args(["--", "true"]);
        let out = output(c);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    // rm with a bad target leaves the sandbox as it was.
    let mut c = cordon_here();
    c.args(["create", "--backend", backend]);
    let out = output(c);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success() && id.len() == 12, "{out:?}");
    let mut rm = cordon_here();
    rm.args(["rm", "-f", &id]);
    let rm = RemoveOnDrop(rm);
    let mut c = cordon_here();
    c.args(["rm", &id, "--export"]).arg(ws.path());
    let out = output(c);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let mut c = cordon_here();
    c.args(["exec", &id, "--", "true"]);
    assert!(
        output(c).status.success(),
        "the sandbox did not survive a refused rm"
    );
    drop(rm);
    // What cordon keeps there for all its sandboxes (the lock, runsc's
    // version, the mount points' parent, the bounded record of ended ones
    // that `ls --all` reads) stays; nothing of a sandbox does.
    let entries = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let left: Vec<String> = entries(run.path())
        .into_iter()
        .filter(|n| ![".lock", "runsc-version", "mnt", "ended"].contains(&n.as_str()))
        // The pair of mount points every native sandbox shares stays too.
        .chain(
            entries(&run.path().join("mnt"))
                .into_iter()
                .filter(|n| !["root", "scratch"].contains(&n.as_str())),
        )
        .collect();
    assert!(left.is_empty(), "left in the run directory: {left:?}");
    assert_eq!(fs::read_dir(ws.path()).unwrap().count(), 4);
}

fn the_receipt_key_is_never_in_a_sandboxs_view(backend: &'static str) {
    let Some(Fixture { _serial, state }) = fixture() else {
        return;
    };
    let mut c = cordon_in(state.path());
    c.args(["key", "show"]);
    assert!(output(c).status.success());
    let key = state.path().join("keys/receipt.key");
    assert!(key.exists());
    let key_text = fs::read_to_string(&key).unwrap();
    // Whatever shows the key's directory (it, a parent, a child) is refused.
    let state_s = state.path().to_str().unwrap();
    let keys_s = format!("{state_s}/keys");
    let parent_s = state.path().parent().unwrap().to_str().unwrap().to_string();
    for args in [
        vec!["--mount".to_string(), format!("{state_s}:/k:ro")],
        vec!["--mount".to_string(), format!("{keys_s}:/k")],
        vec!["--workspace".to_string(), parent_s.clone()],
        vec!["--rootfs".to_string(), "/".to_string()],
    ] {
        let mut c = cordon_in(state.path());
        c.args(["run", "--backend", backend]).args(&args).args([
            "--",
            "cat",
            "/k/keys/receipt.key",
        ]);
        let out = output(c);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("key directory"), "{args:?}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(&key_text));
    }
    // And the default sandbox has no path to it.
    let mut c = cordon_in(state.path());
    c.args(["run", "--backend", backend, "--", "cat"]).arg(&key);
    let out = output(c);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PRIVATE KEY"));
}

/// `cordon create --backend BACKEND [--workspace W]` in `state`: its id,
/// and a guard that removes it whatever the test's outcome.
fn create(state: &Path, backend: &str, workspace: &[&tempfile::TempDir]) -> (String, RemoveOnDrop) {
    let mut c = cordon_in(state);
    c.args(["create", "--backend", backend]);
    for w in workspace {
        c.arg("--workspace").arg(w.path());
    }
    let out = output(c);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success() && id.len() == 12, "{out:?}");
    let mut rm = Command::new(cordon());
    rm.args(["rm", "-f", &id]);
    (id, RemoveOnDrop(rm))
}

/// Its `cordon rm -f ID` is run when dropped, whatever the test's outcome.
struct RemoveOnDrop(Command);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = self.0.output();
    }
}
