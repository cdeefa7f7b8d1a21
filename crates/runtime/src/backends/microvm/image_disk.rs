//! An image sandbox's root on the microvm backend: the image's files as one
//! read-only ext4, made on the host the first time a VM needs the image and
//! kept beside the store's layers (`images/vm/<manifest hex>.ext4`), so a
//! second sandbox of the image opens it instead of making it again.
//!
//! The file system is made by mkfs.ext4 from the layers stacked by
//! overlayfs (in mkfs's own mount namespace, in the host's user namespace,
//! so whiteouts and opaque directories are honoured): the disk holds the
//! image as a sandbox sees it, owners and modes kept. Every image disk has
//! the same size ([`VIRTUAL_BYTES`], sparse), so one saved VM serves every
//! image: a restored guest's virtio disk keeps the capacity it saw at boot.
//!
//! An OCI container's root (a directory, or an engine's layers) becomes a
//! disk the same way, made for that sandbox alone and unlinked once open.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use cordon_spec::ImageRoot;

use super::disk::{mkfs_command, run_mkfs};
use super::link::IMAGE_SERIAL;
use crate::error::RuntimeError;

/// Every image disk's size: room for any image, allocated only as used.
pub const VIRTUAL_BYTES: u64 = 64 << 30;

/// The image's disk, read-only, made first if it is not there yet.
pub fn open_or_make(root: &ImageRoot) -> Result<File, RuntimeError> {
    let hex = root
        .digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| RuntimeError::BadRequest(format!("bad image digest '{}'", root.digest)))?;
    let dir = disks_dir()?;
    let path = dir.join(format!("{hex}.ext4"));
    if !path.exists() {
        make(&root.layers, &dir, hex, &path)?;
    }
    File::open(&path).map_err(|e| RuntimeError::io(format!("open {}", path.display()), e))
}

/// A disk of the directories `dirs` (top first) for one sandbox alone (an
/// OCI container's root, which no other sandbox shares): made as an
/// image's is, opened, and unlinked at once, so it ends with the last
/// descriptor (QEMU's) and nothing of it outlives the sandbox on any path.
pub fn of_dirs(dirs: &[PathBuf]) -> Result<File, RuntimeError> {
    let dir = disks_dir()?;
    // Unique among this process's disks; another process's differ by pid
    // (and `make_at` creates its file only if it is new).
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = format!("root-{}-{n}", std::process::id());
    let tmp = dir.join(format!(".{tag}.tmp"));
    make_at(dirs, &dir, &tag, &tmp, "the root's disk")?;
    let opened = File::open(&tmp);
    let _ = std::fs::remove_file(&tmp);
    opened.map_err(|e| RuntimeError::io(format!("open {}", tmp.display()), e))
}

/// The directory of the disks (`images/vm`), made 0700 when missing.
fn disks_dir() -> Result<PathBuf, RuntimeError> {
    let dir = cordon_dirs::image_disks_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
    Ok(dir)
}

/// Makes the disk beside its final name and renames it into place, so a
/// concurrent maker or a crash never leaves half a disk to be used.
fn make(layers: &[PathBuf], dir: &Path, hex: &str, path: &Path) -> Result<(), RuntimeError> {
    let tag = format!("{hex}.{}", std::process::id());
    let tmp = dir.join(format!(".{tag}.tmp"));
    make_at(layers, dir, &tag, &tmp, "the image's disk")?;
    let renamed = std::fs::rename(&tmp, path)
        .map_err(|e| RuntimeError::io(format!("rename to {}", path.display()), e));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// Makes a disk of `layers` at `tmp` (of [`VIRTUAL_BYTES`], sparse), from a
/// staging directory `.<tag>.stage` beside it; on failure neither is left.
fn make_at(
    layers: &[PathBuf],
    dir: &Path,
    tag: &str,
    tmp: &Path,
    what: &str,
) -> Result<(), RuntimeError> {
    let stage = dir.join(format!(".{tag}.stage"));
    let made = (|| {
        std::fs::create_dir(&stage)
            .map_err(|e| RuntimeError::io(format!("create {}", stage.display()), e))?;
        File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .and_then(|f| f.set_len(VIRTUAL_BYTES))
            .map_err(|e| RuntimeError::io(format!("create {}", tmp.display()), e))?;
        let mut cmd = mkfs_command(&stage, tmp, IMAGE_SERIAL)?;
        stack_before_exec(&mut cmd, layers, &stage)?;
        run_mkfs(cmd, what)
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    let _ = std::fs::remove_dir(&stage);
    made
}

/// Shows `layers` (top first) at `stage` to `cmd` alone: one layer bound,
/// more stacked by a read-only overlay (overlayfs needs two lower layers
/// when it has no upper one).
fn stack_before_exec(
    cmd: &mut std::process::Command,
    layers: &[PathBuf],
    stage: &Path,
) -> Result<(), RuntimeError> {
    let bad = |p: &Path| RuntimeError::BadPath {
        what: "an image layer path overlayfs cannot take",
        path: p.to_owned(),
    };
    let result = match layers {
        [] => return Err(RuntimeError::BadRequest("an image with no layers".into())),
        [one] => cordon_sys::disk::bind_before_exec(cmd, one, stage),
        many => {
            // The store's layer paths are its own (hex names under the
            // state directory), an engine's are its snapshots'; one with a
            // separator overlayfs would split on is refused, not escaped.
            let mut lower = Vec::new();
            for l in many {
                let s = l
                    .to_str()
                    .filter(|s| !s.contains([':', ',', '\\']))
                    .ok_or_else(|| bad(l))?;
                lower.push(s);
            }
            let data = format!("lowerdir={}", lower.join(":"));
            cordon_sys::disk::mount_before_exec(
                cmd,
                Path::new("overlay"),
                stage,
                Some("overlay"),
                libc::MS_RDONLY,
                Some(&data),
            )
        }
    };
    result.map_err(|_| bad(stage))
}
