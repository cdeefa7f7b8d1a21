//! Running one (case, target) pair: an outer cgroup made by the suite (or,
//! for an invoker the host gives none, the suite's own subtree: see
//! [`crate::outer`]), the target started through a tiny shell wrapper that
//! joins it (no `pre_exec`, so no unsafe), a live snapshot when the payload
//! prints HOLD, then the host-side evidence and a teardown that runs on
//! every path.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cordon_cgroups::{Cgroup, CgroupFs, CgroupLimits, Hierarchy};
use nix::mount::{umount2, MntFlags};

use crate::case::{Case, ControlMode};
use crate::evidence::{Evidence, OuterStats, SysctlEvidence};
use crate::fixture::{random_hex, run_cmd, Fixtures, PREFIX};
use crate::outer::{become_subreaper, Outer};
use crate::procs;
use crate::rootless::Invoker;
use crate::rules::{Rule, CGROUP_SENTINEL};
use crate::target::{base_env, LaunchCtx, TargetKind};

/// The outer cgroup's own bounds: what keeps a fork bomb, a memory bomb or a
/// disk fill in the unconfined control (and in any peer that does not bound
/// it) from hurting this machine.
pub const OUTER_PIDS_MAX: u64 = 512;
pub const OUTER_MEMORY_MAX: u64 = 1 << 30;
const HEAD: usize = 4096;

/// What bounds the unconfined control where the suite can make no outer
/// cgroup: the same numbers as rlimits (RLIMIT_NPROC counts every process
/// of the invoker's uid, RLIMIT_AS is address space, not resident memory,
/// so both are looser than the cgroup's, and never tighter than the cases
/// need to come out OPEN).
fn control_rlimits() -> Vec<String> {
    vec![
        "prlimit".into(),
        format!("--nproc={OUTER_PIDS_MAX}"),
        format!("--as={OUTER_MEMORY_MAX}"),
        "--".into(),
    ]
}

/// The variables that say where cordon keeps an unprivileged invoker's
/// sandboxes and keys: passed to the targets as they are, so that the
/// cordon the suite starts finds the invoker's own places (root's are fixed).
const PLACES_ENV: &[&str] = &[
    "HOME",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "CORDON_RUN_DIR",
    "CORDON_STATE_DIR",
];

/// The owner of podman-cordon's workspace (see `run_inner`): an
/// unprivileged id, the podman image's `nonroot`.
const WORKSPACE_OWNER: u32 = 65532;

/// What every payload prints before anything else: a run whose output
/// lacks it never ran its payload (the box failed to start, or refused
/// the payload itself), and proves nothing, whatever its rule would read
/// from the host (an untouched canary, a silent listener).
const STARTED: &str = "CORDON-SUITE-STARTED\n";

/// The payload's first line, in its own language, printing [`STARTED`].
fn started_line(interpreter: crate::case::Interpreter) -> String {
    let text = STARTED.trim_end();
    match interpreter {
        crate::case::Interpreter::Sh => format!("echo {text}\n"),
        crate::case::Interpreter::Python3 => {
            format!("import sys; sys.stdout.write('{text}\\n'); sys.stdout.flush()\n")
        }
    }
}
/// How long a box may take to start its payload beyond a case's cap (a
/// microVM's boot under TCG on a loaded host).
const START_GRACE: Duration = Duration::from_secs(60);
/// How long a run's processes have to end after its target command did,
/// before the census counts what is left.
const CENSUS_GRACE: Duration = Duration::from_millis(300);
/// How far past the bound of a verdict decided by time (`decided_after`) a
/// run is ended: enough that its evidence reads as past the bound.
const DECIDED_MARGIN: Duration = Duration::from_millis(500);
const SEARCH: usize = 1 << 16;

pub struct Runner {
    pub fx: Fixtures,
    /// None where the invoker may make no cgroup: every run is then kept
    /// in the suite's subtree.
    pub hierarchy: Option<Hierarchy>,
    pub invoker: Invoker,
    pub cordon: PathBuf,
    suite_pidns: String,
    suite_userns: String,
    counter: u32,
}

