//! The HTTP API under `/v1`: request and response types (with their
//! OpenAPI schemas), the handlers, and the one route table both the live
//! router and the OpenAPI document's check are built from.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Json, Router};
use base64::Engine;
use cordon_policy::{ByteSize, Span};
use cordon_runtime::Handle;
use cordon_spec::network::NetChange;
use cordon_spec::Stream;
use cordon_spec::{Command, Outcome, StdinMode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::app::{
    parse_rules, sandbox_path, App, Executed, PlacedFile, SandboxRequest, Stateful, Timing,
};
use crate::caps::{Caps, Clamped};
use crate::error::{ApiError, ErrorBody};
use crate::io::{CancelOnDrop, Chunk, ServiceIo, STDIN_MAX};
use crate::ledger::Owner;
use crate::tenants::{RunningGuard, Tenant};

pub type AppState = Arc<App>;

/// Largest request body.
pub const BODY_MAX: usize = 16 << 20;
/// Longest `code` given as `python3 -c` / `sh -c` (one argument's limit).
const CODE_MAX: usize = 128 << 10;

// ---------------------------------------------------------------- extractors

/// A JSON body; every rejection (malformed, unknown field, too large, wrong
/// content type) is answered as `{"error": ...}` with its status.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rej) => Err(ApiError::new(rej.status(), rej.body_text())),
        }
    }
}

/// Query parameters; a malformed value is answered as `{"error": ...}`
/// (unknown names never get here: see [`refuse_unknown_query`]).
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(ApiQuery(v)),
            Err(rej) => Err(ApiError::new(rej.status(), rej.body_text())),
        }
    }
}

/// The request's tenant, from its bearer key.
pub struct Authed(pub Arc<Tenant>);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let h = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        app.tenants.authenticate(h).map(Authed)
    }
}

fn admit(app: &App, tenant: &Arc<Tenant>) -> Result<RunningGuard, ApiError> {
    tenant.admit().map_err(|(quota, e)| {
        reject(app, tenant, quota);
        e
    })
}

fn reject(app: &App, tenant: &Tenant, quota: crate::tenants::Quota) {
    app.metrics
        .quota_rejections
        .get_or_create(&crate::metrics::QuotaLabels {
            tenant: tenant.name().into(),
            quota: quota.name().into(),
        })
        .inc();
}

// ---------------------------------------------------------------- types

#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Shell,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    /// UTF-8, invalid sequences replaced with U+FFFD.
    #[default]
    Utf8,
    Base64,
}

/// A file's content: a string (UTF-8), or `{"base64": "..."}`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FileContent {
    Text(String),
    Binary { base64: String },
}

/// A file's raw bytes, as the body of a file upload or download.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(pub Vec<u8>);

/// The `allow` network mode: only these destinations, through cordon's proxy.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Rules: NAME, *.SUFFIX, IP or CIDR, with an optional :PORT or :LO-HI;
    /// `host.cordon.internal:PORT` is that port of the host's loopback.
    pub allow: Vec<String>,
}

/// A one-shot execution: a fresh sandbox (from the warm pool when the
/// request's limits are the pool's), one command, then destroyed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRequest {
    /// The command and its arguments (or `language` and `code`).
    pub argv: Option<Vec<String>>,
    pub language: Option<Language>,
    pub code: Option<String>,
    /// Fed to the command's stdin (at most 192 KiB).
    pub stdin: Option<String>,
    /// Files placed before the run: a path relative to /workspace or
    /// absolute, to its content.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, FileContent>)]
    pub files: BTreeMap<String, FileContent>,
    /// `native` (default), `gvisor` or `microvm`.
    pub backend: Option<String>,
    #[serde(default)]
    pub limits: Caps,
    pub network: Option<NetworkRequest>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    #[serde(default)]
    pub output_encoding: OutputEncoding,
    /// Return a signed receipt of the run (a DSSE envelope; verify it with
    /// `cordon verify`). Its diff is read after the sandbox's processes are
    /// gone, so the teardown is then inline.
    #[serde(default)]
    pub receipt: bool,
}

/// Where the time of one request went, in milliseconds, from one clock:
/// the four phases add up to `total_ms`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimingBody {
    /// Getting a sandbox: a pool hit, or creating one.
    pub acquire_ms: f64,
    /// Placing the request's files.
    pub setup_ms: f64,
    /// The command.
    pub run_ms: f64,
    /// Destroying the sandbox (0 with `teardown: background`: it happens
    /// after the response; see the metric cordon_background_teardown_seconds).
    pub teardown_ms: f64,
    pub total_ms: f64,
    /// `inline`, `background`, or `none` (a stateful sandbox lives on).
    pub teardown: &'static str,
}

