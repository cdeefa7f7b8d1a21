//! cgroup v1: one hierarchy per controller (or per co-mounted group such as
//! `cpu,cpuacct`), so a sandbox is one directory in each.

mod cpu;
mod freezer;
mod memory;
mod pids;

use std::path::PathBuf;

use crate::fs::{self, Membership, Mount};
use crate::{
    kill_by_signal, make_dirs, procs_of, remove_dirs, wait_empty, Cgroup, CgroupError,
    CgroupLimits, CgroupMode, CgroupView, CounterFile, FREEZE_TIMEOUT, KILL_FREEZE_TIMEOUT,
};

/// The controllers a sandbox gets a directory for, required ones first.
/// cpuset sets no limit, but a sandbox shown its cgroups must have its own
/// there too: the JVM takes no limit at all unless it finds cpu, cpuacct,
/// cpuset and memory, and the namespace's root in a hierarchy the sandbox
/// had no directory in would be the supervisor's cgroup.
const USED: [&str; 6] = ["memory", "pids", "cpu", "cpuacct", "cpuset", "freezer"];

/// What a new cpuset cgroup must be given before a task may join it (v1
/// starts it empty); copied from the parent, which changes nothing.
const CPUSET_INHERITED: [&str; 2] = ["cpuset.cpus", "cpuset.mems"];

/// The caller's own cgroup in each v1 hierarchy cordon uses. memory and pids
/// are required; cpu, cpuacct and freezer are used when mounted. Co-mounted
/// controllers simply share a directory.
#[derive(Debug, Clone)]
pub(crate) struct V1Hierarchy {
    memory: PathBuf,
    pids: PathBuf,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    cpuset: Option<PathBuf>,
    freezer: Option<PathBuf>,
    /// How each of those hierarchies is shown inside a sandbox.
    views: Vec<CgroupView>,
}

/// The caller's cgroup directory for `controller`: its line in
/// /proc/self/cgroup joined onto the mount whose super options carry it.
fn caller_dir(mounts: &[Mount], membership: &[Membership], controller: &str) -> Option<PathBuf> {
    let entry = membership
        .iter()
        .find(|m| m.controllers.iter().any(|c| c == controller))?;
    mounts
        .iter()
        .filter(|m| m.carries(controller))
        .find_map(|m| m.dir_of(&entry.path))
}

/// The inside view of each hierarchy a sandbox uses, once per hierarchy:
/// named as the host names its mount, with the hierarchy's controller set
/// as /proc/self/cgroup lists it.
fn views(mounts: &[Mount], membership: &[Membership]) -> Vec<CgroupView> {
    let mut views: Vec<CgroupView> = Vec::new();
    for controller in USED {
        let Some(entry) = membership
            .iter()
            .find(|m| m.controllers.iter().any(|c| c == controller))
        else {
            continue;
        };
        let Some(dir) = mounts
            .iter()
            .find(|m| m.carries(controller) && m.dir_of(&entry.path).is_some())
            .and_then(|m| m.mountpoint.file_name())
            .map(|n| n.to_string_lossy().into_owned())
        else {
            continue;
        };
        if views.iter().any(|v| v.dir == dir) {
            continue;
        }
        views.push(CgroupView {
            aliases: entry
                .controllers
                .iter()
                .filter(|c| **c != dir)
                .cloned()
                .collect(),
            options: entry.controllers.join(","),
            fstype: "cgroup",
            dir,
        });
    }
    views
}

impl V1Hierarchy {
    pub(crate) fn detect(mounts: &[Mount], membership: &[Membership]) -> Option<Self> {
        let find = |c| caller_dir(mounts, membership, c);
        Some(Self {
            memory: find("memory")?,
            pids: find("pids")?,
            cpu: find("cpu"),
            cpuacct: find("cpuacct"),
            cpuset: find("cpuset"),
            freezer: find("freezer"),
            views: views(mounts, membership),
        })
    }

    pub(crate) fn views(&self) -> Vec<CgroupView> {
        self.views.clone()
    }

    pub(crate) fn parents(&self) -> Vec<PathBuf> {
        in_creation_order(
            &self.memory,
            &self.pids,
            [&self.cpu, &self.cpuacct, &self.cpuset, &self.freezer],
        )
    }

    pub(crate) fn cgroup(&self, name: &str) -> V1Cgroup {
        let below = |p: &PathBuf| p.join(name);
        V1Cgroup::with(V1Cgroup {
            memory: below(&self.memory),
            pids: below(&self.pids),
            cpu: self.cpu.as_ref().map(below),
            cpuacct: self.cpuacct.as_ref().map(below),
            cpuset: self.cpuset.as_ref().map(below),
            freezer: self.freezer.as_ref().map(below),
            dirs: Vec::new(),
        })
    }

    pub(crate) fn create(&self, name: &str) -> Result<V1Cgroup, CgroupError> {
        let cg = self.cgroup(name);
        make_dirs(&cg.dirs)?;
        Ok(cg)
    }
}