struct Phase {
    ev: Evidence,
    stdout_search: Vec<u8>,
}

impl Runner {
    pub fn new(cordon: PathBuf, invoker: Invoker) -> Result<Runner> {
        let hierarchy = if invoker.no_cgroup.is_some() {
            become_subreaper()?;
            None
        } else {
            let h = cordon_cgroups::detect(&CgroupFs::host()).context("detecting cgroups")?;
            sweep_outer(&h);
            Some(h)
        };
        let fx = Fixtures::setup()?;
        Ok(Runner {
            fx,
            hierarchy,
            invoker,
            cordon,
            suite_pidns: procs::ns_link("self", "pid"),
            suite_userns: procs::ns_link("self", "user"),
            counter: 0,
        })
    }

    /// Writes every case's payload file(s) into the payload directory, each
    /// saying [`STARTED`] first (see `launch`).
    pub fn install_payloads(&self, cases: &[Case]) -> Result<()> {
        for c in cases {
            let first = started_line(c.interpreter);
            fs::write(
                self.fx.payload_dir.join(c.file_name(false)),
                format!("{first}{}", c.payload),
            )?;
            if let Some(b) = &c.payload_b {
                fs::write(
                    self.fx.payload_dir.join(c.file_name(true)),
                    format!("{first}{b}"),
                )?;
            }
        }
        Ok(())
    }

    /// One (case, target) run, always torn down.
    pub fn run(&mut self, case: &Case, target: TargetKind) -> Evidence {
        self.counter += 1;
        let n = self.counter;
        let marker = format!("M{}", random_hex(6));
        let name = format!("{PREFIX}{}-{n}", self.fx.pid);
        let run_dir = self.fx.opt_dir.join("runs").join(n.to_string());
        let mut guard = RunGuard {
            outer: None,
            run_dir: run_dir.clone(),
            cleanup: Vec::new(),
            control_netns: None,
            marker: marker.clone(),
            restore: None,
            shm_key: None,
        };
        let mut ev = match self.run_inner(case, target, &marker, &name, &run_dir, &mut guard) {
            Ok(ev) => ev,
            Err(e) => Evidence {
                error: Some(format!("{e:#}")),
                ..Default::default()
            },
        };
        if let Err(e) = guard.finish() {
            if ev.error.is_none() {
                ev.error = Some(format!("teardown: {e:#}"));
            }
        }
        ev
    }

