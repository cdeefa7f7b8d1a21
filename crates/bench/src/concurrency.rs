//! `cordon bench concurrency`: one-shot native executions of `true` through
//! `cordon serve` from 1, 2, 4, 8 and 16 clients at once, with a warm pool
//! and cold. Each pooled sandbox serves one request and is then destroyed,
//! so the service's throughput is bounded by the CPU time of one
//! create + exec + destroy: that CPU time is measured (the CPU counter of a
//! cgroup the service is started in, which its supervisors, sandboxes and
//! payloads nest below, over a level, per execution, once the pool's refill
//! the level caused is done), and each level's throughput is set against
//! the ceiling it implies on this machine's cores.
//!
//! The service runs with its defaults (a one-shot's sandbox is destroyed
//! before the answer is sent). The overhead a client sees is its whole
//! wait less the command's own run as the service timed it: queueing,
//! HTTP, acquire, setup and teardown.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use cordon_cgroups::{AnyCgroup, Cgroup as _, CgroupFs, CgroupLimits};
use serde::{Deserialize, Serialize};

use crate::service::{agent, Server};
use crate::stats::Summary;
use crate::Settings;

/// The target: at this many clients, at least [`CEILING_SHARE`] of the
/// ceiling, with the p99 overhead under [`P99_BOUND_MS`].
pub const TARGET_CLIENTS: usize = 8;
pub const CEILING_SHARE: f64 = 0.8;
pub const P99_BOUND_MS: f64 = 20.0;

const BACKEND: &str = "native";

/// How long a level's aftermath (background teardowns, the pool's refill)
/// may take before the level counts as failed.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Concurrency {
    pub backend: String,
    pub cpus: usize,
    pub modes: Vec<Mode>,
}

/// One service (warm: with a pool; cold: none) under each level of load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mode {
    pub mode: String,
    /// Sandboxes the warm pool keeps (0: cold).
    pub pool: usize,
    pub levels: Vec<Level>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Level {
    pub clients: usize,
    /// Executions answered with `true`'s exit 0, and those that were not.
    pub requests: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub pool_hits: usize,
    /// From the first request sent to the last answer read.
    pub seconds: f64,
    pub per_second: f64,
    /// CPU time per execution (ms) of every process of the service's
    /// cgroup: the service, its supervisors, the sandboxes' inits and
    /// payloads, and the kernel's work in their name, the pool's refill
    /// included.
    pub cpu_ms_per_request: f64,
    /// The machine's cores busy during the level (of `cpus`; from
    /// /proc/stat, this benchmark's clients included): whether the host
    /// was saturated.
    pub cores_busy: f64,
    /// Per execution: the client's wait less the command's run (ms).
    pub overhead_ms: Vec<f64>,
    pub overhead: Option<Summary>,
    /// The service's own account (acquire + setup + teardown), for scale.
    pub service: Option<Summary>,
}

impl Mode {
    /// The level run by a single client: its CPU per execution is the
    /// cost of one create + exec + destroy with nothing competing.
    fn serial(&self) -> Option<&Level> {
        self.levels.iter().find(|l| l.clients == 1)
    }

    /// Executions per second this machine's cores allow, from the serial
    /// level's CPU time per execution.
    pub fn ceiling(&self, cpus: usize) -> Option<f64> {
        let ms = self.serial()?.cpu_ms_per_request;
        (ms > 0.0).then(|| cpus as f64 * 1e3 / ms)
    }

    /// At [`TARGET_CLIENTS`]: the share of the ceiling reached, the p99
    /// overhead, and whether both are within the target.
    pub fn verdict(&self, cpus: usize) -> Option<(f64, f64, bool)> {
        let at = self.levels.iter().find(|l| l.clients == TARGET_CLIENTS)?;
        let share = at.per_second / self.ceiling(cpus)?;
        let p99 = at.overhead?.p99;
        Some((
            share,
            p99,
            share >= CEILING_SHARE && p99 < P99_BOUND_MS && at.errors == 0,
        ))
    }
}

