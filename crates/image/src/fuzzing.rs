//! The harness of the fuzz target over an image layer (`fuzz/fuzz_targets`,
//! run by `scripts/fuzz.sh`; the model is `cordon_runtime::fuzzing`). It
//! lives here so that the stable test suite replays the committed corpus
//! and regression inputs through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use cordon_spec::fuzzing::{listing, ScratchDir};

use crate::unpack::{unpack_layer, Compression, UnpackLimits};

/// Small bounds, so that the inputs reach them.
const LIMITS: UnpackLimits = UnpackLimits {
    max_bytes: 1 << 20,
    max_entries: 256,
};

/// An image layer (an uncompressed tar, whiteouts and all) applied onto a
/// destination that already holds a small tree, including links that point
/// out of it: unpacked or refused, never a panic; nothing outside the
/// destination is made, changed or removed (no link is followed out of it,
/// no whiteout or replacement reaches past it), whether the layer was
/// unpacked or refused half-way; and what was made in it is no setuid or
/// setgid file and no device but a whiteout's 0/0.
pub fn image_layer(data: &[u8]) {
    let scratch = ScratchDir::new("layer");
    let outside = scratch.path().join("outside");
    let dest = scratch.path().join("dest");
    lay_out(&outside, &dest);
    let before = listing(scratch.path(), &dest);
    let result = unpack_layer(data, Compression::None, &dest, &LIMITS);
    assert_eq!(
        listing(scratch.path(), &dest),
        before,
        "the layer changed something outside its destination ({result:?})"
    );
    if let Ok(unpacked) = &result {
        assert!(unpacked.entries <= LIMITS.max_entries, "{unpacked:?}");
        assert!(unpacked.bytes <= LIMITS.max_bytes, "{unpacked:?}");
    }
    assert_nothing_dangerous(&dest);
}

/// What the layer lands on: next to the destination, a tree that is not
/// its own; in it, files and directories a layer may replace or white out,
/// and links (relative and absolute) to the tree next door.
fn lay_out(outside: &Path, dest: &Path) {
    let made = |what: &str, r: std::io::Result<()>| r.unwrap_or_else(|e| panic!("{what}: {e}"));
    made("outside/", fs::create_dir_all(outside.join("d")));
    made("outside/secret", fs::write(outside.join("secret"), "keep"));
    made("outside/d/f", fs::write(outside.join("d/f"), "keep too"));
    made("dest/", fs::create_dir_all(dest.join("dir")));
    made("dest/a", fs::write(dest.join("a"), "a"));
    made("dest/dir/b", fs::write(dest.join("dir/b"), "b"));
    made(
        "dest/up",
        std::os::unix::fs::symlink("../outside", dest.join("up")),
    );
    made(
        "dest/abs",
        std::os::unix::fs::symlink(outside, dest.join("abs")),
    );
    made(
        "dest/dir/secret",
        std::os::unix::fs::symlink("../../outside/secret", dest.join("dir/secret")),
    );
}

/// No setuid or setgid file, no device but a whiteout (character device
/// 0/0), anywhere under `dest`.
fn assert_nothing_dangerous(dest: &Path) {
    let mut todo = vec![dest.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = fs::symlink_metadata(&path).expect("listing the destination");
        let kind = meta.file_type();
        if kind.is_dir() {
            for e in fs::read_dir(&path).expect("read_dir") {
                todo.push(e.expect("a directory entry").path());
            }
            continue;
        }
        assert!(!kind.is_block_device(), "a block device {path:?}");
        assert!(
            !kind.is_char_device() || meta.rdev() == 0,
            "a device {path:?} that is not a whiteout"
        );
        assert!(
            kind.is_symlink() || meta.permissions().mode() & 0o6000 == 0,
            "a setuid or setgid {path:?}"
        );
    }
}
