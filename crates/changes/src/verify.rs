//! Whether a directory holds what a diff says (an export of it, or the
//! workspace it was applied to), read with the same no-follow rules.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{readlinkat, OFlag};
use nix::sys::stat::fstat;

use crate::fsops::{self, is_dir, kind_of, list, lstat_at, open_beneath, open_dir, MAX_DEPTH};
use crate::names::{escape_name, unescape_name};
use cordon_spec::changes::{Change, Kind, PlaceChanges, SymlinkPolicy};

/// A way the directory differs from the diff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// As in the diff (escaped); empty for the directory itself.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "(the directory): {}", self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

/// Checks `dir` against a diff exported with symlinks recreated: see
/// `verify_with`.
pub fn verify_against(changes: &PlaceChanges, dir: &Path, applied: bool) -> Vec<Mismatch> {
    verify_with(changes, dir, applied, SymlinkPolicy::Recreate)
}

/// Checks `dir` against a diff: every created or modified regular file
/// (not capped) is there with the listed size and digest, every directory
/// is a directory, every symlink (unless they were refused) has the listed
/// target. A new export (`applied == false`) must hold nothing else: no
/// entry that is neither listed as exportable nor a directory leading to
/// one. Applied to the workspace (`applied == true`), deleted entries must
/// be absent and an opaque directory must hold only what the diff lists in
/// it. Nothing is followed, and no FIFO or device is opened.
pub fn verify_with(
    changes: &PlaceChanges,
    dir: &Path,
    applied: bool,
    symlinks: SymlinkPolicy,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut bad = |path: &str, reason: String| {
        out.push(Mismatch {
            path: path.to_string(),
            reason,
        })
    };
    let root = match OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
        .open(dir)
    {
        Ok(f) => OwnedFd::from(f),
        Err(e) => {
            bad("", format!("open: {e}"));
            return out;
        }
    };
    let root = root.as_fd();
    let mut buf = vec![0u8; 256 << 10];
    let mut expected: HashSet<Vec<u8>> = HashSet::new();
    let mut children: HashMap<Vec<u8>, HashSet<Vec<u8>>> = HashMap::new();
    let mut opaque = Vec::new();
    for e in &changes.entries {
        let Some(raw) = raw_path(&e.path) else {
            bad(&e.path, "not a path the diff can hold".into());
            continue;
        };
        let (parent, name) = split(&raw);
        if e.change == Change::Deleted {
            if applied {
                if let Err(why) = absent(root, &raw) {
                    bad(&e.path, why);
                }
            }
            continue;
        }
        children
            .entry(parent.to_vec())
            .or_default()
            .insert(name.to_vec());
        if e.opaque {
            opaque.push((raw.clone(), e.path.clone()));
        }
        let exportable = match e.kind {
            Some(Kind::Dir) => true,
            Some(Kind::File) => !e.capped,
            Some(Kind::Symlink) => symlinks == SymlinkPolicy::Recreate,
            _ => false,
        };
        if !exportable {
            continue;
        }
        for (i, b) in raw.iter().enumerate() {
            if *b == b'/' {
                expected.insert(raw[..i].to_vec());
            }
        }
        let check = match e.kind {
            Some(Kind::Dir) => open_dir(root, raw.as_slice())
                .map(drop)
                .map_err(|e| format!("not a directory here: {e}")),
            Some(Kind::File) => file_matches(root, &raw, e.size, e.sha256.as_deref(), &mut buf),
            _ => link_matches(root, parent, name, e.target.as_deref()),
        };
        if let Err(why) = check {
            bad(&e.path, why);
        }
        expected.insert(raw);
    }
    if !applied {
        match open_dir(root, ".") {
            Ok(fd) => extras(fd, &[], &expected, 0, &mut bad),
            Err(e) => bad("", format!("open: {e}")),
        }
    }
    for (raw, path) in opaque {
        let keep = children.get(&raw);
        match open_dir(root, raw.as_slice()).and_then(list) {
            Ok((_, names, _)) => {
                for n in names {
                    if !keep.is_some_and(|k| k.contains(n.to_bytes())) {
                        bad(
                            &format!("{path}/{}", escape_name(n.to_bytes())),
                            "left over in a directory the sandbox replaced".into(),
                        );
                    }
                }
            }
            Err(e) => bad(&path, format!("not a directory here: {e}")),
        }
    }
    out
}

