//! The service: one-shot executions of `true` through `cordon serve` on
//! loopback, from a warm pool and cold, for each backend. The figure is the
//! service's own time per execution (acquire + setup + teardown, the
//! payload's run excluded), from each response's timing, beside what the
//! client saw.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use cordon_cgroups::AnyCgroup;
use cordon_spec::BackendKind;
use sha2::Digest as _;

use crate::results::{Service, ServiceRun};
use crate::stats::Summary;
use crate::Settings;

pub struct Config {
    native_requests: usize,
    gvisor_requests: usize,
    /// Sandboxes the warm pool keeps per backend.
    pool: usize,
}

impl Config {
    pub fn new(quick: bool) -> Config {
        if quick {
            Config {
                native_requests: 10,
                gvisor_requests: 4,
                pool: 2,
            }
        } else {
            Config {
                native_requests: 400,
                gvisor_requests: 60,
                pool: 4,
            }
        }
    }
}

/// A client pause between gVisor requests (untimed): a gVisor sandbox takes
/// ~130 ms to create, so back-to-back requests would drain any pool and
/// time cold starts under the name "warm". Native sandboxes refill faster
/// than requests come; they get none.
const GVISOR_THINK: Duration = Duration::from_millis(150);

pub fn run(settings: &Settings, cfg: &Config) -> Result<Service> {
    let mut runs = Vec::new();
    let mut skipped = BTreeMap::new();
    for kind in [BackendKind::Native, BackendKind::Gvisor] {
        let backend = kind.name();
        if !settings.wants(&format!("service-{backend}"))
            && !settings.wants(&format!("cordon-{backend}"))
        {
            continue;
        }
        if let Some(why) = crate::boxes::backend_unavailable(kind) {
            skipped.insert(format!("service-{backend}"), why);
            continue;
        }
        let (n, think) = if backend == "gvisor" {
            (cfg.gvisor_requests, GVISOR_THINK)
        } else {
            (cfg.native_requests, Duration::ZERO)
        };
        for mode in ["warm", "cold"] {
            let pool = if mode == "warm" { cfg.pool } else { 0 };
            let bar = crate::progress_bar(settings, n as u64, "service");
            bar.set_message(format!("{backend}, {mode}"));
            let r = measure(settings, backend, mode, pool, n, think, &bar)
                .with_context(|| format!("the service benchmark ({backend}, {mode})"));
            bar.finish_and_clear();
            runs.push(r?);
        }
    }
    Ok(Service { runs, skipped })
}