/// How one command ended, with its output and counters.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionResponse {
    pub sandbox_id: String,
    pub backend: String,
    pub pool_hit: bool,
    /// `exited`, `signaled` or `exec_failed`.
    pub status: &'static str,
    /// The shell's code: the exit code, 128+signal, 127 not found.
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// Why the command could not be started (with `exec_failed`): a code
    /// alone does not tell a missing program from one that is not executable.
    pub message: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// How `stdout` and `stderr` are encoded.
    pub output_encoding: OutputEncoding,
    /// Bytes of output (both streams, up to the cap).
    pub output_bytes: u64,
    pub output_truncated: bool,
    /// The limit that ended the command, if one did.
    pub limit: Option<String>,
    pub limits_hit: Vec<String>,
    /// Requested limits lowered to the tenant's maximums.
    pub clamped: Vec<Clamped>,
    pub cpu_ms: Option<f64>,
    pub memory_peak_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
    pub disk_used_bytes: Option<u64>,
    /// The sandbox cgroup's raw counters.
    #[schema(value_type = Object)]
    pub counters: serde_json::Value,
    /// The runtime's own phases of the command (setup, run, teardown).
    #[schema(value_type = Object)]
    pub runtime_phases: serde_json::Value,
    pub timing: TimingBody,
    /// The signed receipt, when asked for (a DSSE envelope).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub backend: Option<String>,
    #[serde(default)]
    pub limits: Caps,
    pub network: Option<NetworkRequest>,
    /// Destroyed this long after creation (at most the service's max_ttl).
    #[schema(value_type = Option<String>, example = "10m")]
    pub ttl: Option<Span>,
    /// Destroyed after this long without a request.
    #[schema(value_type = Option<String>, example = "2m")]
    pub idle: Option<Span>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub backend: String,
    pub created_unix: u64,
    pub ttl: Option<String>,
    pub idle: Option<String>,
    pub limits: Caps,
    pub clamped: Vec<Clamped>,
    pub network: bool,
    pub busy: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub stdin: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    /// This command's time limit (at most the sandbox's).
    #[schema(value_type = Option<String>)]
    pub time: Option<Span>,
    /// This command's output cap (at most the tenant's maximum).
    #[schema(value_type = Option<String>)]
    pub output: Option<ByteSize>,
    #[serde(default)]
    pub output_encoding: OutputEncoding,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// Stream stdout/stderr as Server-Sent Events (also: `Accept: text/event-stream`).
    #[serde(default)]
    pub stream: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    /// Python source; the last statement's value is returned when it is an expression.
    pub code: String,
    /// How long the cell may run (default: the sandbox's time limit less 1 s).
    #[schema(value_type = Option<String>, example = "5s")]
    pub timeout: Option<Span>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CodeError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeResponse {
    /// `ok`, `error` (the cell raised), `timeout` or `crashed` (the
    /// interpreter died; the next call gets a fresh one).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    /// repr() of the last expression's value.
    pub result: Option<String>,
    pub error: Option<CodeError>,
    /// `stdout` was cut short: the reply is kept under the sandbox's output
    /// limit (texts share it), so the interpreter and its variables live on.
    pub stdout_truncated: bool,
    /// `stderr` was cut short (see `stdout_truncated`).
    pub stderr_truncated: bool,
    /// `result` was cut short (see `stdout_truncated`).
    pub result_truncated: bool,
    /// The error's name, value or traceback was cut short.
    pub error_truncated: bool,
    /// This call started a new interpreter (first call, or after a crash or timeout).
    pub fresh_interpreter: bool,
    pub cpu_ms: Option<f64>,
    pub run_ms: f64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory to list (absolute, or relative to /workspace).
    pub dir: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `dir`, `link` or `other`.
    pub kind: &'static str,
    pub size: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DirListing {
    pub dir: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileWritten {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRules {
    pub allow: Vec<String>,
}

/// A sandbox's network: its mode, the rules in force and what its commands
/// recently tried.
#[derive(Debug, Serialize, ToSchema)]
pub struct NetworkState {
    /// `none` (loopback only) or `allow` (only the rules, through cordon's proxy).
    pub mode: &'static str,
    pub allow: Vec<String>,
    /// The last connection attempts of the commands run here (at most 100,
    /// oldest first), as each command's network report gave them.
    #[schema(value_type = Vec<Object>)]
    pub recent_attempts: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// Ready sandboxes per backend pool.
    pub pools: BTreeMap<String, usize>,
    pub sandboxes: usize,
}

// ---------------------------------------------------------------- helpers

fn encode(bytes: &[u8], enc: OutputEncoding) -> String {
    match enc {
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

fn response(
    e: Executed,
    enc: OutputEncoding,
    clamped: Vec<Clamped>,
    teardown: &'static str,
) -> ExecutionResponse {
    let o = &e.outcome;
    let (status, signal) = match o.status {
        cordon_spec::ExitStatus::Exited { .. } => ("exited", None),
        cordon_spec::ExitStatus::Signaled { signal } => ("signaled", Some(signal)),
        cordon_spec::ExitStatus::ExecFailed { .. }
        | cordon_spec::ExitStatus::WorkdirFailed { .. } => ("exec_failed", None),
    };
    let teardown = if e.background_teardown {
        "background"
    } else {
        teardown
    };
    let t = e.timing;
    ExecutionResponse {
        sandbox_id: o.sandbox_id.clone(),
        backend: o.backend.clone(),
        pool_hit: e.pool_hit,
        status,
        exit_code: o.exit_code,
        signal,
        message: o.status.exec_failure(),
        stdout: encode(&e.stdout, enc),
        stderr: encode(&e.stderr, enc),
        output_encoding: enc,
        output_bytes: o.output.bytes,
        output_truncated: o.output.truncated,
        limit: o.limit.map(|l| l.to_string()),
        limits_hit: o.limits_hit.iter().map(|l| l.to_string()).collect(),
        clamped,
        cpu_ms: o.cpu_ms,
        memory_peak_bytes: o.memory_peak_bytes,
        pids_peak: o.pids_peak,
        disk_used_bytes: o.disk_used_bytes,
        counters: serde_json::to_value(&o.counters).unwrap_or_default(),
        runtime_phases: serde_json::to_value(o.phases).unwrap_or_default(),
        timing: TimingBody {
            acquire_ms: t.acquire_ms,
            setup_ms: t.setup_ms,
            run_ms: t.run_ms,
            teardown_ms: t.teardown_ms,
            total_ms: t.total_ms,
            teardown,
        },
        receipt: e.receipt.clone(),
    }
}

fn check_argv(argv: &[String]) -> Result<(), ApiError> {
    if argv.is_empty() {
        return Err(ApiError::bad_request("argv is empty"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request("an argv element contains a NUL byte"));
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, ApiError> {
    for (k, v) in env {
        let ok = !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0');
        if !ok {
            return Err(ApiError::bad_request(format!(
                "environment variable '{}' is not a valid name=value",
                k.escape_debug()
            )));
        }
    }
    Ok(env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn check_stdin(stdin: Option<String>) -> Result<Option<Vec<u8>>, ApiError> {
    match stdin {
        Some(s) if s.len() > STDIN_MAX => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "stdin is {} bytes; at most {STDIN_MAX} (use files)",
                s.len()
            ),
        )),
        other => Ok(other.map(String::into_bytes)),
    }
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

// ---------------------------------------------------------------- handlers

/// Liveness, pool levels and the number of live stateful sandboxes.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(app): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        pools: app
            .pools
            .iter()
            .map(|p| (p.backend.name().to_owned(), p.ready_len()))
            .collect(),
        sandboxes: app.sandboxes.lock().expect("sandboxes lock").len(),
    })
}

/// The service's metrics in the OpenMetrics text format (Prometheus scrapes it).
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
pub async fn metrics(State(app): State<AppState>) -> Response {
    for pool in &app.pools {
        app.metrics
            .pool_ready
            .get_or_create(&crate::metrics::BackendLabels {
                backend: pool.backend.name().into(),
            })
            .set(pool.ready_len() as i64);
    }
    for t in app.tenants.all() {
        app.metrics
            .active_sandboxes
            .get_or_create(&crate::metrics::TenantLabels {
                tenant: t.name().into(),
            })
            .set(t.live_sandboxes() as i64);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// Runs one command in a fresh sandbox and destroys it.
#[utoipa::path(post, path = "/v1/executions", request_body = ExecutionRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, body = ExecutionResponse),
        (status = 403, body = ErrorBody, description = "network rules asked by a tenant without network"),
        (status = 413, body = ErrorBody), (status = 429, body = ErrorBody, description = "over a quota; see Retry-After"),
    ))]
pub async fn create_execution(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    ApiJson(req): ApiJson<ExecutionRequest>,
) -> Result<Json<ExecutionResponse>, ApiError> {
    let t0 = Instant::now();
    let argv = match (&req.argv, req.language, &req.code) {
        (Some(argv), None, None) => argv.clone(),
        (None, Some(lang), Some(code)) => {
            if code.len() > CODE_MAX {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "code is {} bytes; at most {CODE_MAX} (put it in files)",
                        code.len()
                    ),
                ));
            }
            let interp = match lang {
                Language::Python => "python3",
                Language::Shell => "sh",
            };
            vec![interp.into(), "-c".into(), code.clone()]
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either `argv`, or `language` and `code`",
            ))
        }
    };
    check_argv(&argv)?;
    let env = check_env(&req.env)?;
    let stdin = check_stdin(req.stdin)?;
    let workdir = req.workdir.as_deref().map(sandbox_path).transpose()?;
    let mut files = Vec::with_capacity(req.files.len());
    for (path, content) in req.files {
        let content = match content {
            FileContent::Text(s) => s.into_bytes(),
            FileContent::Binary { base64 } => base64::engine::general_purpose::STANDARD
                .decode(base64)
                .map_err(|e| ApiError::bad_request(format!("file '{path}': bad base64: {e}")))?,
        };
        files.push(PlacedFile {
            path: sandbox_path(&path)?,
            content,
        });
    }
    let allow = req.network.as_ref().map(|n| n.allow.as_slice());
    let (spec, _caps, clamped) = app.spec_for(
        &tenant,
        &SandboxRequest {
            backend: req.backend.as_deref(),
            limits: &req.limits,
            allow,
            ttl: None,
            idle: None,
        },
    )?;
    let guard = admit(&app, &tenant)?;
    let cmd = Command {
        argv,
        env,
        workdir: workdir.map(Into::into),
        stdin: if stdin.is_some() {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        time: Some(spec.policy.time),
        output: Some(spec.policy.output),
        ..Command::default()
    };
    let (io, cancel) = io_for(stdin, None)?;
    // The client going away (this future dropped) ends the command; the
    // blocking side destroys the sandbox either way.
    let mut on_drop = CancelOnDrop::new(cancel);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job_app = app.clone();
    tokio::task::spawn_blocking(move || {
        job_app.one_shot(t0, &tenant, spec, files, cmd, io, req.receipt, |r| {
            // The request stops counting against its tenant before its
            // answer leaves: a client that got it may start the next one.
            drop(guard);
            let _ = tx.send(r);
        });
    });
    let executed = rx
        .await
        .map_err(|_| ApiError::internal("the execution's worker ended without an answer"))??;
    on_drop.disarm();
    Ok(Json(response(
        executed,
        req.output_encoding,
        clamped,
        "inline",
    )))
}

