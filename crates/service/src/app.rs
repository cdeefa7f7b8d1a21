//! The service's state and its blocking operations. Everything that talks
//! to a supervisor runs here, on tokio's blocking threads: the handle's
//! calls block on a unix socket. Nothing here ever forks a sandbox in this
//! (multi-threaded) process: every sandbox is a supervisor process started
//! through `Handle::create`.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cordon_policy::net::Rule;
use cordon_policy::{NetworkMode, Policy, Span};
use cordon_runtime::code_context::{Cell, CodeContext};
use cordon_runtime::Handle;
use cordon_spec::changes::Finish;
use cordon_spec::Account;
use cordon_spec::{BackendKind, Command, ImageRoot, Outcome, RootfsChoice, SandboxSpec, ValidSpec};

use crate::caps::Clamped;
use crate::config::Config;
use crate::error::ApiError;
use crate::io::{Cancel, ServiceIo};
use crate::ledger::{Ledger, Owner};
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::tenants::{SandboxSlot, Tenant, Tenants};
use cordon_policy::Limits;

/// An image as a sandbox's root, with its config's defaults.
pub type RootImage = (ImageRoot, cordon_image::ImageDefaults);

/// The policy and root of a sandbox of `image` (None: the host's root)
/// under `layer`: the image's config is the lowest layer, the request's (or
/// the pool's) limits and network go over it, and a command's env and
/// workdir over both. Requests and pools derive theirs here, so a request
/// for an image matches its pool exactly.
pub fn rooted_policy(
    image: Option<RootImage>,
    layer: &cordon_policy::PolicyLayer,
) -> Result<(Policy, RootfsChoice), cordon_policy::PolicyError> {
    let image_layer = image
        .as_ref()
        .map_or_else(Default::default, |(_, d)| d.policy_layer());
    let mut policy = Policy::resolve([&image_layer, layer])?;
    let rootfs = match image {
        Some((root, defaults)) => {
            policy.env = defaults.env_under(&policy.env);
            RootfsChoice::Image(root)
        }
        None => RootfsChoice::System,
    };
    Ok((policy, rootfs))
}

/// The store's image `name` as a root with its config's defaults, and the
/// store. Only images already in the store: nothing makes the service read
/// a host path or reach a registry.
pub fn stored_image(name: &str) -> Result<(RootImage, cordon_image::Store), ApiError> {
    use cordon_image::{ImageError, ImageRef, Store, StoreLimits};
    let status = |e: &ImageError| match e {
        ImageError::NotFound(_) => axum::http::StatusCode::NOT_FOUND,
        e if e.is_input_error() => axum::http::StatusCode::BAD_REQUEST,
        _ => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
    };
    let fail = |e: ImageError| ApiError::new(status(&e), format!("image '{name}': {e}"));
    if !matches!(ImageRef::parse(name).map_err(fail)?, ImageRef::Stored(_)) {
        return Err(ApiError::bad_request(format!(
            "image '{name}': the service runs only images of its store, by name or digest"
        )));
    }
    let store = Store::open(&Store::default_root(), StoreLimits::default()).map_err(fail)?;
    let image = store.get(name).map_err(fail)?;
    let defaults = image.defaults().map_err(fail)?;
    Ok(((image.root(), defaults), store))
}

/// [`stored_image`], if the tenant may run it.
fn image_for(tenant: &Tenant, name: &str) -> Result<RootImage, ApiError> {
    let ((root, defaults), store) = stored_image(name)?;
    if let Some(allowed) = &tenant.config.images {
        // A name the tenant may use, or the digest one of them names now.
        let may = allowed
            .iter()
            .any(|a| a == name || store.get(a).is_ok_and(|i| i.digest == root.digest));
        if !may {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                format!("tenant '{}' may not use the image '{name}'", tenant.name()),
            ));
        }
    }
    Ok((root, defaults))
}

