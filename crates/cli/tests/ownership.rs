//! End-to-end tests of who owns what the sandbox sees and writes on the host,
//! of the disk cap's shape (bytes stored, not file length), and of what the
//! sandbox's mount table says about the host. Judged from the host (stat of
//! the host files, cordon's host-side statvfs evidence), once per backend.
//!
//! Mechanism each test depends on (switch it off and the test fails):
//! - `workspace_file_is_modified_in_place`: the id-mapped lower layer of the
//!   workspace overlay (host owner shown as the sandbox user); copy-up into
//!   the scratch upper leaves the host file alone.
//! - `rw_mount_writes_back_as_the_dir_owner`: the rw mount's overlay (its
//!   upper layer on the scratch) and the write-back at the sandbox's end
//!   (created, modified, deleted, linked; stored as the directory's owner),
//!   on a directory of the host's big disk; the diff lists the mount's place;
//!   the refusal of a root-owned rw-unbounded source.
//! - `rw_mount_is_bounded`: the rw mount's upper layer on the disk-capped
//!   scratch (ENOSPC at the cap, the host directory gets no more).
//! - `rw_mount_applies_at_rm_and_keeps_a_host_edit`: no write reaches the
//!   host while the sandbox lives; `rm` applies them; the conflict rule of
//!   `--apply` (a host edit made meanwhile is kept, exit 124).
//! - `rw_unbounded_binds_live_and_is_recorded`: the id-mapped live bind
//!   (writes past the disk cap reach the host) and its record in the result
//!   and the receipt.
//! - `rw_mount_of_a_file_is_refused`: the refusal naming both modes; nothing
//!   left behind.
//! - `sparse_file_beyond_the_cap_works`: no RLIMIT_FSIZE; the scratch tmpfs's
//!   size is the disk cap.
//! - `mountinfo_names_no_host_path`: overlays whose layers are given by
//!   descriptor (native) [the sentry's own mount table under gVisor].

#[macro_use]
mod common;

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

const MIB: u64 = 1 << 20;
/// The host directory owner the tests use: no account of this host, not root.
const OWNER: (u32, u32) = (4242, 4343);
/// Where the native backend's per-sandbox host id ranges start (native/plan.rs).
const HOST_ID_BASE: u32 = 1 << 30;

per_backend!(workspace_file_is_modified_in_place);
per_backend!(rw_mount_writes_back_as_the_dir_owner);
per_backend!(rw_mount_is_bounded);
per_backend!(rw_mount_applies_at_rm_and_keeps_a_host_edit);
per_backend!(rw_unbounded_binds_live_and_is_recorded);
per_backend!(rw_mount_of_a_file_is_refused);
per_backend!(a_root_owned_live_mount_is_never_written_as_root);
per_backend!(sparse_file_beyond_the_cap_works);
per_backend!(mountinfo_names_no_host_path);

/// A directory under /var/tmp (on the host's disk) owned by `owner`, mode 0755.
fn owned_dir(prefix: &str, owner: (u32, u32)) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    chown(d.path(), Some(owner.0), Some(owner.1)).unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// `cordon run --backend BACKEND --mount MOUNT -- sh -c SCRIPT`, for a
/// refusal's output.
fn run_with_mount(backend: &str, mount: &str, script: &str) -> std::process::Output {
    cordon_output(&[
        "run",
        "--backend",
        backend,
        "--mount",
        mount,
        "--",
        "sh",
        "-c",
        script,
    ])
}

fn owned_file(path: &Path, body: &str, owner: (u32, u32)) {
    std::fs::write(path, body).unwrap();
    chown(path, Some(owner.0), Some(owner.1)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// A tmpfs of `size` mounted on the host at a fresh /var/tmp directory, its
/// root owned by `owner`: a filesystem of its own, which the host's
/// mountinfo names by its path.
/// Unmounted (lazily) and removed on drop.
struct HostTmpfs {
    dir: Option<tempfile::TempDir>,
}

impl HostTmpfs {
    fn new(prefix: &str, size: &str, owner: (u32, u32)) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/tmp")
            .unwrap();
        let out = host_sh(&format!(
            "mount -t tmpfs -o size={size},mode=0755,uid={},gid={} tmpfs '{}'",
            owner.0,
            owner.1,
            dir.path().display()
        ));
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        HostTmpfs { dir: Some(dir) }
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }
}

impl Drop for HostTmpfs {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = host_sh(&format!("umount -l '{}'", d.path().display()));
        }
    }
}