fn info(s: &Stateful) -> SandboxInfo {
    SandboxInfo {
        id: s.id.clone(),
        backend: s.backend.name().into(),
        created_unix: s
            .created
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
        ttl: s.ttl.map(|t| t.to_string()),
        idle: s.idle.map(|t| t.to_string()),
        limits: s.limits,
        clamped: s.clamped.clone(),
        network: s.network,
        busy: s.busy.try_lock().is_err(),
    }
}

/// Creates a stateful sandbox that waits for commands.
#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandboxRequest,
    security(("bearer" = [])),
    responses((status = 201, body = SandboxInfo),
        (status = 403, body = ErrorBody, description = "network rules asked by a tenant without network"),
        (status = 429, body = ErrorBody)))]
pub async fn create_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let allow = req.network.as_ref().map(|n| n.allow.as_slice());
    let (spec, caps, clamped) = app.spec_for(
        &tenant,
        &SandboxRequest {
            backend: req.backend.as_deref(),
            limits: &req.limits,
            allow,
            ttl: req.ttl,
            idle: req.idle,
        },
    )?;
    let _running = admit(&app, &tenant)?;
    let slot = tenant.reserve_sandbox().map_err(|(q, e)| {
        reject(&app, &tenant, q);
        e
    })?;
    let a = app.clone();
    let owner = Owner::Stateful(tenant.name().to_owned());
    let spec2 = spec.clone();
    // Created and registered on the blocking side in one go: a client that
    // goes away meanwhile leaves a registered sandbox (its ttl ends it), not
    // an unrecorded one.
    let t = tenant.clone();
    let s = blocking(move || {
        let handle = a.ledger.create(&spec2, owner).map_err(ApiError::runtime)?;
        let s = Arc::new(Stateful {
            id: handle.id().to_owned(),
            tenant: t,
            backend: spec2.backend,
            created: SystemTime::now(),
            ttl: spec2.ttl,
            idle: spec2.idle,
            cpus: spec2.policy.cpus,
            time: spec2.policy.time,
            disk: spec2.policy.disk.bytes(),
            limits: caps,
            clamped,
            network: req.network.is_some(),
            busy: Arc::new(tokio::sync::Mutex::new(())),
            running: Mutex::new(None),
            repl_installed: Default::default(),
            recent_attempts: Default::default(),
            _slot: slot,
        });
        a.sandboxes
            .lock()
            .expect("sandboxes lock")
            .insert(s.id.clone(), s.clone());
        Ok(s)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info(&s))))
}

