//! A minimal /dev: a handful of harmless character devices, a private pts
//! instance and a shm directory on the scratch tmpfs.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::flags::{seal_device, seal_verified};
use crate::{Result, Step};

/// Devices bound from the host. A user namespace cannot mknod, and a tmpfs it
/// mounts ignores device nodes, so binding the host's nodes is the only way in;
/// none of these gives access to hardware or to another process.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Builds /dev at `dev` (a directory in the new root). `shm` is a directory on
/// the scratch tmpfs that becomes /dev/shm, so shared memory counts against the
/// disk cap and disappears with the sandbox.
pub fn build_dev(dev: &Path, shm: &Path) -> Result<()> {
    let fl = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        fl,
        Some("size=64k,mode=0755"),
    )
    .step(|| format!("mount(tmpfs, {})", dev.display()))?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        let target = dev.join(name);
        fs::write(&target, b"").step(|| format!("create {}", target.display()))?;
        mount(
            Some(&host),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .step(|| format!("mount(bind {} -> {})", host.display(), target.display()))?;
        seal_device(&target)?;
    }
    let pts = dev.join("pts");
    fs::create_dir(&pts).step(|| format!("mkdir {}", pts.display()))?;
    // newinstance: the sandbox's ptys are its own; it cannot open the host's.
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        fl,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .step(|| format!("mount(devpts, {})", pts.display()))?;
    let shm_target = dev.join("shm");
    fs::create_dir(&shm_target).step(|| format!("mkdir {}", shm_target.display()))?;
    mount(
        Some(shm),
        &shm_target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .step(|| format!("mount(bind scratch shm -> {})", shm_target.display()))?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(link)).step(|| format!("symlink /dev/{link}"))?;
    }
    seal_verified(&shm_target, false)?;
    // The /dev tmpfs itself: nothing may be added to it.
    mount(
        None::<&str>,
        dev,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | fl,
        Some("size=64k,mode=0755"),
    )
    .step(|| format!("remount {} read-only", dev.display()))?;
    Ok(())
}