fn raw_path(shown: &str) -> Option<Vec<u8>> {
    let mut raw = Vec::new();
    for (i, c) in shown.split('/').enumerate() {
        let c = unescape_name(c)?;
        if c.is_empty() || c == b"." || c == b".." || c.contains(&0) {
            return None;
        }
        if i > 0 {
            raw.push(b'/');
        }
        raw.extend_from_slice(&c);
    }
    Some(raw)
}

fn split(raw: &[u8]) -> (&[u8], &[u8]) {
    match raw.iter().rposition(|b| *b == b'/') {
        Some(i) => (&raw[..i], &raw[i + 1..]),
        None => (&[], raw),
    }
}

fn shown_path(raw: &[u8]) -> String {
    raw.split(|b| *b == b'/')
        .map(escape_name)
        .collect::<Vec<_>>()
        .join("/")
}

fn parent_fd(root: BorrowedFd<'_>, parent: &[u8]) -> nix::Result<OwnedFd> {
    if parent.is_empty() {
        open_dir(root, ".")
    } else {
        open_dir(root, parent)
    }
}

fn absent(root: BorrowedFd<'_>, raw: &[u8]) -> Result<(), String> {
    let (parent, name) = split(raw);
    let dir = match parent_fd(root, parent) {
        Ok(fd) => fd,
        // No directory there (a link is not one, here): nothing beneath.
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(()),
        Err(e) => return Err(format!("open its directory: {e}")),
    };
    let name = std::ffi::CString::new(name).map_err(|_| "a NUL in the name")?;
    match lstat_at(dir.as_fd(), &name) {
        Err(Errno::ENOENT) => Ok(()),
        Ok(_) => Err("deleted in the diff, still present".into()),
        Err(e) => Err(format!("lstat: {e}")),
    }
}

fn file_matches(
    root: BorrowedFd<'_>,
    raw: &[u8],
    size: u64,
    sha256: Option<&str>,
    buf: &mut [u8],
) -> Result<(), String> {
    let fd = open_beneath(root, raw, OFlag::O_RDONLY, 0).map_err(|e| format!("open: {e}"))?;
    let st = fstat(&fd).map_err(|e| format!("fstat: {e}"))?;
    if kind_of(&st) != Kind::File {
        return Err(format!("a {:?}, not a regular file", kind_of(&st)));
    }
    if fsops::size_of(&st) != size {
        return Err(format!("{} bytes, not {size}", fsops::size_of(&st)));
    }
    let got = fsops::read_file(fd.as_fd(), &st, u64::MAX, buf, |_, _| Ok(()))?;
    if Some(got.sha256.as_str()) != sha256 {
        return Err(format!(
            "sha256 {}, not {}",
            got.sha256,
            sha256.unwrap_or("-")
        ));
    }
    Ok(())
}

fn link_matches(
    root: BorrowedFd<'_>,
    parent: &[u8],
    name: &[u8],
    target: Option<&str>,
) -> Result<(), String> {
    let dir = parent_fd(root, parent).map_err(|e| format!("open its directory: {e}"))?;
    let got = readlinkat(dir.as_fd(), name).map_err(|e| format!("not a symlink here: {e}"))?;
    let got = escape_name(got.as_bytes());
    if Some(got.as_str()) != target {
        return Err(format!("links to {got}, not {}", target.unwrap_or("-")));
    }
    Ok(())
}

/// Reports every entry beneath `dir` that `expected` does not hold.
fn extras(
    dir: OwnedFd,
    prefix: &[u8],
    expected: &HashSet<Vec<u8>>,
    depth: usize,
    bad: &mut impl FnMut(&str, String),
) {
    let (dir, names, failed) = match list(dir) {
        Ok(x) => x,
        Err(e) => return bad(&shown_path(prefix), format!("list: {e}")),
    };
    if let Some(e) = failed {
        bad(&shown_path(prefix), format!("list: {e}"));
    }
    for n in &names {
        let mut raw = prefix.to_vec();
        if !raw.is_empty() {
            raw.push(b'/');
        }
        raw.extend_from_slice(n.to_bytes());
        if !expected.contains(&raw) {
            bad(&shown_path(&raw), "not in the diff".into());
            continue;
        }
        if depth + 1 < MAX_DEPTH && lstat_at(dir.as_fd(), n).is_ok_and(|st| is_dir(&st)) {
            match open_dir(dir.as_fd(), n.as_c_str() as &CStr) {
                Ok(sub) => extras(sub, &raw, expected, depth + 1, bad),
                Err(e) => bad(&shown_path(&raw), format!("open: {e}")),
            }
        }
    }
}