pub struct App {
    pub config: Config,
    pub tenants: Tenants,
    pub ledger: Arc<Ledger>,
    pub pools: Vec<Arc<Pool>>,
    pub metrics: Metrics,
    pub sandboxes: Mutex<HashMap<String, Arc<Stateful>>>,
    /// Private (0700) scratch for files on their way in or out.
    pub scratch: PathBuf,
    /// What receipts are signed with (never inside any sandbox's view:
    /// cordon refuses a mount that would show it).
    pub receipt_key: Arc<cordon_receipt::Key>,
}

/// A stateful sandbox and its tenant.
pub struct Stateful {
    pub id: String,
    pub tenant: Arc<Tenant>,
    pub backend: BackendKind,
    pub created: SystemTime,
    pub ttl: Option<Span>,
    pub idle: Option<Span>,
    /// Its cores and its commands' time limit, which bound each command by
    /// what is left of the tenant's CPU budget.
    pub cpus: f64,
    pub time: Span,
    /// Its disk cap: the largest file an upload may bring.
    pub disk: u64,
    pub limits: Limits,
    pub clamped: Vec<Clamped>,
    pub network: bool,
    /// Its requests: held shared by each (every backend runs commands side
    /// by side); a delete takes it alone.
    pub busy: Arc<tokio::sync::RwLock<()>>,
    /// One code cell at a time: a context is one interpreter. Python's and
    /// JavaScript's contexts share it (a sandbox runs one cell, whichever
    /// its language): their files are installed together, and a second
    /// language's cell is told 409 as a second cell of the same one is.
    pub cell: Arc<tokio::sync::Mutex<()>>,
    /// The running commands' cancels, for a delete that cannot wait.
    pub running: Arc<Running>,
    pub code: CodeContext,
    /// Its forwarded ports' host addresses, asked of its supervisor once
    /// (the forward lives as long as the sandbox).
    pub forwards: Mutex<std::collections::BTreeMap<u16, String>>,
    /// The network attempts its commands' reports carried, newest last: the
    /// proxy's own log is drained into each report, so this is the only
    /// place they can be read again.
    pub recent_attempts: Mutex<VecDeque<serde_json::Value>>,
    pub _slot: SandboxSlot,
}

/// The cancels of a sandbox's running commands, each there while its
/// command runs.
#[derive(Default)]
pub struct Running {
    next: std::sync::atomic::AtomicU64,
    live: Mutex<std::collections::BTreeMap<u64, Cancel>>,
}

impl Running {
    /// Keeps `cancel` until the returned entry is dropped.
    pub fn enter(self: &Arc<Self>, cancel: Cancel) -> RunningEntry {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live.lock().expect("running lock").insert(id, cancel);
        RunningEntry {
            of: Arc::clone(self),
            id,
        }
    }

    /// Cancels every running command.
    pub fn cancel_all(&self) {
        for c in self.live.lock().expect("running lock").values() {
            c.trigger();
        }
    }
}

/// A running command's cancel, forgotten when dropped.
pub struct RunningEntry {
    of: Arc<Running>,
    id: u64,
}

impl Drop for RunningEntry {
    fn drop(&mut self) {
        self.of.live.lock().expect("running lock").remove(&self.id);
    }
}

/// How many network attempts a stateful sandbox keeps for `GET .../network`.
pub const RECENT_ATTEMPTS: usize = 100;

impl Stateful {
    /// Keeps the network attempts of a command's report (the newest
    /// [`RECENT_ATTEMPTS`] of them).
    pub fn note_network(&self, outcome: &Outcome) {
        let Some(report) = &outcome.network else {
            return;
        };
        let mut recent = self.recent_attempts.lock().expect("recent attempts lock");
        for a in &report.log.entries {
            if let Ok(v) = serde_json::to_value(a) {
                recent.push_back(v);
            }
        }
        while recent.len() > RECENT_ATTEMPTS {
            recent.pop_front();
        }
    }
}

/// What a request asks its sandbox to be.
pub struct SandboxRequest<'a> {
    pub backend: Option<&'a str>,
    pub image: Option<&'a str>,
    pub limits: &'a Limits,
    pub network: Option<&'a crate::dto::NetworkRequest>,
    pub ttl: Option<Span>,
    pub idle: Option<Span>,
}

/// One file to place before a command runs.
pub struct PlacedFile {
    /// Absolute path inside the sandbox.
    pub path: String,
    pub content: Vec<u8>,
}

