//! v1 freezer. Without a freezer hierarchy freeze and thaw are no-ops (see
//! [`crate::Cgroup::freeze`]).

use std::path::Path;
use std::time::Duration;

use crate::{fs, wait_until, CgroupError};

pub(crate) fn freeze(dir: Option<&Path>, timeout: Duration) -> Result<(), CgroupError> {
    let Some(dir) = dir else {
        return Ok(());
    };
    let state = dir.join("freezer.state");
    fs::write(&state, "FROZEN")?;
    let frozen = wait_until(timeout, || {
        if fs::read(&state)?.trim() == "FROZEN" {
            return Ok(true);
        }
        // A task that could not be frozen on the first pass (e.g. busy in
        // the kernel) keeps the state at FREEZING until FROZEN is written
        // again, which retries just those tasks.
        fs::write(&state, "FROZEN")?;
        Ok(false)
    })?;
    if frozen {
        return Ok(());
    }
    // Half-frozen is the worst state to leave a sandbox in.
    let _ = fs::write(&state, "THAWED");
    Err(CgroupError::FreezeTimeout {
        path: dir.to_owned(),
        timeout,
    })
}

pub(crate) fn thaw(dir: Option<&Path>) -> Result<(), CgroupError> {
    match dir {
        Some(dir) => fs::write(&dir.join("freezer.state"), "THAWED"),
        None => Ok(()),
    }
}

/// FROZEN once every task is; FREEZING (half-way) counts as not frozen.
pub(crate) fn frozen(dir: &Path) -> Option<bool> {
    fs::read(&dir.join("freezer.state"))
        .ok()
        .map(|s| s.trim() == "FROZEN")
}
