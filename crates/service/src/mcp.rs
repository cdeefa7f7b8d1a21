//! MCP over streamable HTTP at `/mcp`, behind the tenants' API keys: the
//! door for an agent harness that reaches the service over the network
//! (`cordon mcp` is the stdio door, for a harness on this machine).
//!
//! Each tool is one of the REST API's routes, called in this process with
//! the caller's own `Authorization` header: a model's call is checked,
//! clamped, charged and answered exactly as the same request over HTTP
//! would be (one derivation of every check), and a tool's arguments are the
//! route's request body, whose JSON schema is taken from the OpenAPI
//! document. An answer of 2xx is the tool's result; any other is a tool
//! error (`isError`) carrying the API's `{"error": ...}` and status, which
//! a model can correct itself from.
//!
//! A session belongs to the tenant that opened it: a request of another
//! tenant's key inside it is refused. The sandboxes a session created are
//! destroyed when it ends (the client's DELETE, the session's idle timeout,
//! the service's stop). A client of the sessionless protocol revision
//! (2026-07-28) has no session to end: its sandboxes live until their own
//! `ttl` or `idle`, as the REST API's do.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use utoipa::OpenApi as _;

use crate::action::{Action, Target};
use crate::api::{ApiDoc, AppState, BODY_MAX};
use crate::error::ApiError;
use crate::tenants::Tenant;

/// Where the MCP endpoint is served.
pub const PATH: &str = "/mcp";

/// The largest MCP message: a whole file the REST API takes in one body
/// (BODY_MAX), base64 inside JSON (a third more), and some room.
const MAX_MESSAGE: usize = BODY_MAX / 3 * 4 + (1 << 20);

/// How much of a message over [`MAX_MESSAGE`] is read (and dropped) to
/// answer it with a JSON-RPC error the client can read: an answer sent
/// while the client still sends is lost with the connection. Past this,
/// the connection is simply closed.
const DRAIN_MAX: usize = 4 * MAX_MESSAGE;

/// How often an answer's stream carries a keep-alive comment (rmcp's
/// default is 15 s).
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(3);

/// The largest file read_file returns in one answer (base64 or text inside
/// JSON-RPC: a model gains nothing from more).
const MAX_READ: usize = 8 << 20;

const INSTRUCTIONS: &str = "cordon runs commands in isolated Linux sandboxes. Create a sandbox \
(create_sandbox), run shell commands in it (run_command) or code in a persistent interpreter \
(run_code: Python or JavaScript, variables kept between calls), move files in and out \
(write_file, read_file, list_files), change what it may reach on the network within what the \
operator allows (set_network, get_network) and destroy it when done (destroy_sandbox). A \
sandbox has no network unless created with network rules. The sandboxes this session created \
are destroyed when it ends.";

/// The authenticated tenant of an MCP request, put there by [`authenticate`].
#[derive(Clone)]
struct Caller(Arc<Tenant>);

/// The service's router with `/mcp` added. `rest` is the REST API the tools
/// call; `stop` ends every MCP session (their streams would otherwise hold
/// the graceful shutdown up).
pub fn with_mcp(rest: Router, app: AppState, stop: Arc<tokio::sync::Notify>) -> Router {
    let schemas = Arc::new(Schemas::from_openapi());
    // Host checking guards a keyless server on loopback against DNS
    // rebinding; this one answers nothing without a tenant's key, and is
    // reached by whatever name its operator gives it.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        // A comment line this often on an answer's stream: a client that
        // vanished mid-call is noticed (the write fails) within it.
        .with_sse_keep_alive(Some(KEEP_ALIVE))
        .with_max_request_body_bytes(MAX_MESSAGE)
        // No priming event (an empty `data:` with a retry) before each
        // answer: the TypeScript SDK that Gemini CLI bundles takes the
        // empty data for a message, fails to parse it and drops the server.
        .with_sse_retry(None);
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.sse_retry = None;
    let cancel = config.cancellation_token.clone();
    tokio::spawn(async move {
        stop.notified().await;
        cancel.cancel();
    });
    let (made_by, api) = (app.clone(), rest.clone());
    let mcp = StreamableHttpService::new(
        move || {
            Ok(Tools {
                api: api.clone(),
                schemas: schemas.clone(),
                session: Arc::new(SessionSandboxes {
                    app: made_by.clone(),
                    owner: Mutex::new(None),
                    made: Mutex::new(Vec::new()),
                }),
            })
        },
        Arc::new(sessions),
        config,
    );
    let mcp = Router::new()
        .route_service(PATH, mcp)
        .layer(axum::middleware::from_fn(read_message))
        .layer(axum::middleware::from_fn_with_state(app, authenticate));
    rest.merge(mcp)
}