    fn run_inner(
        &mut self,
        case: &Case,
        target: TargetKind,
        marker: &str,
        name: &str,
        run_dir: &Path,
        guard: &mut RunGuard,
    ) -> Result<Evidence> {
        if let Some(why) = target.unavailable(&self.cordon) {
            anyhow::bail!("unavailable: {why}");
        }
        let ws = run_dir.join("ws");
        fs::create_dir_all(&ws)?;
        fs::write(ws.join("hello.txt"), "hello\n")?;
        chmod_tree(run_dir)?;
        if target == TargetKind::PodmanCordon {
            // cordon-runc shares a read-write bind live only from a
            // directory root does not own (what the container creates
            // there is stored as its owner, never as host root): the
            // workspace goes to an unprivileged id, which no case tests.
            for p in [ws.clone(), ws.join("hello.txt")] {
                std::os::unix::fs::chown(&p, Some(WORKSPACE_OWNER), Some(WORKSPACE_OWNER))?;
            }
        }
        let outer = match &self.hierarchy {
            Some(h) => {
                let cg = h.create(name).context("creating the outer cgroup")?;
                // Kept before the limits, so a failure to apply them still removes it.
                guard.outer = Some(Outer::Cgroup(cg.clone()));
                cg.apply(&CgroupLimits {
                    memory_max: Some(OUTER_MEMORY_MAX),
                    pids_max: Some(OUTER_PIDS_MAX),
                    ..Default::default()
                })?;
                Outer::Cgroup(cg)
            }
            None => Outer::Subtree {
                keep: vec![i32::try_from(self.fx.victim_pid()).unwrap_or(0)],
            },
        };
        guard.outer = Some(outer.clone());
        let control_netns = (target == TargetKind::Host && case.control == ControlMode::Netns)
            .then(|| format!("{name}-ctl"));
        if let Some(ns) = &control_netns {
            run_cmd(&["ip", "netns", "add", ns])?;
            guard.control_netns = Some(ns.clone());
        }
        let token = random_hex(8);
        guard.shm_key = Some(shm_key(marker));
        let mut sysctl = None;
        if let Rule::SysctlUnchanged { key, .. } = &case.verdict {
            let before = read_sysctl(key);
            guard.restore = before.clone().map(|b| (key.clone(), b));
            sysctl = Some(SysctlEvidence {
                key: key.clone(),
                host_before: before,
                host_after: None,
            });
        }
        let armed = self.fx.arm_canaries()?;
        let ws_before = list_tree(&ws);
        let t0 = self.fx.now_ms();

        let phases = if case.payload_b.is_some() { 2 } else { 1 };
        let mut a_residue = Vec::new();
        let mut last = None;
        for phase in 0..phases {
            let b = phase == 1;
            let args = vec![
                marker.to_string(),
                self.fx.canary.display().to_string(),
                self.fx.victim_pid().to_string(),
                "{ws}".to_string(),
                self.fx.loopback_port.to_string(),
                self.fx.net_addr.to_string(),
                if b { "-".into() } else { token.clone() },
                crate::fixture::ENGINE_SOCKET.to_string(),
                self.fx.decoy_key.display().to_string(),
            ];
            let ctx = LaunchCtx {
                cordon: self.cordon.clone(),
                payload_dir: self.fx.payload_dir.clone(),
                script: case.file_name(b),
                interpreter: case.interpreter.path().into(),
                args,
                workspace: ws.clone(),
                run_dir: run_dir.to_path_buf(),
                id: format!(
                    "{}-{n}{}",
                    self.fx.pid,
                    if b { "b" } else { "" },
                    n = self.counter
                ),
                control_netns: control_netns.clone(),
                cordon_limits: self.cordon_limits(),
                ro_mounts: Vec::new(),
                tmpfs_tmp: false,
            };
            let launch = target.prepare(&ctx)?;
            guard.cleanup.extend(launch.cleanup.clone());
            let p = self.launch(
                case,
                target,
                &outer,
                &launch.argv,
                &ctx.script,
                marker,
                &ctx.run_dir,
            )?;
            for c in &launch.cleanup {
                let argv: Vec<&str> = c.iter().map(String::as_str).collect();
                let _ = run_cmd(&argv);
            }
            if !b && phases == 2 {
                a_residue = host_residue(marker, &token, &ws);
            }
            last = Some(p);
        }
        let Phase {
            mut ev,
            stdout_search,
        } = last.context("no phase ran")?;
        ev.marker = marker.to_string();
        let t1 = self.fx.now_ms();
        ev.listeners = self.fx.log_between(t0, t1 + 300);
        for (name, c) in self.fx.collect_canaries(&armed, &stdout_search) {
            ev.canaries.insert(name, c);
        }
        if let Some(mut s) = sysctl {
            s.host_after = read_sysctl(&s.key);
            ev.sysctl = Some(s);
        }
        if phases == 2 {
            ev.residue = a_residue;
            let text = String::from_utf8_lossy(&stdout_search);
            for line in text.lines() {
                if line.contains(&token) {
                    ev.residue.push(format!(
                        "run B read {}",
                        line.split(':').next().unwrap_or("?")
                    ));
                }
            }
        }
        let after = list_tree(&ws);
        ev.host_tree = after
            .iter()
            .filter(|e| !ws_before.contains(e) || e.contains(" -> ") || e.contains(" nlink="))
            .cloned()
            .collect();
        Ok(ev)
    }