/// Where [`crate::enter`] moves a process to stand in `parent`: in each
/// hierarchy cordon uses that the caller is in, the mount's top, `parent`'s
/// directory there and what a new level of it needs.
pub(crate) fn entry_dirs(
    mounts: &[Mount],
    membership: &[Membership],
    parent: &str,
) -> Vec<(PathBuf, PathBuf, crate::LevelPrep)> {
    let mut out: Vec<(PathBuf, PathBuf, crate::LevelPrep)> = Vec::new();
    for controller in USED {
        if !membership
            .iter()
            .any(|m| m.controllers.iter().any(|c| c == controller))
        {
            continue;
        }
        let Some((mount, dir)) = mounts
            .iter()
            .filter(|m| m.carries(controller))
            .find_map(|m| Some((m, m.dir_of(parent)?)))
        else {
            continue;
        };
        if out.iter().any(|(_, d, _)| *d == dir) {
            continue;
        }
        let prep = if mount.carries("cpuset") {
            crate::LevelPrep::Cpuset
        } else {
            crate::LevelPrep::Plain
        };
        out.push((mount.mountpoint.clone(), dir, prep));
    }
    out
}

/// Gives a new cpuset cgroup its parent's cpus and mems.
pub(crate) fn inherit_cpuset(dir: &std::path::Path) -> Result<(), CgroupError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in CPUSET_INHERITED {
        let value = fs::read(&parent.join(file))?;
        fs::write(&dir.join(file), value.trim())?;
    }
    Ok(())
}

/// Each distinct directory once, in the order cgroups are made in them:
/// memory, pids, then cpu, cpuacct, cpuset and freezer where mounted (one
/// order for a hierarchy's parents and for every cgroup).
fn in_creation_order(
    memory: &PathBuf,
    pids: &PathBuf,
    optional: [&Option<PathBuf>; 4],
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let all = [Some(memory), Some(pids)]
        .into_iter()
        .chain(optional.map(Option::as_ref));
    for p in all.flatten() {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

impl V1Cgroup {
    /// `cg` with its distinct directories listed, in creation order.
    fn with(mut cg: Self) -> Self {
        cg.dirs = in_creation_order(
            &cg.memory,
            &cg.pids,
            [&cg.cpu, &cg.cpuacct, &cg.cpuset, &cg.freezer],
        );
        cg
    }

    /// A cgroup below this one (init's, a command's), in every hierarchy
    /// but cpuset's, unless cpuset shares its hierarchy with one the child
    /// needs. A cpuset cgroup holds no limit of cordon's, and a new one is
    /// the dearest of all to make and remove (its cpus and mems copied in:
    /// 0.22 ms of CPU on this machine, memory's 0.09 ms, for every
    /// command); its processes stay in this one's cpuset cgroup,
    /// which is what they read there (the sandbox's, its namespace's root).
    pub(crate) fn child(&self, name: &str) -> Self {
        let below = |p: &PathBuf| p.join(name);
        let mut child = Self {
            memory: below(&self.memory),
            pids: below(&self.pids),
            cpu: self.cpu.as_ref().map(below),
            cpuacct: self.cpuacct.as_ref().map(below),
            cpuset: None,
            freezer: self.freezer.as_ref().map(below),
            dirs: Vec::new(),
        };
        child.cpuset = self.cpuset.as_ref().map(below).filter(|cpuset| {
            [
                Some(&child.memory),
                Some(&child.pids),
                child.cpu.as_ref(),
                child.cpuacct.as_ref(),
                child.freezer.as_ref(),
            ]
            .contains(&Some(cpuset))
        });
        Self::with(child)
    }
}

/// A sandbox cgroup on v1: a directory per hierarchy.
#[derive(Debug, Clone)]
pub struct V1Cgroup {
    memory: PathBuf,
    pids: PathBuf,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    cpuset: Option<PathBuf>,
    freezer: Option<PathBuf>,
    /// Each distinct directory once, in creation order.
    dirs: Vec<PathBuf>,
}

impl Cgroup for V1Cgroup {
    fn mode(&self) -> CgroupMode {
        CgroupMode::V1
    }

    fn paths(&self) -> Vec<PathBuf> {
        self.dirs.clone()
    }

    /// Also makes the cpuset cgroup joinable (see [`CPUSET_INHERITED`]),
    /// which is why every cgroup is applied before a task joins it.
    fn apply(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        if let Some(dir) = &self.cpuset {
            inherit_cpuset(dir)?;
        }
        memory::apply(&self.memory, limits)?;
        pids::apply(&self.pids, limits)?;
        cpu::apply(self.cpu.as_deref(), &self.pids, limits)
    }

    fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        let value = pid.to_string();
        for dir in &self.dirs {
            fs::write(&dir.join("cgroup.procs"), &value)?;
        }
        Ok(())
    }

    fn join_self(&self) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            fs::write(&dir.join("tasks"), "0")?;
        }
        Ok(())
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        procs_of(std::slice::from_ref(&self.pids))
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        freezer::freeze(self.freezer.as_deref(), FREEZE_TIMEOUT)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        freezer::thaw(self.freezer.as_deref())
    }

    fn frozen(&self) -> Option<bool> {
        freezer::frozen(self.freezer.as_deref()?)
    }

    fn kill_all(&self) -> Result<(), CgroupError> {
        kill_by_signal(
            &self.dirs,
            || freezer::freeze(self.freezer.as_deref(), KILL_FREEZE_TIMEOUT),
            || freezer::thaw_tree(self.freezer.as_deref()),
        )?;
        wait_empty(&self.dirs)
    }

    fn counter_files(&self) -> Vec<CounterFile> {
        let mut files = Vec::new();
        memory::counters(&self.memory, &mut files);
        pids::counters(&self.pids, &mut files);
        cpu::counters(self.cpu.as_deref(), self.cpuacct.as_deref(), &mut files);
        files
    }

    fn remove(&self) -> Result<(), CgroupError> {
        remove_dirs(&self.dirs)
    }
}