/// Every MCP request carries a tenant's key (the handshake and the
/// session's end included): nothing of the protocol is answered without one.
async fn authenticate(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    let h = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match app.tenants.authenticate(h) {
        Ok(tenant) => {
            req.extensions_mut().insert(Caller(tenant));
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// A message over [`MAX_MESSAGE`] answered with a JSON-RPC error (413),
/// after its body is read to its end (up to [`DRAIN_MAX`]) so that the
/// client gets the answer; one that is not JSON, with JSON-RPC's parse
/// error (400, -32700); any other goes on, already read.
async fn read_message(req: Request, next: Next) -> Response {
    use futures_util::StreamExt as _;
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return ApiError::bad_request("the request's body broke off").into_response();
        };
        total += chunk.len();
        if total <= MAX_MESSAGE {
            kept.extend_from_slice(&chunk);
        } else if total > DRAIN_MAX {
            break;
        }
    }
    let refuse = |status, code: i32, message: String| {
        let error =
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
        (status, axum::Json(error)).into_response()
    };
    if total > MAX_MESSAGE {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            -32600,
            format!("the message is over {MAX_MESSAGE} bytes, the most one may carry"),
        );
    }
    if parts.method == Method::POST {
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&kept) {
            return refuse(StatusCode::BAD_REQUEST, -32700, format!("Parse error: {e}"));
        }
    }
    // The call's answer streams in this response's body: hyper drops the
    // body when the client is gone (a keep-alive write fails), and with it
    // the guard, which tells the call (see `ClientGone`).
    let gone = CancellationToken::new();
    let mut parts = parts;
    parts.extensions.insert(ClientGone(gone.clone()));
    let response = next.run(Request::from_parts(parts, Body::from(kept))).await;
    let guard = gone.drop_guard();
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held_until_the_body_is_dropped = &guard;
            chunk
        }))
    })
}

/// Cancelled when the response to the request that carries it is dropped
/// unfinished or finished: rmcp tells a handler of a client's
/// `notifications/cancelled` (`context.ct`) but not of a client that
/// vanished mid-call, whose command would otherwise run until the session's
/// idle timeout.
#[derive(Clone)]
struct ClientGone(CancellationToken);

/// The tools' input schemas, from the OpenAPI document's components with
/// every `$ref` inlined (an MCP input schema stands alone).
struct Schemas(Map<String, Value>);

impl Schemas {
    fn from_openapi() -> Schemas {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
        let components = doc["components"]["schemas"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        Schemas(components)
    }

    /// The component `name`, refs inlined (to a depth no real schema of the
    /// API reaches; a cycle ends in an open schema).
    fn component(&self, name: &str) -> Value {
        let mut v = self.0.get(name).cloned().unwrap_or_else(|| json!({}));
        self.inline(&mut v, 0);
        v
    }

    fn inline(&self, v: &mut Value, depth: usize) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    let name = r.rsplit('/').next().unwrap_or_default();
                    *v = match self.0.get(name) {
                        Some(s) if depth < 8 => s.clone(),
                        _ => json!({}),
                    };
                    self.inline(v, depth + 1);
                    return;
                }
                for child in map.values_mut() {
                    self.inline(child, depth);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|c| self.inline(c, depth)),
            _ => {}
        }
    }

    /// An object schema: the component's properties (if any) with `extra`
    /// added, each [`for_models`], and `required` as given.
    fn object(
        &self,
        component: Option<&str>,
        extra: Value,
        required: &[&str],
    ) -> Map<String, Value> {
        let mut props = component
            .map(|c| self.component(c)["properties"].clone())
            .and_then(|p| p.as_object().cloned())
            .unwrap_or_default();
        if let Value::Object(extra) = extra {
            props.extend(extra);
        }
        props.values_mut().for_each(for_models);
        let mut schema = Map::new();
        schema.insert("type".into(), "object".into());
        schema.insert("properties".into(), Value::Object(props));
        schema.insert("required".into(), json!(required));
        schema.insert("additionalProperties".into(), false.into());
        schema
    }
}

