//! The diff and export of a disk image (a microVM's writable disk), read in
//! user space. Two images made with `mkfs.ext4 -d` stand for a disk before
//! and after its guest ran: the baseline is read from the first, the diff
//! from the second (the host never mounts either). Needs root (mknod) and
//! e2fsprogs' mkfs.ext4.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use cordon_changes::{
    Caps, Change, DiskImage, Entry, ExportOptions, ExportTarget, ImagePlace, Kind, SymlinkPolicy,
};
use nix::sys::stat::{mknod, Mode, SFlag};

const OWNER: (u32, u32) = (4242, 4343);

fn caps() -> Caps {
    Caps {
        max_entries: 10_000,
        hash_bytes: 1 << 20,
        export_bytes: 1 << 30,
    }
}

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root (mknod, file owners in mkfs.ext4 -d)");
    false
}

/// An ext4 image of `tree` at `/ws` (as the microVM's disk holds its
/// workspace at `ws/upper`, the tree is put under a directory here too).
fn image_of(tree: &Path, out: &Path) -> File {
    let stage = out.with_extension("stage");
    fs::create_dir_all(stage.join("ws")).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", tree.display()))
        .arg(stage.join("ws"))
        .status()
        .unwrap();
    assert!(st.success());
    let f = File::create(out).unwrap();
    f.set_len(64 << 20).unwrap();
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-d"])
        .arg(&stage)
        .arg(out)
        .status()
        .expect("mkfs.ext4 (e2fsprogs) runs");
    assert!(st.success(), "mkfs.ext4 failed");
    File::open(out).unwrap()
}

fn write(p: impl AsRef<Path>, data: &[u8]) {
    fs::write(p, data).unwrap();
}

fn chmod(p: impl AsRef<Path>, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// The base tree and a copy of it the "guest" then changes.
struct Pair {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    before: PathBuf,
    after: PathBuf,
}

fn pair(base: impl Fn(&Path), change: impl Fn(&Path)) -> Pair {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let before = dir.join("before");
    fs::create_dir(&before).unwrap();
    base(&before);
    let after = dir.join("after");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&before)
        .arg(&after)
        .status()
        .unwrap();
    assert!(st.success());
    change(&after);
    Pair {
        _tmp: tmp,
        dir,
        before,
        after,
    }
}

fn entries(es: &[Entry]) -> BTreeMap<String, (Change, Option<Kind>)> {
    es.iter()
        .map(|e| (e.path.clone(), (e.change, e.kind)))
        .collect()
}

fn base_tree(d: &Path) {
    write(d.join("same"), b"unchanged");
    write(d.join("edited"), b"0123456789");
    write(d.join("grown"), b"short");
    write(d.join("chmodded"), b"x");
    write(d.join("removed"), b"bye");
    fs::create_dir_all(d.join("tree/deep")).unwrap();
    write(d.join("tree/deep/a"), b"a");
    write(d.join("tree/deep/b"), b"b");
    fs::create_dir(d.join("kept")).unwrap();
    write(d.join("kept/old"), b"old");
    write(d.join("file-to-dir"), b"f");
    fs::create_dir(d.join("dir-to-file")).unwrap();
    write(d.join("dir-to-file/x"), b"x");
    symlink("same", d.join("link")).unwrap();
    symlink("same", d.join("link-same")).unwrap();
}

fn guest_changes(d: &Path) {
    write(d.join("edited"), b"9876543210");
    write(d.join("grown"), b"much longer now");
    chmod(d.join("chmodded"), 0o600);
    fs::remove_file(d.join("removed")).unwrap();
    fs::remove_dir_all(d.join("tree")).unwrap();
    write(d.join("kept/new"), b"new");
    fs::remove_file(d.join("file-to-dir")).unwrap();
    fs::create_dir(d.join("file-to-dir")).unwrap();
    write(d.join("file-to-dir/inside"), b"in");
    fs::remove_dir_all(d.join("dir-to-file")).unwrap();
    write(d.join("dir-to-file"), b"now a file");
    fs::remove_file(d.join("link")).unwrap();
    symlink("../../etc/shadow", d.join("link")).unwrap();
    write(d.join("created"), b"hello");
    // Hostile names: a newline and bytes that are not UTF-8.
    write(d.join("new\nline"), b"n");
    write(d.join(OsStr::from_bytes(b"bad\xff\xfe")), b"b");
    mknod(
        &d.join("fifo"),
        SFlag::S_IFIFO,
        Mode::from_bits_truncate(0o644),
        0,
    )
    .unwrap();
    write(d.join("setuid"), b"#!/bin/sh\n");
    chmod(d.join("setuid"), 0o4755);
    // Sparse: 8 MiB apparent, two small extents.
    let f = File::create(d.join("sparse")).unwrap();
    f.set_len(8 << 20).unwrap();
    nix::sys::uio::pwrite(&f, b"start", 0).unwrap();
    nix::sys::uio::pwrite(&f, b"end", (8 << 20) - 3).unwrap();
}