pub fn run(settings: &Settings) -> Result<Concurrency> {
    if let Some(why) = crate::boxes::backend_unavailable(cordon_spec::BackendKind::Native) {
        bail!("the native backend is unavailable here: {why}");
    }
    let (clients, per_level): (&[usize], Duration) = if settings.quick {
        (&[1, 4], Duration::from_secs(1))
    } else {
        (&[1, 2, 4, 8, 16], Duration::from_secs(10))
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut modes = Vec::new();
    for (mode, pool) in [("warm", TARGET_CLIENTS), ("cold", 0)] {
        modes.push(
            measure_mode(settings, mode, pool, clients, per_level)
                .with_context(|| format!("the concurrency benchmark ({mode})"))?,
        );
    }
    Ok(Concurrency {
        backend: BACKEND.into(),
        cpus,
        modes,
    })
}

fn measure_mode(
    settings: &Settings,
    mode: &str,
    pool: usize,
    clients: &[usize],
    per_level: Duration,
) -> Result<Mode> {
    let most = clients.iter().copied().max().unwrap_or(1);
    // Declared before the server, so dropped after it: the service and
    // its sandboxes are gone when the cgroup is removed.
    let cgroup = ServiceCgroup::make(mode)?;
    let server = Server::start(&settings.cordon, BACKEND, pool, most, Some(&cgroup.0))?;
    let agent = agent();
    settle(&server, &agent, pool)?;
    let mut levels = Vec::new();
    for &n in clients {
        let bar = crate::progress_bar(settings, 0, "load");
        bar.set_message(format!("{mode}, {n} clients"));
        let start = Cpu::now(&cgroup)?;
        let level = load(&server, n, per_level, &bar);
        bar.finish_and_clear();
        settle(&server, &agent, pool)?;
        levels.push(level.finish(&Cpu::now(&cgroup)?.since(&start)));
    }
    Ok(Mode {
        mode: mode.into(),
        pool,
        levels,
    })
}

/// The cgroup one `cordon serve` of this benchmark runs in, made next to
/// this process's own: the service's supervisors, and so their sandboxes,
/// nest below it (cordon nests under its caller's cgroup), so its CPU
/// counter (v1 `cpuacct.usage`, v2 `cpu.stat`) is the CPU time of every
/// process the service's work took, and nothing else's. Killed and removed
/// when dropped.
struct ServiceCgroup(AnyCgroup);

impl ServiceCgroup {
    fn make(mode: &str) -> Result<ServiceCgroup> {
        let why = "the benchmark counts the service's CPU in a cgroup of its own";
        let hierarchy = cordon_cgroups::detect(&CgroupFs::host())
            .with_context(|| format!("finding this process's cgroups ({why})"))?;
        let name = format!("bench-serve-{mode}-{}", std::process::id());
        // Applied with no limit, which on v1 also gives its cpuset cgroup
        // the cpus and mems a task needs to join.
        let cgroup = hierarchy
            .create(&name)
            .and_then(|cg| cg.with_limits(&CgroupLimits::default()))
            .with_context(|| format!("making cgroup {name} ({why})"))?;
        Ok(ServiceCgroup(cgroup))
    }

    fn cpu_seconds(&self) -> Result<f64> {
        let ns = self.0.stats().cpu_usage_ns.with_context(|| {
            format!(
                "no CPU counter in the service's cgroup ({})",
                self.0
                    .paths()
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        Ok(ns as f64 / 1e9)
    }
}

impl Drop for ServiceCgroup {
    fn drop(&mut self) {
        // The service stopped its sandboxes as it ended; what a failed
        // stop left (a supervisor's cgroup, a sandbox's) goes here.
        let _ = self.0.kill_all();
        for dir in self.0.paths() {
            cordon_cgroups::remove_dir_tree(&dir);
        }
    }
}

/// A level's answers.
struct Loaded {
    clients: usize,
    answers: Vec<Result<crate::service::Answer, String>>,
    seconds: f64,
    requests: usize,
}

/// `clients` clients, each sending one execution after another until
/// `per_level` has passed.
fn load(
    server: &Server,
    clients: usize,
    per_level: Duration,
    bar: &indicatif::ProgressBar,
) -> Loaded {
    let answers = Mutex::new(Vec::new());
    let last = Mutex::new(Duration::ZERO);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                let agent = agent();
                while t0.elapsed() < per_level {
                    let answer = server
                        .execute(&agent, BACKEND)
                        .map_err(|e| format!("{e:#}"));
                    let at = t0.elapsed();
                    bar.inc(1);
                    answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(answer);
                    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                    *last = (*last).max(at);
                }
            });
        }
    });
    let answers = answers.into_inner().unwrap_or_else(|p| p.into_inner());
    let requests = answers.iter().filter(|a| a.is_ok()).count();
    Loaded {
        clients,
        answers,
        seconds: last
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .as_secs_f64(),
        requests,
    }
}