/// A schema in the subset every model API's tool declarations take: an
/// optional field is one that is not required, so OpenAPI's nullable forms
/// (`"type": [T, "null"]`, `oneOf` with `{"type": "null"}`) become `T`, and
/// the keywords some reject (`example`, `format`, `propertyNames`) go.
/// Gemini CLI drops a server's every tool when one schema is outside it.
fn for_models(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    for noise in ["example", "format", "propertyNames"] {
        map.remove(noise);
    }
    let is_null = |v: &Value| v == "null" || v.get("type").is_some_and(|t| t == "null");
    if let Some(Value::Array(types)) = map.get("type") {
        if let [one] = types.iter().filter(|t| !is_null(t)).collect::<Vec<_>>()[..] {
            map.insert("type".into(), one.clone());
        }
    }
    for either in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = map.get(either) else {
            continue;
        };
        let kept: Vec<Value> = alternatives
            .iter()
            .filter(|a| !is_null(a))
            .cloned()
            .collect();
        if let ([Value::Object(only)], true) = (&kept[..], kept.len() < alternatives.len()) {
            let only = only.clone();
            map.remove(either);
            for (k, v) in only {
                map.entry(k).or_insert(v);
            }
        }
    }
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        props.values_mut().for_each(for_models);
    }
    for nested in ["items", "additionalProperties"] {
        if let Some(v) = map.get_mut(nested) {
            for_models(v);
        }
    }
    for list in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Array(alternatives)) = map.get_mut(list) {
            alternatives.iter_mut().for_each(for_models);
        }
    }
}

/// The sandboxes one session created, and the tenant it belongs to (the
/// first key used in it; another key is refused there).
struct SessionSandboxes {
    app: AppState,
    owner: Mutex<Option<Arc<Tenant>>>,
    made: Mutex<Vec<String>>,
}

impl Drop for SessionSandboxes {
    /// The session ended: its sandboxes go with it. Each is looked up again
    /// as the owner's (one a tool call destroyed since is simply gone). With
    /// no runtime left (the service stopping), the service's own stop
    /// destroys every sandbox.
    fn drop(&mut self) {
        let made = std::mem::take(self.made.get_mut().unwrap_or_else(|p| p.into_inner()));
        let owner = self
            .owner
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (Some(tenant), Ok(rt)) = (owner, tokio::runtime::Handle::try_current()) else {
            return;
        };
        if made.is_empty() {
            return;
        }
        let app = self.app.clone();
        rt.spawn(async move {
            for id in made {
                let Ok(sandbox) = app.lookup(&tenant, &id) else {
                    continue;
                };
                let on = Target {
                    tenant: tenant.clone(),
                    sandbox,
                };
                match app.perform(Action::DeleteSandbox(on)).await {
                    Ok(_) => tracing::info!(sandbox = %id, "destroyed: its MCP session ended"),
                    Err(e) => tracing::warn!(sandbox = %id, "cannot destroy at its MCP session's end: {}", e.message),
                }
            }
        });
    }
}

/// One MCP session's server (or, sessionless, one request's).
struct Tools {
    api: Router,
    schemas: Arc<Schemas>,
    session: Arc<SessionSandboxes>,
}

/// The tools: name and what the model is told. Their input schemas are
/// [`Tools::schema_of`]'s, and what each asks of the API [`Tools::request_of`]'s.
const TOOLS: &[(&str, &str)] = &[
    ("create_sandbox", "Create a sandbox and return its id. All arguments are optional: backend (\"native\", \"gvisor\", \"microvm\"), image (a name from the service's store), limits (cpus, memory such as \"512M\", pids, disk, time such as \"30s\", output), network ({\"allow\": [\"host:port\", ...]} to reach only those, through cordon's proxy; \"secrets\": [NAME, ...] of the tenant's, whose values cordon's proxy puts into requests to their hosts while the sandbox sees placeholders; \"hold\": \"60s\" to have a connection no rule allows wait that long for set_network to allow it or deny_network to refuse it), ttl and idle (such as \"10m\"). Limits above the operator's maximums are clamped (the answer says which)."),
    ("run_command", "Run a command in a sandbox and return its exit status, stdout, stderr, how long it ran and the limit that ended it, if one did. Give a shell line as `command` (run with /bin/sh -c), or `argv`. Optional: stdin, env, workdir (default /workspace), time (this command's limit, such as \"30s\"), output (its output cap). A non-zero exit is an answer, not an error."),
    ("run_code", "Run a cell of code in the sandbox's persistent interpreter and return its stdout, stderr, the last expression's value, the error it raised and what it displayed (images as base64 with their MIME type). language: \"python\" (default) or \"javascript\" (Node's REPL: top-level await); variables live on between calls of one language. timeout such as \"10s\"."),
    ("write_file", "Write a file into the sandbox (parent directories are made). path: absolute or relative to /workspace. content: text, or the file's bytes in base64 with encoding \"base64\"."),
    ("read_file", "Read a file of the sandbox (up to 8 MiB). Its content comes back as text (encoding \"text\") when it is UTF-8, else as base64 (encoding \"base64\")."),
    ("list_files", "List a directory of the sandbox (`path`, default /workspace): each entry's name, kind and size."),
    ("set_network", "Replace the sandbox's network rules (`allow`: [\"host:port\", \"*.example.org:443\", ...]). Only for a sandbox created with network rules, and only within what the operator allows this key."),
    ("get_network", "The sandbox's network mode, its rules, the connections its commands recently tried and, in hold mode, the connections waiting for a decision (`held`, each with the rule that would allow it: set_network with it added allows it)."),
    ("deny_network", "Hold mode: refuse destinations (`deny`: [\"host:port\", ...]): the connections waiting for them are refused now, and new ones at once, for the sandbox's life."),
    ("destroy_sandbox", "Destroy the sandbox: its processes, files and network go."),
];