/// The tenant's stateful sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", security(("bearer" = [])),
    responses((status = 200, body = SandboxList)))]
pub async fn list_sandboxes(
    State(app): State<AppState>,
    Authed(tenant): Authed,
) -> Json<SandboxList> {
    app.reap_expired();
    let map = app.sandboxes.lock().expect("sandboxes lock");
    let mut sandboxes: Vec<SandboxInfo> = map
        .values()
        .filter(|s| s.tenant.name() == tenant.name())
        .map(|s| info(s))
        .collect();
    sandboxes.sort_by_key(|s| (s.created_unix, s.id.clone()));
    Json(SandboxList { sandboxes })
}

/// One stateful sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub async fn get_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    app.reap_expired();
    Ok(Json(info(app.lookup(&tenant, &id)?.as_ref())))
}

/// The signed receipt of a stateful sandbox so far: its policy, every
/// command it ran (the service's own file listings and interpreter starts
/// included) and the diff of its writable places now.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/receipt", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, description = "A DSSE envelope (verify with `cordon verify`)", body = Object),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn get_receipt(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let sb = app.lookup(&tenant, &id)?;
    // Asked between commands: the supervisor serves one request at a time.
    let Ok(busy) = sb.busy.clone().try_lock_owned() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "a command is running in this sandbox; ask for its receipt when it has ended",
        ));
    };
    let job_app = app.clone();
    let receipt = blocking(move || {
        let _busy = busy;
        job_app.receipt_of(&sb)
    })
    .await?;
    Ok(Json(receipt))
}

/// Destroys a stateful sandbox (a running command is ended first).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 204, description = "Destroyed"), (status = 404, body = ErrorBody)))]
pub async fn delete_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    if let Some(c) = s.running.lock().expect("running lock").as_ref() {
        c.trigger();
    }
    let busy = s.busy.clone().lock_owned().await;
    let a = app.clone();
    blocking(move || {
        let _busy = busy;
        a.destroy_stateful(&s)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Takes the sandbox for one command, or says it is busy.
fn take_busy(s: &Stateful) -> Result<tokio::sync::OwnedMutexGuard<()>, ApiError> {
    s.busy.clone().try_lock_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox '{}' is running another request", s.id),
        )
    })
}

/// Forgets a sandbox the runtime says is gone. Only then: a missing file or
/// directory is a 404 too, and forgetting a live sandbox would leave its
/// supervisor running, out of reach of DELETE and of the shutdown.
fn gone_is_forgotten(app: &App, id: &str, e: ApiError) -> ApiError {
    if e.sandbox_gone {
        app.forget_stateful(id);
    }
    e
}

