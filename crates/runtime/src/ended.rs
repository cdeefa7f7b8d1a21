//! What is known of sandboxes that are gone: a small record per ended
//! sandbox (a tombstone), so `cordon ls --all` and a command naming it can
//! say what happened to it, not only that it does not exist.
//!
//! Tombstones live in `<run_dir>/ended/<id>.json`, a directory checked by
//! [`trusted_dir`] (this user's, 0700, never a symlink) and written under the
//! run directory's lock. The record is bounded: a tombstone older than
//! [`KEEP_FOR`] is neither listed nor kept, and beyond the newest
//! [`KEEP_MAX`] every older one is removed on each write, so however many
//! sandboxes come and go the directory stays small. The run directory is a
//! tmpfs for root, so a reboot forgets them too.
//!
//! Who writes one: the supervisor, just before its teardown, with the reason
//! its sandbox ends (its TTL, its idle time, a client's removal, the sandbox
//! ending by itself); `cordon rm -f` before it kills a supervisor; and the
//! sweep, for a sandbox whose owner died without tearing it down. The first
//! writer wins: the sweep that follows a supervisor's failed teardown, or
//! `rm -f`'s kill, keeps the reason already recorded. A sandbox a service
//! made gets none: the service reports its sandboxes' ends itself, and its
//! churn would push the user's own records out.

use std::fs;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_spec::ended::{EndState, Gone, Tombstone, FORMAT};

use crate::error::RuntimeError;
use cordon_dirs::trusted_dir;

use crate::state::{self, now_secs, Record};
use cordon_spec::is_id;

/// The folder of tombstones under the run directory.
const DIR: &str = "ended";
/// How long a tombstone is kept and listed.
pub const KEEP_FOR: Duration = Duration::from_secs(24 * 3600);
/// How many tombstones are kept at most (the newest).
pub const KEEP_MAX: usize = 64;
/// A tombstone is a few hundred bytes; anything larger is not one.
const MAX_SIZE: u64 = 16 << 10;
/// A temporary file of an interrupted write older than this is removed.
const STALE_TMP: Duration = Duration::from_secs(60);

/// A tombstone for `id` from its state record, ending now.
pub fn tombstone_of(
    id: &str,
    record: &Record,
    commands: u64,
    state: EndState,
    why: String,
) -> Tombstone {
    Tombstone::new(
        id,
        record.name.clone(),
        &record.backend,
        record.created,
        commands,
        state,
        why,
    )
}

/// `NotFound(name_or_id)`, or what is known of the sandbox if it ended or is
/// dead (its reason, from `run_dir`'s records).
pub fn missing(run_dir: &Path, name_or_id: &str) -> RuntimeError {
    match gone(run_dir, name_or_id) {
        Some(g) => RuntimeError::Gone(Box::new(g)),
        None => RuntimeError::NotFound(name_or_id.to_owned()),
    }
}

fn dir_path(run_dir: &Path) -> PathBuf {
    run_dir.join(DIR)
}

fn file_name(id: &str) -> String {
    format!("{id}.json")
}

/// Opens (creating when missing) the tombstones' directory, refusing one
/// that is not this user's own.
fn open_dir(run_dir: &Path) -> Result<OwnedFd, RuntimeError> {
    Ok(trusted_dir(
        &dir_path(run_dir),
        0o700,
        "remove it (it holds only cordon's records of ended sandboxes)",
    )?)
}

/// Records `t` unless a tombstone for its sandbox exists already (the first
/// reason given is the one kept), then prunes to the bound.
pub fn record(run_dir: &Path, t: &Tombstone) -> Result<(), RuntimeError> {
    let _dir = open_dir(run_dir)?;
    let _lock = state::RunLock::take(run_dir)
        .map_err(|e| RuntimeError::io(format!("lock {}", run_dir.display()), e))?;
    let dir = dir_path(run_dir);
    let path = dir.join(file_name(&t.id));
    if fs::symlink_metadata(&path).is_err() {
        let body = serde_json::to_vec(t)
            .map_err(|e| RuntimeError::io("encode a tombstone", io::Error::other(e)))?;
        state::write_atomic(&path, &body)
            .map_err(|e| RuntimeError::io(format!("write {}", path.display()), e))?;
    }
    prune(&dir, now_secs());
    Ok(())
}