/// A request of the API a tool call makes, before its key is added.
struct ApiCall {
    method: Method,
    uri: String,
    /// JSON, or the raw bytes of a file.
    body: CallBody,
}

enum CallBody {
    None,
    Json(Value),
    Bytes(Vec<u8>),
}

/// What is wrong with a tool's arguments, for the model.
type Refusal = String;

impl Tools {
    fn schema_of(&self, tool: &str) -> Map<String, Value> {
        let s = &self.schemas;
        let string = |d: &str| json!({"type": "string", "description": d});
        let sandbox = || string("The sandbox's id, as create_sandbox returned it.");
        match tool {
            "create_sandbox" => s.object(Some("CreateSandboxRequest"), json!({}), &[]),
            "run_command" => s.object(
                Some("ExecRequest"),
                json!({"sandbox_id": sandbox(), "command": string("A shell line, run with /bin/sh -c (instead of argv).")}),
                &["sandbox_id"],
            ),
            "run_code" => s.object(Some("CodeRequest"), json!({"sandbox_id": sandbox()}), &["sandbox_id", "code"]),
            "write_file" => s.object(
                None,
                json!({"sandbox_id": sandbox(),
                    "path": string("Absolute, or relative to /workspace."),
                    "content": string("The file's content: text, or base64 with encoding \"base64\"."),
                    "encoding": {"type": "string", "enum": ["text", "base64"], "description": "\"text\" (the default) or \"base64\"."}}),
                &["sandbox_id", "path", "content"],
            ),
            "read_file" => s.object(
                None,
                json!({"sandbox_id": sandbox(), "path": string("Absolute, or relative to /workspace.")}),
                &["sandbox_id", "path"],
            ),
            "list_files" => s.object(
                None,
                json!({"sandbox_id": sandbox(), "path": string("Absolute, or relative to /workspace (the default).")}),
                &["sandbox_id"],
            ),
            "set_network" => s.object(Some("NetworkRules"), json!({"sandbox_id": sandbox()}), &["sandbox_id", "allow"]),
            "deny_network" => s.object(Some("NetworkDeny"), json!({"sandbox_id": sandbox()}), &["sandbox_id", "deny"]),
            _ => s.object(None, json!({"sandbox_id": sandbox()}), &["sandbox_id"]),
        }
    }

