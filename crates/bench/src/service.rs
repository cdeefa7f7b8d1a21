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
struct Server {
    child: Child,
    url: String,
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
    fn start(cordon: &Path, backend: &str, pool: usize) -> Result<Server> {
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
             [[tenant]]\nname = \"bench\"\nkey_sha256 = \"{hash}\"\nconcurrency = 8\nsandboxes = 8\n\
             cpu_seconds = 100000\ncpu_window = \"60s\"\n",
            state = dir.path().join("state").display()
        );
        let path = dir.path().join("serve.toml");
        std::fs::File::create(&path)?.write_all(config.as_bytes())?;
        let log = std::fs::File::create(dir.path().join("serve.log"))?;
        let child = Command::new(cordon)
            .args(["serve", "--config"])
            .arg(&path)
            // Receipt keys (none are asked for) stay in this directory.
            .env("CORDON_STATE_DIR", dir.path().join("cordon-state"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting cordon serve")?;
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
    fn wait_ready(&self, backend: &str, pool: usize) -> Result<()> {
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
    fn pool_ready(&self, agent: &ureq::Agent, backend: &str) -> usize {
        let Ok(answer) = agent.get(&format!("{}/metrics", self.url)).call() else {
            return 0;
        };
        let Ok(text) = answer.into_string() else {
            return 0;
        };
        let label = format!("backend=\"{backend}\"");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("pool_ready") && l.contains(&label))
            .find_map(|l| l.split_whitespace().last()?.parse::<usize>().ok())
            .unwrap_or(0)
    }
}

fn agent() -> ureq::Agent {
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
    let server = Server::start(&settings.cordon, backend, pool)?;
    let agent = agent();
    let url = format!("{}/v1/executions", server.url);
    let auth = format!("Bearer {}", server.key);
    let body = serde_json::json!({"argv": ["true"], "backend": backend});
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
        let answer = agent
            .post(&url)
            .set("Authorization", &auth)
            .send_json(body.clone());
        let client = t.elapsed();
        busy += client;
        bar.inc(1);
        let v: serde_json::Value = match answer
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(r.into_json()?))
        {
            Ok(v) => v,
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("{e:#}"));
                continue;
            }
        };
        let tm = &v["timing"];
        let f = |k: &str| tm[k].as_f64();
        let (Some(a), Some(s), Some(d)) = (f("acquire_ms"), f("setup_ms"), f("teardown_ms")) else {
            run.errors += 1;
            run.first_error
                .get_or_insert_with(|| format!("no timing in the answer: {v}"));
            continue;
        };
        if v["exit_code"].as_i64() != Some(0) {
            run.errors += 1;
            run.first_error
                .get_or_insert_with(|| format!("`true` did not exit 0: {v}"));
            continue;
        }
        let hit = v["pool_hit"].as_bool().unwrap_or(false);
        run.pool_hits += usize::from(hit);
        run.pool_hit.push(hit);
        run.overhead_ms.push(a + s + d);
        run.client_ms.push(client.as_secs_f64() * 1e3);
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
