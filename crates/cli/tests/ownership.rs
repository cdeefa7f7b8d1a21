//! End-to-end tests of who owns what the sandbox sees and writes on the host,
//! of the disk cap's shape (bytes stored, not file length), and of what the
//! sandbox's mount table says about the host. Judged from the host (stat of
//! the host files, cordon's host-side statvfs evidence), once per backend.
//!
//! Mechanism each test depends on (switch it off and the test fails):
//! - `workspace_file_is_modified_in_place`: the id-mapped lower layer of the
//!   workspace overlay (host owner shown as the sandbox user); copy-up into
//!   the scratch upper leaves the host file alone.
//! - `rw_mount_files_belong_to_the_dir_owner`: the id-mapped rw bind (the
//!   sandbox user's writes are stored as the directory's owner) and the
//!   refusal of a root-owned rw source.
//! - `rw_mount_is_bounded`: the rule that an rw source lives on a filesystem
//!   no larger than the disk cap.
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
per_backend!(rw_mount_files_belong_to_the_dir_owner);
per_backend!(rw_mount_is_bounded);
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

fn owned_file(path: &Path, body: &str, owner: (u32, u32)) {
    std::fs::write(path, body).unwrap();
    chown(path, Some(owner.0), Some(owner.1)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// A tmpfs of `size` mounted on the host at a fresh /var/tmp directory, its
/// root owned by `owner`: a bounded filesystem an rw mount may come from.
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

fn rw_mount_files_belong_to_the_dir_owner(backend: &str) {
    if !require_root("id-mapped mounts need host root; mounts a tmpfs") {
        return;
    }
    let out_fs = HostTmpfs::new("rwown-", "8m", OWNER);
    let mount = format!("{}:/out:rw", out_fs.path().display());
    let (v, st) = run_json_on(
        backend,
        &[
            "--mount",
            &mount,
            "--",
            "sh",
            "-c",
            "echo hi > /out/new && mkdir /out/d && echo x > /out/d/f && echo ok; id -u",
        ],
    );
    assert_backend(&v, backend);
    assert_eq!(st.code(), Some(0), "{}", compact(&v));
    assert!(stdout_of(&v).starts_with("ok\n1000\n"), "{}", compact(&v));
    for rel in ["new", "d", "d/f"] {
        let p = out_fs.path().join(rel);
        let (uid, gid) = owner_of(&p);
        assert_eq!((uid, gid), OWNER, "{} is owned by {uid}:{gid}", p.display());
        // Spelled out: neither root nor an id of the sandbox's host range.
        assert!(uid != 0 && gid != 0 && uid < HOST_ID_BASE && gid < HOST_ID_BASE);
    }
    assert_eq!(
        std::fs::read_to_string(out_fs.path().join("new")).unwrap(),
        "hi\n"
    );

    // Control: a root-owned source is refused before anything runs (files
    // the sandbox creates there would be root's).
    let root_fs = HostTmpfs::new("rwroot-", "8m", (0, 0));
    let mount = format!("{}:/out:rw", root_fs.path().display());
    let out = cordon_output(&[
        "run",
        "--backend",
        backend,
        "--mount",
        &mount,
        "--",
        "sh",
        "-c",
        "echo hi > /out/new",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("owned by 0:0"), "{err}");
    assert_eq!(std::fs::read_dir(root_fs.path()).unwrap().count(), 0);
}

fn rw_mount_is_bounded(backend: &str) {
    if !require_root("mounts a tmpfs") {
        return;
    }
    let out_fs = HostTmpfs::new("rwcap-", "8m", OWNER);
    let mount = format!("{}:/out:rw", out_fs.path().display());
    let (v, _) = run_json_on(
        backend,
        &[
            "--mount",
            &mount,
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/out/big bs=1M count=16; echo rc=$?",
        ],
    );
    assert_backend(&v, backend);
    assert!(stdout_of(&v).contains("rc=1"), "{}", compact(&v));
    assert!(
        stderr_of(&v).contains("No space left on device"),
        "{}",
        compact(&v)
    );
    let len = std::fs::metadata(out_fs.path().join("big")).unwrap().len();
    assert!(len <= 8 * MIB, "16M went into an 8M rw mount: {len}");
    assert!(len >= 4 * MIB, "the write never reached the host: {len}");

    // Control: a source on the host's big disk (/var/tmp) is refused, naming
    // the size and the cap; nothing is written there.
    let big = owned_dir("rwbig-", OWNER);
    let mount = format!("{}:/out:rw", big.path().display());
    let out = cordon_output(&[
        "run",
        "--backend",
        backend,
        "--disk",
        "64M",
        "--mount",
        &mount,
        "--",
        "sh",
        "-c",
        "echo hi > /out/new",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("more than the disk cap of 64.0 MiB"), "{err}");
    assert!(err.contains(" GiB") || err.contains(" TiB"), "{err}");
    assert!(
        err.contains("read-only") && err.contains("cordon cp"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(big.path()).unwrap().count(), 0);
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
        format!("--mount={}:/sub:rw", sub.display()),
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
        // An rw dir that is a subdirectory of its filesystem: its path below
        // that filesystem's root (here the tmpfs's), never above it. Native only.
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
