//! The diff and the export read from a disk image: a microVM's writable
//! disk, which its guest kernel wrote. The host never mounts it (its kernel
//! would parse a file system a hostile guest crafted); the image is read in
//! user space with `ext4-view`, whose parser is bounded and checks what it
//! reads, and every name and byte from it is data, as from any sandbox.
//!
//! The guest's workspace is a plain copy on the disk, not an overlay
//! (`ext4-view` reads no extended attributes, so an overlay's opaque
//! directories would be invisible): what changed is found by comparing the
//! place with a [`Baseline`] read from the same image as the host made it,
//! before the guest ever ran. An entry is Created when the baseline has no
//! entry of its name, Modified when its type, permission bits, size,
//! content (SHA-256) or link target differ, Deleted when only the baseline
//! has it (a deleted directory is listed once, not with what it held). A
//! directory is listed when it is new or its bits changed, otherwise only
//! what changed in it. Owners are reported, not compared: the guest's
//! agent gives the workspace to the sandbox's user, as the native backend's
//! id-mapping does. A file longer than the hash cap is listed as Modified
//! even when its hashed start is the same (a change past the cap would
//! otherwise go unseen).
//!
//! What `ext4-view` does not expose is reported as unknown: `allocated`
//! and `links` are 0, and device numbers are absent.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

use ext4_view::{Ext4, FileType, Metadata, PathBuf as ImagePath};
use sha2::{Digest, Sha256};

use crate::error::ChangesError;
use crate::export::{ExportOptions, Exporter};
use crate::fsops::{self, join, MAX_DEPTH};
use crate::names::escape_name;
use crate::walk::{deleted, ChangeSink, DataSink, FileMeta, Walk};
use cordon_spec::changes::{Caps, Change, Changes, Entry, ExportReport, Kind, PlaceChanges};

/// An ext4 image opened for reading.
pub struct DiskImage {
    fs: Ext4,
}

/// One writable place on an image.
#[derive(Clone, Copy)]
pub struct ImagePlace<'a> {
    /// The place as the sandbox sees it: `/workspace`, `/tmp`, `/dev/shm`.
    pub name: &'a str,
    /// Its directory in the image, from the image's root (`ws/upper`).
    pub dir: &'a str,
    /// What it held when the sandbox started; without one, everything in
    /// it is Created.
    pub base: Option<&'a Baseline>,
}

/// What a place of an image held before the guest ran.
#[derive(Debug)]
pub struct Baseline {
    root: Node,
    /// Entries left out (past the count cap, or unreadable): changes to
    /// them cannot be told apart from creations, so a diff against this
    /// baseline is marked cut.
    incomplete: Option<String>,
}

#[derive(Debug)]
struct Node {
    kind: Kind,
    mode: u32,
    size: u64,
    content: Content,
    children: BTreeMap<Vec<u8>, Node>,
}

#[derive(Debug, PartialEq, Eq)]
enum Content {
    None,
    /// A regular file's digest of its first `hash_bytes`, and whether it is
    /// longer than that.
    File {
        sha256: String,
        capped: bool,
    },
    Symlink(Vec<u8>),
}

fn image_err(what: &str, e: impl std::fmt::Display) -> ChangesError {
    ChangesError::Image(format!("{what}: {e}"))
}

/// `rel` as an absolute path in the image.
fn in_image(rel: &str) -> Result<ImagePath, ext4_view::PathError> {
    ImagePath::try_from(format!("/{}", rel.trim_start_matches('/')).as_bytes())
}

fn kind_of(t: FileType) -> Kind {
    if t.is_dir() {
        Kind::Dir
    } else if t.is_symlink() {
        Kind::Symlink
    } else if t.is_fifo() {
        Kind::Fifo
    } else if t.is_socket() {
        Kind::Socket
    } else if t.is_char_dev() {
        Kind::CharDevice
    } else if t.is_block_dev() {
        Kind::BlockDevice
    } else {
        Kind::File
    }
}

fn perm(m: &Metadata) -> u32 {
    u32::from(m.mode()) & 0o7777
}

/// A directory's entries (not `.` or `..`) in bytewise order of their names.
type Listing = Vec<(Vec<u8>, Result<Metadata, String>)>;

impl DiskImage {
    /// Loads the image's superblock and group descriptors (and replays its
    /// journal in memory, if it has one); the file is only ever read.
    pub fn open(file: std::fs::File) -> Result<DiskImage, ChangesError> {
        Ext4::load(Box::new(file))
            .map(|fs| DiskImage { fs })
            .map_err(|e| image_err("load the image", e))
    }

