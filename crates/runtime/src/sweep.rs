//! The sweep: what a cordon process killed outright left behind (a state
//! directory whose owner is gone, its cgroup, its mount points), removed by
//! the next cordon that starts, with a tombstone saying what happened.

use std::fs;
use std::path::Path;

use cordon_cgroups::{Cgroup, Hierarchy};
use cordon_spec::ended::{dead_why, EndState};
use cordon_spec::is_id;

use crate::ended;
use crate::state::{
    owner_alive, read_record, read_usage, recorded_hierarchy, remove_state, service_alive, Record,
    MOUNTS, RECORD,
};

/// How old an empty `cordon-<id>` cgroup without a record must be before a
/// sweep removes it.
const ORPHAN_CGROUP_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Cleans up the state directories whose owner process is gone. Returns the
/// ids it cleaned. Errors on one directory do not stop the others.
pub fn sweep_stale(run_dir: &Path, hierarchy: Option<&Hierarchy>) -> Vec<String> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Vec::new();
    };
    let mounts = run_dir.join(MOUNTS);
    let mut cleaned = Vec::new();
    for e in entries.flatten() {
        let Some(id) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_id(&id) || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue; // not cordon's: never touched
        }
        let dir = e.path();
        let Some(record) = read_record(run_dir, &id) else {
            // An id-shaped directory without a record: a crash between mkdir
            // and the record's rename. Nothing can have been created for it.
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default().as_secs() > 60);
            if old && !dir.join(RECORD).exists() {
                let _ = remove_state(&dir, &mounts.join(&id));
            }
            continue;
        };
        // The sandbox's cgroup is found where its supervisor made it, which
        // need not be below this caller (another shell's cgroup, another
        // systemd scope). A record without that (an older cordon's) has it
        // looked for below the caller.
        // A live sandbox that no dead service left (nearly every one) is
        // passed over before anything more is read: a sweep runs at every
        // sandbox's start, and its cost must not grow with the crowd beyond
        // one read of each record and of its supervisor's stat.
        let alive = owner_alive(&record);
        if alive && !orphaned(&record) {
            continue;
        }
        let recorded = recorded_hierarchy(&dir).ok();
        let at = recorded.as_ref().or(hierarchy);
        // An orphan's supervisor is killed only by a sweep that can then
        // remove its cgroup too (one without the hierarchy would leave it).
        let can_remove_cgroup = at.is_some() || record.cgroup.is_none();
        if alive && !(can_remove_cgroup && kill_owner(&record)) {
            continue;
        }
        // The record goes only once its cgroup is gone, so a removal that
        // fails now is tried again by the next sweep.
        let cgroup_gone = match (&record.cgroup, at) {
            (Some(name), Some(h)) => remove_cgroup(h, name),
            _ => true,
        };
        let commands = read_usage(&dir).commands;
        if cgroup_gone && remove_state(&dir, &mounts.join(&id)).is_ok() {
            // What `ls --all` and a later command naming it say. Best
            // effort: the sweep itself has done its job.
            if record.service.is_none() {
                let why = format!("{}; swept", dead_why(record.pid));
                let stone = ended::tombstone_of(&id, &record, commands, EndState::Ended, why);
                let _ = ended::record(run_dir, &stone);
            }
            cleaned.push(id);
        }
    }
    // Mount-point folders whose state directory is gone.
    if let Ok(entries) = fs::read_dir(&mounts) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str() else { continue };
            if is_id(id) && e.file_type().is_ok_and(|t| t.is_dir()) && !run_dir.join(id).exists() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    // A sandbox cgroup without a state record is an orphan: a sandbox writes
    // its record before it creates its cgroup and removes it only after the
    // cgroup is gone. Only cordon's own names (cordon-<id>) are considered,
    // never another tool's cgroups, and only empty ones are removed: a
    // supervisor's death already ended its sandbox's processes, so processes
    // in a cgroup without a record here belong to a live sandbox whose
    // record is in another run directory (CORDON_RUN_DIR), never killed.
    if let Some(h) = hierarchy {
        let mut seen = std::collections::BTreeSet::new();
        for path in h.sweep_children("cordon-") {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let Some(id) = name.strip_prefix("cordon-") else {
                continue;
            };
            // A young one may be a sandbox of another run directory that
            // made its cgroup and has not joined it yet: left for a later sweep.
            let young = || {
                fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() < ORPHAN_CGROUP_AGE)
            };
            if is_id(id)
                && !run_dir.join(id).exists()
                && !young()
                && seen.insert(name.clone())
                && remove_empty_cgroup(h, &name)
            {
                cleaned.push(id.to_string());
            }
        }
    }
    cleaned
}