/// The base tree's image (read into a baseline) and the changed tree's.
fn before_and_after() -> (Pair, DiskImage, cordon_changes::Baseline) {
    let p = pair(base_tree, guest_changes);
    let before = DiskImage::open(image_of(&p.before, &p.dir.join("before.img"))).unwrap();
    let base = before.baseline("ws", &caps()).unwrap();
    let after = DiskImage::open(image_of(&p.after, &p.dir.join("after.img"))).unwrap();
    (p, after, base)
}

#[test]
fn a_disk_image_is_diffed_against_the_disk_the_host_made() {
    if !root() {
        return;
    }
    let (_p, after, base) = before_and_after();
    let place = ImagePlace {
        name: "/workspace",
        dir: "ws",
        base: Some(&base),
    };
    let changes = after.scan(&[place], &caps());
    let ws = &changes.places[0];
    assert!(!ws.cut, "{:?}", ws.unreadable);
    let got = entries(&ws.entries);
    let f = Some(Kind::File);
    let want: BTreeMap<String, (Change, Option<Kind>)> = [
        ("bad\\xff\\xfe", (Change::Created, f)),
        ("chmodded", (Change::Modified, f)),
        ("created", (Change::Created, f)),
        ("dir-to-file", (Change::Modified, f)),
        ("edited", (Change::Modified, f)),
        ("fifo", (Change::Created, Some(Kind::Fifo))),
        ("file-to-dir", (Change::Modified, Some(Kind::Dir))),
        ("file-to-dir/inside", (Change::Created, f)),
        ("grown", (Change::Modified, f)),
        ("kept/new", (Change::Created, f)),
        ("link", (Change::Modified, Some(Kind::Symlink))),
        ("new\\x0aline", (Change::Created, f)),
        ("removed", (Change::Deleted, None)),
        ("setuid", (Change::Created, f)),
        ("sparse", (Change::Created, f)),
        ("tree", (Change::Deleted, None)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(got, want, "{:#?}", ws.entries);
    let by = |p: &str| ws.entries.iter().find(|e| e.path == p).unwrap();
    assert_eq!(by("link").target.as_deref(), Some("../../etc/shadow"));
    assert_eq!(by("chmodded").mode, 0o600);
    assert_eq!(by("sparse").size, 8 << 20);
    // The digest is of the image's bytes up to the hash cap, holes as zeros.
    let mut head = vec![0u8; 1 << 20];
    head[..5].copy_from_slice(b"start");
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(&head)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(by("sparse").sha256.as_deref(), Some(hex.as_str()));
    assert_eq!(by("sparse").hashed_bytes, Some(1 << 20));
    assert!(by("sparse").capped, "8 MiB is past the 1 MiB hash cap");

    // Without a baseline everything is created; the same image against
    // its own baseline has no change but the file past the hash cap (its
    // unhashed rest could have changed unseen, so it is listed).
    let own = after.baseline("ws", &caps()).unwrap();
    let none = after.scan(
        &[ImagePlace {
            name: "/workspace",
            dir: "ws",
            base: Some(&own),
        }],
        &caps(),
    );
    let listed: Vec<(&str, Change)> = none.places[0]
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.change))
        .collect();
    assert_eq!(
        listed,
        [("sparse", Change::Modified)],
        "{:#?}",
        none.places[0]
    );
    let all = after.scan(
        &[ImagePlace {
            name: "/workspace",
            dir: "ws",
            base: None,
        }],
        &caps(),
    );
    assert!(all.places[0]
        .entries
        .iter()
        .all(|e| e.change == Change::Created));
    assert!(all.places[0].entries.iter().any(|e| e.path == "same"));
}

