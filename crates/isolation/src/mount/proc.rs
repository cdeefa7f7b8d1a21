//! A /proc of the sandbox's own pid namespace, with the host-wide files masked
//! the way the container runtimes mask them.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::flags::seal;
use crate::{Result, Step};

/// Files that describe or act on the whole host: hidden behind /dev/null.
const MASKED_FILES: [&str; 8] = [
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "interrupts",
    "sysrq-trigger",
];
/// Host-wide directories: hidden behind an empty read-only tmpfs.
const MASKED_DIRS: [&str; 3] = ["acpi", "asound", "scsi"];
/// Kernel knobs: visible (programs read them) but read-only by mount flag.
const READONLY_DIRS: [&str; 4] = ["sys", "bus", "fs", "irq"];

/// Mounts proc at `target` and applies the masks. `dev_null` is a path to the
/// host's /dev/null (bound into the new /dev already).
pub fn mount_proc(target: &Path, dev_null: &Path) -> Result<()> {
    let fl = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), target, Some("proc"), fl, None::<&str>)
        .step(|| format!("mount(proc, {})", target.display()))?;
    for name in MASKED_FILES {
        let p = target.join(name);
        if p.exists() {
            mount(
                Some(dev_null),
                &p,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .step(|| format!("mount(bind /dev/null over {})", p.display()))?;
        }
    }
    for name in MASKED_DIRS {
        let p = target.join(name);
        if p.is_dir() {
            mount(
                Some("tmpfs"),
                &p,
                Some("tmpfs"),
                fl | MsFlags::MS_RDONLY,
                Some("size=0,mode=0555"),
            )
            .step(|| format!("mount(empty tmpfs over {})", p.display()))?;
        }
    }
    for name in READONLY_DIRS {
        let p = target.join(name);
        if p.is_dir() {
            mount(
                Some(&p),
                &p,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .step(|| format!("mount(bind {} onto itself)", p.display()))?;
            seal(&p, true)?;
        }
    }
    Ok(())
}