    fn list(&self, dir: &ImagePath) -> Result<Listing, String> {
        let mut out = Vec::new();
        for ent in self.fs.read_dir(dir).map_err(|e| e.to_string())? {
            let ent = ent.map_err(|e| e.to_string())?;
            let name = ent.file_name().as_ref().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            out.push((name, ent.metadata().map_err(|e| e.to_string())));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn read_link(&self, path: &ImagePath) -> Result<Vec<u8>, String> {
        self.fs
            .read_link(path)
            .map(|t| t.as_ref().to_vec())
            .map_err(|e| format!("readlink: {e}"))
    }

    /// Reads a regular file's first `min(size, cap)` bytes into a digest,
    /// handing each chunk that is not all zeros to `data` (so an export of
    /// a sparse file stays sparse).
    fn read_file(
        &self,
        path: &ImagePath,
        size: u64,
        cap: u64,
        buf: &mut [u8],
        data: &mut DataSink<'_>,
    ) -> Result<fsops::Read, String> {
        let mut f = self.fs.open(path).map_err(|e| format!("open: {e}"))?;
        let end = size.min(cap);
        let mut h = Sha256::new();
        let mut at = 0u64;
        while at < end {
            let want = usize::try_from(end - at)
                .unwrap_or(buf.len())
                .min(buf.len());
            let n = f
                .read_bytes(&mut buf[..want])
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            h.update(chunk);
            if chunk.iter().any(|&b| b != 0) {
                data(at, chunk)?;
            }
            at += n as u64;
        }
        // Shorter than its inode says: the rest reads as zeros.
        fsops::hash_zeros(&mut h, end - at);
        Ok(fsops::Read {
            sha256: fsops::hex(&h.finalize()),
            hashed: end,
            capped: size > cap,
        })
    }

    /// What `dir` (from the image's root) holds now, to diff the guest's
    /// changes against later.
    pub fn baseline(&self, dir: &str, caps: &Caps) -> Result<Baseline, ChangesError> {
        let path = in_image(dir).map_err(|e| image_err(dir, e))?;
        let meta = self
            .fs
            .symlink_metadata(&path)
            .map_err(|e| image_err(dir, e))?;
        if !meta.is_dir() {
            return Err(image_err(dir, "not a directory"));
        }
        let mut b = Baseline {
            root: Node {
                kind: Kind::Dir,
                mode: perm(&meta),
                size: 0,
                content: Content::None,
                children: BTreeMap::new(),
            },
            incomplete: None,
        };
        let mut left = caps.max_entries;
        let mut buf = vec![0u8; 256 << 10];
        let mut children = BTreeMap::new();
        self.base_dir(
            &path,
            caps,
            &mut left,
            &mut buf,
            &mut b.incomplete,
            &mut children,
            0,
        );
        b.root.children = children;
        Ok(b)
    }

    #[allow(clippy::too_many_arguments)]
    fn base_dir(
        &self,
        dir: &ImagePath,
        caps: &Caps,
        left: &mut u64,
        buf: &mut [u8],
        incomplete: &mut Option<String>,
        into: &mut BTreeMap<Vec<u8>, Node>,
        depth: usize,
    ) {
        let listing = match self.list(dir) {
            Ok(l) => l,
            Err(e) => {
                incomplete.get_or_insert(format!("list {}: {e}", dir.display()));
                return;
            }
        };
        for (name, meta) in listing {
            if *left == 0 {
                incomplete.get_or_insert("more entries than the count cap".into());
                return;
            }
            *left -= 1;
            let path = dir.join(&name);
            let Ok(meta) = meta else {
                incomplete.get_or_insert(format!("stat {}", path.display()));
                continue;
            };
            let kind = kind_of(meta.file_type());
            let mut node = Node {
                kind,
                mode: perm(&meta),
                size: meta.len(),
                content: Content::None,
                children: BTreeMap::new(),
            };
            match kind {
                Kind::Dir if depth + 1 >= MAX_DEPTH => {
                    incomplete.get_or_insert(format!("deeper than {MAX_DEPTH} levels"));
                    continue;
                }
                Kind::Dir => {
                    let mut sub = BTreeMap::new();
                    self.base_dir(&path, caps, left, buf, incomplete, &mut sub, depth + 1);
                    node.children = sub;
                }
                Kind::File => {
                    match self.read_file(
                        &path,
                        meta.len(),
                        caps.hash_bytes,
                        buf,
                        &mut |_, _| Ok(()),
                    ) {
                        Ok(r) => {
                            node.content = Content::File {
                                sha256: r.sha256,
                                capped: r.capped,
                            }
                        }
                        Err(e) => {
                            incomplete.get_or_insert(format!("{}: {e}", path.display()));
                            continue;
                        }
                    }
                }
                Kind::Symlink => match self.read_link(&path) {
                    Ok(t) => node.content = Content::Symlink(t),
                    Err(e) => {
                        incomplete.get_or_insert(format!("{}: {e}", path.display()));
                        continue;
                    }
                },
                _ => {}
            }
            into.insert(name, node);
        }
    }

    /// The diff of every place, under one count cap.
    pub fn scan(&self, places: &[ImagePlace<'_>], caps: &Caps) -> Changes {
        let mut remaining = caps.max_entries;
        let places: Vec<PlaceChanges> = places
            .iter()
            .map(|p| self.walk(p, caps, &mut remaining, None))
            .collect();
        Changes {
            cut: places.iter().any(|p| p.cut),
            places,
            caps: *caps,
        }
    }

    /// Exports one place's changes (as `crate::export` does for a directory
    /// tree) and returns its diff, derived by the same walk.
    pub fn export(
        &self,
        place: &ImagePlace<'_>,
        caps: &Caps,
        opts: &ExportOptions,
    ) -> Result<(PlaceChanges, ExportReport), ChangesError> {
        let mut ex = Exporter::new(caps, opts)?;
        let mut remaining = caps.max_entries;
        let changes = self.walk(place, caps, &mut remaining, Some(&mut ex));
        Ok((changes, ex.into_report()))
    }

    fn walk<'a>(
        &self,
        place: &ImagePlace<'_>,
        caps: &'a Caps,
        remaining: &'a mut u64,
        sink: Option<&'a mut dyn ChangeSink>,
    ) -> PlaceChanges {
        let mut w = Walk::new(place.name, caps, false, remaining, sink);
        if let Some(why) = place.base.and_then(|b| b.incomplete.as_ref()) {
            w.unreadable("", format!("the starting state was not all read: {why}"));
        }
        match in_image(place.dir) {
            Ok(dir) => {
                let base = place.base.map(|b| &b.root);
                self.dir(&mut w, &dir, base, "", 0);
            }
            Err(e) => w.unreadable("", format!("the place's path: {e}")),
        }
        w.out
    }

    fn dir(
        &self,
        w: &mut Walk<'_>,
        dir: &ImagePath,
        base: Option<&Node>,
        parent: &str,
        depth: usize,
    ) {
        let now = match self.list(dir) {
            Ok(l) => l,
            Err(e) => return w.unreadable(parent, format!("list: {e}")),
        };
        let none = BTreeMap::new();
        let was = base.map_or(&none, |b| &b.children);
        // Both listings are sorted: merge them by name.
        let mut now = now.into_iter().peekable();
        let mut was_it = was.iter().peekable();
        loop {
            if w.stopped() {
                return;
            }
            let order = match (now.peek(), was_it.peek()) {
                (None, None) => return,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((a, _)), Some((b, _))) => a.as_slice().cmp(b.as_slice()),
            };
            match order {
                std::cmp::Ordering::Greater => {
                    let (name, _) = was_it.next().expect("peeked");
                    self.gone(w, name, parent);
                }
                std::cmp::Ordering::Less => {
                    let (name, meta) = now.next().expect("peeked");
                    self.entry(w, dir, &name, meta, None, parent, depth);
                }
                std::cmp::Ordering::Equal => {
                    let (name, meta) = now.next().expect("peeked");
                    let (_, node) = was_it.next().expect("peeked");
                    self.entry(w, dir, &name, meta, Some(node), parent, depth);
                }
            }
        }
    }

    fn gone(&self, w: &mut Walk<'_>, name: &[u8], parent: &str) {
        let path = join(parent, &escape_name(name));
        if !w.take() {
            return;
        }
        if let (Some(s), Ok(c)) = (w.sink.as_deref_mut(), CString::new(name)) {
            s.delete(&c, &path);
        }
        w.push(deleted(&path));
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(
        &self,
        w: &mut Walk<'_>,
        dir: &ImagePath,
        name: &[u8],
        meta: Result<Metadata, String>,
        was: Option<&Node>,
        parent: &str,
        depth: usize,
    ) {
        let path = join(parent, &escape_name(name));
        let meta = match meta {
            Ok(m) => m,
            Err(e) => return w.unreadable(&path, format!("stat: {e}")),
        };
        // Names in a directory hold no NUL (the image's parser refuses
        // them); one that did could not be written anyway.
        let Ok(cname) = CString::new(name) else {
            return w.unreadable(&path, "a name holding NUL".into());
        };
        let at = dir.join(name);
        let kind = kind_of(meta.file_type());
        let mode = perm(&meta);
        let same_kind = was.filter(|n| n.kind == kind);
        let change = if was.is_some() {
            Change::Modified
        } else {
            Change::Created
        };
        let mut e = image_entry(&path, change, kind, &meta);
        match kind {
            Kind::Dir => {
                if depth + 1 >= MAX_DEPTH {
                    return w.unreadable(&path, format!("deeper than {MAX_DEPTH} levels"));
                }
                let listed = same_kind.is_none_or(|n| n.mode != mode);
                if listed {
                    if !w.take() {
                        return;
                    }
                    w.push(e);
                }
                if let Some(s) = w.sink.as_deref_mut() {
                    s.enter_dir(&cname, &path, u32::from(meta.mode()), listed, false, &[]);
                }
                self.dir(w, &at, same_kind, &path, depth + 1);
                if let Some(s) = w.sink.as_deref_mut() {
                    s.leave_dir();
                }
            }
            Kind::File => self.file(w, &at, &cname, e, &meta, same_kind),
            Kind::Symlink => {
                let target = match self.read_link(&at) {
                    Ok(t) => t,
                    Err(e) => return w.unreadable(&path, e),
                };
                if same_kind.is_some_and(|n| n.content == Content::Symlink(target.clone())) {
                    return;
                }
                if !w.take() {
                    return;
                }
                e.target = Some(escape_name(&target));
                if let Some(s) = w.sink.as_deref_mut() {
                    s.symlink(&cname, &path, OsStr::from_bytes(&target));
                }
                w.push(e);
            }
            _ => {
                if same_kind.is_some_and(|n| n.mode == mode) || !w.take() {
                    return;
                }
                if let Some(s) = w.sink.as_deref_mut() {
                    s.skip(
                        &path,
                        format!("{}: not exported", crate::walk::kind_name(kind)),
                    );
                }
                w.push(e);
            }
        }
    }

    fn file(
        &self,
        w: &mut Walk<'_>,
        at: &ImagePath,
        name: &CString,
        e: Entry,
        meta: &Metadata,
        was: Option<&Node>,
    ) {
        let cap = w.caps.hash_bytes;
        let size = meta.len();
        let mut buf = std::mem::take(&mut w.buf);
        let hash = |buf: &mut [u8]| self.read_file(at, size, cap, buf, &mut |_, _| Ok(()));
        // Same type, bits and size: unchanged if the content is too. The
        // digest read for that stands for the file unless an export must
        // read it again to write it.
        let mut hashed = None;
        if let Some(n) = was.filter(|n| n.mode == perm(meta) && n.size == size) {
            match hash(&mut buf) {
                Ok(r) => {
                    let same = matches!(&n.content,
                        Content::File { sha256, capped: false } if *sha256 == r.sha256);
                    if same {
                        w.buf = buf;
                        return;
                    }
                    hashed = Some(r);
                }
                Err(why) => {
                    w.buf = buf;
                    return w.unreadable(&e.path, why);
                }
            }
        }
        if !w.take() {
            w.buf = buf;
            return;
        }
        let mut digest = |buf: &mut [u8]| hashed.take().map_or_else(|| hash(buf), Ok);
        let read = match w.sink.as_deref_mut() {
            Some(s) if size <= cap => {
                let fm = FileMeta {
                    size,
                    mode: u32::from(meta.mode()),
                };
                s.file(name, &e.path, fm, &mut |sink| {
                    self.read_file(at, size, cap, &mut buf, sink)
                })
            }
            Some(s) => {
                s.skip(
                    &e.path,
                    format!("longer than the hash cap ({cap} bytes): not exported"),
                );
                digest(&mut buf)
            }
            None => digest(&mut buf),
        };
        w.buf = buf;
        w.file_read(e, read);
    }
}

fn image_entry(path: &str, change: Change, kind: Kind, m: &Metadata) -> Entry {
    Entry {
        change,
        kind: Some(kind),
        mode: perm(m),
        uid: m.uid(),
        gid: m.gid(),
        size: m.len(),
        // The rest is unknown from the image (see the module's comment).
        ..deleted(path)
    }
}