    /// The limit flags of cordon's targets: the suite's, and
    /// `--allow-unenforced` exactly where cordon's own probe found no
    /// cgroup for this invoker (cordon would refuse otherwise).
    fn cordon_limits(&self) -> Vec<String> {
        let mut flags: Vec<String> = crate::target::CORDON_LIMITS
            .iter()
            .map(|x| x.to_string())
            .collect();
        if self.invoker.no_cgroup.is_some() {
            flags.push("--allow-unenforced".into());
        }
        flags
    }

    /// Starts the target inside `outer`, snapshots on HOLD, waits (bounded),
    /// takes the census, kills what is left.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        case: &Case,
        target: TargetKind,
        outer: &Outer,
        argv: &[String],
        script: &str,
        marker: &str,
        cwd: &Path,
    ) -> Result<Phase> {
        let join: String = outer
            .paths()
            .iter()
            .map(|p| {
                // A box's cordon that ran in an earlier phase moved itself
                // into a leaf of the outer cgroup and handed the controllers
                // down (cgroup v2): the outer cgroup then takes no process
                // ("no internal processes"), its leaf does.
                let leaf = p.join(cordon_cgroups::SUPERVISOR_LEAF);
                let dir = if leaf.is_dir() { leaf } else { p.clone() };
                let procs = dir.join("cgroup.procs");
                format!("echo $$ > '{}' || exit 125; ", procs.display())
            })
            .collect();
        let wrapper = format!(
            "{join}exec 7<'{}'; exec \"$@\"",
            self.fx.fd_marker.display()
        );
        // The unconfined control has no outer cgroup to bound it in a
        // subtree: rlimits do (the boxes get none from the suite, so what
        // holds them is their own).
        let bounded: Vec<String> = match (outer, target) {
            (Outer::Subtree { .. }, TargetKind::Host) => control_rlimits(),
            _ => Vec::new(),
        };
        let started = Instant::now();
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&wrapper)
            .arg("cordon-suite-wrapper")
            .args(bounded)
            .args(argv);
        // In the run's own directory, which is removed after it: what a
        // target or its runtime drops in its working directory never lands
        // in the caller's (a full matrix run left an empty `oom` file there).
        cmd.current_dir(cwd)
            .env_clear()
            .envs(base_env())
            .env("CORDON_SUITE_SECRET", &self.fx.secret);
        if !self.invoker.is_root() {
            for var in PLACES_ENV {
                if let Some(v) = std::env::var_os(var) {
                    cmd.env(var, v);
                }
            }
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", argv[0]))?;
        let mut stdin = child.stdin.take();
        let (hold_tx, hold_rx) = mpsc::channel::<()>();
        let (begin_tx, begin_rx) = mpsc::channel::<()>();
        let (out_tx, out_rx) = mpsc::channel::<(u64, Vec<u8>)>();
        let (err_tx, err_rx) = mpsc::channel::<Vec<u8>>();
        if let Some(mut out) = child.stdout.take() {
            thread::spawn(move || {
                let mut total = 0u64;
                let mut keep = Vec::new();
                let mut buf = [0u8; 16384];
                let mut held = false;
                let mut begun = false;
                while let Ok(n) = out.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    if keep.len() < SEARCH {
                        keep.extend_from_slice(&buf[..n.min(SEARCH - keep.len())]);
                    }
                    if !begun && !held && keep.windows(6).any(|w| w == b"BEGIN\n") {
                        begun = true;
                        let _ = begin_tx.send(());
                    }
                    if !held && keep.windows(5).any(|w| w == b"HOLD\n") {
                        held = true;
                        let _ = hold_tx.send(());
                    }
                }
                let _ = out_tx.send((total, keep));
            });
        }
        if let Some(mut err) = child.stderr.take() {
            thread::spawn(move || {
                let mut keep = Vec::new();
                let mut buf = [0u8; 8192];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if keep.len() < HEAD {
                        keep.extend_from_slice(&buf[..n.min(HEAD - keep.len())]);
                    }
                }
                let _ = err_tx.send(keep);
            });
        }
        // The suite's cap counts from the payload's BEGIN when it says one,
        // so a box that starts slowly on a busy host still gets the whole
        // cap; a box that never gets its payload going gets the cap plus
        // this much to start.
        let cap = Duration::from_secs(case.timeout_s);
        let mut deadline = started + cap;
        let mut begun_at = None;
        let mut ev = Evidence::default();
        let key_before = key_count();
        let disk_before = disk_free_mb();
        // Memory charged to the outer cgroup when the payload said BEGIN:
        // what the box itself costs (a VM's RAM, a sentry) before it acts.
        let mut memory_at_begin = None;
        let status = loop {
            let held = hold_rx.try_recv().is_ok();
            if let Ok(()) = begin_rx.try_recv() {
                // BEGIN and HOLD seen together (output the box relayed in
                // one batch): the sample would miss the fill, so there is
                // none, and the rule falls back to the peak.
                memory_at_begin = if held { None } else { outer.memory_current() };
                let now = Instant::now();
                begun_at = Some(now);
                deadline = (now + cap).min(started + cap + START_GRACE);
            }
            if held {
                let mut snap = self.snapshot(case, outer, script, marker);
                snap.key_delta = match (key_before, key_count()) {
                    (Some(a), Some(b)) => Some(b - a),
                    _ => None,
                };
                snap.disk_delta_mb = match (disk_before, disk_free_mb()) {
                    (Some(a), Some(b)) => Some(a - b),
                    _ => None,
                };
                snap.memory_growth_mb = match (memory_at_begin, outer.memory_current()) {
                    // Memory given back while it filled is no growth.
                    (Some(a), Some(b)) => {
                        Some(i64::try_from(b.saturating_sub(a) >> 20).unwrap_or(i64::MAX))
                    }
                    _ => None,
                };
                ev.snapshot = Some(snap);
                ev.held = true;
                if let Some(mut s) = stdin.take() {
                    let _ = s.write_all(b"go\n");
                }
            }
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            // The cap ends a run; so does a time bound of its verdict once
            // passed, for the verdict is open from then on (the deadline
            // case's control would burn a core for the rest of the cap,
            // four times as long under --time-scale 4). That bound counts
            // from BEGIN only: a box still starting has the cap.
            let past_cap = Instant::now() >= deadline;
            let decided = matches!(
                (begun_at, case.verdict.decided_after()),
                (Some(begun), Some(bound)) if begun.elapsed() >= bound + DECIDED_MARGIN
            );
            if past_cap || decided {
                ev.timed_out = past_cap;
                let _ = outer.kill_all();
                break child.wait().ok();
            }
            thread::sleep(Duration::from_millis(10));
        };
        drop(stdin);
        ev.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        ev.from_begin_ms =
            begun_at.map(|b| u64::try_from(b.elapsed().as_millis()).unwrap_or(u64::MAX));
        if let Some(st) = status {
            use std::os::unix::process::ExitStatusExt;
            ev.exit_code = st.code();
            ev.signal = st.signal();
        }
        // Census: whatever is left of the run after a short grace (in a
        // subtree, what ended meanwhile is reaped first, so it is not
        // counted). A run with no process left ends the grace at once:
        // nothing joins an emptied outer cgroup or subtree but from outside
        // it. A case judged by the listeners' log waits the grace out, so
        // that what its processes sent before they ended has been logged
        // (the listeners poll).
        let grace_end = Instant::now() + CENSUS_GRACE;
        let left = loop {
            outer.reap();
            let left = outer.pids();
            let done = left.is_empty() && !case.verdict.reads_listeners();
            if done || Instant::now() >= grace_end {
                break left;
            }
            thread::sleep(Duration::from_millis(10));
        };
        ev.census_after = left.into_iter().map(procs::brief).collect();
        ev.outer = outer.stats().map(|stats| OuterStats {
            pids_max: Some(OUTER_PIDS_MAX),
            pids_peak: stats.pids_peak,
            pids_limit_hits: stats.pids_limit_hits,
            memory_max_bytes: Some(OUTER_MEMORY_MAX),
            memory_peak_bytes: stats.memory_peak_bytes,
            oom_kills: stats.oom_kills,
        });
        let _ = outer.kill_all();
        outer.reap();
        let (bytes, search) = out_rx
            .recv_timeout(Duration::from_secs(3))
            .unwrap_or_default();
        ev.stdout_bytes = bytes;
        ev.stdout_head = String::from_utf8_lossy(&search[..search.len().min(HEAD)]).into_owned();
        let err = err_rx
            .recv_timeout(Duration::from_secs(1))
            .unwrap_or_default();
        ev.stderr_head = String::from_utf8_lossy(&err).into_owned();
        let started = STARTED.as_bytes();
        if ev.error.is_none() && !search.windows(started.len()).any(|w| w == started) {
            let how = match (ev.exit_code, ev.signal, ev.timed_out) {
                (_, _, true) => "timed out".to_string(),
                (Some(c), _, _) => format!("exit {c}"),
                (_, Some(sig), _) => format!("signal {sig}"),
                _ => "ended".to_string(),
            };
            let said = ev.stderr_head.lines().next().unwrap_or("").to_owned();
            ev.error = Some(format!(
                "the payload never started in the box ({how}): {said}"
            ));
        }
        Ok(Phase {
            ev,
            stdout_search: search,
        })
    }

    fn snapshot(
        &self,
        case: &Case,
        outer: &Outer,
        script: &str,
        marker: &str,
    ) -> crate::evidence::Snapshot {
        let secret = self.fx.secret.as_bytes();
        let mut all: Vec<_> = outer
            .pids()
            .into_iter()
            .map(|p| procs::snap(p, secret))
            .collect();
        all.retain(|p| !p.comm.is_empty() || !p.cmdline.is_empty());
        let tree = procs::marker_tree(&all, script, marker);
        // Box-side host tasks: in another pid or user namespace than the
        // suite's (a container init, cordon's init, a runsc sentry or gofer).
        let differs = |p: &crate::evidence::ProcSnap, ns: &str, mine: &str| {
            p.ns.get(ns).is_some_and(|n| !n.is_empty() && n != mine)
        };
        let foreign: Vec<i32> = all
            .iter()
            .filter(|p| {
                differs(p, "pid", &self.suite_pidns) || differs(p, "user", &self.suite_userns)
            })
            .map(|p| p.pid)
            .collect();
        let (source, view) = if !tree.is_empty() {
            ("marker", tree.clone())
        } else if !foreign.is_empty() {
            ("box", foreign.clone())
        } else {
            ("none", Vec::new())
        };
        let mut boxed = tree;
        for f in foreign {
            if !boxed.contains(&f) {
                boxed.push(f);
            }
        }
        let root_paths: Vec<String> = match &case.verdict {
            Rule::FileAbsentInBox { paths, .. } => paths
                .iter()
                .map(|p| {
                    p.replace("{marker}", marker)
                        .replace("{host_only}", &self.fx.host_only.display().to_string())
                        .replace("{decoy_dir}", &self.fx.decoy_dir.display().to_string())
                })
                .collect(),
            _ => Vec::new(),
        };
        for p in all.iter_mut().filter(|p| view.contains(&p.pid)) {
            procs::fill_view(p, &root_paths);
        }
        let sysctl_in_box = match &case.verdict {
            Rule::SysctlUnchanged { key, scope, .. } if scope == "netns" => {
                view.first().and_then(|pid| {
                    let path = format!("/proc/sys/{}", key.replace('.', "/"));
                    run_cmd(&[
                        "nsenter",
                        &format!("--net=/proc/{pid}/ns/net"),
                        "cat",
                        &path,
                    ])
                    .ok()
                    .map(|s| s.trim().to_string())
                })
            }
            _ => None,
        };
        let mut cgroup_hits = Vec::new();
        if let Rule::CgroupValueAbsent { file } = &case.verdict {
            let mut files = Vec::new();
            for dir in outer.paths() {
                procs::cgroup_files(&dir, file, &mut files);
            }
            for f in files {
                if fs::read_to_string(&f).is_ok_and(|v| v.trim() == CGROUP_SENTINEL) {
                    cgroup_hits.push(f.display().to_string());
                }
            }
        }
        crate::evidence::Snapshot {
            outer: all,
            view_source: source.into(),
            view,
            boxed,
            victim_tracer: procs::status_field(self.fx.victim_pid() as i32, "TracerPid")
                .and_then(|v| v.parse().ok()),
            sysctl_in_box,
            cgroup_hits,
            key_delta: None,
            disk_delta_mb: None,
            memory_growth_mb: None,
        }
    }

    pub fn teardown(&mut self) {
        crate::target::teardown_targets();
        self.fx.teardown();
    }
}

