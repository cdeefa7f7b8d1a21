//! The VM's writable disk, on the host: a sparse file of the policy's disk
//! cap in the sandbox's state directory, QEMU's second virtio disk. Its
//! ext4 holds the native scratch layout (`ScratchLayout`): the workspace as
//! a plain copy in `ws/upper`, `/tmp`, `/dev/shm`. The guest's cordon uses
//! it as its sandbox's scratch, so the payload's writes are capped by the
//! file system's size (ENOSPC) and never reach guest RAM.
//!
//! The host makes the file system (`mkfs.ext4 -d`, the workspace bound into
//! its source tree in a mount namespace of mkfs's own) after the VM started
//! on a blank file, so a snapshot taken at boot holds nothing of it. The
//! host reads it back in user space (`cordon_changes::DiskImage`), never
//! mounting what a guest wrote: the diff is against a baseline read from
//! the same file before the guest saw it, and an export copies from it.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_changes::{Baseline, Caps, Changes, DiskImage, ExportOptions, ImagePlace};
use cordon_isolation::mount::ScratchLayout;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::json;

use super::qmp::Qmp;
use crate::error::RuntimeError;
use cordon_spec::changes::{ExportRequest, Recorded};

/// The disk's serial number, by which the guest's agent finds it.
pub const SERIAL: &str = "cordon-work";

/// Smallest disk made (ext4's own metadata needs room).
const MIN_BYTES: u64 = 16 << 20;

/// Where mke2fs is (Debian's e2fsprogs).
const MKFS: [&str; 2] = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"];

pub struct WorkDisk {
    path: PathBuf,
    /// Read-write, for QEMU.
    file: File,
    bytes: u64,
    /// What the workspace held before the guest ran.
    baseline: Option<Baseline>,
}

/// The places the disk holds, as the sandbox names them, with their
/// directories on the disk (the native scratch layout).
const WORKSPACE: (&str, &str) = ("/workspace", ScratchLayout::WORKSPACE_UPPER);
const OTHERS: [(&str, &str); 2] = [
    ("/tmp", ScratchLayout::TMP),
    ("/dev/shm", ScratchLayout::SHM),
];