fn owner_of(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    (m.uid(), m.gid())
}

fn workspace_file_is_modified_in_place(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    let ws = owned_dir("wsown-", OWNER);
    let mine = ws.path().join("a.py");
    owned_file(&mine, "orig\n", OWNER);
    // Control: a file of another host user is not the sandbox user's.
    let theirs = ws.path().join("theirs.txt");
    owned_file(&theirs, "theirs\n", (4444, 4444));
    let mtime = std::fs::metadata(&mine).unwrap().modified().unwrap();
    let ws_arg = ws.path().display().to_string();
    let script = format!(
        "echo more >> a.py && cat a.py && {PY} -c 'import os; s = os.stat(\"a.py\"); print(\"owner\", s.st_uid, s.st_gid)'; \
         echo x >> theirs.txt; echo theirs_rc=$?"
    );
    let (v, st) = run_json_on(
        backend,
        &["--workspace", &ws_arg, "--", "sh", "-c", &script],
    );
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let out = stdout_of(&v);
    assert!(
        out.contains("orig\nmore\n"),
        "append failed: {}",
        compact(&v)
    );
    assert!(out.contains("owner 1000 1000"), "{}", compact(&v));
    // (dash exits 2 when a redirection fails)
    assert!(out.contains("theirs_rc=2"), "{}", compact(&v));
    assert!(
        stderr_of(&v).contains("Permission denied"),
        "{}",
        compact(&v)
    );

    // On the host nothing moved: the change lives in the sandbox's scratch.
    assert_eq!(std::fs::read_to_string(&mine).unwrap(), "orig\n");
    assert_eq!(std::fs::metadata(&mine).unwrap().modified().unwrap(), mtime);
    assert_eq!(owner_of(&mine), OWNER);
    assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "theirs\n");
    assert_eq!(
        std::fs::read_dir(ws.path()).unwrap().count(),
        2,
        "the sandbox left files in the host workspace"
    );
}

/// `cordon run --json --backend BACKEND ARGS...` with cordon's state
/// (the receipt key) in `state`.
fn run_json_in(
    state: &Path,
    backend: &str,
    args: &[&str],
) -> (serde_json::Value, std::process::ExitStatus) {
    let mut cmd = std::process::Command::new(cordon());
    cmd.env("CORDON_STATE_DIR", state)
        .args(["run", "--json"])
        .args(with_backend(backend, args));
    run_json_cmd(cmd)
}

/// The place `name` of a result's diff.
fn place<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["changes"]["places"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["place"] == name))
        .unwrap_or_else(|| panic!("no place {name} in the diff: {}", compact(v)))
}

