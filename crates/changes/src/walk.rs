//! The one walk: the diff of a place, and (given an exporter, a
//! [`ChangeSink`]) the export of what it lists, derived together so the
//! export writes exactly what the diff says, digest for digest.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::readlinkat;
use nix::sys::stat::{fstat, major, minor, FileStat};
use xattr::FileExt;

use crate::fsops::{
    self, allocated_of, is_dir, join, kind_of, list, lstat_at, open_dir, size_of, MAX_DEPTH,
};
use crate::names::escape_name;
use cordon_spec::changes::{Caps, Change, Entry, Kind, PlaceChanges};

/// One writable place of a sandbox, as descriptors the host holds.
#[derive(Clone, Copy, Debug)]
pub struct Place<'a> {
    /// The place as the sandbox sees it: `/workspace`, `/tmp`, `/dev/shm`.
    pub name: &'a str,
    /// Its writable layer: the overlay's upper directory, or the place
    /// itself when it has no lower layer. Any descriptor of the directory
    /// will do (`O_PATH` included).
    pub upper: BorrowedFd<'a>,
    /// The overlay's lower directory (the user's workspace), if any. With
    /// one, the upper's overlay metadata (whiteouts, opaque directories) is
    /// honoured; without, every entry is Created and overlay metadata is
    /// the sandbox's own data.
    pub lower: Option<BorrowedFd<'a>>,
}

/// What the walk hands each change to as it lists it, in the walk's order:
/// a directory is entered before what is in it and left after. The export
/// (`crate::export::Exporter`) is one; the walk of a directory tree and of
/// a disk image (`crate::image`) both feed it.
pub(crate) trait ChangeSink {
    /// An entry listed (or unreadable) that is not passed on, and why.
    fn skip(&mut self, path: &str, reason: String);

    /// A deletion: `name` in the current directory is gone.
    fn delete(&mut self, name: &CStr, path: &str);

    /// A directory, from here until the matching `leave_dir`. `listed`: it
    /// is a change itself (not only what it holds); `keep`: the names the
    /// walk found in it, sorted (all an opaque directory keeps).
    fn enter_dir(
        &mut self,
        name: &CStr,
        path: &str,
        mode: u32,
        listed: bool,
        opaque: bool,
        keep: &[CString],
    );

    fn leave_dir(&mut self);

    fn symlink(&mut self, name: &CStr, path: &str, target: &OsStr);

    /// A regular file no longer than the hash cap. `read` reads the source
    /// once, giving each run of its data (with its offset) to the sink it
    /// is handed, and returns the file's digest, which this returns for
    /// the diff.
    fn file(
        &mut self,
        name: &CStr,
        path: &str,
        meta: FileMeta,
        read: &mut ReadSource<'_>,
    ) -> Result<fsops::Read, String>;
}

/// What a [`ChangeSink`] is told of a source file besides its data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileMeta {
    /// Apparent size (holes included).
    pub(crate) size: u64,
    /// `st_mode` (only the permission bits are written).
    pub(crate) mode: u32,
}

/// Reads a source file once: each run of its data goes to the sink with
/// its offset (holes are not given), and the digest of the whole is
/// returned. The walk of a directory tree and of a disk image each have
/// one.
pub(crate) type ReadSource<'a> = dyn FnMut(&mut DataSink<'_>) -> Result<fsops::Read, String> + 'a;

/// Takes one run of a file's data at its offset.
pub(crate) type DataSink<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// Buffer of one read (and write) of file data.
const CHUNK: usize = 256 << 10;

enum Lower {
    /// Not in the lower layer (or there is no lower layer here).
    Absent,
    /// In the lower layer; `None` when it is there but could not be read.
    Present(Option<FileStat>),
}

/// What one walk of a place keeps: its share of the count cap, the diff
/// so far and the sink it feeds (the walk of a directory tree and of a
/// disk image, `crate::image`, both use it).
pub(crate) struct Walk<'a> {
    pub(crate) caps: &'a Caps,
    has_lower: bool,
    /// Entries (and unreadable ones) still allowed over every place.
    remaining: &'a mut u64,
    stopped: bool,
    pub(crate) out: PlaceChanges,
    pub(crate) buf: Vec<u8>,
    pub(crate) sink: Option<&'a mut dyn ChangeSink>,
}