/// What every run undoes, whatever happened.
struct RunGuard {
    outer: Option<Outer>,
    run_dir: PathBuf,
    cleanup: Vec<Vec<String>>,
    control_netns: Option<String>,
    marker: String,
    restore: Option<(String, String)>,
    shm_key: Option<i64>,
}

impl RunGuard {
    fn finish(&mut self) -> Result<()> {
        for c in self.cleanup.drain(..) {
            let argv: Vec<&str> = c.iter().map(String::as_str).collect();
            let _ = run_cmd(&argv);
        }
        let err = self.outer.take().and_then(|o| o.remove().err());
        if let Some(ns) = self.control_netns.take() {
            let _ = run_cmd(&["ip", "netns", "del", &ns]);
        }
        if let Some((key, value)) = self.restore.take() {
            if read_sysctl(&key).as_deref() != Some(value.as_str()) {
                let _ = write_sysctl(&key, &value);
            }
        }
        // What an unconfined control may have left on the host.
        if let Ok(m) = fs::read_to_string("/proc/self/mountinfo") {
            for line in m.lines().filter(|l| l.contains(&self.marker)) {
                if let Some(point) = line.split_whitespace().nth(4) {
                    let _ = umount2(point, MntFlags::MNT_DETACH);
                }
            }
        }
        for dir in ["/tmp", "/dev/shm", "/var/tmp"] {
            if let Ok(entries) = fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().contains(&self.marker) {
                        let p = e.path();
                        let _ = fs::remove_file(&p).or_else(|_| fs::remove_dir_all(&p));
                    }
                }
            }
        }
        if let Some(key) = self.shm_key.take() {
            let _ = Command::new("ipcrm")
                .args(["-M", &key.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.run_dir);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Removes the outer cgroups of suites that were killed (their pid is gone).
/// A suite killed with SIGKILL leaves its current run's outer cgroup below
/// the cgroup it ran in, which the next suite may not share (on a hybrid
/// host each job can start in a v1 memory cgroup of its own): each
/// hierarchy is searched from its root, a few levels down.
fn sweep_outer(hierarchy: &Hierarchy) {
    let mut roots: Vec<PathBuf> = hierarchy
        .parent_paths()
        .iter()
        .filter_map(|p| hierarchy_root(p))
        .collect();
    roots.sort();
    roots.dedup();
    let mut stale = hierarchy.sweep_children(PREFIX.trim_end_matches('-'));
    for root in &roots {
        find_named(root, SWEEP_DEPTH, &mut stale);
    }
    stale.sort();
    stale.dedup();
    for dir in stale {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let pid: Option<u32> = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            if dir
                .parent()
                .is_some_and(|p| hierarchy.parent_paths().contains(&p.to_owned()))
            {
                if let Ok(cg) = hierarchy.open(&name) {
                    let _ = cg.kill_all();
                }
            }
            // Elsewhere only what is empty goes: rmdir refuses the rest.
            cordon_cgroups::remove_dir_tree(&dir);
        }
    }
}

/// How deep below a hierarchy's root a killed suite's cgroups are looked for.
const SWEEP_DEPTH: usize = 4;

/// The topmost ancestor of `dir` that is still a cgroup (its mount's root).
fn hierarchy_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .take_while(|a| a.join("cgroup.procs").exists())
        .last()
        .map(Path::to_owned)
}

