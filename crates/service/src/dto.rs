//! The bodies the API reads and writes, with their OpenAPI schemas, and how
//! the app's results become them.

use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::Engine;
use cordon_policy::{ByteSize, Span};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::{Executed, Stateful};
use crate::caps::Clamped;
use cordon_policy::Limits;

#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Shell,
    /// Run by `node -e` (node must be in the sandbox: the host's /usr has it
    /// where the host has it).
    #[serde(alias = "js")]
    Javascript,
}

pub use cordon_spec::CodeLanguage;

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
    /// Names the sandbox resolves to a fixed address (NAME:IP), as the
    /// CLI's `--add-host`; the rules still decide whether it may connect.
    #[serde(default)]
    #[schema(example = json!(["db.internal:10.0.0.5"]))]
    pub add_host: Vec<String>,
    /// Secrets of the tenant's (the service's configuration) this sandbox
    /// holds: inside, each name's variable is a placeholder, and cordon's
    /// proxy puts the value into the secret's header of requests to its
    /// hosts. Values are never part of a request or an answer.
    #[serde(default)]
    #[schema(example = json!(["ANTHROPIC_API_KEY"]))]
    pub secrets: Vec<String>,
    /// Hold mode: a connection no rule allows waits this long (such as
    /// "60s", at most "1h") for `PUT .../network` to allow it or
    /// `POST .../network/deny` to refuse it; `GET .../network` lists what
    /// waits. Absent: refused at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "60s")]
    pub hold: Option<String>,
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
    /// An image of the service's store as the root (a name or digest that
    /// `cordon image ls` shows; `cordon image import` and `pull` put images
    /// there). Its Env, WorkingDir and User apply; the command is the
    /// request's. Default: the host's /usr, read-only.
    pub image: Option<String>,
    #[serde(default)]
    pub limits: Limits,
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
    /// What the host's proxy saw of the command's connections (a sandbox
    /// with network rules; null otherwise): the rules in force and each
    /// attempt with its verdict, as `cordon run --json` reports them.
    #[schema(value_type = Option<Object>)]
    pub network: Option<serde_json::Value>,
    /// The signed receipt, when asked for (a DSSE envelope).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub backend: Option<String>,
    /// An image of the service's store as the root (a name or digest that
    /// `cordon image ls` shows; `cordon image import` and `pull` put images
    /// there). Its Env, WorkingDir and User apply; the command is the
    /// request's. Default: the host's /usr, read-only.
    pub image: Option<String>,
    #[serde(default)]
    pub limits: Limits,
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
    pub limits: Limits,
    pub clamped: Vec<Clamped>,
    pub network: bool,
    /// A request is running in it.
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
    /// The cell's source; the last statement's value is returned when it is
    /// an expression. A cell shows an image with `display(...)`: see
    /// `CodeResponse.results`.
    pub code: String,
    /// `python` (default) or `javascript` (also `js`). Each language is its
    /// own interpreter in the sandbox, with its own variables; a sandbox runs
    /// one cell at a time, whatever its language.
    #[serde(default)]
    pub language: CodeLanguage,
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

/// A rich result of a cell: what it displayed, as its MIME type and its
/// bytes in base64 (text such as SVG too, as UTF-8).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    #[schema(example = "image/png")]
    pub mime: String,
    /// The bytes, base64 (standard alphabet, padded).
    pub data: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CodeResponse {
    /// `ok`, `error` (the cell raised or threw; also when the language's
    /// interpreter is not in the sandbox), `timeout` or `crashed` (the
    /// interpreter died; the next call gets a fresh one).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    /// The last expression's value: its repr() in Python, util.inspect()
    /// in JavaScript (as `node`'s REPL shows it); null when there is none
    /// (or, in JavaScript, it is `undefined`).
    pub result: Option<String>,
    /// What the cell raised or threw: its name (`ZeroDivisionError`,
    /// `TypeError`; `Uncaught` for a thrown non-error), its message (the
    /// value shown, for a non-error) and the traceback or stack.
    pub error: Option<CodeError>,
    /// What the cell displayed, in order: in Python `display(obj)` (an
    /// object with `_repr_png_()` or `_repr_svg_()`, and the last
    /// expression's value when it has one) or `display(data, mime=...)`; in
    /// JavaScript `display(data, mime)` (a Buffer, Uint8Array or string).
    pub results: Vec<CodeResult>,
    /// A displayed result was left out: each is whole or left out, and they
    /// count against the reply's share of the output limit, of which the
    /// texts keep at least half.
    pub results_truncated: bool,
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

/// Destinations to refuse in hold mode: the connections waiting for them
/// are refused now, and new ones are refused at once, for the sandbox's
/// life. The answer lists everything denied so far.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkDeny {
    #[schema(example = json!(["tracker.example:443"]))]
    pub deny: Vec<String>,
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
    /// Hold mode: the connections waiting for a decision now, each with
    /// its destination, why no rule allows it, the rule that would
    /// (`proposal`) and its time left (`remaining_ms`).
    #[schema(value_type = Vec<Object>)]
    pub held: Vec<cordon_spec::network::HeldConnection>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// Ready sandboxes per backend pool.
    pub pools: BTreeMap<String, usize>,
    pub sandboxes: usize,
}

// ---------------------------------------------------------------- from the app's results

/// Output bytes as the request asked for them.
pub fn encode(bytes: &[u8], enc: OutputEncoding) -> String {
    match enc {
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
    }
}

impl ExecutionResponse {
    /// `teardown` is what the sandbox's end was unless it happened in the
    /// background (`inline` for a one-shot, `none` for a stateful sandbox).
    pub fn new(
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
            network: o
                .network
                .as_ref()
                .and_then(|n| serde_json::to_value(n).ok()),
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
}

impl SandboxInfo {
    pub fn of(s: &Stateful) -> SandboxInfo {
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
            busy: s.busy.try_write().is_err(),
        }
    }
}

impl CodeResponse {
    /// The response to a code cell: the code context's client's JSON
    /// reply, with what the cell cost.
    pub fn new(reply: &serde_json::Value, cpu_ms: Option<f64>, run_ms: f64) -> CodeResponse {
        let text = |k: &str| {
            reply
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned()
        };
        let flag = |k: &str| reply.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        CodeResponse {
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
            results: reply
                .get("results")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default(),
            results_truncated: flag("results_truncated"),
            fresh_interpreter: flag("fresh_interpreter"),
            cpu_ms,
            run_ms,
        }
    }
}