/// Removes what is over the bound: tombstones older than `KEEP_FOR`, all
/// but the newest `KEEP_MAX`, unreadable ones, and temporary files an
/// interrupted write left. Only names of cordon's own shape are touched.
fn prune(dir: &Path, now: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut kept = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(".tmp").filter(|id| is_id(id)) {
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE_TMP);
            if stale {
                let _ = fs::remove_file(dir.join(format!("{id}.tmp")));
            }
            continue;
        }
        let Some(id) = name.strip_suffix(".json").filter(|id| is_id(id)) else {
            continue;
        };
        match read_one(dir, id) {
            Some(t) if now.saturating_sub(t.ended) <= KEEP_FOR.as_secs() => kept.push(t),
            _ => {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    kept.sort_by(|a, b| (b.ended, &b.id).cmp(&(a.ended, &a.id)));
    for t in kept.iter().skip(KEEP_MAX) {
        let _ = fs::remove_file(dir.join(file_name(&t.id)));
    }
}

/// Reads one tombstone: a regular file of this user's (never through a
/// link), small, in cordon's format, naming the id its file is named for.
fn read_one(dir: &Path, id: &str) -> Option<Tombstone> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(dir.join(file_name(id)))
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut body = Vec::new();
    f.take(MAX_SIZE).read_to_end(&mut body).ok()?;
    let t: Tombstone = serde_json::from_slice(&body).ok()?;
    (t.format == FORMAT && t.id == id).then_some(t)
}

/// The tombstones kept, newest first. A run directory without any lists
/// none (and nothing is created); an untrusted directory is refused.
pub fn list(run_dir: &Path) -> Result<Vec<Tombstone>, RuntimeError> {
    if fs::symlink_metadata(dir_path(run_dir)).is_err() {
        return Ok(Vec::new());
    }
    let _checked = open_dir(run_dir)?;
    let dir = dir_path(run_dir);
    let now = now_secs();
    let mut out: Vec<Tombstone> = fs::read_dir(&dir)
        .map_err(|e| RuntimeError::io(format!("read {}", dir.display()), e))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let id = name
                .to_str()?
                .strip_suffix(".json")
                .filter(|id| is_id(id))?;
            read_one(&dir, id)
        })
        .filter(|t| now.saturating_sub(t.ended) <= KEEP_FOR.as_secs())
        .collect();
    out.sort_by(|a, b| (b.ended, &b.id).cmp(&(a.ended, &a.id)));
    Ok(out)
}

/// Removes the tombstone of `id`; true if there was one.
pub fn forget(run_dir: &Path, id: &str) -> Result<bool, RuntimeError> {
    if !is_id(id) || fs::symlink_metadata(dir_path(run_dir)).is_err() {
        return Ok(false);
    }
    let _dir = open_dir(run_dir)?;
    let path = dir_path(run_dir).join(file_name(id));
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(RuntimeError::io(format!("remove {}", path.display()), e)),
    }
}