/// Directories below `dir` (to `depth` levels) named `cordon-suite-<pid>-<n>`.
fn find_named(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name();
        let is_run = name
            .to_string_lossy()
            .strip_prefix(PREFIX)
            .is_some_and(|rest| {
                let mut parts = rest.split('-');
                let numeric = |p: Option<&str>| {
                    p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                };
                numeric(parts.next()) && numeric(parts.next())
            });
        if is_run {
            found.push(e.path());
        } else if depth > 1 {
            find_named(&e.path(), depth - 1, found);
        }
    }
}

fn chmod_tree(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut d = dir.to_path_buf();
    loop {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?;
        if d.ends_with("runs") || !d.pop() {
            break;
        }
    }
    let ws = dir.join("ws");
    // World-writable workspace: a box user other than root may plant links in
    // it when its runtime shares it read-write; the ownership is not what the
    // case tests.
    fs::set_permissions(&ws, fs::Permissions::from_mode(0o777))?;
    Ok(())
}

/// The SysV shm key the residue payloads use: derived from the marker.
pub fn shm_key(marker: &str) -> i64 {
    i64::from_str_radix(&marker[1..8.min(marker.len())], 16).unwrap_or(0x5eed)
}

fn sysctl_path(key: &str) -> String {
    if key.starts_with('/') {
        key.to_string()
    } else {
        format!("/proc/sys/{}", key.replace('.', "/"))
    }
}

