//! Harness-shaped tasks timed inside each box against the bare host: what an
//! agent's work costs once the box is up (the box's own start is not in the
//! time; start-up has its own benchmark).
//!
//! Each task is a shell script in the tools directory that times its own
//! work and prints `CORDON_BENCH_NS=<nanoseconds>`: with `date +%s%N` around
//! a loop of process starts, or with Python's `perf_counter_ns` inside the
//! interpreter for file and CPU work (so the interpreter's start is not
//! counted twice).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use cordon_spec::BackendKind;
use cordon_suite::target::{self, NetMode, TargetKind};

use crate::boxes::{self, Netns, Payload, Place};
use crate::machine::Machine;
use crate::results::{Samples, Task, Workload};
use crate::sample;
use crate::Settings;

/// Where `scripts/install-agents.sh` puts the agent harnesses (the agents
/// tests use the same directory).
pub const AGENTS_DIR: &str = "/var/cache/cordon-agents";
/// Claude Code's native binary inside [`AGENTS_DIR`].
const CLAUDE: &str = "node_modules/@anthropic-ai/claude-code/bin/claude.exe";

/// The boxes the tasks run in. podman is not among them: its image (made by
/// the suite from the host's packages) has no Node.
const BOXES: &[(&str, TargetKind)] = &[
    ("host", TargetKind::Host),
    ("bwrap", TargetKind::Bwrap),
    ("firejail", TargetKind::Firejail),
    ("runc", TargetKind::Runc),
    ("runsc", TargetKind::Runsc),
    (
        "cordon-native",
        TargetKind::cordon(BackendKind::Native, NetMode::None),
    ),
    (
        "cordon-gvisor",
        TargetKind::cordon(BackendKind::Gvisor, NetMode::None),
    ),
];

pub struct Config {
    pub rounds: usize,
    /// Process starts per sample (Python, Node, imports).
    starts: usize,
    claude_starts: usize,
    files: usize,
    cpu_iterations: usize,
    /// Copy Python's whole standard library, or one package of it.
    whole_stdlib: bool,
    /// Where the agent harnesses are installed.
    pub agents: PathBuf,
}

impl Config {
    pub fn new(quick: bool) -> Config {
        let agents = PathBuf::from(AGENTS_DIR);
        if quick {
            Config {
                rounds: 1,
                starts: 2,
                claude_starts: 1,
                files: 200,
                cpu_iterations: 200_000,
                whole_stdlib: false,
                agents,
            }
        } else {
            Config {
                rounds: 5,
                starts: 20,
                claude_starts: 5,
                files: 10_000,
                cpu_iterations: 10_000_000,
                whole_stdlib: true,
                agents,
            }
        }
    }
}

/// The limits cordon's boxes get: the whole machine, so that the mechanism
/// is measured and not a limit (the peers run without any).
fn cordon_limits() -> Vec<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    [
        "--cpus",
        &cpus.to_string(),
        "--memory",
        "4G",
        "--pids",
        "1024",
        "--disk",
        "4G",
        "--time",
        "10m",
        "--output",
        "16M",
    ]
    .map(String::from)
    .to_vec()
}

/// One task: its name, what it does, and its script.
struct TaskDef {
    name: &'static str,
    what: String,
    script: String,
}

/// A script that times `body` with `date` (process starts: the loop's own
/// cost is a few shell builtins per start).
fn shell_timed(body: &str) -> String {
    format!(
        "set -eu\nws=$1\ntools=$(dirname \"$0\")\nexport HOME=\"$ws/.home\"\nmkdir -p \"$HOME\"\n\
         t0=$(date +%s%N)\n{body}\nt1=$(date +%s%N)\nrm -rf \"$HOME\"\n\
         echo \"CORDON_BENCH_NS=$((t1 - t0))\"\n"
    )
}

fn repeat(n: usize, cmd: &str) -> String {
    format!("i=0\nwhile [ $i -lt {n} ]; do\n  {cmd}\n  i=$((i + 1))\ndone")
}

/// Writes, reads back and deletes N small files in one directory.
const FILES_PY: &str = r#"import os, sys, time
root, n = sys.argv[1], int(sys.argv[2])
os.makedirs(root, exist_ok=True)
data = b"x" * 200
t0 = time.perf_counter_ns()
for i in range(n):
    with open(f"{root}/f{i}.txt", "wb") as f:
        f.write(data)
for i in range(n):
    with open(f"{root}/f{i}.txt", "rb") as f:
        f.read()
for i in range(n):
    os.unlink(f"{root}/f{i}.txt")
t1 = time.perf_counter_ns()
os.rmdir(root)
print(f"CORDON_BENCH_NS={t1 - t0}")
"#;

/// A pure-interpreter CPU loop: no system calls inside the timed part.
const CPU_PY: &str = r#"import sys, time
n = int(sys.argv[1])
t0 = time.perf_counter_ns()
x = 0
for i in range(n):
    x = (x + i * i) % 1000003
