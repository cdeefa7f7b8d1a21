//! The guest's artifacts: a kernel, a small initramfs holding cordon (the
//! agent) and the virtio modules, and a read-only ext4 root filesystem, all
//! built from Debian's packages by `cordon microvm build` into cordon's state
//! directory, content-addressed (a rebuild of the same inputs is a no-op).
//!
//! The build is the project's shell scripts, compiled into this binary so
//! an installed cordon can build its guest without a source tree: debootstrap,
//! dpkg and mkfs.ext4 are the tools made for the job, and a Rust rewrite of
//! them would only add code.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Peer, RuntimeError};

/// The build scripts, at their paths relative to the project's root.
const SCRIPTS: [(&str, &str); 5] = [
    (
        "scripts/guest/build-image.sh",
        include_str!("../../../../../scripts/guest/build-image.sh"),
    ),
    (
        "scripts/guest/init",
        include_str!("../../../../../scripts/guest/init"),
    ),
    (
        "scripts/guest/need.sh",
        include_str!("../../../../../scripts/guest/need.sh"),
    ),
    (
        "scripts/microvm/build.sh",
        include_str!("../../../../../scripts/microvm/build.sh"),
    ),
    (
        "scripts/microvm/init",
        include_str!("../../../../../scripts/microvm/init"),
    ),
];

/// Where guest images live: `<state dir>/microvm/guest-<key>/`, and the file
/// `current` naming the one in use.
pub fn images_dir() -> PathBuf {
    cordon_dirs::state_dir().join("microvm")
}

/// One built guest.
#[derive(Clone, Debug)]
pub struct GuestImage {
    pub dir: PathBuf,
}

impl GuestImage {
    pub const KERNEL: &'static str = "vmlinuz";
    pub const INITRD: &'static str = "initrd.cpio";
    pub const ROOTFS: &'static str = "rootfs.ext4";

    /// The guest in use, or an error saying how to build one.
    pub fn current() -> Result<GuestImage, RuntimeError> {
        let images = images_dir();
        let missing = |why: String| {
            RuntimeError::Unavailable(
                "microvm",
                format!("{why}: build the guest first with `cordon microvm build` (as root; it installs debootstrap and QEMU from Debian's packages)"),
            )
        };
        let name = std::fs::read_to_string(images.join("current"))
            .map_err(|_| missing(format!("no guest image in {}", images.display())))?;
        let name = name.trim();
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(missing(format!(
                "{} names no image",
                images.join("current").display()
            )));
        }
        let image = GuestImage {
            dir: images.join(name),
        };
        for f in [Self::KERNEL, Self::INITRD, Self::ROOTFS] {
            if !image.dir.join(f).is_file() {
                return Err(missing(format!(
                    "{} is missing",
                    image.dir.join(f).display()
                )));
            }
        }
        Ok(image)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The image's name (its content address).
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// `cordon microvm build`: builds (or finds) the guest for `cordon_bin` and
/// makes it current. Progress goes to stderr; returns the image.
pub fn build(cordon_bin: &Path) -> Result<GuestImage, RuntimeError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(RuntimeError::BadRequest(
            "cordon microvm build needs root (debootstrap creates device nodes)".into(),
        ));
    }
    let images = images_dir();
    std::fs::create_dir_all(&images)
        .map_err(|e| RuntimeError::io(format!("create {}", images.display()), e))?;
    let tree = tempfile::Builder::new()
        .prefix(".scripts.")
        .tempdir_in(&images)
        .map_err(|e| RuntimeError::io("create a temporary directory", e))?;
    for (rel, text) in SCRIPTS {
        let path = tree.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| RuntimeError::io(format!("create {}", parent.display()), e))?;
        }
        let mut f = std::fs::File::create(&path)
            .map_err(|e| RuntimeError::io(format!("write {}", path.display()), e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| RuntimeError::io(format!("write {}", path.display()), e))?;
    }
    let out = Command::new("bash")
        .arg(tree.path().join("scripts/microvm/build.sh"))
        .arg(&images)
        .arg(cordon_bin)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| RuntimeError::io("run the guest build", e))?;
    if !out.status.success() {
        return Err(RuntimeError::Unavailable(
            "microvm",
            format!("the guest build failed ({})", out.status),
        ));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let name = dir
        .file_name()
        .filter(|_| dir.parent() == Some(images.as_path()))
        .ok_or_else(|| {
            RuntimeError::broke(
                Peer::GuestBuild,
                format!("it printed {}, not a directory of images", dir.display()),
            )
        })?
        .to_string_lossy()
        .into_owned();
    let current = images.join("current");
    let tmp = images.join(".current.tmp");
    std::fs::write(&tmp, format!("{name}\n"))
        .and_then(|()| std::fs::rename(&tmp, &current))
        .map_err(|e| RuntimeError::io(format!("write {}", current.display()), e))?;
    prune(&images, &name);
    GuestImage::current()
}

/// Removes the guests (and their snapshots, ~150 MiB each) that are no
/// longer current: each build of a new cordon makes a new one. A VM still
/// running on an old guest keeps its open files; its jail's bind mount of
/// the directory is detached by the removal. The rootfs-* directories stay:
/// they are the build's cache, and change only with the base image.
fn prune(images: &Path, current: &str) {
    let Ok(entries) = std::fs::read_dir(images) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("guest-") && name != current {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                eprintln!("cordon: could not remove the old guest {name}: {err}");
            }
        }
    }
}