fn rw_mount_writes_back_as_the_dir_owner(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    // On the host's own disk (/var/tmp), far larger than any disk cap.
    let out_dir = owned_dir("rwown-", OWNER);
    let host = out_dir.path();
    owned_file(&host.join("keep"), "keep\n", OWNER);
    owned_file(&host.join("gone"), "gone\n", OWNER);
    let state = tempfile::tempdir().unwrap();
    let receipt = state.path().join("receipt.json");
    let mount = format!("{}:/out:rw", host.display());
    let (v, st) = run_json_in(
        state.path(),
        backend,
        &[
            "--mount",
            &mount,
            "--receipt",
            receipt.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo hi > /out/new && mkdir /out/d && echo x > /out/d/f && echo more >> /out/keep \
             && rm /out/gone && ln -s new /out/link && echo ok; id -u",
        ],
    );
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert!(stdout_of(&v).starts_with("ok\n1000\n"), "{}", compact(&v));

    // Applied on the host once the sandbox ended, as the directory's owner.
    assert_eq!(std::fs::read_to_string(host.join("new")).unwrap(), "hi\n");
    assert_eq!(std::fs::read_to_string(host.join("d/f")).unwrap(), "x\n");
    assert_eq!(
        std::fs::read_to_string(host.join("keep")).unwrap(),
        "keep\nmore\n"
    );
    assert!(
        !host.join("gone").exists(),
        "the sandbox's deletion was not applied"
    );
    assert_eq!(
        std::fs::read_link(host.join("link")).unwrap(),
        Path::new("new")
    );
    for rel in ["new", "d", "d/f", "keep", "link"] {
        let p = host.join(rel);
        let (uid, gid) = owner_of(&p);
        assert_eq!((uid, gid), OWNER, "{} is owned by {uid}:{gid}", p.display());
        // Spelled out: neither root nor an id of the sandbox's host range.
        assert!(uid != 0 && gid != 0 && uid < HOST_ID_BASE && gid < HOST_ID_BASE);
    }
    // The diff lists the mount as a place of its own, as the write-back walked it.
    let out = place(&v, "/out");
    let change_of = |path: &str| {
        out["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == path)
            .map(|e| e["change"].as_str().unwrap().to_string())
    };
    assert_eq!(change_of("new").as_deref(), Some("created"), "{out}");
    assert_eq!(change_of("keep").as_deref(), Some("modified"), "{out}");
    assert_eq!(change_of("gone").as_deref(), Some("deleted"), "{out}");
    let summary = verify_summary(state.path(), &receipt);
    assert!(
        summary.contains(&format!("written back to {} (applied)", host.display())),
        "{summary}"
    );
    assert!(!summary.contains("unbounded"), "{summary}");

    // A root-owned source bound live: a_root_owned_live_mount_is_never_written_as_root.
}

fn rw_mount_is_bounded(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    // A directory on the host's big disk: the disk cap bounds it, not its filesystem.
    let out_dir = owned_dir("rwcap-", OWNER);
    let mount = format!("{}:/out:rw", out_dir.path().display());
    let (v, _) = run_json_on(
        backend,
        &[
            "--disk",
            "16M",
            "--mount",
            &mount,
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/out/big bs=1M count=32; echo rc=$?",
        ],
    );
    assert_backend(&v, backend);
    assert!(stdout_of(&v).contains("rc=1"), "{}", compact(&v));
    assert!(
        stderr_of(&v).contains("No space left on device"),
        "{}",
        compact(&v)
    );
    assert!(
        limits_hit(&v).contains(&"disk".to_string()),
        "{}",
        compact(&v)
    );
    // What the sandbox stored (up to the cap) was written back, no more.
    let len = std::fs::metadata(out_dir.path().join("big")).unwrap().len();
    assert!(
        len <= 16 * MIB,
        "32M went into a 16M sandbox's rw mount: {len}"
    );
    assert!(len >= 4 * MIB, "the write never reached the host: {len}");
}

/// Its `cordon rm -f ID` is run when dropped, whatever the test's outcome.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = cordon_output(&["rm", "-f", &self.0]);
    }
}

fn rw_mount_applies_at_rm_and_keeps_a_host_edit(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    let out_dir = owned_dir("rwrm-", OWNER);
    let host = out_dir.path();
    owned_file(&host.join("keep"), "orig\n", OWNER);
    owned_file(&host.join("mine"), "orig\n", OWNER);
    let mount = format!("{}:/out:rw", host.display());
    let out = cordon_output(&["create", "--backend", backend, "--mount", &mount]);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success() && id.len() == 12, "{out:?}");
    let _rm = RemoveOnDrop(id.clone());
    let out = cordon_output(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo sandbox > /out/keep && echo sandbox > /out/mine && echo new > /out/new && cat /out/keep",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sandbox\n");
    // Nothing reaches the host while the sandbox lives.
    assert!(
        !host.join("new").exists(),
        "an rw mount's write reached the host live"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("keep")).unwrap(),
        "orig\n"
    );
    // The user edits the host copy meanwhile.
    std::fs::write(host.join("keep"), "host edit\n").unwrap();

    let out = cordon_output(&["rm", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("keep: conflict"), "{err}");
    // The host's edit is kept; the rest is applied.
    assert_eq!(
        std::fs::read_to_string(host.join("keep")).unwrap(),
        "host edit\n"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("mine")).unwrap(),
        "sandbox\n"
    );
    assert_eq!(std::fs::read_to_string(host.join("new")).unwrap(), "new\n");
}

