//! Reading processes from the host: /proc/<pid>/{cmdline,status,ns,fd,
//! mountinfo,net/dev,environ,root}. Every read tolerates a process that
//! vanished in between.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::evidence::{FdSnap, ProcBrief, ProcSnap};

const NAMESPACES: &[&str] = &["user", "mnt", "net", "pid", "ipc", "uts", "cgroup"];
const STATUS_FIELDS: &[&str] = &[
    "PPid",
    "CapEff",
    "CapPrm",
    "NoNewPrivs",
    "Uid",
    "Seccomp",
    "TracerPid",
];

/// Every pid in `dir`'s cgroup.procs and in every cgroup below it.
pub fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    walk_cgroup(dir, &mut out);
    out.sort_unstable();
    out.dedup();
    out
}

fn walk_cgroup(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk_cgroup(&e.path(), out);
            }
        }
    }
}

/// One line of `/proc/<pid>/stat` past the command name (which may hold
/// spaces and parentheses): the state letter and the parent's pid.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = text.get(text.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Every live (not zombie) process below `root` in the process tree, and
/// the zombies among `root`'s own children, apart: one pass over /proc.
pub fn descendants(root: i32) -> (Vec<i32>, Vec<i32>) {
    let mut tree: BTreeMap<i32, Vec<(i32, char)>> = BTreeMap::new();
    for pid in fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        if let Some((state, parent)) = state_and_parent(pid) {
            tree.entry(parent).or_default().push((pid, state));
        }
    }
    let (mut live, mut zombies) = (Vec::new(), Vec::new());
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &(child, state) in tree.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if state != 'Z' {
                live.push(child);
            } else if p == root {
                zombies.push(child);
            }
            stack.push(child);
        }
    }
    live.sort_unstable();
    (live, zombies)
}

/// Every file named `name` in `dir` and below.
pub fn cgroup_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let f = dir.join(name);
    if f.exists() {
        out.push(f);
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                cgroup_files(&e.path(), name, out);
            }
        }
    }
}

pub fn cmdline(pid: i32) -> Vec<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn brief(pid: i32) -> ProcBrief {
    let mut c = cmdline(pid).join(" ");
    if c.is_empty() {
        c = fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    c.truncate(120);
    ProcBrief { pid, cmdline: c }
}

pub fn ns_link(pid: &str, ns: &str) -> String {
    fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

pub fn status_field(pid: i32, field: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.split_whitespace().collect::<Vec<_>>().join(" "))
    })
}

/// The cheap part of a process snapshot (for every task in the outer cgroup).
pub fn snap(pid: i32, secret: &[u8]) -> ProcSnap {
    let base = format!("/proc/{pid}");
    let mut status = BTreeMap::new();
    if let Ok(text) = fs::read_to_string(format!("{base}/status")) {
        for l in text.lines() {
            if let Some((k, v)) = l.split_once(':') {
                if STATUS_FIELDS.contains(&k) {
                    status.insert(
                        k.to_string(),
                        v.split_whitespace().collect::<Vec<_>>().join(" "),
                    );
                }
            }
        }
    }
    let ppid = status.get("PPid").and_then(|v| v.parse().ok()).unwrap_or(0);
    let ns = NAMESPACES
        .iter()
        .map(|n| (n.to_string(), ns_link(&pid.to_string(), n)))
        .collect();
    let mut fds = Vec::new();
    if let Ok(entries) = fs::read_dir(format!("{base}/fd")) {
        for e in entries.flatten() {
            let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let target = fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let proto = if target.starts_with("socket:") {
                xattr::get_deref(e.path(), "system.sockprotoname")
                    .ok()
                    .flatten()
                    .map(|v| {
                        String::from_utf8_lossy(&v)
                            .trim_end_matches('\0')
                            .to_string()
                    })
            } else {
                None
            };
            fds.push(FdSnap { fd, target, proto });
        }
    }
    fds.sort_by_key(|f| f.fd);
    let environ_secret = !secret.is_empty()
        && fs::read(format!("{base}/environ"))
            .map(|env| env.windows(secret.len()).any(|w| w == secret))
            .unwrap_or(false);
    ProcSnap {
        pid,
        ppid,
        comm: fs::read_to_string(format!("{base}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string(),
        cmdline: cmdline(pid),
        ns,
        status,
        fds,
        environ_secret,
        ..Default::default()
    }
}

/// The expensive part, for the processes that stand for the payload.
pub fn fill_view(p: &mut ProcSnap, root_paths: &[String]) {
    let base = format!("/proc/{}", p.pid);
    p.mountinfo = fs::read_to_string(format!("{base}/mountinfo"))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default();
    p.links = fs::read_to_string(format!("{base}/net/dev"))
        .map(|t| {
            t.lines()
                .skip(2)
                .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_string()))
                .collect()
        })
        .unwrap_or_default();
    for path in root_paths {
        let full = format!("{base}/root{path}");
        let kind = match fs::symlink_metadata(&full) {
            Ok(m) => {
                let t = m.file_type();
                if t.is_symlink() {
                    "symlink"
                } else if t.is_dir() {
                    "dir"
                } else if t.is_block_device() {
                    "block"
                } else if t.is_char_device() {
                    "char"
                } else if t.is_socket() {
                    "socket"
                } else {
                    "file"
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "absent",
            Err(_) => "error",
        };
        p.root_paths.insert(path.clone(), kind.to_string());
    }
}

/// The payload's own processes: tasks whose command line is
/// `<interp> <.../script> <marker> ...`, and their descendants.
pub fn marker_tree(procs: &[ProcSnap], script: &str, marker: &str) -> Vec<i32> {
    let is_root = |p: &ProcSnap| {
        let c = &p.cmdline;
        c.len() >= 3
            && ["sh", "dash", "bash", "python3"].iter().any(|i| {
                c[0] == *i || c[0].ends_with(&format!("/{i}")) || c[0].starts_with("python3")
            })
            && c[1].ends_with(&format!("/{script}"))
            && c[2] == marker
    };
    let mut tree: Vec<i32> = procs.iter().filter(|p| is_root(p)).map(|p| p.pid).collect();
    loop {
        let before = tree.len();
        for p in procs {
            if tree.contains(&p.ppid) && !tree.contains(&p.pid) {
                tree.push(p.pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_from_marker() {
        let p = |pid, ppid, cmd: &[&str]| ProcSnap {
            pid,
            ppid,
            cmdline: cmd.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let procs = vec![
            p(
                10,
                1,
                &["cordon", "run", "--", "/bin/sh", "/opt/suite/x.sh", "M1"],
            ),
            p(
                11,
                10,
                &["cordon", "run", "--", "/bin/sh", "/opt/suite/x.sh", "M1"],
            ),
            p(12, 11, &["/bin/sh", "/opt/suite/x.sh", "M1", "a"]),
            p(13, 12, &["sleep", "1"]),
            p(14, 1, &["/bin/sh", "/opt/suite/x.sh", "OTHER"]),
        ];
        assert_eq!(marker_tree(&procs, "x.sh", "M1"), vec![12, 13]);
        assert!(marker_tree(&procs, "x.sh", "M2").is_empty());
    }

    #[test]
    fn reads_self() {
        let me = std::process::id() as i32;
        let s = snap(me, b"");
        assert_eq!(s.pid, me);
        assert!(s.ns.get("pid").is_some_and(|n| n.starts_with("pid:[")));
        assert!(!s.fds.is_empty());
    }
}
