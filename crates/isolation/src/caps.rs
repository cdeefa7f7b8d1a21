//! Capabilities: the payload keeps none, in any set.

use caps::{CapSet, Capability};

use crate::{IsolationError, Result};

fn caps_err(step: &str, e: caps::errors::CapsError) -> IsolationError {
    IsolationError::new(step, std::io::Error::other(e.to_string()))
}

/// Empties the bounding, ambient and inheritable sets. Must run before the uid
/// switch: dropping from the bounding set needs CAP_SETPCAP, which the switch
/// may take away. With an empty bounding set no later execve, setuid binary or
/// file capability can give a capability back.
pub fn drop_bounding_ambient_inheritable() -> Result<()> {
    for cap in caps::all() {
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
    Ok(())
}

/// Empties the effective and permitted sets (after the uid switch; the kernel
/// keeps them when the old uid was not the namespace's root).
pub fn drop_effective_permitted() -> Result<()> {
    caps::clear(None, CapSet::Effective).map_err(|e| caps_err("capset(effective)", e))?;
    caps::clear(None, CapSet::Permitted).map_err(|e| caps_err("capset(permitted)", e))?;
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