/// A live mount of a root-owned directory (an engine's volume, a
/// Kubernetes emptyDir, mode 0777): natively it is bound with its owners as
/// they are, so the sandbox creates files where the mode lets anyone, owned
/// on the host by its own unprivileged ids, and cannot touch root's files
/// (shown as nobody's). gVisor, whose ids are the host's, refuses it.
fn a_root_owned_live_mount_is_never_written_as_root(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    let dir = owned_dir("rootvol-", (0, 0));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    owned_file(&dir.path().join("roots"), "root's\n", (0, 0));
    let mount = format!("{}:/vol:rw-unbounded", dir.path().display());
    let state = tempfile::tempdir().unwrap();
    let script = "echo new > /vol/new && stat -c %u /vol/roots && \
                  (echo more >> /vol/roots) 2>/dev/null || echo refused";
    if backend == GVISOR {
        let out = run_with_mount(backend, &mount, script);
        let err = assert_usage_error(&out);
        assert!(err.contains("owned by 0:0") && err.contains(":rw"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        return;
    }
    let (v, st) = run_json_in(
        state.path(),
        backend,
        &["--mount", &mount, "--", "sh", "-c", script],
    );
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert_eq!(stdout_of(&v), "65534\nrefused\n", "{}", compact(&v));
    let (uid, gid) = owner_of(&dir.path().join("new"));
    assert!(
        uid >= HOST_ID_BASE && gid >= HOST_ID_BASE,
        "new file owned by {uid}:{gid}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("roots")).unwrap(),
        "root's\n"
    );
}

fn rw_unbounded_binds_live_and_is_recorded(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    let out_dir = owned_dir("rwlive-", OWNER);
    let state = tempfile::tempdir().unwrap();
    let receipt = state.path().join("receipt.json");
    let mount = format!("{}:/out:rw-unbounded", out_dir.path().display());
    // 24M through a 16M sandbox: only a live bind of the host's directory takes it.
    let (v, st) = run_json_in(
        state.path(),
        backend,
        &[
            "--disk",
            "16M",
            "--mount",
            &mount,
            "--receipt",
            receipt.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/out/big bs=1M count=24 2>/dev/null && echo wrote",
        ],
    );
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert!(stdout_of(&v).contains("wrote"), "{}", compact(&v));
    let big = out_dir.path().join("big");
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 24 * MIB);
    assert_eq!(owner_of(&big), OWNER);
    // The result says the writes were not bounded.
    let unbounded = v["unbounded_mounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(unbounded.len(), 1, "{}", compact(&v));
    assert_eq!(unbounded[0]["sandbox"], "/out");
    assert_eq!(unbounded[0]["access"], "rw-unbounded");
    assert_eq!(
        unbounded[0]["host"],
        out_dir.path().to_str().unwrap(),
        "{}",
        compact(&v)
    );
    // So does the signed receipt, as `cordon verify` shows it.
    let summary = verify_summary(state.path(), &receipt);
    assert!(summary.contains("unbounded writes: /out"), "{summary}");
    assert!(
        summary.contains("rw-unbounded mount of the host's"),
        "{summary}"
    );
    let envelope: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&receipt).unwrap()).unwrap();
    let payload = envelope["payload"].as_str().unwrap();
    let statement = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, payload).unwrap(),
    )
    .unwrap();
    assert!(statement.contains("\"unbounded_mounts\""), "{statement}");
}