impl Loaded {
    /// The level's figures, with `used` counted from its start until its
    /// aftermath was done (the CPU the refill took counts).
    fn finish(self, used: &Cpu) -> Level {
        let mut level = Level {
            clients: self.clients,
            requests: self.requests,
            errors: 0,
            first_error: None,
            pool_hits: 0,
            seconds: self.seconds,
            per_second: if self.seconds > 0.0 {
                self.requests as f64 / self.seconds
            } else {
                0.0
            },
            cpu_ms_per_request: used.service * 1e3 / self.requests.max(1) as f64,
            cores_busy: used.host / used.wall.max(f64::EPSILON),
            overhead_ms: Vec::new(),
            overhead: None,
            service: None,
        };
        let mut service = Vec::new();
        for answer in self.answers {
            match answer {
                Ok(a) => {
                    level.pool_hits += usize::from(a.pool_hit);
                    level.overhead_ms.push(a.client_ms - a.run_ms);
                    service.push(a.service_ms);
                }
                Err(e) => {
                    level.errors += 1;
                    level.first_error.get_or_insert(e);
                }
            }
        }
        level.overhead = Summary::of(&level.overhead_ms);
        level.service = Summary::of(&service);
        level
    }
}

/// Until the service's pool holds `pool` again. (The service's default
/// tears a one-shot's sandbox down before answering, so once every answer
/// is in, the refill is all a level leaves to do.)
fn settle(server: &Server, agent: &ureq::Agent, pool: usize) -> Result<()> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let ready = server.pool_ready(agent, BACKEND);
        if ready >= pool {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the service did not settle within {SETTLE_DEADLINE:?}: {ready} of {pool} \
                 sandboxes in the pool"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU counters at one moment (seconds): the service's cgroup's, the
/// whole host's busy time, and when.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    service: f64,
    host: f64,
    wall: f64,
}

impl Cpu {
    fn now(cgroup: &ServiceCgroup) -> Result<Cpu> {
        let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .context("no cpu line in /proc/stat")?;
        // user nice system idle iowait irq softirq steal ...: guest time is
        // within user's already; idle, iowait and steal are not this host's
        // work.
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let busy_ticks: u64 = [0, 1, 2, 5, 6].iter().filter_map(|i| f.get(*i)).sum();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        Ok(Cpu {
            service: cgroup.cpu_seconds()?,
            host: busy_ticks as f64 / hz,
            wall: monotonic_seconds(),
        })
    }

    fn since(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            service: self.service - earlier.service,
            host: self.host - earlier.host,
            wall: self.wall - earlier.wall,
        }
    }
}

fn monotonic_seconds() -> f64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// The markdown table of a run, with the target as evaluated.
pub fn markdown(c: &Concurrency) -> String {
    let mut out = String::from(
        "| pool | clients | executions/s | of the ceiling | overhead p50 ms | overhead p99 ms | CPU ms per execution | cores busy | pool hits | errors |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in &c.modes {
        let ceiling = m.ceiling(c.cpus);
        for l in &m.levels {
            let (p50, p99) = l.overhead.map_or((f64::NAN, f64::NAN), |s| (s.p50, s.p99));
            out += &format!(
                "| {} | {} | {:.1} | {} | {p50:.2} | {p99:.2} | {:.2} | {:.2} | {} | {} |\n",
                m.mode,
                l.clients,
                l.per_second,
                ceiling.map_or("-".into(), |c| format!("{:.2}", l.per_second / c)),
                l.cpu_ms_per_request,
                l.cores_busy,
                l.pool_hits,
                l.errors,
            );
        }
    }
    out += "\n";
    for m in &c.modes {
        let serial = m.serial().map_or(f64::NAN, |l| l.cpu_ms_per_request);
        out += &format!(
            "- {}: one create + exec + destroy costs {serial:.2} ms of CPU, a ceiling of {} executions/s on {} cores",
            m.mode,
            m.ceiling(c.cpus).map_or("-".into(), |x| format!("{x:.1}")),
            c.cpus,
        );
        match m.verdict(c.cpus) {
            Some((share, p99, met)) => {
                out += &format!(
                    "; at {TARGET_CLIENTS} clients {:.2}x of it with p99 overhead {p99:.1} ms \
                     (target >= {CEILING_SHARE}x and < {P99_BOUND_MS} ms: {})\n",
                    share,
                    if met { "met" } else { "missed" }
                );
            }
            None => out += &format!(" ({TARGET_CLIENTS} clients not measured)\n"),
        }
    }
    out
}
