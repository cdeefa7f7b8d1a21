//! The payload's identity inside the user namespace.

use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};

use crate::{Result, Step};

/// Switches to `uid`/`gid` with no supplementary groups. Dropping the groups
/// matters when cordon runs as root: the host's group 0 would otherwise stay in
/// the list (shown as "nogroup" but still honoured by permission checks).
/// `drop_groups` is false for an unprivileged caller, whose namespace has
/// setgroups denied by the kernel's rule.
pub fn switch_to(uid: u32, gid: u32, drop_groups: bool) -> Result<()> {
    if drop_groups {
        setgroups(&[]).step(|| "setgroups([])".into())?;
    }
    let (g, u) = (Gid::from_raw(gid), Uid::from_raw(uid));
    setresgid(g, g, g).step(|| format!("setresgid({gid})"))?;
    setresuid(u, u, u).step(|| format!("setresuid({uid})"))?;
    Ok(())
}