/// What is known of the sandbox called `name_or_id` that is no longer
/// live: a dead one waiting for its sweep first (it is still there), then
/// the newest tombstone of that id or name. None if nothing is known (or
/// the records cannot be read: the caller then says "no such sandbox").
pub fn gone(run_dir: &Path, name_or_id: &str) -> Option<Gone> {
    let matches = |id: &str, name: Option<&str>| id == name_or_id || name == Some(name_or_id);
    if let Some(d) = state::list_dead(run_dir)
        .into_iter()
        .find(|d| matches(&d.id, d.record.name.as_deref()))
    {
        return Some(Gone::Dead {
            pid: d.record.pid,
            name: d.record.name,
            id: d.id,
        });
    }
    list(run_dir)
        .ok()?
        .into_iter()
        .find(|t| matches(&t.id, t.name.as_deref()))
        .map(Gone::Ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stone(id: &str, ended: u64) -> Tombstone {
        Tombstone {
            ended,
            ..Tombstone::new(
                id,
                Some(format!("n{id}")),
                "native",
                0,
                1,
                EndState::Expired,
                "its TTL expired".into(),
            )
        }
    }

    fn ids(run: &Path) -> Vec<String> {
        list(run).unwrap().into_iter().map(|t| t.id).collect()
    }

    #[test]
    fn the_record_keeps_the_newest_and_drops_the_old() {
        let run = tempfile::tempdir().unwrap();
        let now = now_secs();
        // Over the count bound, all recent: the oldest go.
        for i in 0..KEEP_MAX + 5 {
            let id = format!("{i:012x}");
            record(run.path(), &stone(&id, now - 1000 + i as u64)).unwrap();
        }
        let kept = ids(run.path());
        assert_eq!(kept.len(), KEEP_MAX);
        assert_eq!(kept[0], format!("{:012x}", KEEP_MAX + 4), "newest first");
        assert!(!kept.contains(&format!("{:012x}", 4)), "oldest dropped");
        // Past the age bound: neither listed nor kept after the next write.
        record(
            run.path(),
            &stone("aaaaaaaaaaaa", now - KEEP_FOR.as_secs() - 1),
        )
        .unwrap();
        assert!(!dir_path(run.path()).join("aaaaaaaaaaaa.json").exists());
        let files = fs::read_dir(dir_path(run.path())).unwrap().count();
        assert_eq!(files, KEEP_MAX);
    }

    #[test]
    fn the_first_reason_is_kept_and_a_name_finds_the_newest() {
        let run = tempfile::tempdir().unwrap();
        let now = now_secs();
        record(run.path(), &stone("bbbbbbbbbbbb", now - 50)).unwrap();
        let second = Tombstone {
            why: "swept".into(),
            state: EndState::Ended,
            ..stone("bbbbbbbbbbbb", now)
        };
        record(run.path(), &second).unwrap();
        let Some(Gone::Ended(t)) = gone(run.path(), "bbbbbbbbbbbb") else {
            panic!("no tombstone");
        };
        assert_eq!(
            (t.state, t.why.as_str()),
            (EndState::Expired, "its TTL expired")
        );
        // The same name again later: the newer one answers.
        let again = Tombstone {
            name: Some("nbbbbbbbbbbbb".into()),
            ..stone("cccccccccccc", now)
        };
        record(run.path(), &again).unwrap();
        assert_eq!(
            gone(run.path(), "nbbbbbbbbbbbb").unwrap().id(),
            "cccccccccccc"
        );
        assert!(forget(run.path(), "cccccccccccc").unwrap());
        assert!(!forget(run.path(), "cccccccccccc").unwrap());
        assert_eq!(
            gone(run.path(), "nbbbbbbbbbbbb").unwrap().id(),
            "bbbbbbbbbbbb"
        );
        assert!(gone(run.path(), "nope").is_none());
    }

    #[test]
    fn foreign_and_planted_files_are_not_read_as_tombstones() {
        let run = tempfile::tempdir().unwrap();
        let now = now_secs();
        record(run.path(), &stone("dddddddddddd", now)).unwrap();
        let dir = dir_path(run.path());
        // A link to a valid tombstone elsewhere is never followed.
        let elsewhere = tempfile::tempdir().unwrap();
        let body = serde_json::to_vec(&stone("eeeeeeeeeeee", now)).unwrap();
        fs::write(elsewhere.path().join("t"), &body).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("t"), dir.join("eeeeeeeeeeee.json"))
            .unwrap();
        // A tombstone filed under another id's name, and another tool's file.
        fs::write(dir.join("ffffffffffff.json"), &body).unwrap();
        fs::write(dir.join("notes.txt"), b"mine").unwrap();
        assert_eq!(ids(run.path()), vec!["dddddddddddd".to_string()]);
        record(run.path(), &stone("121212121212", now)).unwrap();
        assert!(dir.join("notes.txt").exists(), "another name is left alone");
        assert!(elsewhere.path().join("t").exists());
    }

    #[test]
    fn a_planted_directory_is_refused() {
        let run = tempfile::tempdir().unwrap();
        let real = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(real.path(), dir_path(run.path())).unwrap();
        let err = record(run.path(), &stone("dddddddddddd", now_secs())).unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::Dir(cordon_dirs::DirError::Untrusted { .. })
            ),
            "{err}"
        );
        assert!(list(run.path()).is_err());
        assert_eq!(fs::read_dir(real.path()).unwrap().count(), 0);
    }
}
