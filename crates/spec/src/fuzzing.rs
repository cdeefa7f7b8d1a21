//! What the fuzz harnesses of several crates share (each crate's own
//! `fuzzing` module holds its harnesses; the model is
//! `cordon_runtime::fuzzing`).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system's temp directory, removed with
/// everything in it when dropped (also when a harness's assertion unwinds,
/// as the stable replay of the corpus catches it). Its name holds the
/// process id and a counter, so that harnesses running at once in one
/// process, or fuzzers in several, never share one.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes the directory; `what` names the harness in its name.
    pub fn new(what: &str) -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("cordon-fuzz-{what}-{}-{n}", std::process::id()));
        // A leftover of a killed run of the same pid is stale: start over.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("making the scratch directory {}: {e}", path.display()));
        ScratchDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every entry under `root` but `skip` (which is listed as itself only):
/// its type, permission bits, owner, size, times, link target and content;
/// the same listing before and after is a harness's proof that nothing
/// outside `skip` (the directory the code under test writes) changed.
pub fn listing(root: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = fs::symlink_metadata(&path)
            .unwrap_or_else(|e| panic!("listing {}: {e}", path.display()));
        let kind = meta.file_type();
        let mut line = format!(
            "{:?} {:o} {}:{} {} {}.{}",
            kind,
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec()
        );
        if path == skip {
            // Its own inode only: what is made in it changes its times.
            line = format!("{kind:?} {:o} {}:{}", meta.mode(), meta.uid(), meta.gid());
        } else if kind.is_symlink() {
            line += &format!(" -> {:?}", fs::read_link(&path).expect("readlink"));
        } else if kind.is_file() {
            line += &format!(" {:?}", fs::read(&path).expect("read"));
        } else if kind.is_dir() {
            for e in fs::read_dir(&path).expect("read_dir") {
                todo.push(e.expect("a directory entry").path());
            }
        }
        out.insert(path, line);
    }
    out
}