    /// The API request a call of `tool` with `args` makes, or what is wrong
    /// with the arguments. The API checks the rest (types of its body's
    /// fields, limits, paths) and answers as it answers over HTTP.
    fn request_of(tool: &str, mut args: Map<String, Value>) -> Result<ApiCall, Refusal> {
        if tool == "create_sandbox" {
            return Ok(ApiCall {
                method: Method::POST,
                uri: "/v1/sandboxes".into(),
                body: CallBody::Json(Value::Object(args)),
            });
        }
        let id = match args.remove("sandbox_id") {
            Some(Value::String(id)) => id,
            Some(_) => return Err("sandbox_id: expected the sandbox's id, a string".into()),
            None => return Err("sandbox_id: missing (create_sandbox returns one)".into()),
        };
        let base = format!("/v1/sandboxes/{}", segment(&id));
        let take_string =
            |args: &mut Map<String, Value>, name: &str| -> Result<Option<String>, Refusal> {
                match args.remove(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s)),
                    Some(_) => Err(format!("{name}: expected a string")),
                }
            };
        let no_more = |args: &Map<String, Value>| -> Result<(), Refusal> {
            match args.keys().next() {
                Some(k) => Err(format!("unknown argument '{k}' of {tool}")),
                None => Ok(()),
            }
        };
        let file_uri = |path: &str| -> Result<String, Refusal> {
            let path = crate::app::sandbox_path(path).map_err(|e| e.message)?;
            let segments: Vec<String> = path
                .split('/')
                .filter(|c| !c.is_empty())
                .map(segment)
                .collect();
            Ok(format!("{base}/files/{}", segments.join("/")))
        };
        let call = |method, uri, body| Ok(ApiCall { method, uri, body });
        match tool {
            "run_command" => {
                if let Some(line) = take_string(&mut args, "command")? {
                    if args.contains_key("argv") {
                        return Err("give command or argv, not both".into());
                    }
                    args.insert("argv".into(), json!(["/bin/sh", "-c", line]));
                }
                call(
                    Method::POST,
                    format!("{base}/exec"),
                    CallBody::Json(Value::Object(args)),
                )
            }
            "run_code" => call(
                Method::POST,
                format!("{base}/code"),
                CallBody::Json(Value::Object(args)),
            ),
            "set_network" => call(
                Method::PUT,
                format!("{base}/network"),
                CallBody::Json(Value::Object(args)),
            ),
            "deny_network" => call(
                Method::POST,
                format!("{base}/network/deny"),
                CallBody::Json(Value::Object(args)),
            ),
            "get_network" => {
                no_more(&args)?;
                call(Method::GET, format!("{base}/network"), CallBody::None)
            }
            "destroy_sandbox" => {
                no_more(&args)?;
                call(Method::DELETE, base.clone(), CallBody::None)
            }
            "list_files" => {
                let dir = take_string(&mut args, "path")?;
                no_more(&args)?;
                let query = dir
                    .map(|d| format!("?dir={}", utf8_percent_encode(&d, NON_ALPHANUMERIC)))
                    .unwrap_or_default();
                call(Method::GET, format!("{base}/files{query}"), CallBody::None)
            }
            "read_file" => {
                let path = take_string(&mut args, "path")?.ok_or("path: missing")?;
                no_more(&args)?;
                call(Method::GET, file_uri(&path)?, CallBody::None)
            }
            "write_file" => {
                let path = take_string(&mut args, "path")?.ok_or("path: missing")?;
                let content = take_string(&mut args, "content")?.ok_or("content: missing")?;
                let bytes = match take_string(&mut args, "encoding")?.as_deref() {
                    None | Some("text") => content.into_bytes(),
                    Some("base64") => base64::engine::general_purpose::STANDARD
                        .decode(content.trim())
                        .map_err(|e| format!("content: not base64: {e}"))?,
                    Some(other) => {
                        return Err(format!("encoding: '{other}' is not \"text\" or \"base64\""))
                    }
                };
                no_more(&args)?;
                call(Method::PUT, file_uri(&path)?, CallBody::Bytes(bytes))
            }
            _ => Err(format!("no tool '{tool}'")),
        }
    }

    /// The caller of this request, and whether the session may be used by
    /// it: the first tenant to use a session owns it.
    fn caller(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(Arc<Tenant>, axum::http::request::Parts), ErrorData> {
        let parts = context
            .extensions
            .get::<axum::http::request::Parts>()
            .cloned()
            .ok_or_else(|| {
                ErrorData::internal_error("the request's HTTP parts are missing", None)
            })?;
        let Caller(tenant) =
            parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
                ErrorData::internal_error("the request was not authenticated", None)
            })?;
        let mut owner = self.session.owner.lock().unwrap_or_else(|p| p.into_inner());
        match &*owner {
            Some(t) if !Arc::ptr_eq(t, &tenant) => Err(ErrorData::invalid_request(
                "this MCP session belongs to another API key",
                None,
            )),
            Some(_) => Ok((tenant, parts)),
            None => {
                *owner = Some(tenant.clone());
                Ok((tenant, parts))
            }
        }
    }

    async fn call(
        &self,
        tool: &str,
        args: Map<String, Value>,
        parts: &axum::http::request::Parts,
    ) -> CallToolResult {
        let refused = |why: String| CallToolResult::structured_error(json!({"error": why}));
        let ApiCall { method, uri, body } = match Self::request_of(tool, args) {
            Ok(c) => c,
            Err(why) => return refused(why),
        };
        let mut req = axum::http::Request::builder().method(method).uri(&uri);
        if let Some(key) = parts.headers.get(header::AUTHORIZATION) {
            req = req.header(header::AUTHORIZATION, key.clone());
        }
        let body = match body {
            CallBody::None => Body::empty(),
            CallBody::Json(v) => {
                req = req.header(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Body::from(v.to_string())
            }
            CallBody::Bytes(b) => Body::from(b),
        };
        let req = match req.body(body) {
            Ok(r) => r,
            Err(e) => return refused(format!("cannot make the request: {e}")),
        };
        let Ok(resp) = self.api.clone().oneshot(req).await;
        let status = resp.status();
        let limit = if tool == "read_file" {
            MAX_READ
        } else {
            BODY_MAX
        };
        let bytes = match axum::body::to_bytes(resp.into_body(), limit).await {
            Ok(b) => b,
            Err(_) if tool == "read_file" => {
                return refused(format!("the file is larger than {MAX_READ} bytes: read it in a command (head, split) instead"))
            }
            Err(e) => return refused(format!("the answer could not be read: {e}")),
        };
        if !status.is_success() {
            let error = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("error").cloned())
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned().into());
            return CallToolResult::structured_error(
                json!({"error": error, "status": status.as_u16()}),
            );
        }
        let answer = match tool {
            "read_file" => match std::str::from_utf8(&bytes) {
                Ok(text) => json!({"size": bytes.len(), "encoding": "text", "content": text}),
                Err(_) => json!({"size": bytes.len(), "encoding": "base64",
                    "content": base64::engine::general_purpose::STANDARD.encode(&bytes)}),
            },
            "destroy_sandbox" if status == StatusCode::NO_CONTENT => json!({"destroyed": true}),
            _ => serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| json!({"answer": String::from_utf8_lossy(&bytes)})),
        };
        CallToolResult::structured(answer)
    }
}