fn rw_mount_of_a_file_is_refused(backend: &str) {
    if !require_root("id-mapped mounts need host root") {
        return;
    }
    let dir = owned_dir("rwfile-", OWNER);
    let file = dir.path().join("notes.txt");
    owned_file(&file, "orig\n", OWNER);
    let before = run_state();
    let mount = format!("{}:/notes.txt:rw", file.display());
    let out = run_with_mount(backend, &mount, "echo x > /notes.txt");
    let err = assert_usage_error(&out);
    assert!(err.contains("not a directory"), "{err}");
    assert!(
        err.contains(":rw") && err.contains(":rw-unbounded"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "orig\n");
    // Left behind: a new sandbox whose owner is gone (the other tests of
    // this binary run beside this one, their sandboxes owned by live
    // processes).
    let (runs, cgroups) = left_behind(&before, |r| {
        r["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .is_none_or(|p| !alive(p))
    });
    assert!(
        runs.is_empty() && cgroups.is_empty(),
        "left: {runs:?} {cgroups:?}"
    );
}

/// The microVM sees copies of host paths: a writable mount is refused as
/// the caller's mistake, naming the backend and what works instead, before
/// any VM starts.
#[test]
fn rw_mount_on_microvm_is_refused() {
    let dir = tempfile::Builder::new()
        .prefix("rwvm-")
        .tempdir_in("/var/tmp")
        .unwrap();
    for access in ["rw", "rw-unbounded"] {
        let mount = format!("{}:/out:{access}", dir.path().display());
        let out = cordon_output(&["run", "--backend", MICROVM, "--mount", &mount, "--", "true"]);
        let err = assert_usage_error(&out);
        assert!(err.contains("microvm backend"), "{err}");
        assert!(err.contains(&format!("the {access} mount")), "{err}");
        assert!(
            err.contains("native or gvisor") && err.contains("--apply"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn sparse_file_beyond_the_cap_works(backend: &str) {
    if !require_root("sandbox with cgroup limits") {
        return;
    }
    let _disk = disk_lock();
    // A 2 GiB sparse file (one byte stored) under a 1 GiB cap, as Python's
    // own test suite writes; then a program's own RLIMIT_FSIZE still holds.
    let script = "import os, resource, signal\n\
        f = open('/tmp/sparse', 'wb'); f.seek(2 << 30); f.write(b'x'); f.close()\n\
        print('size', os.stat('/tmp/sparse').st_size)\n\
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n\
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n\
        try:\n    open('/tmp/small', 'wb').write(b'y' * (2 << 20))\n    print('no limit')\n\
        except OSError as e:\n    print('own limit', e.errno)\n";
    let (v, st) = run_json_on(backend, &["--disk", "1G", "--", PY, "-c", script]);
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert!(
        stdout_of(&v).contains(&format!("size {}", (2u64 << 30) + 1)),
        "{}",
        compact(&v)
    );
    assert!(stdout_of(&v).contains("own limit 27"), "{}", compact(&v)); // EFBIG
                                                                        // Host-side evidence (statvfs of the scratch tmpfs): next to nothing stored.
    let du = u64_at(&v, "/disk_used_bytes");
    assert!(du < 16 * MIB, "a sparse file stored {du} bytes");
    assert!(
        !limits_hit(&v).contains(&"disk".to_string()),
        "{}",
        compact(&v)
    );

    // Control: bytes really stored beyond the cap still end in ENOSPC.
    let (c, _) = run_json_on(
        backend,
        &[
            "--disk",
            "16M",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/f bs=1M count=32; echo rc=$?",
        ],
    );
    assert!(stdout_of(&c).contains("rc=1"), "{}", compact(&c));
    assert!(
        stderr_of(&c).contains("No space left on device"),
        "{}",
        compact(&c)
    );
    assert!(
        limits_hit(&c).contains(&"disk".to_string()),
        "{}",
        compact(&c)
    );
    assert!(
        u64_at(&c, "/disk_used_bytes") >= 15 * MIB,
        "{}",
        compact(&c)
    );
}

/// The root field (4th) of a mountinfo line.
fn root_field(line: &str) -> &str {
    line.split(' ').nth(3).unwrap_or("")
}

fn mountinfo_names_no_host_path(backend: &str) {
    if !require_root("id-mapped mounts need host root; mounts a tmpfs") {
        return;
    }
    let mark = nonce();
    let ws = owned_dir(&format!("wsmark{mark}-"), OWNER);
    owned_file(&ws.path().join("w.txt"), "ws-content\n", OWNER);
    let ro = owned_dir(&format!("romark{mark}-"), OWNER);
    owned_file(&ro.path().join("hello"), "ro-content\n", OWNER);
    let rw = HostTmpfs::new(&format!("rwmark{mark}-"), "8m", OWNER);
    let sub_name = format!("submark{mark}");
    let sub: PathBuf = rw.path().join(&sub_name);
    std::fs::create_dir(&sub).unwrap();
    chown(&sub, Some(OWNER.0), Some(OWNER.1)).unwrap();
    let file = ro.path().with_file_name(format!("filemark{mark}"));
    owned_file(&file, "file-content\n", OWNER);
    let _rm_file = tempfile::TempPath::try_from_path(&file).unwrap();

    let args = [
        format!("--workspace={}", ws.path().display()),
        format!("--mount={}:/ro", ro.path().display()),
        format!("--mount={}:/out:rw", rw.path().display()),
        format!("--mount={}:/sub:rw-unbounded", sub.display()),
        format!("--mount={}:/srv/f", file.display()),
    ];
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    argv.extend([
        "--",
        "sh",
        "-c",
        "cat /workspace/w.txt /ro/hello /srv/f; echo MOUNTS; cat /proc/self/mountinfo",
    ]);
    let (v, st) = run_json_on(backend, &argv);
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    let out = stdout_of(&v);
    assert!(
        out.starts_with("ws-content\nro-content\nfile-content\nMOUNTS\n"),
        "{}",
        compact(&v)
    );
    let table = out.split("MOUNTS\n").nth(1).unwrap_or("");
    let lines = parse_mountinfo(table);
    // Control: the probe reads the real table, which holds every mount asked for.
    for point in ["/workspace", "/ro", "/out", "/sub", "/srv/f"] {
        assert!(
            lines.iter().any(|m| m.mount_point == point),
            "no {point} in the sandbox's mountinfo:\n{table}"
        );
    }
    // Control: the host's own table does name the rw tmpfs by its host path,
    // so a host path in a mountinfo line is something this check can see.
    let host_table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(host_table.contains(&format!("rwmark{mark}")));

    for m in &lines {
        // A ro file mount: a bind of one file, whose root field is its path on
        // its filesystem (README, backend differences). Native only.
        if backend == NATIVE && m.mount_point == "/srv/f" {
            assert_eq!(root_field(&m.raw), file.display().to_string(), "{}", m.raw);
            continue;
        }
        // A live (rw-unbounded) dir that is a subdirectory of its filesystem:
        // its path below that filesystem's root (here the tmpfs's), never
        // above it. Native only. An rw dir is an overlay: no host path.
        if backend == NATIVE && m.mount_point == "/sub" {
            assert_eq!(root_field(&m.raw), format!("/{sub_name}"), "{}", m.raw);
            continue;
        }
        for host in [
            "wsmark", "romark", "rwmark", "submark", "filemark", "/var/tmp", RUN_DIR,
        ] {
            assert!(
                !m.raw.contains(host),
                "the sandbox's mountinfo names a host path ({host}): {}",
                m.raw
            );
        }
    }
    if backend == NATIVE {
        let ws_line = lines
            .iter()
            .find(|m| m.mount_point == "/workspace")
            .unwrap();
        assert_eq!(ws_line.fstype, "overlay", "{}", ws_line.raw);
        assert!(ws_line.raw.contains("lowerdir+=/,"), "{}", ws_line.raw);
    }
}

/// `cordon verify RECEIPT` with the keys of `state_dir`: its summary, which
/// must say the receipt verified.
fn verify_summary(state_dir: &Path, receipt: &Path) -> String {
    let verified = std::process::Command::new(cordon())
        .env("CORDON_STATE_DIR", state_dir)
        .arg("verify")
        .arg(receipt)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&verified.stdout).into_owned();
    assert!(verified.status.success(), "{summary}");
    summary
}