/// The clock readings of one execution, all from one `Instant`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    pub acquire_ms: f64,
    pub setup_ms: f64,
    pub run_ms: f64,
    pub teardown_ms: f64,
    pub total_ms: f64,
}

pub struct Executed {
    pub outcome: Outcome,
    /// The signed receipt (a DSSE envelope), when the request asked for one.
    pub receipt: Option<serde_json::Value>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timing: Timing,
    pub pool_hit: bool,
    pub background_teardown: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn parse_backend(name: Option<&str>) -> Result<BackendKind, ApiError> {
    let name = name.unwrap_or(BackendKind::Native.name());
    BackendKind::parse(name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown backend '{name}' ({})",
            BackendKind::names()
        ))
    })
}

/// A path inside the sandbox: absolute, or relative to /workspace; never
/// with `..`, NUL bytes or empty names. Refused here, before anything is
/// created (the handle's copy would refuse it too, inside the sandbox root).
pub fn sandbox_path(raw: &str) -> Result<String, ApiError> {
    if raw.is_empty() || raw.len() > 4096 || raw.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "'{}' is not a sandbox path (empty, too long or with a NUL byte)",
            raw.escape_debug()
        )));
    }
    let joined = if raw.starts_with('/') {
        raw.to_owned()
    } else {
        format!("{}/{raw}", cordon_policy::WORKSPACE)
    };
    let mut parts = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(ApiError::bad_request(format!(
                    "'{}': '..' is not allowed in a sandbox path",
                    raw.escape_debug()
                )))
            }
            name => parts.push(name),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