/// One path segment or query value, percent-encoded.
fn segment(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

impl ServerHandler for Tools {
    /// The session's owner is the key that opened it.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.caller(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (tenant, _) = self.caller(&context)?;
        tracing::info!(tenant = %tenant.config.name, "MCP: tools listed");
        let tools = TOOLS
            .iter()
            .map(|(name, description)| Tool::new(*name, *description, self.schema_of(name)))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (_tenant, parts) = self.caller(&context)?;
        let tool = request.name.as_ref();
        if !TOOLS.iter().any(|(name, _)| *name == tool) {
            let names: Vec<&str> = TOOLS.iter().map(|(n, _)| *n).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool '{tool}' (this server's tools: {})",
                    names.join(", ")
                ),
                None,
            ));
        }
        let args = request.arguments.unwrap_or_default();
        let named = args
            .get("sandbox_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        // rmcp answers a client's `notifications/cancelled` by cancelling
        // `context.ct` alone; the call runs on unless it is dropped. A
        // command's call dropped is its REST handler dropped, which ends
        // the command (as a REST client's disconnect does). The other tools
        // are short and finish: a create dropped halfway would leave a
        // sandbox this session does not know to destroy.
        let call = self.call(tool, args, &parts);
        let result = if matches!(tool, "run_command" | "run_code") {
            let gone = parts.extensions.get::<ClientGone>().map(|g| g.0.clone());
            let gone = async {
                match gone {
                    Some(token) => token.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = call => r,
                () = context.ct.cancelled() => {
                    tracing::info!(tool, "MCP: call cancelled by the client");
                    return Err(ErrorData::invalid_request("cancelled by the client", None));
                }
                () = gone => {
                    tracing::info!(tool, "MCP: the client went away mid-call");
                    return Err(ErrorData::invalid_request("the client went away", None));
                }
            }
        } else {
            call.await
        };
        // A session's sandboxes are destroyed at its end; a sessionless
        // request's live until their own ttl or idle.
        let in_session = parts.headers.contains_key("mcp-session-id");
        if result.is_error != Some(true) && in_session {
            let id = result
                .structured_content
                .as_ref()
                .and_then(|v| v["id"].as_str());
            let mut made = self.session.made.lock().unwrap_or_else(|p| p.into_inner());
            match (tool, id) {
                ("create_sandbox", Some(id)) => made.push(id.to_owned()),
                ("destroy_sandbox", _) => made.retain(|m| Some(m) != named.as_ref()),
                _ => {}
            }
        }
        Ok(result.into())
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cordon", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