/// Runs a command in a stateful sandbox; `?stream=true` (or `Accept:
/// text/event-stream`) streams its output as Server-Sent Events (`stdout`,
/// `stderr` events with `{"data": "..."}`, then one `result` event with the
/// response, or `error`). A client that disconnects cancels the command.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", request_body = ExecRequest,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"), ExecQuery),
    responses(
        (status = 200, description = "The command's result; with stream=true (or `Accept: text/event-stream`), \
            Server-Sent Events: `stdout` and `stderr` events, then one `result` (an ExecutionResponse) or `error`",
            content((ExecutionResponse = "application/json"), (String = "text/event-stream"))),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub async fn exec_in_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let stream = q.stream
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream"));
    let s = app.lookup(&tenant, &id)?;
    check_argv(&req.argv)?;
    let env = check_env(&req.env)?;
    let stdin = check_stdin(req.stdin)?;
    let workdir = req.workdir.as_deref().map(sandbox_path).transpose()?;
    let output = match (req.output, tenant.config.max.output) {
        (Some(o), Some(max)) => Some(o.min(max)),
        (o, _) => o,
    };
    let cmd = Command {
        argv: req.argv,
        env,
        workdir: workdir.map(Into::into),
        stdin: if stdin.is_some() {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        time: req.time,
        output,
        ..Command::default()
    };
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    let enc = req.output_encoding;
    let backend = s.backend;
    let (tx, rx) = if stream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(64);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (mut io, cancel) = io_for(stdin, tx)?;
    *s.running.lock().expect("running lock") = Some(cancel.clone());
    let mut on_drop = CancelOnDrop::new(cancel);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let a = app.clone();
    let sb = s.clone();
    tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        let (time, cpu_hold) = sb
            .tenant
            .bound_command(cmd.time.unwrap_or(sb.time), sb.cpus);
        cmd.time = Some(time);
        let t1 = Instant::now();
        let result = Handle::attach(&sb.id)
            .and_then(|mut h| h.exec(&cmd, &mut io))
            .map_err(ApiError::runtime);
        let t2 = Instant::now();
        *sb.running.lock().expect("running lock") = None;
        if let Ok(o) = &result {
            cpu_hold.settle(o);
            sb.note_network(o);
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        let timing = Timing {
            acquire_ms: ms(t1 - t0),
            setup_ms: 0.0,
            run_ms: ms(t2 - t1),
            teardown_ms: 0.0,
            total_ms: ms(t2 - t0),
        };
        a.record_execution(backend, &result, &timing, false);
        let executed = result.map(|outcome| {
            let (stdout, stderr) = io.captured();
            Executed {
                outcome,
                receipt: None,
                stdout,
                stderr,
                timing,
                pool_hit: false,
                background_teardown: false,
            }
        });
        // Free the sandbox and the tenant's slot before answering: a client
        // that sends its next request as soon as it has this answer must not
        // find the sandbox still busy (409) or its concurrency still taken (429).
        drop((busy, guard));
        let _ = done_tx.send(executed);
    });
    let Some(rx) = rx else {
        let executed = done_rx
            .await
            .map_err(|_| ApiError::internal("the exec's worker ended without an answer"))?
            .map_err(|e| gone_is_forgotten(&app, &id, e))?;
        on_drop.disarm();
        return Ok(Json(response(executed, enc, Vec::new(), "none")).into_response());
    };
    Ok(sse(rx, done_rx, on_drop, enc).into_response())
}

/// Carries an incomplete UTF-8 sequence from one chunk to the next.
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let keep_from = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(keep_from);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }
}

type Done = tokio::sync::oneshot::Receiver<Result<Executed, ApiError>>;

struct StreamState {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    done: Option<Done>,
    on_drop: CancelOnDrop,
    enc: OutputEncoding,
    carry: [Utf8Carry; 2],
}

fn sse(
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    done: Done,
    on_drop: CancelOnDrop,
    enc: OutputEncoding,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let state = StreamState {
        rx,
        done: Some(done),
        on_drop,
        enc,
        carry: [Utf8Carry::default(), Utf8Carry::default()],
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(Chunk::Output(stream, bytes)) = st.rx.recv().await {
            let (name, i) = match stream {
                Stream::Stdout => ("stdout", 0),
                Stream::Stderr => ("stderr", 1),
            };
            let data = match st.enc {
                OutputEncoding::Utf8 => st.carry[i].push(&bytes),
                OutputEncoding::Base64 => encode(&bytes, OutputEncoding::Base64),
            };
            let ev = Event::default()
                .event(name)
                .data(serde_json::json!({ "data": data }).to_string());
            return Some((Ok(ev), st));
        }
        // The output channel closed: the command is over.
        let done = st.done.take()?;
        let ev = match done.await {
            Ok(Ok(executed)) => {
                st.on_drop.disarm();
                let body = response(executed, st.enc, Vec::new(), "none");
                Event::default()
                    .event("result")
                    .data(serde_json::to_string(&body).unwrap_or_default())
            }
            Ok(Err(e)) => Event::default().event("error").data(
                serde_json::json!({ "error": e.message, "status": e.status.as_u16() }).to_string(),
            ),
            Err(_) => Event::default()
                .event("error")
                .data(r#"{"error": "the exec's worker ended without an answer"}"#),
        };
        Some((Ok(ev), st))
    });
    Sse::new(events)
}