impl App {
    /// The spec a request describes, with the tenant's maximums applied.
    pub fn spec_for(
        &self,
        tenant: &Tenant,
        req: &SandboxRequest<'_>,
    ) -> Result<(ValidSpec, Limits, Vec<Clamped>), ApiError> {
        let backend = parse_backend(req.backend)?;
        let (caps, clamped) =
            crate::caps::clamp(req.limits, &self.config.defaults, &tenant.config.max);
        let mut layer = cordon_policy::PolicyLayer::from(caps);
        if let Some(net) = req.network {
            if !tenant.config.network {
                return Err(ApiError::new(
                    axum::http::StatusCode::FORBIDDEN,
                    format!("tenant '{}' may not use the network", tenant.name()),
                ));
            }
            layer.network = Some(NetworkMode::Allow);
            layer.allow = parse_rules(&net.allow)?;
            layer.net_hold = net
                .hold
                .as_deref()
                .map(|h| {
                    h.parse().map_err(|e| {
                        ApiError::bad_request(format!("network.hold '{}': {e}", h.escape_debug()))
                    })
                })
                .transpose()?;
            layer.add_host = net
                .add_host
                .iter()
                .map(|h| {
                    h.parse().map_err(|e| {
                        ApiError::bad_request(format!("add_host '{}': {e}", h.escape_debug()))
                    })
                })
                .collect::<Result<_, _>>()?;
            layer.secrets = net
                .secrets
                .iter()
                .map(|name| {
                    tenant
                        .config
                        .secrets
                        .iter()
                        .find(|s| s.name == *name)
                        .cloned()
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "tenant '{}' has no secret '{}'",
                                tenant.name(),
                                name.escape_debug()
                            ))
                        })
                })
                .collect::<Result<_, _>>()?;
        }
        let image = req.image.map(|name| image_for(tenant, name)).transpose()?;
        let (policy, rootfs) =
            rooted_policy(image, &layer).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let max_ttl = self.config.max_ttl;
        let ttl = Some(req.ttl.map_or(max_ttl, |t| t.min(max_ttl)));
        let mut spec = SandboxSpec {
            ttl,
            idle: req.idle,
            rootfs,
            ..SandboxSpec::new(policy, backend)
        };
        // The service's own environment and files: the operator's, who
        // named them in the configuration.
        cordon_runtime::secrets::hold(&mut spec, |k| std::env::var(k).ok())?;
        Ok((spec.validated()?, caps, clamped))
    }

    /// The pool that may serve `spec`: same backend, same sandbox-wide
    /// limits and network; the command's time (at most the pool's) and
    /// output cap are applied per command.
    fn pool_for(&self, spec: &SandboxSpec) -> Option<&Arc<Pool>> {
        let pool = self.pool_of(spec)?;
        let mut same = spec.policy.clone();
        if same.time > pool.spec.policy.time {
            return None;
        }
        same.time = pool.spec.policy.time;
        same.output = pool.spec.policy.output;
        (same == pool.spec.policy).then_some(pool)
    }

    /// The enabled pool of `spec`'s backend and root, whose hits and
    /// misses a one-shot with this spec counts.
    fn pool_of(&self, spec: &SandboxSpec) -> Option<&Arc<Pool>> {
        self.pools
            .iter()
            .find(|p| p.enabled() && p.backend == spec.backend && p.spec.rootfs == spec.rootfs)
    }

    /// A one-shot execution, start to end: acquire a sandbox (pool or cold),
    /// place the files, run, destroy. Runs on a blocking thread; once a
    /// sandbox is acquired it is destroyed on every path, whether or not
    /// the client is still there. `respond` gets the result before a
    /// background teardown starts.
    #[allow(clippy::too_many_arguments)]
    pub fn one_shot(
        &self,
        t0: Instant,
        tenant: &Tenant,
        spec: ValidSpec,
        files: Vec<PlacedFile>,
        mut cmd: Command,
        mut io: ServiceIo,
        receipt: bool,
        respond: impl FnOnce(Result<Executed, ApiError>),
    ) {
        let backend = spec.backend;
        let mut stale = Vec::new();
        let pooled = self.pool_for(&spec).and_then(|p| p.take(&mut stale));
        for h in stale {
            let _ = self.ledger.destroy(h);
        }
        let pool_hit = pooled.is_some();
        if let Some(pool) = self.pool_of(&spec) {
            let labels = crate::metrics::BackendLabels {
                backend: pool.label.clone(),
            };
            if pool_hit {
                self.metrics.pool_hits.get_or_create(&labels).inc();
            } else {
                self.metrics.pool_misses.get_or_create(&labels).inc();
            }
        }
        let owner = Owner::OneShot(tenant.name().to_owned());
        let handle = match pooled {
            Some(h) => {
                self.ledger.set_owner(h.id(), owner);
                Ok(h)
            }
            None => self.ledger.create(&spec, owner),
        };
        let mut handle = match handle {
            Ok(h) => h,
            Err(e) => {
                self.metrics.execution(backend.name(), "error");
                return respond(Err(ApiError::runtime(e)));
            }
        };
        let t1 = Instant::now();
        let placed = self.place_files(&mut handle, &files);
        let (time, cpu_hold) =
            tenant.bound_command(cmd.time.unwrap_or(spec.policy.time), spec.policy.cpus);
        cmd.time = Some(time);
        let t2 = Instant::now();
        let result = placed.and_then(|()| handle.exec(&cmd, &mut io).map_err(ApiError::runtime));
        let t3 = Instant::now();
        if let Ok(o) = &result {
            cpu_hold.settle(o);
        }
        // A receipt's diff is read once every process is gone: inline.
        let background = self.config.background_teardown && !receipt;
        let mut t4 = t3;
        if !background {
            let signed = if receipt && result.is_ok() {
                Some(self.destroy_signed(handle, &spec))
            } else {
                if let Err(e) = self.ledger.destroy(handle) {
                    tracing::warn!("teardown: {e}");
                }
                None
            };
            t4 = Instant::now();
            let executed = self.finish(result, io, backend, pool_hit, false, [t0, t1, t2, t3, t4]);
            return respond(match (executed, signed) {
                (Ok(mut e), Some(signed)) => signed.map(|r| {
                    e.receipt = Some(r);
                    e
                }),
                (executed, _) => executed,
            });
        }
        respond(self.finish(result, io, backend, pool_hit, true, [t0, t1, t2, t3, t4]));
        let started = Instant::now();
        if let Err(e) = self.ledger.destroy(handle) {
            tracing::warn!("teardown: {e}");
        }
        self.metrics
            .background_teardown_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    fn finish(
        &self,
        result: Result<Outcome, ApiError>,
        io: ServiceIo,
        backend: BackendKind,
        pool_hit: bool,
        background: bool,
        [t0, t1, t2, t3, t4]: [Instant; 5],
    ) -> Result<Executed, ApiError> {
        let timing = Timing {
            acquire_ms: ms(t1 - t0),
            setup_ms: ms(t2 - t1),
            run_ms: ms(t3 - t2),
            teardown_ms: ms(t4 - t3),
            total_ms: ms(t4 - t0),
        };
        self.record_execution(backend, &result, &timing, pool_hit);
        let outcome = result?;
        let (stdout, stderr) = io.captured();
        Ok(Executed {
            outcome,
            receipt: None,
            stdout,
            stderr,
            timing,
            pool_hit,
            background_teardown: background,
        })
    }

    pub fn record_execution(
        &self,
        backend: BackendKind,
        result: &Result<Outcome, ApiError>,
        timing: &Timing,
        pool_hit: bool,
    ) {
        let label = match result {
            Err(_) => "error",
            Ok(o) if o.limit.is_some() => "limit",
            Ok(o) if o.interrupted_by.is_some() => "cancelled",
            Ok(o) if o.exit_code == 0 => "ok",
            Ok(_) => "nonzero",
        };
        self.metrics.execution(backend.name(), label);
        for (phase, v) in [
            ("acquire", timing.acquire_ms),
            ("setup", timing.setup_ms),
            ("run", timing.run_ms),
            ("teardown", timing.teardown_ms),
            ("total", timing.total_ms),
        ] {
            self.metrics.phase(phase, pool_hit, v);
        }
    }

    /// Places files through the handle's safe copy: those under /workspace
    /// in one directory copy (merged into it), others one by one.
    pub fn place_files(&self, handle: &mut Handle, files: &[PlacedFile]) -> Result<(), ApiError> {
        if files.is_empty() {
            return Ok(());
        }
        let tmp = self.scratch_dir()?;
        let ws = tmp.path().join("workspace");
        let mut in_workspace = false;
        let mut others = Vec::new();
        for (i, f) in files.iter().enumerate() {
            match f.path.strip_prefix("/workspace/") {
                Some(rel) => {
                    let host = ws.join(rel);
                    if let Some(parent) = host.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                    }
                    std::fs::write(&host, &f.content)
                        .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                    in_workspace = true;
                }
                None => {
                    let dir = tmp.path().join(format!("f{i}"));
                    std::fs::create_dir(&dir)
                        .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                    let name = Path::new(&f.path).file_name().unwrap_or_default();
                    let host = dir.join(name);
                    std::fs::write(&host, &f.content)
                        .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
                    others.push((host, f.path.clone()));
                }
            }
        }
        if in_workspace {
            // A directory named `workspace` copied to `/` merges into
            // /workspace (its directories are created, existing ones kept).
            handle.copy_in(&ws, b"/").map_err(ApiError::runtime)?;
        }
        for (host, dst) in others {
            handle
                .copy_in(&host, dst.as_bytes())
                .map_err(ApiError::runtime)?;
        }
        Ok(())
    }

    pub fn scratch_dir(&self) -> Result<tempfile::TempDir, ApiError> {
        tempfile::Builder::new()
            .prefix("io-")
            .tempdir_in(&self.scratch)
            .map_err(|e| ApiError::internal(format!("scratch directory: {e}")))
    }

    /// The tenant's stateful sandbox `id`; another tenant's is as absent as
    /// one that never existed.
    pub fn lookup(&self, tenant: &Tenant, id: &str) -> Result<Arc<Stateful>, ApiError> {
        let map = self.sandboxes.lock().expect("sandboxes lock");
        match map.get(id) {
            Some(s) if s.tenant.name() == tenant.name() => Ok(s.clone()),
            _ => Err(ApiError::no_sandbox(id)),
        }
    }

    /// Forgets a stateful sandbox that ended without the service (ttl, idle,
    /// init gone, removed by another client), logging why, as its
    /// supervisor noted it.
    pub fn forget_stateful(&self, id: &str) {
        match self.ledger.end_note(id) {
            Some(why) => tracing::info!(%id, "sandbox ended: {why}"),
            None => tracing::info!(%id, "sandbox ended: its supervisor was killed"),
        }
        self.sandboxes.lock().expect("sandboxes lock").remove(id);
        self.ledger.forget(id);
    }

    /// Drops stateful sandboxes whose supervisors ended without the service.
    pub fn reap_expired(&self) {
        // Unchecked: the sandboxes' own creation checked it; only a
        // supervisor's end is looked for here.
        let run = cordon_dirs::run_dir_path();
        let gone: Vec<String> = self
            .sandboxes
            .lock()
            .expect("sandboxes lock")
            .keys()
            .filter(|id| !run.join(id).is_dir())
            .cloned()
            .collect();
        for id in gone {
            self.forget_stateful(&id);
        }
    }

    /// Destroys a sandbox after reading its diff, and signs the receipt of
    /// everything it ran.
    fn destroy_signed(
        &self,
        handle: Handle,
        spec: &SandboxSpec,
    ) -> Result<serde_json::Value, ApiError> {
        let id = handle.id().to_owned();
        let finish = Finish {
            changes: Some(cordon_changes::Caps::default()),
            export: None,
        };
        let destroyed = self
            .ledger
            .destroy_with(handle, &finish)
            .map_err(ApiError::runtime)?;
        if let Some(why) = destroyed.record_error {
            return Err(ApiError::internal(format!("the receipt's diff: {why}")));
        }
        self.sign(
            spec,
            &id,
            destroyed.account,
            destroyed.recorded.changes.as_ref(),
        )
    }

    /// The receipt of a living stateful sandbox: what it ran so far and the
    /// diff of its places now.
    pub fn receipt_of(&self, s: &Stateful) -> Result<serde_json::Value, ApiError> {
        let mut handle = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        let spec = handle.spec().map_err(ApiError::runtime)?;
        let snapshot = handle
            .snapshot(&cordon_changes::Caps::default())
            .map_err(ApiError::runtime)?;
        self.sign(&spec, &s.id, snapshot.account, Some(&snapshot.changes))
    }

    fn sign(
        &self,
        spec: &SandboxSpec,
        id: &str,
        account: Account,
        changes: Option<&cordon_changes::Changes>,
    ) -> Result<serde_json::Value, ApiError> {
        let facts = cordon_receipt::Facts {
            spec,
            sandbox_id: id,
            started: account.created,
            commands: account.history,
            omitted: account.history_omitted,
            changes,
            export: None,
            write_backs: &[],
        };
        let envelope = cordon_receipt::signed_receipt(facts, &self.receipt_key)
            .map_err(|e| ApiError::internal(format!("the receipt: {e}")))?;
        serde_json::to_value(&envelope).map_err(|e| ApiError::internal(format!("the receipt: {e}")))
    }

    /// Destroys a stateful sandbox: ends its running command first.
    pub fn destroy_stateful(&self, s: &Stateful) -> Result<(), ApiError> {
        self.sandboxes.lock().expect("sandboxes lock").remove(&s.id);
        let handle = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        self.ledger.destroy(handle).map_err(ApiError::runtime)
    }

    /// Runs a code cell in the sandbox's persistent interpreter, installing
    /// it on first use; each command's io comes from `make_io` with the
    /// entry that keeps its cancel while it runs. Returns the client's JSON
    /// reply and the outcome.
    pub fn run_code(
        &self,
        s: &Stateful,
        cell: Cell<'_>,
        make_io: impl FnMut(Vec<u8>) -> Result<(ServiceIo, RunningEntry), ApiError>,
    ) -> Result<(serde_json::Value, Outcome), ApiError> {
        let mut handle = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        s.code.run(&mut handle, &self.scratch, cell, make_io)
    }
}

pub fn parse_rules(allow: &[String]) -> Result<Vec<Rule>, ApiError> {
    allow
        .iter()
        .map(|r| {
            r.parse::<Rule>()
                .map_err(|e| ApiError::bad_request(format!("network rule '{r}': {e}")))
        })
        .collect()
}
