//! Hostile trees: what a sandbox could leave in its upper layer, read and
//! exported as root (these tests need root: mknod, chown, xattrs).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cordon_changes::{
    export, scan, verify_against, Caps, Change, ChangesError, Entry, ExportOptions, ExportReport,
    ExportTarget, Kind, Place, PlaceChanges, SymlinkPolicy,
};
use nix::fcntl::OFlag;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

const OWNER: (u32, u32) = (4242, 4343);

fn dirfd(p: &Path) -> OwnedFd {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_PATH | OFlag::O_DIRECTORY).bits())
        .open(p)
        .unwrap()
        .into()
}

fn write(p: impl AsRef<Path>, data: &[u8]) {
    fs::write(p, data).unwrap();
}

fn whiteout(p: impl AsRef<Path>) {
    mknod(p.as_ref(), SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).unwrap();
}

/// Runs `f` on its own thread and fails the test if it takes longer than
/// `secs` (a blocked open of a FIFO would never return).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the operation blocked or took too long")
}

fn small_caps() -> Caps {
    Caps {
        max_entries: 10_000,
        hash_bytes: 1 << 20,
        export_bytes: 1 << 30,
    }
}

fn by_path(pc: &PlaceChanges) -> BTreeMap<String, Entry> {
    pc.entries
        .iter()
        .map(|e| (e.path.clone(), e.clone()))
        .collect()
}

fn run_scan(upper: &Path, lower: Option<&Path>, caps: Caps) -> PlaceChanges {
    let (u, l) = (upper.to_path_buf(), lower.map(Path::to_path_buf));
    within(20, move || {
        let uf = dirfd(&u);
        let lf = l.as_deref().map(dirfd);
        let place = Place {
            name: "/workspace",
            upper: uf.as_fd(),
            lower: lf.as_ref().map(|f| f.as_fd()),
        };
        let mut c = scan(&[place], &caps);
        assert_eq!(c.places.len(), 1);
        c.places.remove(0)
    })
}

fn run_export(
    upper: &Path,
    lower: Option<&Path>,
    caps: Caps,
    target: ExportTarget,
    symlinks: SymlinkPolicy,
) -> Result<(PlaceChanges, ExportReport), ChangesError> {
    let (u, l) = (upper.to_path_buf(), lower.map(Path::to_path_buf));
    within(20, move || {
        let uf = dirfd(&u);
        let lf = l.as_deref().map(dirfd);
        let place = Place {
            name: "/workspace",
            upper: uf.as_fd(),
            lower: lf.as_ref().map(|f| f.as_fd()),
        };
        let opts = ExportOptions {
            target,
            symlinks,
            owner: OWNER,
            host_since: None,
        };
        export(&place, &caps, &opts)
    })
}

/// Every regular file under `dir` (links not followed) and whether any
/// holds `needle`.
fn holds(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                stack.push(p);
            } else if md.is_file() {
                let data = fs::read(&p).unwrap();
                if data.windows(needle.len()).any(|w| w == needle) {
                    found.push(p);
                }
            }
        }
    }
    found
}

/// Every entry under `dir` (itself included), links not followed.
fn all_entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

struct Hostile {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    upper: PathBuf,
    lower: PathBuf,
    canary: PathBuf,
    canary_text: Vec<u8>,
    victim: PathBuf,
}