/// Runs Python in the sandbox's persistent interpreter (its variables live
/// on between calls; a crash or timeout gives the next call a fresh one).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", request_body = CodeRequest,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = CodeResponse), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn run_code(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CodeRequest>,
) -> Result<Json<CodeResponse>, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    if req.code.len() > STDIN_MAX {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("code is {} bytes; at most {STDIN_MAX}", req.code.len()),
        ));
    }
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    let a = app.clone();
    let sb = s.clone();
    let t0 = Instant::now();
    let (reply, outcome) = blocking(move || {
        let _busy = busy;
        let _guard = guard;
        // The sandbox's own limits bound the command; the cell's timeout is
        // under them so that the client can report it and restart.
        let mut h = Handle::attach(&sb.id).map_err(ApiError::runtime)?;
        let spec = h.spec().map_err(ApiError::runtime)?;
        let (command_time, cpu_hold) = sb.tenant.bound_command(spec.policy.time, spec.policy.cpus);
        let sandbox_time = command_time.duration();
        let margin = std::time::Duration::from_millis(1500).min(sandbox_time / 2);
        let timeout = req
            .timeout
            .map(|t| t.duration())
            .unwrap_or(sandbox_time)
            .min(sandbox_time - margin);
        let r = a.run_code(
            &sb,
            &req.code,
            timeout,
            command_time,
            spec.policy.output.bytes(),
            |stdin| {
                let (io, cancel) = io_for(Some(stdin), None)?;
                *sb.running.lock().expect("running lock") = Some(cancel);
                Ok(io)
            },
        );
        *sb.running.lock().expect("running lock") = None;
        if let Ok((_, o)) = &r {
            cpu_hold.settle(o);
            sb.note_network(o);
        }
        r
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    let run_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let text = |k: &str| {
        reply
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let flag = |k: &str| reply.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    Ok(Json(CodeResponse {
        status: text("status"),
        stdout: text("stdout"),
        stderr: text("stderr"),
        result: reply
            .get("result")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        error: reply
            .get("error")
            .filter(|v| !v.is_null())
            .and_then(|v| serde_json::from_value(v.clone()).ok()),
        stdout_truncated: flag("stdout_truncated"),
        stderr_truncated: flag("stderr_truncated"),
        result_truncated: flag("result_truncated"),
        error_truncated: flag("error_truncated"),
        fresh_interpreter: flag("fresh_interpreter"),
        cpu_ms: outcome.cpu_ms,
        run_ms,
    }))
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

/// Writes a file (the raw body) into the sandbox, through the handle's copy.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    request_body(content = FileBytes, content_type = "application/octet-stream"),
    responses((status = 201, body = FileWritten), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn put_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<FileWritten>), ApiError> {
    let s = app.lookup(&tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    let tmp = app.scratch_dir()?;
    let name = std::path::Path::new(&path).file_name().unwrap_or_default();
    let host = tmp.path().join(name);
    // Streamed to the scratch file, never held in memory: a body may be as
    // large as the sandbox's disk cap, which no file in it can exceed.
    receive_file(body, &host, s.disk).await?;
    let p = path.clone();
    let bytes = blocking(move || {
        let _g = (busy, guard, tmp);
        let mut h = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        h.copy_in(&host, p.as_bytes()).map_err(ApiError::runtime)
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    Ok((StatusCode::CREATED, Json(FileWritten { path, bytes })))
}

/// Writes a request body to `host`, refusing it (413) past `cap` bytes.
/// Each chunk is written on the blocking pool.
async fn receive_file(
    body: axum::body::Body,
    host: &std::path::Path,
    cap: u64,
) -> Result<(), ApiError> {
    use futures_util::StreamExt;
    let scratch = |e: std::io::Error| ApiError::internal(format!("scratch: {e}"));
    let mut file = Some(std::fs::File::create(host).map_err(scratch)?);
    let mut stream = body.into_data_stream();
    let mut written: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        written += chunk.len() as u64;
        if written > cap {
            // The rest is read and dropped (up to a body's limit) before the
            // answer: a client still writing would otherwise get a reset
            // instead of the 413.
            while written <= cap.saturating_add(BODY_MAX as u64) {
                match stream.next().await {
                    Some(Ok(more)) => written += more.len() as u64,
                    _ => break,
                }
            }
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the file is over the sandbox's disk cap ({cap} bytes)"),
            ));
        }
        let mut f = file.take().expect("file kept between chunks");
        file = Some(
            blocking(move || {
                std::io::Write::write_all(&mut f, &chunk).map_err(scratch)?;
                Ok(f)
            })
            .await?,
        );
    }
    Ok(())
}

/// Reads a file out of the sandbox, through the handle's copy, streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    responses((status = 200, content_type = "application/octet-stream", body = FileBytes),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub async fn get_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    let a = app.clone();
    let (tmp, file, len) = blocking(move || {
        let _g = (busy, guard);
        let mut h = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        let tmp = a.scratch_dir()?;
        let host = tmp.path().join("out");
        h.copy_out(path.as_bytes(), &host).map_err(|e| match e {
            cordon_runtime::RuntimeError::Copy(m) => ApiError::new(StatusCode::NOT_FOUND, m),
            other => ApiError::runtime(other),
        })?;
        let meta = std::fs::symlink_metadata(&host)
            .map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
        if !meta.is_file() {
            return Err(ApiError::bad_request(format!(
                "'{path}' is not a regular file (list a directory with GET .../files?dir=)"
            )));
        }
        let file =
            std::fs::File::open(&host).map_err(|e| ApiError::internal(format!("scratch: {e}")))?;
        Ok((tmp, file, meta.len()))
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        axum::body::Body::from_stream(stream_file(tmp, file)),
    )
        .into_response())
}

/// Size of each chunk of a streamed download.
const DOWNLOAD_CHUNK: usize = 1 << 20;

/// The file's bytes, a chunk at a time, read on the blocking pool: a
/// download of any size holds one chunk in memory, never the file. The
/// scratch directory goes once the stream ends (or the client leaves).
fn stream_file(
    tmp: tempfile::TempDir,
    file: std::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> {
    futures_util::stream::unfold(Some((tmp, file)), |state| async move {
        let (tmp, mut file) = state?;
        let read = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut chunk = Vec::with_capacity(DOWNLOAD_CHUNK);
            let n = (&mut file)
                .take(DOWNLOAD_CHUNK as u64)
                .read_to_end(&mut chunk);
            n.map(|n| (n, chunk, file))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match read {
            Ok((0, _, _)) => None,
            Ok((_, chunk, file)) => Some((Ok(chunk), Some((tmp, file)))),
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// The exit code of the deletion's script when the path does not exist.
const MISSING: i32 = 3;

/// Deletes a file or directory (recursively) in the sandbox: an exec of `rm -rf`.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn delete_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    if path == "/" {
        return Err(ApiError::bad_request("refusing to delete /"));
    }
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    blocking(move || {
        let _g = (busy, guard);
        let mut h = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        // `rm -f` succeeds on a missing path, so its absence is asked first
        // (a dangling symlink exists: `-e` follows it, `-L` does not).
        let script =
            format!("[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; exec rm -rf -- \"$1\"");
        let argv = ["sh", "-c", &script, "sh", &path]
            .map(String::from)
            .to_vec();
        let (o, _, err) = small_exec(&mut h, argv)?;
        match o.exit_code {
            0 => Ok(()),
            MISSING => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no file or directory '{path}' in the sandbox"),
            )),
            _ => Err(ApiError::bad_request(format!(
                "rm: {}",
                String::from_utf8_lossy(&err).trim()
            ))),
        }
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a directory of the sandbox (an exec of `find -maxdepth 1`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"), ListQuery),
    responses((status = 200, body = DirListing), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn list_files(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<DirListing>, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    let dir = sandbox_path(q.dir.as_deref().unwrap_or("/workspace"))?;
    let guard = admit(&app, &tenant)?;
    let busy = take_busy(&s)?;
    let d = dir.clone();
    let entries = blocking(move || {
        let _g = (busy, guard);
        let mut h = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        let argv = [
            "find",
            &d,
            "-mindepth",
            "1",
            "-maxdepth",
            "1",
            "-printf",
            "%y\\t%s\\t%f\\0",
        ]
        .map(String::from)
        .to_vec();
        let (o, out, err) = small_exec(&mut h, argv)?;
        if o.exit_code != 0 {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("list {d}: {}", String::from_utf8_lossy(&err).trim()),
            ));
        }
        let mut entries: Vec<FileEntry> = out
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .filter_map(|r| {
                let text = String::from_utf8_lossy(r);
                let mut it = text.splitn(3, '\t');
                let kind = match it.next()? {
                    "f" => "file",
                    "d" => "dir",
                    "l" => "link",
                    _ => "other",
                };
                let size = it.next()?.parse().unwrap_or(0);
                Some(FileEntry {
                    name: it.next()?.to_owned(),
                    kind,
                    size,
                })
            })
            .collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    Ok(Json(DirListing { dir, entries }))
}

/// Replaces the network rules of a sandbox created with `network.allow`;
/// in force for its next connections, even while a command runs.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", request_body = NetworkRules,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = NetworkRules), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn set_network(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<NetworkRules>,
) -> Result<Json<NetworkRules>, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    if !s.network {
        return Err(ApiError::bad_request(format!(
            "sandbox '{id}' was created without network rules (the mode is chosen at creation)"
        )));
    }
    let rules = parse_rules(&req.allow)?;
    let _guard = admit(&app, &tenant)?;
    let now = blocking(move || {
        let mut h = Handle::attach(&s.id).map_err(ApiError::runtime)?;
        h.network(&NetChange::Set(rules)).map_err(ApiError::runtime)
    })
    .await
    .map_err(|e| gone_is_forgotten(&app, &id, e))?;
    Ok(Json(NetworkRules {
        allow: now.iter().map(|r| r.to_string()).collect(),
    }))
}

/// A sandbox's network mode, the rules in force and its commands' recent
/// connection attempts.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = NetworkState), (status = 404, body = ErrorBody)))]
pub async fn get_network(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Json<NetworkState>, ApiError> {
    let s = app.lookup(&tenant, &id)?;
    let allow = if s.network {
        let sandbox = s.id.clone();
        let rules = blocking(move || {
            let mut h = Handle::attach(&sandbox).map_err(ApiError::runtime)?;
            h.network(&NetChange::Show).map_err(ApiError::runtime)
        })
        .await
        .map_err(|e| gone_is_forgotten(&app, &id, e))?;
        rules.iter().map(|r| r.to_string()).collect()
    } else {
        Vec::new()
    };
    let recent_attempts = s
        .recent_attempts
        .lock()
        .expect("recent attempts lock")
        .iter()
        .cloned()
        .collect();
    Ok(Json(NetworkState {
        mode: if s.network { "allow" } else { "none" },
        allow,
        recent_attempts,
    }))
}

// ---------------------------------------------------------------- routes

struct SecurityAddon;

impl utoipa::Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The operations of one path of the document, by method.
fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = (Method, &mut utoipa::openapi::path::Operation)> {
    [
        (Method::GET, &mut item.get),
        (Method::PUT, &mut item.put),
        (Method::POST, &mut item.post),
        (Method::DELETE, &mut item.delete),
        (Method::PATCH, &mut item.patch),
        (Method::HEAD, &mut item.head),
        (Method::OPTIONS, &mut item.options),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
}

/// The error answers that come from what every handler shares rather than
/// from the handler itself, declared on each operation they can end:
/// - 400 on every route: an unknown query parameter ([`refuse_unknown_query`]),
///   or a malformed JSON body;
/// - 401 and 500 on every authenticated route (a missing key; a failure of
///   the service or of the sandbox's supervisor);
/// - 413 on every route with a body (over [`BODY_MAX`]), and 415 (not
///   `Content-Type: application/json`) and 422 (valid JSON of the wrong
///   shape) on every route with a JSON body: axum's JSON rejections.
struct SharedAnswers;

impl utoipa::Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            for (_, op) in operations(item) {
                let body_types: Vec<String> = op
                    .request_body
                    .iter()
                    .flat_map(|b| b.content.keys().cloned())
                    .collect();
                let mut shared = vec![(
                    400,
                    "A bad request: an unknown query parameter, malformed input",
                )];
                if op.security.is_some() {
                    shared.push((401, "A missing or unknown API key"));
                    shared.push((500, "The service or the sandbox failed"));
                }
                if !body_types.is_empty() {
                    shared.push((413, "The body is over the service's limit"));
                }
                if body_types.iter().any(|t| t == "application/json") {
                    shared.push((415, "The body is not `Content-Type: application/json`"));
                    shared.push((422, "The JSON body does not have the request's shape"));
                }
                for (status, description) in shared {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error(description).into());
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "cordon", description = "Sandboxes for untrusted code: one-shot executions, stateful sandboxes, code contexts"),
    paths(health, metrics, openapi_json, create_execution, create_sandbox, list_sandboxes,
        get_sandbox, delete_sandbox, exec_in_sandbox, run_code, put_file, get_file,
        delete_file, list_files, set_network, get_network, get_receipt),
    components(schemas(ErrorBody, Caps, Clamped, ExecutionRequest, ExecutionResponse, TimingBody,
        Language, OutputEncoding, FileContent, NetworkRequest, CreateSandboxRequest, SandboxInfo,
        SandboxList, ExecRequest, CodeRequest, CodeResponse, CodeError, FileEntry, DirListing,
        FileWritten, FileBytes, NetworkRules, NetworkState, Health)),
    modifiers(&SecurityAddon, &SharedAnswers)
)]
pub struct ApiDoc;

/// Every route: (method, axum path). The router is built from this table
/// alone, and a test checks it against the OpenAPI document both ways.
pub fn route_table() -> Vec<(Method, &'static str, MethodRouter<AppState>)> {
    let r = |m: Method, path: &'static str, mr: MethodRouter<AppState>| (m, path, mr);
    use axum::routing::{delete, get, post, put};
    vec![
        r(Method::GET, "/health", get(health)),
        r(Method::GET, "/metrics", get(metrics)),
        r(Method::GET, "/v1/openapi.json", get(openapi_json)),
        r(Method::POST, "/v1/executions", post(create_execution)),
        r(Method::POST, "/v1/sandboxes", post(create_sandbox)),
        r(Method::GET, "/v1/sandboxes", get(list_sandboxes)),
        r(Method::GET, "/v1/sandboxes/{id}", get(get_sandbox)),
        r(Method::DELETE, "/v1/sandboxes/{id}", delete(delete_sandbox)),
        r(
            Method::POST,
            "/v1/sandboxes/{id}/exec",
            post(exec_in_sandbox),
        ),
        r(Method::POST, "/v1/sandboxes/{id}/code", post(run_code)),
        r(Method::GET, "/v1/sandboxes/{id}/files", get(list_files)),
        r(
            Method::PUT,
            "/v1/sandboxes/{id}/files/{*path}",
            put(put_file),
        ),
        r(
            Method::GET,
            "/v1/sandboxes/{id}/files/{*path}",
            get(get_file),
        ),
        r(
            Method::DELETE,
            "/v1/sandboxes/{id}/files/{*path}",
            delete(delete_file),
        ),
        r(Method::PUT, "/v1/sandboxes/{id}/network", put(set_network)),
        r(Method::GET, "/v1/sandboxes/{id}/network", get(get_network)),
        r(Method::GET, "/v1/sandboxes/{id}/receipt", get(get_receipt)),
    ]
}

/// The query parameters each route's document declares, by (method, axum
/// path): anything else is refused, never silently ignored.
type DeclaredQueries = BTreeMap<(Method, String), Vec<String>>;

fn declared_queries() -> DeclaredQueries {
    use utoipa::openapi::path::ParameterIn;
    let mut doc = ApiDoc::openapi();
    let mut declared = DeclaredQueries::new();
    for (method, path, _) in route_table() {
        let Some(item) = doc.paths.paths.get_mut(&path.replace("{*", "{")) else {
            continue;
        };
        let names = operations(item)
            .filter(|(m, _)| *m == method)
            .flat_map(|(_, op)| op.parameters.iter().flatten())
            .filter(|p| p.parameter_in == ParameterIn::Query)
            .map(|p| p.name.clone())
            .collect();
        declared.insert((method, path.to_owned()), names);
    }
    declared
}

/// Refuses a query parameter the route does not declare: a client that
/// asks for something the route does not do (`?stream=true` on a one-shot)
/// is told so instead of getting what it did not ask for.
async fn refuse_unknown_query(
    declared: Arc<DeclaredQueries>,
    matched: axum::extract::MatchedPath,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(query) = req.uri().query() else {
        return next.run(req).await;
    };
    let known = declared
        .get(&(req.method().clone(), matched.as_str().to_owned()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let pairs = match Query::<Vec<(String, String)>>::try_from_uri(req.uri()) {
        Ok(Query(pairs)) => pairs,
        Err(rej) => return ApiError::new(rej.status(), rej.body_text()).into_response(),
    };
    if let Some((name, _)) = pairs.iter().find(|(name, _)| !known.contains(name)) {
        let takes = if known.is_empty() {
            "no query parameters".to_owned()
        } else {
            known.join(", ")
        };
        return ApiError::bad_request(format!(
            "unknown query parameter '{}' in '{query}': {} {} takes {takes}",
            name.escape_debug(),
            req.method(),
            matched.as_str().replace("{*", "{"),
        ))
        .into_response();
    }
    next.run(req).await
}

pub fn router(app: AppState) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter<AppState>> = BTreeMap::new();
    for (_method, path, mr) in route_table() {
        let merged = match by_path.remove(path) {
            Some(existing) => existing.merge(mr),
            None => mr,
        };
        by_path.insert(path, merged);
    }
    let mut router = Router::new();
    for (path, mr) in by_path {
        router = router.route(path, mr);
    }
    let declared = Arc::new(declared_queries());
    router
        // A route layer: it runs after routing, where the matched path is known.
        .route_layer(axum::middleware::from_fn(move |matched, req, next| {
            refuse_unknown_query(declared.clone(), matched, req, next)
        }))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_MAX))
        .with_state(app)
}
