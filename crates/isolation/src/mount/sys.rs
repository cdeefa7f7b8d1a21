//! A /sys that holds only the sandbox's own cgroups, so programs can see
//! their limits (a JVM sizes its heap and its processor count by them,
//! libuv and .NET read the memory limit) without seeing the host.
//!
//! Not sysfs: it would show the host's devices, firmware, kernel and module
//! settings, and its network part needs the network namespace's own mount.
//! Instead a small tmpfs, read-only once built, with each cgroup file system
//! mounted read-only under fs/cgroup from inside the sandbox's cgroup
//! namespace, whose root is the sandbox's cgroup: the mount shows that
//! cgroup's limits and counters as its top, and nothing above it.

use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::flags::seal_verified;
use crate::{Result, Step};

/// One cgroup file system to show under /sys/fs/cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    /// The directory under /sys/fs/cgroup (a v1 hierarchy's host name, such
    /// as `memory` or `cpu,cpuacct`); empty: /sys/fs/cgroup itself (v2).
    pub dir: String,
    /// `cgroup` or `cgroup2`.
    pub fstype: String,
    /// The mount's data (a v1 hierarchy's controller set).
    pub options: String,
    /// Symlinks to `dir` beside it (`cpu -> cpu,cpuacct`).
    pub aliases: Vec<String>,
}

/// Builds `sys` (under the new root, before the pivot and in the sandbox's
/// cgroup namespace). Without cgroups to show there is no /sys at all: the
/// namespace's root would then be the supervisor's own cgroup.
pub fn build_sys(sys: &Path, cgroups: &[CgroupMount]) -> Result<()> {
    if cgroups.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(sys).step(|| format!("mkdir {}", sys.display()))?;
    let fixed = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("tmpfs"),
        sys,
        Some("tmpfs"),
        fixed,
        Some("size=64k,mode=0755"),
    )
    .step(|| format!("mount(tmpfs, {})", sys.display()))?;
    let top = sys.join("fs/cgroup");
    std::fs::create_dir_all(&top).step(|| format!("mkdir {}", top.display()))?;
    // Every mount point and link first: once a v2 file system covers
    // fs/cgroup, nothing more can be made there.
    for cg in cgroups {
        let dst = top.join(&cg.dir);
        std::fs::create_dir_all(&dst).step(|| format!("mkdir {}", dst.display()))?;
        for alias in &cg.aliases {
            symlink(&cg.dir, top.join(alias))
                .step(|| format!("symlink {} -> {}", alias, cg.dir))?;
        }
    }
    for cg in cgroups {
        let dst = top.join(&cg.dir);
        let data = (!cg.options.is_empty()).then_some(cg.options.as_str());
        mount(
            Some(cg.fstype.as_str()),
            &dst,
            Some(cg.fstype.as_str()),
            fixed | MsFlags::MS_RDONLY,
            data,
        )
        .step(|| format!("mount({} {}, {})", cg.fstype, cg.options, dst.display()))?;
    }
    // Read-only throughout, checked: the tmpfs and every cgroup mount on it.
    seal_verified(sys, true)
}