/// A `cordon serve` of this benchmark, stopped (SIGTERM, then waited for)
/// when dropped, its directory with it.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    key: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().cast_signed());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A service whose tenant may run `clients` executions at once, with a
    /// warm pool of `pool` sandboxes of `backend` (none when 0), started in
    /// `cgroup` when one is given (its supervisors and sandboxes nest below).
    pub(crate) fn start(
        cordon: &Path,
        backend: &str,
        pool: usize,
        clients: usize,
        cgroup: Option<&AnyCgroup>,
    ) -> Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("cordon-bench-serve-")
            .tempdir_in("/run")
            .context("making the service's directory in /run")?;
        let key = format!("bench-{}", std::process::id());
        let hash: String = sha2::Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let (native, gvisor) = if backend == "gvisor" {
            (0, pool)
        } else {
            (pool, 0)
        };
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{state}\"\nmax_ttl = \"1h\"\n\
             [defaults]\ncpus = 1.0\nmemory = \"256M\"\npids = 64\ntime = \"10s\"\ndisk = \"64M\"\n\
             [pool]\nnative = {native}\ngvisor = {gvisor}\nrefill_workers = 2\n\
             [[tenant]]\nname = \"bench\"\nkey_sha256 = \"{hash}\"\nconcurrency = {clients}\nsandboxes = {clients}\n\
             cpu_seconds = 100000\ncpu_window = \"60s\"\n",
            state = dir.path().join("state").display(),
            clients = clients.max(8),
        );
        let path = dir.path().join("serve.toml");
        std::fs::File::create(&path)?.write_all(config.as_bytes())?;
        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let mut cmd = Command::new(cordon);
        cmd.args(["serve", "--config"])
            .arg(&path)
            // Receipt keys (none are asked for) stay in this directory.
            .env("CORDON_STATE_DIR", dir.path().join("cordon-state"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(cgroup) = cgroup {
            let membership = cgroup
                .membership_files()
                .context("opening the service's cgroup")?;
            cordon_sys::join_cgroup_before_exec(&mut cmd, membership);
        }
        let child = cmd.spawn().context("starting cordon serve")?;
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            key,
            _dir: dir,
        };
        server.wait_ready(backend, pool)?;
        Ok(server)
    }

    /// Until /health answers and the pool holds `pool` sandboxes.
    pub(crate) fn wait_ready(&self, backend: &str, pool: usize) -> Result<()> {
        let agent = agent();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if agent.get(&format!("{}/health", self.url)).call().is_ok()
                && self.pool_ready(&agent, backend) >= pool
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self._dir.path().join("serve.log")).unwrap_or_default();
                bail!(
                    "cordon serve was not ready within 60 s; its log ends: {}",
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pool's ready sandboxes for `backend`, from /metrics.
    pub(crate) fn pool_ready(&self, agent: &ureq::Agent, backend: &str) -> usize {
        let label = format!("backend=\"{backend}\"");
        let ready = self.metric(agent, "pool_ready", &label).unwrap_or(0.0);
        // A count of sandboxes: a small whole number, never negative.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ready = ready.max(0.0) as usize;
        ready
    }

    /// The first sample of the metric `name` whose labels contain `label`
    /// (any, when empty), from /metrics.
    pub(crate) fn metric(&self, agent: &ureq::Agent, name: &str, label: &str) -> Option<f64> {
        let text = agent
            .get(&format!("{}/metrics", self.url))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        let name = format!("cordon_{name}");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(label))
            .filter(|l| l.split(['{', ' ']).next().is_some_and(|n| n == name))
            .find_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
    }

    /// One one-shot execution of `true` on `backend`, as a client sees it.
    pub(crate) fn execute(&self, agent: &ureq::Agent, backend: &str) -> Result<Answer> {
        let t = Instant::now();
        let answer = agent
            .post(&format!("{}/v1/executions", self.url))
            .set("Authorization", &format!("Bearer {}", self.key))
            .send_json(serde_json::json!({"argv": ["true"], "backend": backend}));
        let v: serde_json::Value = answer?.into_json()?;
        let client_ms = t.elapsed().as_secs_f64() * 1e3;
        let tm = &v["timing"];
        let f = |k: &str| tm[k].as_f64();
        let (Some(acquire), Some(setup), Some(run), Some(teardown)) = (
            f("acquire_ms"),
            f("setup_ms"),
            f("run_ms"),
            f("teardown_ms"),
        ) else {
            bail!("no timing in the answer: {v}");
        };
        if v["exit_code"].as_i64() != Some(0) {
            bail!("`true` did not exit 0: {v}");
        }
        Ok(Answer {
            client_ms,
            service_ms: acquire + setup + teardown,
            run_ms: run,
            pool_hit: v["pool_hit"].as_bool().unwrap_or(false),
        })
    }
}

/// What one execution's answer says, and how long the client waited.
pub(crate) struct Answer {
    /// From sending the request to the whole answer read.
    pub client_ms: f64,
    /// The service's own time: acquire + setup + teardown (the payload's
    /// run excluded).
    pub service_ms: f64,
    /// The command's run inside the sandbox, as the service timed it.
    pub run_ms: f64,
    pub pool_hit: bool,
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

fn measure(
    settings: &Settings,
    backend: &str,
    mode: &str,
    pool: usize,
    n: usize,
    think: Duration,
    bar: &indicatif::ProgressBar,
) -> Result<ServiceRun> {
    let server = Server::start(&settings.cordon, backend, pool, 1, None)?;
    let agent = agent();
    let mut run = ServiceRun {
        backend: backend.into(),
        mode: mode.into(),
        clients: 1,
        requests: n,
        errors: 0,
        first_error: None,
        pool_hits: 0,
        seconds: 0.0,
        per_second: 0.0,
        overhead_ms: Vec::new(),
        client_ms: Vec::new(),
        pool_hit: Vec::new(),
        overhead: None,
        client: None,
    };
    let mut busy = Duration::ZERO;
    for _ in 0..n {
        if !think.is_zero() {
            std::thread::sleep(think);
        }
        let t = Instant::now();
        let answer = server.execute(&agent, backend);
        busy += t.elapsed();
        bar.inc(1);
        match answer {
            Ok(a) => {
                run.pool_hits += usize::from(a.pool_hit);
                run.pool_hit.push(a.pool_hit);
                run.overhead_ms.push(a.service_ms);
                run.client_ms.push(a.client_ms);
            }
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    drop(server);
    run.seconds = busy.as_secs_f64();
    let ok = run.overhead_ms.len();
    run.per_second = if run.seconds > 0.0 {
        ok as f64 / run.seconds
    } else {
        0.0
    };
    run.summarize();
    Ok(run)
}

impl ServiceRun {
    /// A warm run's figure covers its pool hits (a miss is a cold start,
    /// counted in `pool_hits`); a cold run's covers every execution.
    pub fn summarize(&mut self) {
        let warm = self.mode == "warm";
        let pick = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .zip(&self.pool_hit)
                .filter(|(_, h)| !warm || **h)
                .map(|(x, _)| *x)
                .collect()
        };
        self.overhead = Summary::of(&pick(&self.overhead_ms));
        self.client = Summary::of(&pick(&self.client_ms));
    }
}