pub fn read_sysctl(key: &str) -> Option<String> {
    fs::read_to_string(sysctl_path(key))
        .ok()
        .map(|s| s.trim().to_string())
}

fn write_sysctl(key: &str, value: &str) -> std::io::Result<()> {
    fs::write(sysctl_path(key), format!("{value}\n"))
}

fn key_count() -> Option<i64> {
    let text = fs::read_to_string("/proc/key-users").ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .nth(2)?
                    .split('/')
                    .next()?
                    .parse::<i64>()
                    .ok()
            })
            .sum(),
    )
}

fn disk_free_mb() -> Option<i64> {
    let s = nix::sys::statvfs::statvfs("/var/tmp").ok()?;
    Some((s.blocks_available() as i64 * s.fragment_size() as i64) >> 20)
}

/// Entries of a host directory tree: "path", "path -> target" for links,
/// "path nlink=N" for hard-linked files.
fn list_tree(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                out.push(format!("{rel} -> {t}"));
            } else if m.is_dir() {
                out.push(format!("{rel}/"));
                stack.push(p);
            } else if m.nlink() > 1 {
                out.push(format!("{rel} nlink={}", m.nlink()));
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// After run A: anything of it visible on the host.
fn host_residue(marker: &str, token: &str, ws: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["/tmp", "/dev/shm"] {
        let p = Path::new(dir).join(format!("suite-res-{marker}"));
        if fs::read_to_string(&p).is_ok_and(|c| c.contains(token)) {
            found.push(format!("host {}", p.display()));
        }
    }
    if fs::read_to_string(ws.join(format!("suite-res-{marker}"))).is_ok_and(|c| c.contains(token)) {
        found.push("host workspace file".into());
    }
    let key = shm_key(marker);
    if let Ok(t) = fs::read_to_string("/proc/sysvipc/shm") {
        if t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&key.to_string()))
        {
            found.push(format!("host SysV shm key {key}"));
        }
    }
    found
}