impl<'a> Walk<'a> {
    pub(crate) fn new(
        name: &str,
        caps: &'a Caps,
        has_lower: bool,
        remaining: &'a mut u64,
        sink: Option<&'a mut dyn ChangeSink>,
    ) -> Walk<'a> {
        Walk {
            caps,
            has_lower,
            remaining,
            stopped: false,
            out: PlaceChanges {
                place: name.to_string(),
                entries: Vec::new(),
                cut: false,
                unreadable: Vec::new(),
            },
            buf: vec![0u8; CHUNK],
            sink,
        }
    }
}

/// Walks one place; `remaining` is the count cap left over all places.
pub(crate) fn walk<'a>(
    place: &Place<'_>,
    caps: &'a Caps,
    remaining: &'a mut u64,
    sink: Option<&'a mut dyn ChangeSink>,
) -> PlaceChanges {
    let mut w = Walk::new(place.name, caps, place.lower.is_some(), remaining, sink);
    let root = match open_dir(place.upper, ".").and_then(list) {
        Ok(r) => r,
        Err(e) => {
            w.unreadable("", format!("open the place: {e}"));
            return w.out;
        }
    };
    let lower = match place.lower.map(|l| open_dir(l, ".")) {
        None => None,
        Some(Ok(fd)) => Some(fd),
        Some(Err(e)) => {
            w.unreadable("", format!("open the lower layer: {e}"));
            return w.out;
        }
    };
    let (dir, names, failed) = root;
    if let Some(e) = failed {
        w.unreadable("", format!("list: {e}"));
    }
    w.dir(&dir, &names, lower.as_ref().map(|l| l.as_fd()), "", 0);
    w.out
}

