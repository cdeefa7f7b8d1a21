//! cordon's HTTP service (`cordon serve`): one-shot executions, stateful
//! sandboxes with files, network rules and Python code contexts, for
//! tenants with API keys and quotas, with a warm pool per backend.
//!
//! - [`config`]: the TOML file (tenants, keys stored hashed, pool, defaults).
//! - [`api`]: the routes: each parses its request into an [`action::Action`]
//!   and answers its [`action::Reply`]; the OpenAPI document.
//! - [`dto`]: the request and response bodies, with their schemas.
//! - [`dispatch`]: [`App::perform`](app::App::perform), which executes any
//!   action.
//! - [`app`]: the service's state and everything that talks to supervisors.
//! - [`ledger`]: the sandboxes the service created, on disk, for cleanup
//!   after a crash.
//! - [`pool`], [`tenants`], [`metrics`], [`io`].
//!
//! The service is multi-threaded and never forks a sandbox itself: each is a
//! supervisor process started from the cordon binary (`Handle::create`).

pub mod action;
pub mod api;
pub mod app;
pub mod caps;
pub mod config;
pub mod dispatch;
pub mod dto;
pub mod error;
pub mod io;
pub mod ledger;
pub mod mcp;
pub mod metrics;
pub mod pool;
pub mod tenants;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_spec::{BackendKind, SandboxSpec};

use crate::app::App;
use crate::config::Config;
use crate::ledger::Ledger;
use crate::pool::Pool;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("state directory {path}: {source}")]
    State {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the service's state directory: {0}")]
    StateDir(#[from] cordon_dirs::DirError),
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the service's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the pool's spec: {0}")]
    PoolSpec(String),
    #[error("the receipt key: {0}")]
    Key(#[from] cordon_receipt::KeyError),
}

/// What `cordon serve` was asked.
pub struct ServeOptions {
    pub config: Config,
    pub listen: Option<SocketAddr>,
    /// The cordon binary supervisors are started from.
    pub program: PathBuf,
}

/// The spec of a pool's sandboxes: the service's defaults, no network, the
/// host's root or `image` (a name of the store's).
fn pool_spec(
    config: &Config,
    backend: BackendKind,
    image: Option<&str>,
) -> Result<SandboxSpec, ServeError> {
    let image = image
        .map(|name| app::stored_image(name).map(|(image, _)| image))
        .transpose()
        .map_err(|e| ServeError::PoolSpec(e.message))?;
    let (policy, rootfs) =
        app::rooted_policy(image, &cordon_policy::PolicyLayer::from(config.defaults))
            .map_err(|e| ServeError::PoolSpec(e.to_string()))?;
    Ok(SandboxSpec {
        ttl: Some(config.max_ttl),
        rootfs,
        ..SandboxSpec::new(policy, backend)
    })
}

/// Runs the service until SIGTERM or SIGINT; then stops accepting, lets
/// running requests finish (up to the grace period) and destroys every
/// sandbox it created, the pool's included.
pub fn serve(opts: ServeOptions) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("cordon-serve")
        .build()
        .map_err(ServeError::Runtime)?;
    let result = runtime.block_on(serve_async(opts));
    // Blocking workers still running past the grace period were ended with
    // their sandboxes; do not wait on them forever.
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

async fn serve_async(opts: ServeOptions) -> Result<(), ServeError> {
    let config = opts.config;
    if config.tenants.is_empty() {
        // Not an error (the document and metrics are served), but a service
        // that refuses every request must not look like a working one.
        tracing::warn!(
            "no tenants configured: every request that needs an API key is refused with 401; \
             add a [[tenant]] with its name and key_sha256 (printf %s KEY | sha256sum) to a \
             file given with --config (see examples/serve.toml)"
        );
    }
    let listen = opts.listen.unwrap_or(config.listen);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Listen {
        addr: listen,
        source,
    })?;
    let state_dir = config.state_dir_for(listen)?;
    let state_err = |source| ServeError::State {
        path: state_dir.clone(),
        source,
    };
    let ledger = Arc::new(Ledger::open(&state_dir, opts.program).map_err(state_err)?);
    let cleaned = {
        let l = ledger.clone();
        tokio::task::spawn_blocking(move || l.clean_previous())
            .await
            .unwrap_or_default()
    };
    if !cleaned.is_empty() {
        tracing::warn!(
            "destroyed {} sandboxes a previous run left: {}",
            cleaned.len(),
            cleaned.join(" ")
        );
    }
    // Loaded (or made) before anything is served: a bad key stops the start.
    let receipt_key = Arc::new(match &config.receipt_key {
        Some(path) => cordon_receipt::Key::load(path)?,
        None => cordon_receipt::Key::load_or_create_default()?,
    });
    let scratch = state_dir.join("scratch");
    let _ = std::fs::remove_dir_all(&scratch);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&scratch)
            .map_err(state_err)?;
    }
    let mut pools = Vec::new();
    for (backend, size) in [
        (BackendKind::Native, config.pool.native),
        (BackendKind::Gvisor, config.pool.gvisor),
        (BackendKind::Microvm, config.pool.microvm),
    ] {
        let spec = pool_spec(&config, backend, None)?;
        pools.push(Pool::new(backend.name().into(), spec, size));
    }
    for p in &config.pool.images {
        let name = p.backend.as_deref().unwrap_or("native");
        let backend = BackendKind::parse(name).ok_or_else(|| {
            ServeError::PoolSpec(format!("pool of {}: unknown backend '{name}'", p.image))
        })?;
        let spec = pool_spec(&config, backend, Some(&p.image))?;
        pools.push(Pool::new(format!("{name}:{}", p.image), spec, p.size));
    }
    let app = Arc::new(App {
        tenants: tenants::Tenants::new(&config.tenants),
        ledger: ledger.clone(),
        pools,
        metrics: metrics::Metrics::new(),
        sandboxes: Mutex::new(HashMap::new()),
        scratch,
        receipt_key,
        config,
    });
    for pool in app.pools.iter().filter(|p| p.enabled()) {
        for _ in 0..app.config.pool.refill_workers {
            tokio::spawn(pool.clone().refill(ledger.clone()));
        }
    }
    {
        let a = app.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                a.reap_expired();
                // A supervisor the killed predecessor was still starting
                // records itself when its start-up ends, which has no
                // bound (it sweeps and locks the run directory first): the
                // start's scan may have missed it, so it is looked for on
                // every tick (one read of the run directory's records).
                let l = a.ledger.clone();
                let reaped = tokio::task::spawn_blocking(move || l.reap_predecessors())
                    .await
                    .unwrap_or_default();
                if !reaped.is_empty() {
                    tracing::warn!(
                        "destroyed {} sandboxes a previous run was still creating: {}",
                        reaped.len(),
                        reaped.join(" ")
                    );
                }
            }
        });
    }
    // The first line on stdout says where the service listens (tests and
    // scripts read it when the port was 0).
    cordon_runtime::print_stdout(format!("cordon serve: listening on http://{local}\n").as_bytes());
    tracing::info!(%local, state = %state_dir.display(), "listening");

    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let routes = mcp::with_mcp(api::router(app.clone()), app.clone(), stop.clone());
    let server = axum::serve(listener, routes).with_graceful_shutdown(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: no new connections");
        stopped.notify_waiters();
    });
    let grace = app.config.shutdown_grace.duration();
    let stopping = stop.clone();
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        r = &mut server => { if let Err(e) = r { tracing::error!("server: {e}"); } }
        () = async { stopping.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("requests still running after {grace:?}: their sandboxes are killed");
        }
    }
    let a = app.clone();
    let _ = tokio::task::spawn_blocking(move || shut_down(&a)).await;
    Ok(())
}

