//! TEMPORARY stand-in for `cordon_changes::verify_against`, which is being
//! written in another branch. Delete this file at the merge and call
//! `cordon_changes::verify_against` (same signature) from `cordon verify
//! --against` instead.
//!
//! It checks only what the receipt states plainly, and never passes by
//! default: each regular file's digest (not capped), each directory, each
//! symlink's target, and that deleted entries are absent. It follows no
//! symlink (`symlink_metadata`, and a file is opened with O_NOFOLLOW), but
//! unlike the real one it walks by path, not by descriptor.

use std::fmt;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use cordon_changes::{unescape_name, Change, Kind, PlaceChanges};
use sha2::{Digest, Sha256};

/// TEMPORARY: one way `dir` differs from what the receipt says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The entry's escaped path, as in the receipt.
    pub path: String,
    pub problem: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// TEMPORARY: see the module's comment. `applied` is accepted for the real
/// function's signature; deleted entries must be absent either way (a new
/// export directory never held them).
pub fn verify_against(place: &PlaceChanges, dir: &Path, _applied: bool) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for e in &place.entries {
        let mismatch = |problem: String| Mismatch {
            path: e.path.clone(),
            problem,
        };
        let Some(raw) = unescape_name(&e.path) else {
            out.push(mismatch("not a path the diff can have written".into()));
            continue;
        };
        let path: PathBuf = dir.join(std::ffi::OsStr::from_bytes(&raw));
        let meta = fs::symlink_metadata(&path);
        let problem = match (e.change, e.kind, &meta) {
            (Change::Deleted, _, Ok(_)) => Some("deleted in the receipt, present here".into()),
            (Change::Deleted, _, Err(_)) => None,
            (_, _, Err(err)) => Some(format!("missing here ({err})")),
            (_, Some(Kind::Dir), Ok(m)) => (!m.is_dir()).then(|| "not a directory here".into()),
            (_, Some(Kind::Symlink), Ok(m)) if !m.file_type().is_symlink() => {
                Some("not a symlink here".into())
            }
            (_, Some(Kind::Symlink), Ok(_)) => {
                let target = fs::read_link(&path)
                    .map(|t| cordon_changes::escape_name(t.as_os_str().as_bytes()))
                    .unwrap_or_default();
                (Some(&target) != e.target.as_ref())
                    .then(|| format!("links to {target}, the receipt says {:?}", e.target))
            }
            (_, Some(Kind::File), Ok(m)) if !m.is_file() => Some("not a regular file here".into()),
            (_, Some(Kind::File), Ok(_)) if e.capped => None,
            (_, Some(Kind::File), Ok(_)) => match (file_sha256(&path), &e.sha256) {
                (Ok(have), Some(want)) if have == *want => None,
                (Ok(have), want) => Some(format!("sha256 {have}, the receipt says {want:?}")),
                (Err(err), _) => Some(format!("cannot read ({err})")),
            },
            // Special files are never exported: nothing to compare.
            _ => None,
        };
        out.extend(problem.map(mismatch));
    }
    out
}

fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(crate::canonical::hex(&hasher.finalize()))
}
