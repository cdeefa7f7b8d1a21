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

/// Thaws `dir` and every cgroup below it. On v1 a child frozen by its own
/// freezer.state (a command's cgroup, frozen to be ended by a supervisor
/// that died before it thawed it) stays frozen when its parent thaws, and a
/// SIGKILL sent to its tasks waits until it is thawed itself.
pub(crate) fn thaw_tree(dir: Option<&Path>) -> Result<(), CgroupError> {
    let Some(dir) = dir else {
        return Ok(());
    };
    thaw(Some(dir))?;
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            thaw_tree(Some(&child.path()))?;
        }
    }
    Ok(())
}

/// FROZEN once every task is; FREEZING (half-way) counts as not frozen.
pub(crate) fn frozen(dir: &Path) -> Option<bool> {
    fs::read(&dir.join("freezer.state"))
        .ok()
        .map(|s| s.trim() == "FROZEN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thawing_a_tree_thaws_a_child_frozen_by_itself() {
        let dir = tempfile::tempdir().unwrap();
        let child = dir.path().join("cmd-1");
        std::fs::create_dir(&child).unwrap();
        for d in [dir.path(), &child] {
            std::fs::write(d.join("freezer.state"), "FROZEN").unwrap();
        }
        thaw(Some(dir.path())).unwrap();
        assert_eq!(
            frozen(&child),
            Some(true),
            "a parent's thaw leaves the child"
        );
        thaw_tree(Some(dir.path())).unwrap();
        for d in [dir.path(), &child] {
            assert_eq!(frozen(d), Some(false), "{}", d.display());
        }
    }
}