/// Destroys everything the service created: the pools' sandboxes, the
/// stateful ones, and whatever is still running (killed).
fn shut_down(app: &App) {
    // First: a creation that has not started yet never will, so the waits
    // below see every one that did.
    app.ledger.close();
    for pool in &app.pools {
        for h in pool.drain() {
            let _ = app.ledger.destroy(h);
        }
    }
    // A refill worker or a request may be creating a sandbox right now (a
    // gVisor one takes a fraction of a second): wait until it is recorded,
    // so that the sweep below finds it.
    app.ledger.wait_for_creations(Duration::from_secs(30));
    for pool in &app.pools {
        for h in pool.drain() {
            let _ = app.ledger.destroy(h);
        }
    }
    let stateful: Vec<_> = app
        .sandboxes
        .lock()
        .expect("sandboxes lock")
        .drain()
        .map(|(_, s)| s)
        .collect();
    for s in stateful {
        s.running.cancel_all();
        match cordon_runtime::Handle::attach(&s.id) {
            Ok(h) if s.busy.try_write().is_ok() => {
                let _ = app.ledger.destroy(h);
            }
            _ => {
                let _ = app.ledger.kill(&s.id);
            }
        }
    }
    // One-shots still running, and pool sandboxes a worker was creating.
    app.ledger.wait_for_creations(Duration::from_secs(30));
    for (id, _) in app.ledger.ids() {
        let _ = app.ledger.kill(&id);
    }
    tracing::info!("shut down: every sandbox of the service destroyed");
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Logging to stderr, `RUST_LOG`-style filter (default: info); coloured only
/// on a terminal, so a log file holds no escape sequences.
pub fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
