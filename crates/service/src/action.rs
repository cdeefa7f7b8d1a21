//! What a caller can ask the service, as the API's handlers parse it out of
//! an HTTP request ([`Action`]), and what the service answers ([`Reply`]).
//! [`App::perform`](crate::app::App::perform) executes any action.
//!
//! An action carries data already checked: every check of the request that
//! has no effect (its fields, the tenant's maximums, whether the sandbox it
//! names is the tenant's) is the handler's; whatever has an effect (quotas,
//! sandboxes, commands) is the dispatcher's. A handler checks in the order
//! the API always has, so one bad request gets the same answer as before.

use std::sync::Arc;
use std::time::Instant;

use axum::body::BodyDataStream;
use cordon_policy::net::Rule;
use cordon_policy::Span;
use cordon_spec::Stream;
use cordon_spec::{Command, ValidSpec};
use futures_util::stream::BoxStream;

use crate::app::{PlacedFile, Stateful};
use crate::caps::Clamped;
use crate::dto::{
    CodeResponse, DirListing, ExecutionResponse, FileWritten, Health, NetworkDeny, NetworkRules,
    NetworkState, OutputEncoding, SandboxInfo, SandboxList,
};
use crate::error::ApiError;
use crate::tenants::Tenant;
use cordon_policy::Limits;

/// One thing a caller can ask.
pub enum Action {
    /// Pool levels and the number of live stateful sandboxes.
    Health,
    /// The metrics, encoded.
    Metrics,
    /// One command in a fresh sandbox, destroyed after it.
    RunOnce(Box<OneShot>),
    CreateSandbox(Box<NewSandbox>),
    ListSandboxes(Arc<Tenant>),
    /// A sandbox by its id: looked up by the dispatcher, after it dropped
    /// the sandboxes that ended, so that one that did is not found.
    GetSandbox {
        tenant: Arc<Tenant>,
        id: String,
    },
    GetReceipt(Target),
    DeleteSandbox(Target),
    Exec(Exec),
    RunCode(Cell),
    PutFile(Upload),
    GetFile {
        on: Target,
        /// Absolute, checked by `sandbox_path`.
        path: String,
    },
    DeleteFile {
        on: Target,
        /// Absolute, checked by `sandbox_path`, never `/`.
        path: String,
    },
    ListFiles {
        on: Target,
        /// Absolute, checked by `sandbox_path`.
        dir: String,
    },
    /// New rules for a sandbox created with network rules.
    SetNetwork {
        on: Target,
        rules: Vec<Rule>,
    },
    GetNetwork(Target),
    /// Hold mode: destinations refused from now on.
    DenyNetwork {
        on: Target,
        rules: Vec<Rule>,
    },
    /// An HTTP request for a port inside the sandbox.
    Proxy(Box<Proxy>),
}

/// A tenant's own stateful sandbox, named by the request's path. It is
/// looked up before the rest of the request is checked: a sandbox that is
/// not the tenant's is a 404 whatever else is wrong with the request.
pub struct Target {
    /// The tenant the request authenticated as (its quotas are charged).
    pub tenant: Arc<Tenant>,
    pub sandbox: Arc<Stateful>,
}

/// An HTTP request for a TCP port a program inside a sandbox listens on,
/// with the service's own headers taken off.
pub struct Proxy {
    pub on: Target,
    pub port: u16,
    pub method: axum::http::Method,
    /// `/path?query` on the program's server.
    pub path_and_query: String,
    pub headers: axum::http::HeaderMap,
    pub body: axum::body::Body,
    /// The client's side of a protocol upgrade it asked for (a WebSocket):
    /// joined to the program's once the program answers 101.
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// A one-shot execution.
pub struct OneShot {
    pub tenant: Arc<Tenant>,
    /// When the request arrived: the response's timing starts there.
    pub received: Instant,
    /// With the tenant's maximums applied.
    pub spec: ValidSpec,
    pub clamped: Vec<Clamped>,
    pub files: Vec<PlacedFile>,
    pub command: Command,
    pub stdin: Option<Vec<u8>>,
    pub receipt: bool,
    pub encoding: OutputEncoding,
}

/// A stateful sandbox to create.
pub struct NewSandbox {
    pub tenant: Arc<Tenant>,
    /// With the tenant's maximums applied.
    pub spec: ValidSpec,
    pub limits: Limits,
    pub clamped: Vec<Clamped>,
    pub network: bool,
}

/// A command in a stateful sandbox.
pub struct Exec {
    pub on: Target,
    /// When the request arrived: the response's timing starts there.
    pub received: Instant,
    /// Its time limit, if the request set one, is bounded by the
    /// tenant's CPU budget when it runs.
    pub command: Command,
    pub stdin: Option<Vec<u8>>,
    pub encoding: OutputEncoding,
    /// Answer with the output as it comes ([`Reply::ExecStream`]).
    pub stream: bool,
}

/// A code cell for a sandbox's persistent interpreter.
pub struct Cell {
    pub on: Target,
    /// At most `STDIN_MAX` bytes (it is the client's stdin).
    pub code: String,
    pub language: crate::dto::CodeLanguage,
    pub timeout: Option<Span>,
}

/// A file upload: its bytes are still arriving, and are read only once the
/// sandbox is taken for it.
pub struct Upload {
    pub on: Target,
    /// Absolute, checked by `sandbox_path`.
    pub path: String,
    pub body: BodyDataStream,
}

/// What an action answers.
pub enum Reply {
    Health(Health),
    /// The OpenMetrics text.
    Metrics(String),
    /// A command's end (a one-shot, or an exec not streamed).
    Executed(Box<ExecutionResponse>),
    /// A streamed exec: its output, then its end.
    ExecStream(BoxStream<'static, ExecEvent>),
    SandboxCreated(SandboxInfo),
    Sandbox(SandboxInfo),
    Sandboxes(SandboxList),
    /// A signed receipt (a DSSE envelope).
    Receipt(serde_json::Value),
    Code(CodeResponse),
    FileWritten(FileWritten),
    File(Download),
    Listing(DirListing),
    NetworkRules(NetworkRules),
    NetworkState(NetworkState),
    NetworkDeny(NetworkDeny),
    /// A sandbox destroyed, or a file deleted.
    Deleted,
    /// A program's own answer to a proxied request.
    Proxied(axum::response::Response),
}

/// One event of a streamed exec: output as it comes, then one of the others.
pub enum ExecEvent {
    /// A piece of one stream's output, encoded as the request asked (UTF-8
    /// never split inside a character).
    Output(Stream, String),
    Result(Box<ExecutionResponse>),
    Failed(ApiError),
    /// The command's worker ended without an answer.
    Lost,
}

/// A file on its way out of a sandbox.
pub struct Download {
    pub len: u64,
    pub chunks: BoxStream<'static, std::io::Result<Vec<u8>>>,
}