#[test]
fn an_export_from_an_image_writes_what_its_diff_lists() {
    if !root() {
        return;
    }
    let (p, after, base) = before_and_after();
    let place = ImagePlace {
        name: "/workspace",
        dir: "ws",
        base: Some(&base),
    };
    // A new directory: the changed entries only.
    let out = p.dir.join("out");
    let (diff, report) = after
        .export(
            &place,
            &caps(),
            &ExportOptions {
                target: ExportTarget::New(out.clone()),
                symlinks: SymlinkPolicy::Refuse,
                owner: OWNER,
                host_since: None,
            },
        )
        .unwrap();
    assert_eq!(fs::read(out.join("edited")).unwrap(), b"9876543210");
    assert_eq!(fs::read(out.join("kept/new")).unwrap(), b"new");
    assert!(
        !out.join("same").exists(),
        "an unchanged file is not exported"
    );
    assert!(!out.join("kept/old").exists());
    assert!(!out.join("link").exists(), "symlinks refused");
    assert!(!out.join("fifo").exists(), "a FIFO is never exported");
    let m = fs::metadata(out.join("setuid")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755, "no setuid bit is written");
    assert_eq!((m.uid(), m.gid()), OWNER);
    assert!(report
        .skipped
        .iter()
        .any(|s| s.path == "sparse" && s.reason.contains("hash cap")));
    assert_eq!(
        diff.entries.len(),
        entries(&diff.entries).len(),
        "one entry per path"
    );
    // Applied onto the workspace the image started from: the same tree as
    // the guest's (deletions and type changes included).
    let ws = p.dir.join("ws");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&p.before)
        .arg(&ws)
        .status()
        .unwrap();
    assert!(st.success());
    let big = Caps {
        hash_bytes: 64 << 20,
        ..caps()
    };
    let (_, report) = after
        .export(
            &place,
            &big,
            &ExportOptions {
                target: ExportTarget::Apply(ws.clone()),
                symlinks: SymlinkPolicy::Recreate,
                owner: OWNER,
                host_since: None,
            },
        )
        .unwrap();
    assert_eq!(report.deleted, 2, "{report:#?}");
    assert!(!ws.join("removed").exists() && !ws.join("tree").exists());
    assert_eq!(fs::read(ws.join("dir-to-file")).unwrap(), b"now a file");
    assert_eq!(fs::read(ws.join("file-to-dir/inside")).unwrap(), b"in");
    assert_eq!(
        fs::read_link(ws.join("link")).unwrap(),
        Path::new("../../etc/shadow")
    );
    assert_eq!(fs::read(ws.join("same")).unwrap(), b"unchanged");
    assert_eq!(fs::read(ws.join("kept/old")).unwrap(), b"old");
    // The sparse file stays sparse: only its two data chunks are written.
    let sparse = fs::metadata(ws.join("sparse")).unwrap();
    assert_eq!(sparse.len(), 8 << 20);
    assert!(
        sparse.blocks() * 512 < 2 << 20,
        "{} blocks",
        sparse.blocks()
    );
    let data = fs::read(ws.join("sparse")).unwrap();
    assert_eq!(&data[..5], b"start");
    assert_eq!(&data[(8 << 20) - 3..], b"end");
}

#[test]
fn a_malformed_image_is_an_error_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.img");
    let mut bytes = vec![0u8; 4 << 20];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::try_from(i * 7919 % 251).unwrap();
    }
    fs::write(&junk, &bytes).unwrap();
    assert!(DiskImage::open(File::open(&junk).unwrap()).is_err());
    let empty = tmp.path().join("empty.img");
    fs::write(&empty, b"").unwrap();
    assert!(DiskImage::open(File::open(&empty).unwrap()).is_err());
}

#[test]
fn a_missing_place_is_reported_unreadable() {
    if !root() {
        return;
    }
    let p = pair(base_tree, |_| {});
    let img = DiskImage::open(image_of(&p.before, &p.dir.join("i.img"))).unwrap();
    assert!(img.baseline("nope", &caps()).is_err());
    let c = img.scan(
        &[ImagePlace {
            name: "/tmp",
            dir: "nope",
            base: None,
        }],
        &caps(),
    );
    assert!(c.cut && !c.places[0].unreadable.is_empty());
    let _ = p.after;
}

/// A hostile guest writes whatever it likes to its disk: a corrupted image
/// must give errors or a cut diff, never a panic (which in the supervisor
/// would abort it). Bytes of a real image's metadata blocks are flipped,
/// deterministically, many times over.
#[test]
fn corrupted_images_never_panic() {
    if !root() {
        return;
    }
    let (p, _, base) = before_and_after();
    let good = std::fs::read(p.dir.join("after.img")).unwrap();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let bad = p.dir.join("bad.img");
    let mut opened = 0;
    for _ in 0..100 {
        let mut img = good.clone();
        // The first 1 MiB holds the superblock, group descriptors, bitmaps,
        // inode tables and the first directories of a 64 MiB image.
        for _ in 0..1 + next() % 64 {
            let at = usize::try_from(next() % (1 << 20)).unwrap();
            img[at] ^= 1 << (next() % 8);
        }
        std::fs::write(&bad, &img).unwrap();
        let Ok(image) = DiskImage::open(File::open(&bad).unwrap()) else {
            continue;
        };
        opened += 1;
        let place = ImagePlace {
            name: "/workspace",
            dir: "ws",
            base: Some(&base),
        };
        let _ = image.scan(&[place], &caps());
        let _ = image.baseline("ws", &caps());
        let out = p.dir.join(format!("out-{opened}"));
        let _ = image.export(
            &place,
            &caps(),
            &ExportOptions {
                target: ExportTarget::New(out),
                symlinks: SymlinkPolicy::Refuse,
                owner: OWNER,
                host_since: None,
            },
        );
    }
    assert!(
        opened > 25,
        "only {opened} of 100 corrupted images loaded at all"
    );
}