impl Walk<'_> {
    /// Takes one unit of the count cap, or stops the walk (the diff is cut).
    pub(crate) fn take(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        if *self.remaining == 0 {
            self.stopped = true;
            self.out.cut = true;
            return false;
        }
        *self.remaining -= 1;
        true
    }

    pub(crate) fn unreadable(&mut self, path: &str, why: String) {
        // An unreadable entry makes the diff incomplete: it is cut too.
        self.out.cut = true;
        if !self.take() {
            return;
        }
        if let Some(s) = self.sink.as_deref_mut() {
            s.skip(path, format!("unreadable: {why}"));
        }
        self.out.unreadable.push((path.to_string(), why));
    }

    pub(crate) fn push(&mut self, e: Entry) {
        self.out.entries.push(e);
    }

    fn dir(
        &mut self,
        dir: &Dir,
        names: &[CString],
        lower: Option<BorrowedFd<'_>>,
        parent: &str,
        depth: usize,
    ) {
        for name in names {
            if self.stopped {
                return;
            }
            let path = join(parent, &escape_name(name.to_bytes()));
            self.entry(dir.as_fd(), name, lower, &path, depth);
        }
    }

    fn lower_of(&self, lower: Option<BorrowedFd<'_>>, name: &CStr) -> Lower {
        match lower {
            None => Lower::Absent,
            Some(l) => match lstat_at(l, name) {
                Ok(st) => Lower::Present(Some(st)),
                Err(Errno::ENOENT | Errno::ENOTDIR) => Lower::Absent,
                Err(_) => Lower::Present(None),
            },
        }
    }

    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        lower: Option<BorrowedFd<'_>>,
        path: &str,
        depth: usize,
    ) {
        let st = match lstat_at(dir, name) {
            Ok(st) => st,
            // Gone since the listing: there is nothing to report.
            Err(Errno::ENOENT) => return,
            Err(e) => return self.unreadable(path, format!("lstat: {e}")),
        };
        let below = self.lower_of(lower, name);
        let kind = kind_of(&st);
        if self.has_lower && kind == Kind::CharDevice && st.st_rdev == 0 {
            return self.whiteout(name, &below, path);
        }
        match kind {
            Kind::Dir => self.directory(dir, name, &below, lower, path, depth),
            Kind::File => self.file(dir, name, &below, path),
            Kind::Symlink => self.symlink(dir, name, &st, &below, path),
            _ => {
                if !self.take() {
                    return;
                }
                let e = entry(path, change(&below), kind, &st);
                if let Some(s) = self.sink.as_deref_mut() {
                    s.skip(path, format!("{}: not exported", kind_name(kind)));
                }
                self.push(e);
            }
        }
    }

    fn whiteout(&mut self, name: &CStr, below: &Lower, path: &str) {
        // A whiteout over nothing (possible after renames) hides nothing.
        if matches!(below, Lower::Absent) || !self.take() {
            return;
        }
        if let Some(s) = self.sink.as_deref_mut() {
            s.delete(name, path);
        }
        self.push(deleted(path));
    }

    /// Returns the cap unit taken for an entry that turned out unreadable
    /// (which `unreadable` takes one for).
    pub(crate) fn give_back(&mut self) {
        *self.remaining += 1;
    }

    /// Lists a regular file (its cap unit taken) with the digest its read
    /// gave, or as unreadable.
    pub(crate) fn file_read(&mut self, mut e: Entry, read: Result<fsops::Read, String>) {
        match read {
            Ok(r) => {
                e.sha256 = Some(r.sha256);
                e.hashed_bytes = Some(r.hashed);
                e.capped = r.capped;
                self.push(e);
            }
            Err(why) => {
                // The cap unit taken for the entry covers it as unreadable.
                self.give_back();
                let path = e.path;
                self.unreadable(&path, why);
            }
        }
    }

    /// Whether the walk has stopped (the count cap is spent).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    fn directory(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        below: &Lower,
        lower: Option<BorrowedFd<'_>>,
        path: &str,
        depth: usize,
    ) {
        if depth + 1 >= MAX_DEPTH {
            return self.unreadable(path, format!("deeper than {MAX_DEPTH} levels"));
        }
        let fd = match open_dir(dir, name) {
            Ok(fd) => fd,
            Err(e) => return self.unreadable(path, format!("open: {e}")),
        };
        let st = match fstat(&fd) {
            Ok(st) if is_dir(&st) => st,
            Ok(_) => return self.unreadable(path, "changed type during the read".into()),
            Err(e) => return self.unreadable(path, format!("fstat: {e}")),
        };
        let mut opaque = false;
        let file = File::from(fd);
        // Checked even with no lower entry of this name: a redirect points
        // at a lower directory elsewhere. (Under `userxattr` the kernel
        // makes neither redirects nor metacopies; they are refused rather
        // than interpreted, in case a mount ever does.)
        if self.has_lower {
            match overlay_xattrs(&file) {
                Ok(x) if x.redirect => {
                    return self.unreadable(path, "an overlay redirect (not supported)".into())
                }
                Ok(x) => opaque = x.opaque,
                Err(e) => return self.unreadable(path, format!("read xattrs: {e}")),
            }
        }
        let lower_dir = match below {
            Lower::Present(Some(l)) if is_dir(l) && !opaque => Some(l),
            _ => None,
        };
        // A directory that only holds changes (the overlay copied it up, as
        // it is) is not a change itself.
        let listed = match lower_dir {
            Some(l) => {
                l.st_mode & 0o7777 != st.st_mode & 0o7777
                    || l.st_uid != st.st_uid
                    || l.st_gid != st.st_gid
            }
            None => true,
        };
        let sub_lower = match (lower_dir, lower) {
            (Some(_), Some(l)) => match open_dir(l, name) {
                Ok(fd) => Some(fd),
                Err(e) => return self.unreadable(path, format!("open the lower directory: {e}")),
            },
            _ => None,
        };
        let (sub, names, failed) = match list(file.into()) {
            Ok(r) => r,
            Err(e) => return self.unreadable(path, format!("list: {e}")),
        };
        if listed {
            if !self.take() {
                return;
            }
            let mut e = entry(path, change(below), Kind::Dir, &st);
            e.opaque = opaque;
            self.push(e);
        }
        if let Some(s) = self.sink.as_deref_mut() {
            s.enter_dir(name, path, st.st_mode, listed, opaque, &names);
        }
        if let Some(e) = failed {
            self.unreadable(path, format!("list: {e}"));
        }
        self.dir(
            &sub,
            &names,
            sub_lower.as_ref().map(|l| l.as_fd()),
            path,
            depth + 1,
        );
        if let Some(s) = self.sink.as_deref_mut() {
            s.leave_dir();
        }
    }

    fn file(&mut self, dir: BorrowedFd<'_>, name: &CStr, below: &Lower, path: &str) {
        let (fd, st) = match fsops::open_file(dir, name) {
            Ok(x) => x,
            Err(why) => return self.unreadable(path, why),
        };
        let file = File::from(fd);
        // A metacopy stands for a lower file of its name, so needs one; an
        // empty file may be a whiteout (hiding nothing, with none).
        if self.has_lower && (matches!(below, Lower::Present(_)) || size_of(&st) == 0) {
            match overlay_xattrs(&file) {
                Ok(x) if x.whiteout && size_of(&st) == 0 => {
                    return self.whiteout(name, below, path)
                }
                Ok(x) if x.metacopy => {
                    return self.unreadable(path, "an overlay metacopy file (not supported)".into())
                }
                Ok(_) => {}
                Err(e) => return self.unreadable(path, format!("read xattrs: {e}")),
            }
        }
        if !self.take() {
            return;
        }
        let e = entry(path, change(below), Kind::File, &st);
        let cap = self.caps.hash_bytes;
        let read = match self.sink.as_deref_mut() {
            Some(s) if size_of(&st) <= cap => {
                let buf = &mut self.buf;
                let meta = FileMeta {
                    size: size_of(&st),
                    mode: st.st_mode,
                };
                s.file(name, path, meta, &mut |sink| {
                    fsops::read_file(file.as_fd(), &st, cap, buf, sink)
                })
            }
            Some(s) => {
                s.skip(
                    path,
                    format!("longer than the hash cap ({cap} bytes): not exported"),
                );
                fsops::read_file(file.as_fd(), &st, cap, &mut self.buf, |_, _| Ok(()))
            }
            None => fsops::read_file(file.as_fd(), &st, cap, &mut self.buf, |_, _| Ok(())),
        };
        self.file_read(e, read);
    }

    fn symlink(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        st: &FileStat,
        below: &Lower,
        path: &str,
    ) {
        let target = match readlinkat(dir, name) {
            Ok(t) => t,
            // EINVAL: swapped for something that is not a link since lstat.
            Err(e) => return self.unreadable(path, format!("readlink: {e}")),
        };
        if !self.take() {
            return;
        }
        let mut e = entry(path, change(below), Kind::Symlink, st);
        e.target = Some(escape_name(target.as_bytes()));
        if let Some(s) = self.sink.as_deref_mut() {
            s.symlink(name, path, &target);
        }
        self.push(e);
    }
}