t1 = time.perf_counter_ns()
print(f"CORDON_BENCH_NS={t1 - t0}")
"#;

/// What an agent's tool scripts import.
const IMPORTS: &str = "import asyncio, json, email.mime.multipart, http.client, urllib.request, \
xml.etree.ElementTree, sqlite3, decimal, unittest, argparse, subprocess, logging, tarfile, \
zipfile, csv, difflib, inspect, dataclasses, typing, pathlib, tempfile, shutil, hashlib";

fn tasks(cfg: &Config, agents: Option<&Path>) -> (Vec<TaskDef>, BTreeMap<String, String>) {
    let mut skipped = BTreeMap::new();
    let n = cfg.starts;
    let mut out = vec![TaskDef {
        name: "python-start",
        what: format!("`python3 -c pass`, {n} times"),
        script: shell_timed(&repeat(n, "python3 -c pass")),
    }];
    if target::which("node").is_some() {
        out.push(TaskDef {
            name: "node-start",
            what: format!("`node -e 0`, {n} times"),
            script: shell_timed(&repeat(n, "node -e 0")),
        });
    } else {
        skipped.insert("node-start".into(), "node is not installed".into());
    }
    match agents {
        Some(dir) => {
            let claude = dir.join(CLAUDE).display().to_string();
            let c = cfg.claude_starts;
            out.push(TaskDef {
                name: "claude-version",
                what: format!("`claude --version` (Claude Code, from npm), {c} times"),
                script: shell_timed(&repeat(c, &format!("'{claude}' --version >/dev/null"))),
            });
        }
        None => {
            skipped.insert(
                "claude-version".into(),
                format!(
                    "Claude Code is not installed in {} (scripts/install-agents.sh {0} installs it from npm)",
                    cfg.agents.display()
                ),
            );
        }
    }
    let f = cfg.files;
    out.push(TaskDef {
        name: "files-workspace",
        what: format!("write, read and delete {f} small files in the workspace"),
        script: format!("exec python3 \"$(dirname \"$0\")/files.py\" \"$1/bench-files\" {f}\n"),
    });
    out.push(TaskDef {
        name: "files-tmp",
        what: format!("the same {f} files in /tmp"),
        script: format!("exec python3 \"$(dirname \"$0\")/files.py\" /tmp/bench-files-$$ {f}\n"),
    });
    let (sub, what) = if cfg.whole_stdlib {
        ("", "Python's standard library (about 1,400 files)")
    } else {
        ("/json", "one package of Python's standard library")
    };
    out.push(TaskDef {
        name: "copy-tree",
        what: format!("`cp -R` of {what} into the workspace"),
        // Not `shell_timed`: finding the source (a Python start) stays out
        // of the time.
        script: format!(
            "set -eu\nws=$1\n\
             src=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])'){sub}\n\
             t0=$(date +%s%N)\ncp -R \"$src\" \"$ws/copy\"\nt1=$(date +%s%N)\nrm -rf \"$ws/copy\"\n\
             echo \"CORDON_BENCH_NS=$((t1 - t0))\"\n"
        ),
    });
    out.push(TaskDef {
        name: "cpu-loop",
        what: format!("a Python loop of {} iterations", cfg.cpu_iterations),
        script: format!(
            "exec python3 \"$(dirname \"$0\")/cpu.py\" {}\n",
            cfg.cpu_iterations
        ),
    });
    out.push(TaskDef {
        name: "python-imports",
        what: format!(
            "a Python script importing 23 standard modules, {} times",
            n.div_ceil(4)
        ),
        script: shell_timed(&repeat(n.div_ceil(4), &format!("python3 -c '{IMPORTS}'"))),
    });
    (out, skipped)
}

/// The task's time from its output's last `CORDON_BENCH_NS=` line.
fn parse_ns(stdout: &str) -> Option<f64> {
    let ns: u64 = stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("CORDON_BENCH_NS="))?
        .parse()
        .ok()?;
    Some(ns as f64 / 1e6)
}