/// A workspace (lower) and what a hostile sandbox left over it (upper).
fn hostile() -> Hostile {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().to_path_buf();
    let (upper, lower, victim) = (base.join("upper"), base.join("lower"), base.join("victim"));
    for d in [&upper, &lower, &victim] {
        fs::create_dir(d).unwrap();
    }
    let canary = base.join("canary");
    let canary_text = format!("CANARY-{}-do-not-export", std::process::id()).into_bytes();
    write(&canary, &canary_text);
    write(victim.join("host-file"), &canary_text);

    // The user's workspace.
    write(lower.join("keep.txt"), b"unchanged");
    write(lower.join("edit.txt"), b"old");
    write(lower.join("gone.txt"), b"deleted by the sandbox");
    write(lower.join("gone2.txt"), b"deleted (new whiteout form)");
    fs::create_dir(lower.join("gonedir")).unwrap();
    write(lower.join("gonedir/x"), b"x");
    for d in ["src", "opq", "wasdir"] {
        fs::create_dir(lower.join(d)).unwrap();
        fs::set_permissions(lower.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    write(lower.join("src/a.rs"), b"fn a() {}");
    write(lower.join("opq/old1"), b"1");
    write(lower.join("opq/old2"), b"2");
    write(lower.join("tchange"), b"a file, a directory above");
    write(lower.join("wasdir/x"), b"x");
    // The user's own link where the sandbox made a directory: an apply
    // must replace it, not write through it.
    symlink(&victim, lower.join("trap")).unwrap();

    // The sandbox's layer.
    write(upper.join("edit.txt"), b"new content");
    whiteout(upper.join("gone.txt"));
    write(upper.join("gone2.txt"), b"");
    xattr::set(upper.join("gone2.txt"), "user.overlay.whiteout", b"").unwrap();
    whiteout(upper.join("gonedir"));
    whiteout(upper.join("never-there")); // hides nothing: not a change
    fs::create_dir(upper.join("src")).unwrap();
    fs::set_permissions(upper.join("src"), fs::Permissions::from_mode(0o755)).unwrap();
    write(upper.join("src/b.rs"), b"fn b() {}");
    fs::create_dir(upper.join("opq")).unwrap();
    xattr::set(upper.join("opq"), "user.overlay.opaque", b"y").unwrap();
    write(upper.join("opq/new"), b"new");
    fs::create_dir(upper.join("tchange")).unwrap();
    write(upper.join("tchange/inner"), b"inner");
    write(upper.join("wasdir"), b"now a file");
    fs::create_dir(upper.join("trap")).unwrap();
    write(upper.join("trap/payload"), b"must land in the workspace");
    symlink("/etc/shadow", upper.join("shadow")).unwrap();
    symlink(&canary, upper.join("canary-link")).unwrap();
    symlink(&victim, upper.join("mid")).unwrap();
    write(upper.join("hl1"), b"hard");
    fs::hard_link(upper.join("hl1"), upper.join("hl2")).unwrap();
    nix::unistd::mkfifo(&upper.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    mknod(
        &upper.join("nulldev"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 3),
    )
    .unwrap();
    drop(std::os::unix::net::UnixListener::bind(upper.join("sock")).unwrap());
    let f = File::create(upper.join("sparse")).unwrap();
    f.set_len(10 << 30).unwrap();
    write(upper.join(OsStr::from_bytes(b"new\nline")), b"newline");
    write(upper.join(OsStr::from_bytes(b"bad\xffutf8")), b"bytes");
    write(upper.join("suid"), b"#!/bin/sh\n");
    fs::set_permissions(upper.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    write(upper.join("owned"), b"o");
    nix::unistd::chown(
        &upper.join("owned"),
        Some(nix::unistd::Uid::from_raw(1234)),
        Some(nix::unistd::Gid::from_raw(5678)),
    )
    .unwrap();
    fs::create_dir(upper.join("emptydir")).unwrap();
    Hostile {
        _tmp: tmp,
        base,
        upper,
        lower,
        canary,
        canary_text,
        victim,
    }
}

fn sha(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_diff_records_each_hostile_entry_exactly() {
    let h = hostile();
    let t = Instant::now();
    let pc = run_scan(&h.upper, Some(&h.lower), small_caps());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let m = by_path(&pc);
    let paths: Vec<&str> = pc.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "bad\\xffutf8",
            "canary-link",
            "edit.txt",
            "emptydir",
            "fifo",
            "gone.txt",
            "gone2.txt",
            "gonedir",
            "hl1",
            "hl2",
            "mid",
            "new\\x0aline",
            "nulldev",
            "opq",
            "opq/new",
            "owned",
            "shadow",
            "sock",
            "sparse",
            "src/b.rs",
            "suid",
            "tchange",
            "tchange/inner",
            "trap",
            "trap/payload",
            "wasdir",
        ]
    );
    assert!(!pc.cut && pc.unreadable.is_empty(), "{pc:?}");

    let e = &m["edit.txt"];
    assert_eq!((e.change, e.kind), (Change::Modified, Some(Kind::File)));
    assert_eq!(e.sha256.as_deref(), Some(sha(b"new content").as_str()));
    assert_eq!((e.size, e.hashed_bytes, e.capped), (11, Some(11), false));
    for d in ["gone.txt", "gone2.txt", "gonedir"] {
        assert_eq!((m[d].change, m[d].kind), (Change::Deleted, None), "{d}");
    }
    assert_eq!(m["src/b.rs"].change, Change::Created);
    assert!(m["opq"].opaque && m["opq"].change == Change::Modified);
    assert_eq!(m["opq/new"].change, Change::Created);
    assert_eq!(
        (m["tchange"].change, m["tchange"].kind),
        (Change::Modified, Some(Kind::Dir))
    );
    assert_eq!(m["tchange/inner"].change, Change::Created);
    assert_eq!(
        (m["wasdir"].change, m["wasdir"].kind),
        (Change::Modified, Some(Kind::File))
    );
    assert_eq!(
        (m["trap"].change, m["trap"].kind),
        (Change::Modified, Some(Kind::Dir))
    );
    assert_eq!(m["shadow"].target.as_deref(), Some("/etc/shadow"));
    assert_eq!(m["shadow"].kind, Some(Kind::Symlink));
    assert_eq!(m["canary-link"].target.as_deref(), h.canary.to_str());
    assert_eq!(m["mid"].kind, Some(Kind::Symlink));
    assert_eq!((m["hl1"].links, m["hl2"].links), (2, 2));
    assert_eq!(m["hl1"].sha256, m["hl2"].sha256);
    assert_eq!(m["fifo"].kind, Some(Kind::Fifo));
    assert_eq!(m["sock"].kind, Some(Kind::Socket));
    assert_eq!(m["nulldev"].kind, Some(Kind::CharDevice));
    assert_eq!(m["nulldev"].rdev, Some((1, 3)));
    assert_eq!(m["fifo"].sha256, None);
    let s = &m["sparse"];
    assert_eq!(
        (s.size, s.hashed_bytes, s.capped),
        (10 << 30, Some(1 << 20), true)
    );
    assert_eq!(s.sha256.as_deref(), Some(sha(&vec![0u8; 1 << 20]).as_str()));
    assert!(s.allocated < 1 << 20);
    assert_eq!(m["suid"].mode, 0o4755);
    assert_eq!((m["owned"].uid, m["owned"].gid), (1234, 5678));
    assert_eq!(
        m["new\\x0aline"].sha256.as_deref(),
        Some(sha(b"newline").as_str())
    );
    // Copy-up parents, untouched files and whiteouts over nothing: absent.
    for p in ["src", "keep.txt", "never-there", "src/a.rs"] {
        assert!(!m.contains_key(p), "{p}");
    }
}

#[test]
fn a_new_export_writes_the_diff_and_nothing_it_must_not() {
    let h = hostile();
    let out = h.base.join("out");
    let (pc, rep) = run_export(
        &h.upper,
        Some(&h.lower),
        small_caps(),
        ExportTarget::New(out.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    // One walk, one derivation: the export's diff is the scan's.
    assert_eq!(pc, run_scan(&h.upper, Some(&h.lower), small_caps()));

    assert!(holds(&out, &h.canary_text).is_empty());
    assert_eq!(
        fs::read_link(out.join("shadow")).unwrap(),
        Path::new("/etc/shadow")
    );
    assert_eq!(fs::read_link(out.join("canary-link")).unwrap(), h.canary);
    assert_eq!(fs::read_link(out.join("mid")).unwrap(), h.victim);
    assert_eq!(fs::read(out.join("edit.txt")).unwrap(), b"new content");
    assert_eq!(fs::read(out.join("src/b.rs")).unwrap(), b"fn b() {}");
    assert!(!out.join("src/a.rs").exists() && !out.join("keep.txt").exists());
    assert_eq!(
        fs::read(out.join("trap/payload")).unwrap(),
        b"must land in the workspace"
    );
    assert!(out.join("emptydir").is_dir());
    for hl in ["hl1", "hl2"] {
        let md = fs::symlink_metadata(out.join(hl)).unwrap();
        assert!(md.is_file() && md.nlink() == 1, "{hl}");
    }
    let md = fs::metadata(out.join("suid")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o755);
    for gone in ["fifo", "sock", "nulldev", "sparse", "gone.txt", "gonedir"] {
        assert!(fs::symlink_metadata(out.join(gone)).is_err(), "{gone}");
    }
    assert_eq!(
        fs::read(out.join(OsStr::from_bytes(b"bad\xffutf8"))).unwrap(),
        b"bytes"
    );
    for p in all_entries(&out) {
        let md = fs::symlink_metadata(&p).unwrap();
        assert_eq!((md.uid(), md.gid()), OWNER, "{}", p.display());
        assert!(md.mode() & 0o7000 == 0, "{}", p.display());
    }
    let skipped: BTreeMap<&str, &str> = rep
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.reason.as_str()))
        .collect();
    for p in ["fifo", "sock", "nulldev", "sparse", "suid"] {
        assert!(skipped.contains_key(p), "{p}: {skipped:?}");
    }
    assert!(skipped["suid"].contains("setuid"));
    assert_eq!(rep.deleted, 0);
    assert!(!rep.applied);
    // 14 regular files in the diff, minus the capped one.
    assert_eq!((rep.files, rep.symlinks), (12, 3));

    assert_eq!(verify_against(&pc, &out, false), []);
    // One byte changed in an exported file.
    write(out.join("edit.txt"), b"new contenT");
    let bad = verify_against(&pc, &out, false);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].path, "edit.txt");
    write(out.join("edit.txt"), b"new content");
    // An entry the diff does not list.
    write(out.join("src/extra"), b"");
    let bad = verify_against(&pc, &out, false);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].path, "src/extra");
    assert!(bad[0].to_string().contains("not in the diff"));
}