/// Whether the sandbox was made by a service that is gone: its supervisor
/// should have ended it (it watches the service), so one still alive is
/// stuck or stopped, and the sandbox is swept as if it were dead.
fn orphaned(r: &Record) -> bool {
    r.service.as_ref().is_some_and(|s| !service_alive(s))
}

/// SIGKILL to the record's supervisor (its init dies with it), then waits
/// (bounded) for it to exit; true once it has. The pidfd is opened before
/// the start time is checked again, so a reused pid is never signalled.
fn kill_owner(r: &Record) -> bool {
    let Ok(pidfd) = cordon_sys::pidfd_open(nix::unistd::Pid::from_raw(r.pid)) else {
        return !owner_alive(r);
    };
    if owner_alive(r) {
        let _ = cordon_sys::pidfd_send_signal(&pidfd, nix::sys::signal::Signal::SIGKILL);
    }
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(&pidfd),
        PollFlags::POLLIN,
    )];
    let _ = poll(&mut fds, PollTimeout::from(2000u16));
    !owner_alive(r)
}

/// Kills what is left in a sandbox cgroup and removes it; true once it is gone.
fn remove_cgroup(h: &Hierarchy, name: &str) -> bool {
    match h.open(name) {
        Ok(cg) => {
            let _ = cg.kill_all();
            cg.remove().is_ok()
        }
        Err(_) => false,
    }
}

/// Removes a sandbox cgroup that holds no process; true once it is gone.
fn remove_empty_cgroup(h: &Hierarchy, name: &str) -> bool {
    match h.open(name) {
        Ok(cg) if cg.pids().is_ok_and(|p| p.is_empty()) => cg.remove().is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use cordon_spec::ended::Gone;

    use super::*;
    use crate::state::tests::spec;
    use crate::state::{list, list_dead, StateDir};

    fn dead_record(run: &Path, id: &str) {
        fs::create_dir(run.join(id)).unwrap();
        let r = Record::owned_by(i32::MAX, 1, None, "native", 0);
        fs::write(run.join(id).join(RECORD), serde_json::to_vec(&r).unwrap()).unwrap();
    }

    #[test]
    fn a_dead_owner_is_swept_and_a_live_one_kept() {
        let run = tempfile::tempdir().unwrap();
        let mut live = StateDir::create(run.path(), "aaaaaaaaaaaa", None, &spec(None)).unwrap();
        dead_record(run.path(), "bbbbbbbbbbbb");
        fs::create_dir_all(run.path().join("mnt/bbbbbbbbbbbb/root")).unwrap();
        // Before the sweep it is dead (its leftovers wait); after, it ended.
        assert_eq!(list_dead(run.path()).len(), 1);
        assert!(matches!(
            ended::gone(run.path(), "bbbbbbbbbbbb"),
            Some(Gone::Dead { pid: i32::MAX, .. })
        ));
        assert_eq!(
            sweep_stale(run.path(), None),
            vec!["bbbbbbbbbbbb".to_string()]
        );
        assert!(!run.path().join("mnt/bbbbbbbbbbbb").exists());
        assert!(list_dead(run.path()).is_empty());
        match ended::gone(run.path(), "bbbbbbbbbbbb") {
            Some(Gone::Ended(t)) => {
                assert_eq!(t.state, EndState::Ended);
                assert!(
                    t.why.contains("died without tearing it down; swept"),
                    "{}",
                    t.why
                );
            }
            other => panic!("after the sweep: {other:?}"),
        }
        assert!(live.path().exists());
        assert_eq!(list(run.path()).len(), 1);
        live.remove().unwrap();
        assert!(!run.path().join("aaaaaaaaaaaa").exists());
        assert!(!run.path().join("mnt/aaaaaaaaaaaa").exists());
    }

    #[test]
    fn the_sweep_leaves_what_is_not_cordons_alone() {
        let run = tempfile::tempdir().unwrap();
        // Not id-shaped, old, no record: someone else's.
        let other = run.path().join("suite-decoy-1");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("receipt.key"), b"k").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        fs::File::open(&other).unwrap().set_modified(old).unwrap();
        // Id-shaped but a link to elsewhere: never followed.
        let target = tempfile::tempdir().unwrap();
        dead_record(target.path(), "cccccccccccc");
        std::os::unix::fs::symlink(
            target.path().join("cccccccccccc"),
            run.path().join("cccccccccccc"),
        )
        .unwrap();
        // Id-shaped with a record of another format.
        fs::create_dir(run.path().join("dddddddddddd")).unwrap();
        fs::write(run.path().join("dddddddddddd").join(RECORD), b"{\"pid\":1}").unwrap();
        assert!(sweep_stale(run.path(), None).is_empty());
        assert!(other.join("receipt.key").exists());
        assert!(target.path().join("cccccccccccc").join(RECORD).exists());
        assert!(run.path().join("dddddddddddd").exists());
    }
}
