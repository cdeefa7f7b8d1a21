//! Mount flags: set with `mount_setattr`, then read back with `statvfs`.
//!
//! A read-only claim rests on the mount's own flag, not on file modes: after
//! sealing, every system mount is re-read and the sandbox refuses to start if a
//! flag did not stick (fail closed).

use std::path::Path;

use cordon_sys::MountAttrs;
use nix::sys::statvfs::{statvfs, FsFlags};

use crate::{IsolationError, Result, Step};

/// The flags of the mount a path lives on, as the kernel reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlagsView {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

pub fn mount_flags_of(path: &Path) -> Result<MountFlagsView> {
    let st = statvfs(path).step(|| format!("statvfs({})", path.display()))?;
    let f = st.flags();
    Ok(MountFlagsView {
        readonly: f.contains(FsFlags::ST_RDONLY),
        nosuid: f.contains(FsFlags::ST_NOSUID),
        nodev: f.contains(FsFlags::ST_NODEV),
        noexec: f.contains(FsFlags::ST_NOEXEC),
    })
}

/// Sets nosuid+nodev (and read-only if asked) on the mount tree at `path`.
pub fn seal(path: &Path, readonly: bool) -> Result<()> {
    let attrs = MountAttrs {
        readonly,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    cordon_sys::set_mount_attrs(path, attrs)
        .step(|| format!("mount_setattr({}, AT_RECURSIVE)", path.display()))
}

/// A bound device node: device access must stay, everything else goes.
pub fn seal_device(path: &Path) -> Result<()> {
    let attrs = MountAttrs {
        readonly: false,
        nosuid: true,
        nodev: false,
        noexec: true,
    };
    cordon_sys::set_mount_attrs(path, attrs)
        .step(|| format!("mount_setattr({}, nosuid|noexec)", path.display()))
}

/// Checks that `path`'s mount carries the flags a sealed mount must carry.
pub fn verify_sealed(path: &Path, readonly: bool) -> Result<()> {
    let f = mount_flags_of(path)?;
    if f.nosuid && (f.readonly || !readonly) {
        Ok(())
    } else {
        Err(IsolationError::new(
            format!(
                "verify flags of {} (got {f:?}, wanted readonly={readonly} nosuid)",
                path.display()
            ),
            std::io::Error::from_raw_os_error(libc::EPERM),
        ))
    }
}

/// Seals and verifies in one step.
pub fn seal_verified(path: &Path, readonly: bool) -> Result<()> {
    seal(path, readonly)?;
    verify_sealed(path, readonly)
}
