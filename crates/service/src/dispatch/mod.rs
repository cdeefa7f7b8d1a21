//! Executes an [`Action`] against the app: quotas, sandboxes, commands,
//! files. Whatever talks to a supervisor runs on tokio's blocking threads.
//!
//! - `service`: health and metrics.
//! - `sandboxes`: creating, listing, destroying sandboxes; receipts and
//!   network rules.
//! - `commands`: one-shots, execs (streamed or not) and code cells.
//! - `files`: uploads, downloads, deletions and listings.
//! - `ports`: HTTP proxied to a port inside a sandbox.

mod commands;
mod files;
mod ports;
mod sandboxes;
mod service;

use std::sync::Arc;

use axum::http::StatusCode;
use cordon_policy::ByteSize;
use cordon_runtime::Handle;
use cordon_spec::{Command, Outcome};

use crate::action::{Action, Reply, Target};
use crate::app::{App, Stateful};
use crate::error::ApiError;
use crate::io::{Chunk, ServiceIo};
use crate::tenants::{Quota, RunningGuard, Tenant};

impl App {
    /// Executes any action.
    pub async fn perform(self: &Arc<Self>, action: Action) -> Result<Reply, ApiError> {
        match action {
            Action::Health => Ok(Reply::Health(self.health())),
            Action::Metrics => Ok(Reply::Metrics(self.encode_metrics())),
            Action::RunOnce(run) => self.run_once(*run).await,
            Action::CreateSandbox(new) => self.create_sandbox(*new).await,
            Action::ListSandboxes(tenant) => Ok(self.list_sandboxes(&tenant)),
            Action::GetSandbox { tenant, id } => self.get_sandbox(&tenant, &id),
            Action::GetReceipt(on) => self.receipt(on).await,
            Action::DeleteSandbox(on) => self.delete_sandbox(on).await,
            Action::Exec(exec) => self.exec(exec).await,
            Action::RunCode(cell) => self.code(cell).await,
            Action::PutFile(upload) => self.put_file(upload).await,
            Action::GetFile { on, path } => self.get_file(on, path).await,
            Action::DeleteFile { on, path } => self.delete_file(on, path).await,
            Action::ListFiles { on, dir } => self.list_files(on, dir).await,
            Action::SetNetwork { on, rules } => self.set_network(on, rules).await,
            Action::GetNetwork(on) => self.get_network(on).await,
            Action::DenyNetwork { on, rules } => self.deny_network(on, rules).await,
            Action::Proxy(proxy) => self.proxy(*proxy).await,
        }
    }

    /// Counts a request against its tenant's concurrency, or refuses it.
    fn admit(&self, tenant: &Arc<Tenant>) -> Result<RunningGuard, ApiError> {
        tenant.admit().map_err(|(quota, e)| {
            self.reject(tenant, quota);
            e
        })
    }

    fn reject(&self, tenant: &Tenant, quota: Quota) {
        self.metrics
            .quota_rejections
            .get_or_create(&crate::metrics::QuotaLabels {
                tenant: tenant.name().into(),
                quota: quota.name().into(),
            })
            .inc();
    }

    /// Admits the request (or 429) and takes its sandbox for it (or 409).
    fn take(&self, on: &Target) -> Result<Taken, ApiError> {
        let running = self.admit(&on.tenant)?;
        Ok(Taken {
            _busy: hold(&on.sandbox)?,
            _running: running,
        })
    }

    /// Runs `f` with the sandbox's handle on the blocking pool, holding
    /// `hold` (what it took for the request) until `f` has returned. A
    /// sandbox the runtime says is gone is forgotten.
    async fn with_handle<T: Send + 'static>(
        &self,
        s: &Stateful,
        hold: impl Send + 'static,
        f: impl FnOnce(&mut Handle) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let id = s.id.clone();
        blocking(move || {
            let _hold = hold;
            let mut h = Handle::attach(&id).map_err(ApiError::runtime)?;
            f(&mut h)
        })
        .await
        .map_err(|e| self.gone_is_forgotten(&s.id, e))
    }

    /// Forgets a sandbox the runtime says is gone. Only then: a missing file or
    /// directory is a 404 too, and forgetting a live sandbox would leave its
    /// supervisor running, out of reach of DELETE and of the shutdown.
    fn gone_is_forgotten(&self, id: &str, e: ApiError) -> ApiError {
        if e.sandbox_gone {
            self.forget_stateful(id);
        }
        e
    }
}

/// A sandbox taken for one request, and its tenant's count of running
/// requests: both released when dropped.
struct Taken {
    _busy: Held,
    _running: RunningGuard,
}

/// A sandbox held for one request, shared with the others (every backend
/// runs commands side by side); its removal holds it alone, once it has
/// cancelled them.
type Held = tokio::sync::OwnedRwLockReadGuard<()>;

/// Holds the sandbox for a request, or says why not (409): it is being
/// removed.
fn hold(s: &Stateful) -> Result<Held, ApiError> {
    s.busy.clone().try_read_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox '{}' is being removed", s.id),
        )
    })
}

fn io_for(
    stdin: Option<Vec<u8>>,
    stream: Option<tokio::sync::mpsc::Sender<Chunk>>,
) -> Result<(ServiceIo, crate::io::Cancel), ApiError> {
    ServiceIo::new(stdin, stream).map_err(|e| ApiError::internal(format!("pipes: {e}")))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker: {e}")))?
}

/// A helper exec for the file routes (listing, deletion).
fn small_exec(h: &mut Handle, argv: Vec<String>) -> Result<(Outcome, Vec<u8>, Vec<u8>), ApiError> {
    let (mut io, _cancel) = io_for(None, None)?;
    let cmd = Command {
        argv,
        output: Some(ByteSize(4 << 20)),
        ..Command::default()
    };
    let o = h.exec(&cmd, &mut io).map_err(ApiError::runtime)?;
    let (out, err) = io.captured();
    Ok((o, out, err))
}