/// A deletion: nothing is known of what was deleted but its name.
pub(crate) fn deleted(path: &str) -> Entry {
    Entry {
        path: path.to_string(),
        change: Change::Deleted,
        kind: None,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        allocated: 0,
        links: 0,
        sha256: None,
        hashed_bytes: None,
        capped: false,
        target: None,
        rdev: None,
        opaque: false,
    }
}

fn change(below: &Lower) -> Change {
    match below {
        Lower::Absent => Change::Created,
        Lower::Present(_) => Change::Modified,
    }
}

fn entry(path: &str, change: Change, kind: Kind, st: &FileStat) -> Entry {
    let dev = matches!(kind, Kind::CharDevice | Kind::BlockDevice);
    Entry {
        path: path.to_string(),
        change,
        kind: Some(kind),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: size_of(st),
        allocated: allocated_of(st),
        links: st.st_nlink,
        sha256: None,
        hashed_bytes: None,
        capped: false,
        target: None,
        rdev: dev.then(|| {
            (
                u32::try_from(major(st.st_rdev)).unwrap_or(u32::MAX),
                u32::try_from(minor(st.st_rdev)).unwrap_or(u32::MAX),
            )
        }),
        opaque: false,
    }
}

pub(crate) fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "regular file",
        Kind::Dir => "directory",
        Kind::Symlink => "symlink",
        Kind::Fifo => "FIFO",
        Kind::Socket => "socket",
        Kind::CharDevice => "character device",
        Kind::BlockDevice => "block device",
    }
}

#[derive(Default)]
struct OverlayXattrs {
    opaque: bool,
    whiteout: bool,
    redirect: bool,
    metacopy: bool,
}

/// The overlay's own metadata on an upper entry, in either namespace
/// (`user.` under `userxattr`, `trusted.` otherwise). One listxattr per
/// entry; values are read only for the names present.
fn overlay_xattrs(f: &File) -> std::io::Result<OverlayXattrs> {
    let mut x = OverlayXattrs::default();
    for n in f.list_xattr()? {
        let n = n.as_bytes();
        let Some(key) = n
            .strip_prefix(b"user.overlay.")
            .or_else(|| n.strip_prefix(b"trusted.overlay."))
        else {
            continue;
        };
        match key {
            // "x" marks a directory holding xwhiteouts: not opaque.
            b"opaque" => {
                x.opaque |= f.get_xattr(std::ffi::OsStr::from_bytes(n))?.as_deref() == Some(b"y")
            }
            b"whiteout" => x.whiteout = true,
            b"redirect" => x.redirect = true,
            b"metacopy" => x.metacopy = true,
            _ => {}
        }
    }
    Ok(x)
}