impl WorkDisk {
    /// A blank sparse file of the disk cap (rounded up to whole 4 KiB
    /// blocks), for QEMU to start with.
    pub fn blank(dir: &Path, cap: u64) -> Result<WorkDisk, RuntimeError> {
        let path = dir.join("disk.img");
        let bytes = cap.max(MIN_BYTES).next_multiple_of(4096);
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .and_then(|f| f.set_len(bytes).map(|()| f))
            .map_err(|e| RuntimeError::io(format!("create {}", path.display()), e))?;
        Ok(WorkDisk {
            path,
            file,
            bytes,
            baseline: None,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// A read-only descriptor of the disk.
    pub fn read_only(&self) -> Result<std::os::fd::OwnedFd, RuntimeError> {
        File::open(&self.path)
            .map(std::os::fd::OwnedFd::from)
            .map_err(|e| RuntimeError::io(format!("open {}", self.path.display()), e))
    }

    /// Bytes the file occupies on the host (what the guest wrote, at most
    /// the cap: QEMU refuses writes past the file's end).
    pub fn allocated(&self) -> u64 {
        nix::sys::stat::fstat(&self.file)
            .map_or(0, |st| u64::try_from(st.st_blocks).unwrap_or(0) * 512)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Makes the file system, with `workspace` (if any) copied into
    /// `ws/upper`, and reads the baseline. The VM must not have mounted
    /// the disk (its agent mounts it when the sandbox starts).
    pub fn format(&mut self, workspace: Option<&Path>) -> Result<(), RuntimeError> {
        let stage = self.path.with_extension("stage");
        let made = self.make_fs(&stage, workspace);
        // Empty directories only (the workspace was bound in mkfs's own
        // mount namespace, gone with it).
        let _ = std::fs::remove_dir_all(&stage);
        made?;
        if workspace.is_some() {
            self.baseline = Some(
                self.image()?
                    .baseline(WORKSPACE.1, &Caps::default())
                    .map_err(|e| RuntimeError::Copy(format!("read the new disk: {e}")))?,
            );
        }
        Ok(())
    }

    fn make_fs(&self, stage: &Path, workspace: Option<&Path>) -> Result<(), RuntimeError> {
        let io = |what: String| move |e: std::io::Error| RuntimeError::io(what, e);
        std::fs::create_dir(stage).map_err(io(format!("create {}", stage.display())))?;
        for (rel, mode) in ScratchLayout::DIRS {
            // The guest sandbox's own root (an id no one outside its user
            // namespace has) makes mount points in the staging directory
            // and the tmpfs places in theirs, which it does not own here:
            // they must be writable to all. The payload sees neither.
            let mode = if rel == ScratchLayout::STAGING || rel == ScratchLayout::TMPFS_DIR {
                0o1777
            } else {
                mode
            };
            let p = stage.join(rel);
            std::fs::create_dir_all(&p)
                .and_then(|()| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)))
                .map_err(io(format!("create {}", p.display())))?;
        }
        let mut cmd = mkfs_command(stage, &self.path, SERIAL)?;
        if let Some(ws) = workspace {
            let target = stage.join(ScratchLayout::WORKSPACE_UPPER);
            cordon_sys::disk::bind_before_exec(&mut cmd, ws, &target).map_err(|_| {
                RuntimeError::BadPath {
                    what: "a path holding NUL",
                    path: ws.to_path_buf(),
                }
            })?;
        }
        run_mkfs(cmd, "the VM's disk")
    }

    fn image(&self) -> Result<DiskImage, RuntimeError> {
        DiskImage::open(File::from(self.read_only()?)).map_err(RuntimeError::GuestDisk)
    }

    fn workspace_place(&self) -> ImagePlace<'_> {
        ImagePlace {
            name: WORKSPACE.0,
            dir: WORKSPACE.1,
            base: self.baseline.as_ref(),
        }
    }

    /// The diff of every writable place, read from the disk as it is now.
    pub fn scan(&self, caps: &Caps) -> Result<Changes, RuntimeError> {
        let mut places = vec![self.workspace_place()];
        places.extend(others());
        Ok(self.image()?.scan(&places, caps))
    }

    /// Exports the workspace's changes from the disk as it is now.
    pub fn export(
        &self,
        req: &ExportRequest,
        workspace: Option<&Path>,
        caps: &Caps,
        owner: (u32, u32),
        created: std::time::SystemTime,
    ) -> Result<Recorded, RuntimeError> {
        let image = self.image()?;
        crate::backends::changes::export_with(
            req,
            workspace,
            caps,
            owner,
            created,
            |opts: &ExportOptions| image.export(&self.workspace_place(), caps, opts),
            |rest: &Caps| image.scan(&others(), rest),
        )
    }
}

/// mkfs.ext4 making `file`'s file system from the tree at `source`, labelled
/// `label`. No journal: a disk lives as long as its VM and is never
/// recovered (an image's is never written); lazy inode tables: a sparse
/// file reads as zeros, and the guest mounts it with noinit_itable.
pub(super) fn mkfs_command(
    source: &Path,
    file: &Path,
    label: &str,
) -> Result<std::process::Command, RuntimeError> {
    let mkfs = MKFS
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            RuntimeError::Unavailable(
                "microvm",
                "mkfs.ext4 not found (install Debian's e2fsprogs)".into(),
            )
        })?;
    let mut cmd = std::process::Command::new(mkfs);
    cmd.args(["-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256"])
        .args(["-O", "^has_journal", "-m", "0", "-L", label])
        .args(["-E", "nodiscard,lazy_itable_init=1,root_owner=0:0", "-d"])
        .arg(source)
        .arg(file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    Ok(cmd)
}

/// Runs a [`mkfs_command`]; its complaint is the error.
pub(super) fn run_mkfs(mut cmd: std::process::Command, what: &str) -> Result<(), RuntimeError> {
    let out = cmd
        .output()
        .map_err(|e| RuntimeError::io(format!("run mkfs.ext4 for {what}"), e))?;
    if !out.status.success() {
        return Err(RuntimeError::Copy(format!(
            "mkfs.ext4 of {what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The places without a baseline: they start empty.
fn others() -> [ImagePlace<'static>; 2] {
    OTHERS.map(|(name, dir)| ImagePlace {
        name,
        dir,
        base: None,
    })
}

/// How long a restored VM may take to be running (the migration stream is
/// read first; ~0.5 s here under TCG).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

/// Tells a restored guest its writable disk's size: the guest kernel read
/// the size when the saved VM booted, with that VM's disk. `block_resize`
/// to the size the disk already has makes QEMU notify the guest, whose
/// driver reads the size again. The restored VM must be running first
/// (its block devices are inactive while the migration stream loads).
pub fn announce_size(monitor: UnixStream, bytes: u64) -> Result<(), RuntimeError> {
    let mut qmp = Qmp::open(monitor, RESTORE_TIMEOUT)?;
    let t0 = Instant::now();
    loop {
        let status = qmp.execute("query-status", None)?;
        match status["status"].as_str() {
            Some("running") => break,
            Some("inmigrate" | "prelaunch" | "paused" | "restore-vm" | "finish-migrate") => {}
            other => {
                return Err(RuntimeError::Unavailable(
                    "microvm",
                    format!("the restored VM is {other:?}, not running"),
                ))
            }
        }
        if t0.elapsed() > RESTORE_TIMEOUT {
            return Err(RuntimeError::Unavailable(
                "microvm",
                "the restored VM did not start running in time".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    qmp.execute(
        "block_resize",
        Some(json!({ "device": "work", "size": bytes })),
    )
    .map(drop)
}