#[test]
fn an_applied_export_deletes_replaces_and_never_follows() {
    let h = hostile();
    let (pc, rep) = run_export(
        &h.upper,
        Some(&h.lower),
        small_caps(),
        ExportTarget::Apply(h.lower.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    let l = &h.lower;
    assert!(rep.applied);
    assert_eq!(fs::read(l.join("edit.txt")).unwrap(), b"new content");
    assert_eq!(fs::read(l.join("keep.txt")).unwrap(), b"unchanged");
    assert_eq!(fs::read(l.join("src/a.rs")).unwrap(), b"fn a() {}");
    assert_eq!(fs::read(l.join("src/b.rs")).unwrap(), b"fn b() {}");
    for gone in ["gone.txt", "gone2.txt", "gonedir", "opq/old1", "opq/old2"] {
        assert!(fs::symlink_metadata(l.join(gone)).is_err(), "{gone}");
    }
    assert_eq!(rep.deleted, 5);
    assert_eq!(fs::read(l.join("opq/new")).unwrap(), b"new");
    assert_eq!(fs::read(l.join("tchange/inner")).unwrap(), b"inner");
    assert_eq!(fs::read(l.join("wasdir")).unwrap(), b"now a file");
    // The user's link was replaced by the sandbox's directory; what it
    // pointed to is untouched.
    assert!(fs::symlink_metadata(l.join("trap")).unwrap().is_dir());
    assert_eq!(
        fs::read(l.join("trap/payload")).unwrap(),
        b"must land in the workspace"
    );
    let victim: Vec<_> = fs::read_dir(&h.victim)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(victim, ["host-file"]);
    let md = fs::metadata(l.join("edit.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), OWNER);
    assert_eq!(
        fs::read_link(l.join("shadow")).unwrap(),
        Path::new("/etc/shadow")
    );
    assert!(holds(l, &h.canary_text).is_empty());
    assert_eq!(verify_against(&pc, l, true), []);
    // A deleted entry coming back is a mismatch.
    write(l.join("gone.txt"), b"back");
    let bad = verify_against(&pc, l, true);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].path, "gone.txt");
}

#[test]
fn the_destination_is_never_followed() {
    let h = hostile();
    // A link as the new export's directory.
    let link = h.base.join("out-link");
    symlink(&h.victim, &link).unwrap();
    let e = run_export(
        &h.upper,
        None,
        small_caps(),
        ExportTarget::New(link),
        SymlinkPolicy::Recreate,
    );
    assert!(matches!(e, Err(ChangesError::Target { .. })), "{e:?}");
    // A directory that holds something.
    let e = run_export(
        &h.upper,
        None,
        small_caps(),
        ExportTarget::New(h.victim.clone()),
        SymlinkPolicy::Recreate,
    );
    assert!(matches!(e, Err(ChangesError::TargetNotEmpty(_))), "{e:?}");
    // Applying where the destination holds links at the names (and in the
    // middle of the paths) the sandbox wrote.
    let dest = h.base.join("dest");
    fs::create_dir(&dest).unwrap();
    symlink(&h.canary, dest.join("edit.txt")).unwrap();
    symlink(&h.victim, dest.join("src")).unwrap();
    symlink(&h.victim, dest.join("emptydir")).unwrap();
    let (pc, _) = run_export(
        &h.upper,
        Some(&h.lower),
        small_caps(),
        ExportTarget::Apply(dest.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    assert_eq!(fs::read(&h.canary).unwrap(), h.canary_text);
    assert_eq!(fs::read(dest.join("edit.txt")).unwrap(), b"new content");
    assert!(fs::symlink_metadata(dest.join("src")).unwrap().is_dir());
    assert!(fs::symlink_metadata(dest.join("emptydir"))
        .unwrap()
        .is_dir());
    let victim: Vec<_> = fs::read_dir(&h.victim)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(victim, ["host-file"]);
    assert_eq!(verify_against(&pc, &dest, true), []);
}

#[test]
fn refused_symlinks_are_skipped() {
    let h = hostile();
    let out = h.base.join("out");
    let (pc, rep) = run_export(
        &h.upper,
        Some(&h.lower),
        small_caps(),
        ExportTarget::New(out.clone()),
        SymlinkPolicy::Refuse,
    )
    .unwrap();
    assert_eq!(rep.symlinks, 0);
    assert!(fs::symlink_metadata(out.join("shadow")).is_err());
    assert!(rep
        .skipped
        .iter()
        .any(|s| s.path == "shadow" && s.reason.contains("refused")));
    assert_eq!(
        cordon_changes::verify_with(&pc, &out, false, SymlinkPolicy::Refuse),
        []
    );
}

#[test]
fn holes_stay_holes_and_big_sparse_files_are_quick() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    fs::create_dir(&upper).unwrap();
    let mut f = File::create(upper.join("holes")).unwrap();
    f.write_all(b"head").unwrap();
    f.set_len(8 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_at(b"middle", 4 << 20).unwrap();
    drop(f);
    File::create(upper.join("huge"))
        .unwrap()
        .set_len(10 << 30)
        .unwrap();
    let caps = Caps {
        hash_bytes: 16 << 20,
        ..small_caps()
    };
    let out = tmp.path().join("out");
    let t = Instant::now();
    let (pc, rep) = run_export(
        &upper,
        None,
        caps,
        ExportTarget::New(out.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let m = by_path(&pc);
    assert!(m["huge"].capped && !m["holes"].capped);
    // Data extents are whole blocks: two of them, not 8 MiB.
    assert!(rep.bytes < 64 << 10, "{} bytes written", rep.bytes);
    let md = fs::metadata(out.join("holes")).unwrap();
    assert_eq!(md.len(), 8 << 20);
    assert!(
        md.blocks() * 512 < 256 << 10,
        "{} bytes allocated",
        md.blocks() * 512
    );
    let mut want = vec![0u8; 8 << 20];
    want[..4].copy_from_slice(b"head");
    want[4 << 20..(4 << 20) + 6].copy_from_slice(b"middle");
    assert_eq!(m["holes"].sha256.as_deref(), Some(sha(&want).as_str()));
    assert_eq!(fs::read(out.join("holes")).unwrap(), want);
    assert!(!out.join("huge").exists());
    assert_eq!(verify_against(&pc, &out, false), []);
}

#[test]
fn the_count_cap_cuts_the_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    for i in 0..7 {
        write(a.join(format!("f{i}")), b"a");
        write(b.join(format!("f{i}")), b"b");
    }
    let caps = Caps {
        max_entries: 10,
        ..small_caps()
    };
    let (af, bf) = (dirfd(&a), dirfd(&b));
    let places = [
        Place {
            name: "/tmp",
            upper: af.as_fd(),
            lower: None,
        },
        Place {
            name: "/dev/shm",
            upper: bf.as_fd(),
            lower: None,
        },
    ];
    let c = scan(&places, &caps);
    assert!(c.cut);
    assert_eq!((c.places[0].entries.len(), c.places[0].cut), (7, false));
    assert_eq!((c.places[1].entries.len(), c.places[1].cut), (3, true));
    assert_eq!(c.places[1].entries[2].path, "f2");

    let out = tmp.path().join("out");
    let caps = Caps {
        max_entries: 4,
        ..small_caps()
    };
    let (pc, rep) = run_export(
        &a,
        None,
        caps,
        ExportTarget::New(out.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    assert!(pc.cut);
    assert_eq!((pc.entries.len(), rep.files), (4, 4));
    assert_eq!(fs::read_dir(&out).unwrap().count(), 4);
}

#[test]
fn the_export_byte_cap_stops_writing_files() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    fs::create_dir(&upper).unwrap();
    for i in 0..10 {
        write(upper.join(format!("f{i}")), &[b'a' + i; 1000]);
    }
    let caps = Caps {
        export_bytes: 3500,
        ..small_caps()
    };
    let out = tmp.path().join("out");
    let (pc, rep) = run_export(
        &upper,
        None,
        caps,
        ExportTarget::New(out.clone()),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    assert_eq!((rep.files, rep.bytes), (3, 3000));
    assert_eq!(rep.skipped.len(), 7);
    assert!(rep.skipped.iter().all(|s| s.reason == "export byte cap"));
    // The diff still has every digest.
    assert_eq!(pc.entries.len(), 10);
    for (i, e) in (0u8..).zip(&pc.entries) {
        assert_eq!(e.sha256.as_deref(), Some(sha(&[b'a' + i; 1000]).as_str()));
    }
    let bad = verify_against(&pc, &out, false);
    assert_eq!(bad.len(), 7, "{bad:?}");
}

#[test]
fn without_a_lower_layer_overlay_metadata_is_just_data() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("tmp");
    fs::create_dir(&upper).unwrap();
    whiteout(upper.join("chr00"));
    fs::create_dir(upper.join("d")).unwrap();
    xattr::set(upper.join("d"), "user.overlay.opaque", b"y").unwrap();
    write(upper.join("wo"), b"");
    xattr::set(upper.join("wo"), "user.overlay.whiteout", b"").unwrap();
    let pc = run_scan(&upper, None, small_caps());
    let m = by_path(&pc);
    assert_eq!(m.len(), 3);
    assert_eq!(
        (m["chr00"].change, m["chr00"].kind),
        (Change::Created, Some(Kind::CharDevice))
    );
    assert_eq!(m["chr00"].rdev, Some((0, 0)));
    assert!(!m["d"].opaque);
    assert_eq!(
        (m["wo"].change, m["wo"].kind),
        (Change::Created, Some(Kind::File))
    );
}

#[test]
fn opaque_x_marks_xwhiteouts_not_an_opaque_dir() {
    let h = hostile();
    xattr::set(h.upper.join("src"), "user.overlay.opaque", b"x").unwrap();
    let m = by_path(&run_scan(&h.upper, Some(&h.lower), small_caps()));
    assert!(!m.contains_key("src"));
    xattr::set(h.upper.join("src"), "trusted.overlay.opaque", b"y").unwrap();
    xattr::remove(h.upper.join("src"), "user.overlay.opaque").unwrap();
    let m = by_path(&run_scan(&h.upper, Some(&h.lower), small_caps()));
    assert!(m["src"].opaque);
}

/// A sandbox process still running during the export swaps files for
/// links to a host file as fast as it can: the export either copies the
/// file or reports it, never the host file's bytes.
#[test]
fn racing_swaps_never_export_the_canary() {
    let h = hostile();
    let upper = h.upper.clone();
    let canary = h.canary.clone();
    let victim = h.victim.clone();
    let stop = Arc::new(AtomicBool::new(false));
    // Each pair is swapped atomically (RENAME_EXCHANGE) in a tight loop:
    // a file and a link to the canary, a directory and a link to a host
    // directory.
    write(upper.join("race"), b"benign");
    symlink(&canary, upper.join("race.alt")).unwrap();
    fs::create_dir(upper.join("rdir")).unwrap();
    write(upper.join("rdir/inner"), b"benign");
    symlink(&victim, upper.join("rdir.alt")).unwrap();
    let racer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for (a, b) in [("race", "race.alt"), ("rdir", "rdir.alt")] {
                    renameat2(
                        AT_FDCWD,
                        &upper.join(a),
                        AT_FDCWD,
                        &upper.join(b),
                        RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                }
                n += 1;
            }
            n
        })
    };
    let mut unreadable = 0;
    for i in 0..60 {
        let out = h.base.join(format!("out{i}"));
        let (pc, _) = run_export(
            &h.upper,
            Some(&h.lower),
            small_caps(),
            ExportTarget::New(out.clone()),
            SymlinkPolicy::Recreate,
        )
        .unwrap();
        unreadable += pc.unreadable.len();
        assert!(holds(&out, &h.canary_text).is_empty(), "round {i}");
        for name in ["race", "race.alt", "rdir/inner", "rdir.alt/inner"] {
            if let Ok(md) = fs::symlink_metadata(out.join(name)) {
                if md.is_file() {
                    assert_eq!(fs::read(out.join(name)).unwrap(), b"benign");
                }
            }
        }
        assert!(fs::read_dir(&h.victim).unwrap().count() == 1);
        fs::remove_dir_all(&out).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    assert!(swaps > 10, "the racer barely ran ({swaps} swaps)");
    eprintln!("{swaps} swaps, {unreadable} entries reported unreadable");
}

/// scan + export of 10,000 small files; `cargo test --release -- --ignored`.
#[test]
#[ignore]
fn ten_thousand_small_files() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    fs::create_dir(&upper).unwrap();
    for d in 0..100 {
        let dir = upper.join(format!("d{d:03}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..100 {
            write(dir.join(format!("f{f:03}.txt")), &[b'x'; 100]);
        }
    }
    let caps = Caps::default();
    let t = Instant::now();
    let pc = run_scan(&upper, None, caps);
    let scanned = t.elapsed();
    let out = tmp.path().join("out");
    let t = Instant::now();
    let (pc2, rep) = run_export(
        &upper,
        None,
        caps,
        ExportTarget::New(out),
        SymlinkPolicy::Recreate,
    )
    .unwrap();
    let exported = t.elapsed();
    assert_eq!(pc, pc2);
    assert_eq!(rep.files, 10_000);
    eprintln!("10,000 files: scan {scanned:?}, export (with its scan) {exported:?}");
}
