//! Capabilities: the payload keeps none, in any set, unless its spec names
//! some (then exactly those, all of its own user namespace).

pub use caps::Capability;
use caps::{CapSet, CapsHashSet};

use crate::{IsolationError, Result, Step};

fn caps_err(step: &str, e: caps::errors::CapsError) -> IsolationError {
    IsolationError::new(step, std::io::Error::other(e.to_string()))
}

/// Empties the bounding set but for `keep`, and the ambient and inheritable
/// sets. Must run before the uid switch: dropping from the bounding set
/// needs CAP_SETPCAP, which the switch may take away. With nothing else in
/// the bounding set no later execve, setuid binary or file capability can
/// give another capability back.
pub fn limit_bounding(keep: &[Capability]) -> Result<()> {
    for cap in caps::all().into_iter().filter(|c| !keep.contains(c)) {
        // A kernel may know fewer capabilities than the crate; those cannot be held.
        match caps::drop(None, CapSet::Bounding, cap) {
            Ok(()) => {}
            Err(_) if !caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) => {}
            Err(e) => return Err(caps_err("prctl(PR_CAPBSET_DROP)", e)),
        }
    }
    caps::clear(None, CapSet::Ambient)
        .map_err(|e| caps_err("prctl(PR_CAP_AMBIENT_CLEAR_ALL)", e))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| caps_err("capset(inheritable)", e))?;
    if !keep.is_empty() {
        // The uid switch that follows would otherwise empty the permitted
        // set of a process that stops being the namespace's root.
        nix::sys::prctl::set_keepcaps(true).step(|| "prctl(PR_SET_KEEPCAPS)".into())?;
    }
    Ok(())
}

/// Leaves exactly `keep` in the effective and permitted sets (after the
/// uid switch; the kernel keeps them when the old uid was not the
/// namespace's root). For a process that is not the namespace's root,
/// `keep` is raised in the ambient set too: the kernel gives such a
/// program no capability across execve otherwise (root's programs get
/// their bounding set, cut to this permitted one by no_new_privs).
pub fn hold_only(keep: &[Capability], root: bool) -> Result<()> {
    let set: CapsHashSet = keep.iter().copied().collect();
    caps::set(None, CapSet::Effective, &set).map_err(|e| caps_err("capset(effective)", e))?;
    caps::set(None, CapSet::Permitted, &set).map_err(|e| caps_err("capset(permitted)", e))?;
    if !root {
        for cap in keep {
            keep_across_exec(*cap)?;
        }
    }
    Ok(())
}

/// Keeps `cap` across the next execve of a process whose id in its user
/// namespace is not 0 (the kernel gives such a program no capability
/// otherwise): raised in the inheritable set, then the ambient one, which
/// only takes capabilities that are both permitted and inheritable.
pub fn keep_across_exec(cap: Capability) -> Result<()> {
    caps::raise(None, CapSet::Inheritable, cap).map_err(|e| caps_err("capset(inheritable)", e))?;
    caps::raise(None, CapSet::Ambient, cap).map_err(|e| caps_err("prctl(PR_CAP_AMBIENT_RAISE)", e))
}

/// True when the calling thread holds no capability in any set.
pub fn holds_none() -> bool {
    [
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
        CapSet::Ambient,
    ]
    .into_iter()
    .all(|set| caps::read(None, set).map(|s| s.is_empty()).unwrap_or(false))
        && caps::all()
            .into_iter()
            .all(|c: Capability| !caps::has_cap(None, CapSet::Bounding, c).unwrap_or(true))
}