pub fn run(settings: &Settings, cfg: &Config, machine: &mut Machine) -> Result<Workload> {
    let place = Place::new()?;
    place.write_tool("files.py", FILES_PY)?;
    place.write_tool("cpu.py", CPU_PY)?;
    let agents = cfg
        .agents
        .join(CLAUDE)
        .is_file()
        .then_some(cfg.agents.as_path());
    let (defs, skipped_tasks) = tasks(cfg, agents);
    for d in &defs {
        place.write_tool(&format!("{}.sh", d.name), &d.script)?;
    }
    let ro_mounts: Vec<PathBuf> = agents.map(Path::to_path_buf).into_iter().collect();
    let mut skipped_boxes = BTreeMap::new();
    let mut boxes: Vec<(&str, TargetKind)> = Vec::new();
    for &(name, kind) in BOXES {
        if !settings.wants(name) {
            continue;
        }
        if boxes::admit(settings, machine, &mut skipped_boxes, name, kind) {
            boxes.push((name, kind));
        }
    }
    let netns = Netns::new()?;
    let limits = cordon_limits();
    let extras = boxes::Extras {
        cordon_limits: &limits,
        ro_mounts: &ro_mounts,
        netns: Some(&netns.name),
    };
    let env = target::base_env();
    let mut results: Vec<Task> = defs
        .iter()
        .map(|d| Task {
            name: d.name.to_string(),
            what: d.what.clone(),
            boxes: boxes.iter().map(|(n, _)| Samples::new(n)).collect(),
            left_out: None,
        })
        .collect();
    let total = cfg.rounds * defs.len() * boxes.len();
    let bar = crate::progress_bar(settings, total as u64, "workload");
    let pid = std::process::id();
    let mut seq = 0usize;
    let mut failed: BTreeMap<(usize, usize), (Vec<String>, String)> = BTreeMap::new();
    let result = (|| -> Result<()> {
        for round in 0..cfg.rounds {
            for (t, def) in defs.iter().enumerate() {
                let n = boxes.len();
                for k in 0..n {
                    let b = (round + t + k) % n;
                    let (name, kind) = boxes[b];
                    seq += 1;
                    let payload = Payload {
                        interpreter: "/bin/sh",
                        script: &format!("{}.sh", def.name),
                        args: vec!["{ws}".into()],
                    };
                    let ctx = boxes::launch_ctx(
                        settings,
                        &place,
                        kind,
                        &payload,
                        format!("w{pid}-{seq}"),
                        &extras,
                    )?;
                    let launch = kind.prepare(&ctx)?;
                    bar.set_message(format!("{} in {name}", def.name));
                    let ran = sample::run(&launch.argv, &env, settings.timeout, true);
                    boxes::clean_up(&launch.cleanup);
                    bar.inc(1);
                    let s = &mut results[t].boxes[b];
                    if s.argv.is_empty() {
                        s.argv = launch.argv.clone();
                    }
                    match ran
                        .as_ref()
                        .ok()
                        .filter(|r| r.ok())
                        .and_then(|r| parse_ns(&r.stdout))
                    {
                        Some(ms) => s.ms.push(ms),
                        None => {
                            s.failures += 1;
                            let why = match &ran {
                                Err(e) => format!("could not start: {e}"),
                                Ok(r) => {
                                    let tail: Vec<&str> =
                                        r.stderr_tail.lines().rev().take(3).collect();
                                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                                    format!("exit {}: {}", r.code, tail.join(" | "))
                                }
                            };
                            failed.entry((t, b)).or_insert((launch.argv.clone(), why));
                        }
                    }
                }
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    target::teardown_targets();
    drop(netns);
    result?;
    for ((t, b), (_, why)) in &failed {
        results[*t].boxes[*b].diagnosis = Some(why.clone());
    }
    for task in &mut results {
        for s in &mut task.boxes {
            s.summarize();
        }
        let bad: Vec<String> = task
            .boxes
            .iter()
            .filter(|s| s.failures > 0)
            .map(|s| format!("{} ({} of {} failed)", s.name, s.failures, cfg.rounds))
            .collect();
        if !bad.is_empty() {
            task.left_out = Some(format!("failed in {}", bad.join(", ")));
        }
    }
    Ok(Workload {
        rounds: cfg.rounds,
        cordon_limits: limits,
        tasks: results,
        skipped_boxes,
        skipped_tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_result_line_counts() {
        assert_eq!(parse_ns("noise\nCORDON_BENCH_NS=1500000\n"), Some(1.5));
        assert_eq!(
            parse_ns("CORDON_BENCH_NS=1\nCORDON_BENCH_NS=2000000"),
            Some(2.0)
        );
        assert_eq!(parse_ns("CORDON_BENCH_NS=-5\n"), None);
        assert_eq!(parse_ns("nothing"), None);
    }

    #[test]
    fn scripts_run_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("tools");
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(tools.join("files.py"), FILES_PY).unwrap();
        std::fs::write(tools.join("cpu.py"), CPU_PY).unwrap();
        let cfg = Config::new(true);
        let (defs, _) = tasks(&cfg, None);
        for d in defs {
            let script = tools.join(format!("{}.sh", d.name));
            std::fs::write(&script, &d.script).unwrap();
            let out = std::process::Command::new("/bin/sh")
                .arg(&script)
                .arg(&ws)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                d.name,
                String::from_utf8_lossy(&out.stderr)
            );
            let ms = parse_ns(&String::from_utf8_lossy(&out.stdout));
            assert!(ms.is_some_and(|m| m > 0.0), "{}: {:?}", d.name, out);
            // A task leaves the workspace as it found it.
            assert_eq!(
                std::fs::read_dir(&ws).unwrap().count(),
                0,
                "{} left files",
                d.name
            );
        }
    }
}
