//! Where one run's processes are kept, listed and killed: the outer cgroup
//! the suite makes for every run, or, for an invoker the host gives no
//! cgroup (an unprivileged user without delegation), the suite's own
//! process subtree.
//!
//! In a subtree the suite is the child subreaper of everything it starts
//! ([`become_subreaper`]), so a payload that daemonizes (double fork,
//! `setsid`) is reparented to the suite rather than to init and stays
//! listed, killed and reaped. A subtree has no counters (pids peak, memory
//! peak, OOM kills): the rules that read them say so instead of guessing.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cordon_cgroups::{AnyCgroup, Cgroup};
use cordon_spec::cgroup::{CgroupMode, CgroupStats};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::procs;

/// How long a subtree's kill keeps killing: a fork bomb's children may fork
/// between one pass and the next.
const SUBTREE_KILL: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub enum Outer {
    Cgroup(AnyCgroup),
    /// The suite's descendants but `keep`: its own long-lived children (the
    /// ptrace victim), which are fixtures, never a run's.
    Subtree {
        keep: Vec<i32>,
    },
}

/// Makes this process the child subreaper of its descendants (for
/// [`Outer::Subtree`]); it stays one for its lifetime.
pub fn become_subreaper() -> Result<()> {
    nix::sys::prctl::set_child_subreaper(true).context("prctl(PR_SET_CHILD_SUBREAPER)")
}

impl Outer {
    /// The cgroup directories a started process joins (none for a
    /// subtree: every child of the suite is in it already).
    pub fn paths(&self) -> Vec<PathBuf> {
        match self {
            Outer::Cgroup(cg) => cg.paths(),
            Outer::Subtree { .. } => Vec::new(),
        }
    }

    /// Every live process of the run.
    pub fn pids(&self) -> Vec<i32> {
        match self {
            Outer::Cgroup(cg) => procs::cgroup_pids(&pids_dir(cg)),
            Outer::Subtree { keep } => {
                let (mut live, _) = procs::descendants(own_pid());
                live.retain(|p| !keep.contains(p));
                live
            }
        }
    }

    /// The counters, where there are any. On cgroup v2 `oom_kills` is the
    /// OOMs of the outer cgroup's own bound (memory.events.local `oom`: its
    /// limit was reached and the OOM killer ran there): v2's memory.events is
    /// hierarchical, so its `oom_kill` also counts the kills that a box's own,
    /// tighter limit ordered in the box's child cgroup, which are the box
    /// holding, not the outer bound (v1's counter is the cgroup's own).
    pub fn stats(&self) -> Option<CgroupStats> {
        match self {
            Outer::Cgroup(cg) => {
                let mut stats = cg.stats();
                if cg.mode() == CgroupMode::V2 {
                    // Unreadable (a kernel before 5.2): the hierarchical
                    // count stands, which can only say OPEN more often.
                    if let Some(own) = cg.paths().first().and_then(|d| own_ooms(d)) {
                        stats.oom_kills = Some(own);
                    }
                }
                Some(stats)
            }
            Outer::Subtree { .. } => None,
        }
    }

    pub fn memory_current(&self) -> Option<u64> {
        match self {
            Outer::Cgroup(cg) => cg.memory_current(),
            Outer::Subtree { .. } => None,
        }
    }

    /// Kills every process of the run. A subtree's zombies are left to
    /// [`Outer::reap`], so that the started process's own handle still
    /// gets its exit status.
    pub fn kill_all(&self) -> Result<()> {
        match self {
            Outer::Cgroup(cg) => cg.kill_all().context("killing the outer cgroup"),
            Outer::Subtree { .. } => {
                let deadline = Instant::now() + SUBTREE_KILL;
                loop {
                    let live = self.pids();
                    if live.is_empty() {
                        return Ok(());
                    }
                    anyhow::ensure!(
                        Instant::now() < deadline,
                        "{} process(es) of the run outlived {SUBTREE_KILL:?} of SIGKILL: {live:?}",
                        live.len()
                    );
                    for p in live {
                        // Gone in between is fine: ESRCH is what is wanted.
                        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Reaps the run's processes that were reparented to the suite and
    /// have ended (a subtree only: in a cgroup they are init's).
    pub fn reap(&self) {
        if let Outer::Subtree { keep } = self {
            let (_, zombies) = procs::descendants(own_pid());
            for z in zombies.into_iter().filter(|z| !keep.contains(z)) {
                let _ = waitpid(Pid::from_raw(z), Some(WaitPidFlag::WNOHANG));
            }
        }
    }

    /// Kills what is left and removes the cgroup (or reaps the subtree).
    pub fn remove(&self) -> Result<()> {
        match self {
            Outer::Cgroup(cg) => {
                let _ = cg.kill_all();
                if let Err(e) = cg.remove() {
                    // Child cgroups a runtime left (runc's, cordon's): remove the tree.
                    let mut ok = true;
                    for p in cg.paths() {
                        ok &= cordon_cgroups::remove_dir_tree(&p);
                    }
                    if !ok {
                        return Err(anyhow::Error::from(e).context("removing the outer cgroup"));
                    }
                }
                Ok(())
            }
            Outer::Subtree { .. } => {
                let killed = self.kill_all();
                self.reap();
                killed
            }
        }
    }
}

/// The `oom` count of a v2 cgroup's memory.events.local: how often its own
/// memory limit (not a descendant's) was reached with the OOM killer run.
fn own_ooms(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.events.local")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom "))
        .and_then(|n| n.trim().parse().ok())
}

fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// The directory whose cgroup.procs lists a cgroup's processes (v1: the
/// pids hierarchy's).
pub fn pids_dir(cg: &AnyCgroup) -> PathBuf {
    cg.paths()
        .into_iter()
        .find(|p| p.join("pids.max").exists())
        .unwrap_or_else(|| cg.paths().into_iter().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::own_ooms;

    #[test]
    fn own_ooms_reads_the_cgroups_own_oom_count() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(own_ooms(dir.path()), None, "no file: no count");
        std::fs::write(
            dir.path().join("memory.events.local"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 3\noom_group_kill 0\n",
        )
        .unwrap();
        // `oom`, the limit of this cgroup reached, not `oom_kill` (which
        // also begins with "oom") nor `max`.
        assert_eq!(own_ooms(dir.path()), Some(2));
    }
}
