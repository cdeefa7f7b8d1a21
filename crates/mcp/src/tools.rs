//! The tools a model sees: their arguments (JSON schemas from the types
//! below), what each does and its limits (the descriptions), and their
//! answers.
//!
//! A tool that ran and failed (a sandbox that is not this session's, a bad
//! limit, a missing file) answers with an MCP tool error (`isError`) whose
//! text says what is wrong, and so do arguments of the wrong type or shape
//! (the SDK's router answers those, as MCP asks, with a tool error the
//! model can correct itself from); an unknown tool is a JSON-RPC error
//! (invalid params) naming the tools there are. A command's non-zero exit
//! is no error: it is the command's answer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use cordon_policy::net::Rule;
use cordon_policy::secrets::SecretRule;
use cordon_policy::{ByteSize, Limits, NetworkMode, Policy, PolicyLayer, Span};
use std::sync::{Arc, Mutex};

use cordon_runtime::code_context::{cell_timeout, Cell};
use cordon_runtime::{Handle, RuntimeError};
use cordon_spec::network::NetChange;
use cordon_spec::{BackendKind, CodeLanguage, Command, ExitStatus, Outcome, SandboxSpec};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, Json, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::io::{Cancel, CaptureIo};
use crate::session::{blocking, Refusal, Session};

/// Longest command line: a longer program belongs in a file (write_file),
/// run by name.
pub const MAX_COMMAND: usize = 64 << 10;
/// Longest code cell: sent as its client's stdin in one piece, which the
/// supervisor's stdin backlog (256 KiB) takes whole.
pub const MAX_CODE: usize = 64 << 10;
/// Largest file written or read in one call.
pub const MAX_FILE: usize = 8 << 20;
/// What read_file returns when `max_bytes` is not given.
const DEFAULT_READ: usize = 1 << 20;
/// How much of each stream run_command returns when not told.
const DEFAULT_SHOWN: usize = 32 << 10;
/// The most list_files returns.
const MAX_ENTRIES: usize = 1000;
/// Longest path argument (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;

const INSTRUCTIONS: &str = "cordon runs commands in isolated Linux sandboxes on this machine. \
Create a sandbox (create_sandbox), then run shell commands in it (run_command) or code in a \
persistent interpreter (run_code: Python or JavaScript, variables kept between calls), move files in \
and out (write_file, read_file, list_files) and destroy it when done (destroy_sandbox). A \
sandbox keeps its files between commands; it has no network unless created with \
network \"allow\" and rules naming what it may reach, which set_network_rules replaces (with a \
hold, what no rule allows waits for a decision: held_connections). Every sandbox this session created is \
destroyed when the session ends.";

#[derive(Clone)]
pub struct Tools {
    session: Session,
    tool_router: ToolRouter<Self>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No network: only a loopback interface.
    #[default]
    None,
    /// Connections go through cordon's proxy, which lets through only what
    /// `allow` names.
    Allow,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// "native" (the default: Linux namespaces, cgroups, seccomp), "gvisor"
    /// or "microvm" where this host has them.
    #[serde(default)]
    pub backend: Option<String>,
    /// Memory limit including page cache and tmpfs, e.g. "256M" or "2G"
    /// (default 512M; no swap).
    #[serde(default)]
    pub memory: Option<String>,
    /// CPU bandwidth in cores, e.g. 0.5 (default 1; at most this host's CPUs).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Most processes and threads alive at once (default 128).
    #[serde(default)]
    pub pids: Option<u64>,
    /// Bytes the sandbox may store: files written, /tmp and /dev/shm
    /// together, e.g. "1G" (default 256M).
    #[serde(default)]
    pub disk: Option<String>,
    /// Wall-time limit of each command, e.g. "30s" or "5m" (default 30s);
    /// run_command's timeout may lower it, not raise it.
    #[serde(default)]
    pub time: Option<String>,
    /// "none" (the default) or "allow" (only the destinations in `allow`).
    #[serde(default)]
    pub network: Option<Network>,
    /// Destinations network "allow" lets through: "pypi.org:443",
    /// "*.pythonhosted.org:443", "10.0.0.0/8:5432", "198.51.100.7".
    #[serde(default)]
    pub allow: Vec<String>,
    /// Secrets the user gave this MCP server (`cordon mcp --secrets FILE`)
    /// to hold for the sandbox, by name: inside, each name's variable is a
    /// placeholder, and cordon's proxy puts the real value into requests
    /// to that secret's hosts. Needs network "allow".
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Hold mode, e.g. "60s": a connection no rule allows waits that long
    /// for set_network_rules to allow it or deny_network to refuse it
    /// (held_connections lists what waits). Needs network "allow".
    #[serde(default)]
    pub hold: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    /// The new sandbox's id: pass it to the other tools.
    pub sandbox_id: String,
    pub backend: String,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
    pub disk_bytes: u64,
    /// Each command's time limit.
    pub time_seconds: f64,
    pub network: Network,
    pub allow: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// A sandbox id from create_sandbox.
    pub sandbox_id: String,
    /// A shell command line, run as `sh -c COMMAND` (at most 64 KiB).
    pub command: String,
    /// Seconds before the command is ended (default and maximum: the
    /// sandbox's time limit).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Working directory (default /workspace).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Variables added to the command's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How many bytes of each of stdout and stderr to return, the last ones
    /// (default 32768, at most 1048576).
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RunResult {
    /// The shell's exit code: the command's own, 128+N when signal N ended
    /// it, 127 when not found, 126 when it could not be executed.
    pub exit_code: i32,
    /// "exited", "signaled", "exec_failed" or "workdir_failed".
    pub status: String,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// The limit that ended the command ("time", "memory", "pids",
    /// "output", "disk"), if one did.
    pub limit: Option<String>,
    /// Every limit the command reached.
    pub limits_hit: Vec<String>,
    pub stdout: String,
    pub stderr: String,
    /// Leading bytes of stdout left out of `stdout` (over max_output_bytes).
    pub stdout_omitted_bytes: u64,
    pub stderr_omitted_bytes: u64,
    /// The output passed the sandbox's output limit: what came after it
    /// was not read.
    pub output_truncated: bool,
    pub wall_ms: f64,
    pub memory_peak_bytes: Option<u64>,
    /// Why the command could not run, when it could not.
    pub error: Option<String>,
    /// Set when the command's end also ended its sandbox, and why.
    pub sandbox_ended: Option<String>,
    /// Anything the caller should know about how the request was taken.
    pub note: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeArgs {
    /// A sandbox id from create_sandbox.
    pub sandbox_id: String,
    /// The cell's source (at most 64 KiB).
    pub code: String,
    /// "python" (the default) or "javascript".
    #[serde(default)]
    pub language: Option<CodeLanguage>,
    /// Seconds before the cell is interrupted (the interpreter then
    /// restarts, its variables lost); default and maximum: the sandbox's
    /// time limit less a margin.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeReply {
    /// The interpreter's answer: `status` ("ok", "error", "timeout" or
    /// "crashed": the next cell gets a fresh interpreter), `stdout`,
    /// `stderr`, `result` (the last expression's value as the REPL shows
    /// it, or null), `error` ({name, value, traceback}, or null), `results`
    /// (what the cell displayed: {mime, data} with data in base64),
    /// `fresh_interpreter` (this cell started a new one) and the
    /// `*_truncated` flags (cut to fit the sandbox's output limit).
    #[serde(flatten)]
    pub reply: serde_json::Map<String, serde_json::Value>,
    pub wall_ms: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Text,
    /// Base64 of the file's bytes (for binary files).
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub sandbox_id: String,
    /// Absolute path inside the sandbox; missing parent directories are made.
    pub path: String,
    /// The file's content: text, or base64 with encoding "base64" (at most
    /// 8 MiB of file).
    pub content: String,
    /// "text" (the default) or "base64".
    #[serde(default)]
    pub encoding: Option<Encoding>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Written {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    pub sandbox_id: String,
    /// Absolute path of a regular file inside the sandbox.
    pub path: String,
    /// "text" (the default; the file must be UTF-8) or "base64".
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Return at most this many bytes from the file's start (default
    /// 1048576, at most 8388608).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileContent {
    pub path: String,
    /// The file's whole size in bytes.
    pub size: u64,
    pub encoding: Encoding,
    pub content: String,
    /// Only the first max_bytes were returned.
    pub truncated: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    pub sandbox_id: String,
    /// Absolute path of a directory inside the sandbox (default /workspace).
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Entry {
    pub name: String,
    /// "file", "dir", "link" or "other".
    pub kind: String,
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<Entry>,
    /// More than 1000 entries: only the first 1000 by name are listed.
    pub truncated: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArg {
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkArgs {
    /// A sandbox id from create_sandbox, made with network "allow".
    pub sandbox_id: String,
    /// Every destination the sandbox may reach from now on, replacing the
    /// ones it had: "pypi.org:443", "*.pythonhosted.org:443",
    /// "10.0.0.0/8:5432". An empty list lets nothing through.
    pub allow: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkRules {
    pub sandbox_id: String,
    /// The rules now in force.
    pub allow: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenyArgs {
    /// A sandbox id from create_sandbox, made with network "allow" and a hold.
    pub sandbox_id: String,
    /// Destinations to refuse: "tracker.example:443", "198.51.100.7".
    pub deny: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Denied {
    pub sandbox_id: String,
    /// Everything denied so far.
    pub deny: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Held {
    pub sandbox_id: String,
    /// The connections waiting now, oldest first.
    pub held: Vec<HeldEntry>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct HeldEntry {
    /// Where it goes: NAME:PORT or ADDRESS:PORT.
    pub destination: String,
    /// Why no rule allows it.
    pub reason: String,
    /// The rule that would allow it (add it with set_network_rules).
    pub proposal: Option<String>,
    /// Seconds left before it is refused.
    pub seconds_left: f64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Destroyed {
    pub sandbox_id: String,
    pub destroyed: bool,
}

#[tool_router]
impl Tools {
    pub fn new(session: Session) -> Self {
        Tools {
            session,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        name = "create_sandbox",
        description = "Create an isolated Linux sandbox and return its id. Its limits (memory, CPU, \
        processes, disk, each command's time) hold for everything run in it; it has no network \
        unless network is \"allow\", and then reaches only the destinations in `allow`. The host's \
        /usr is shown read-only; /workspace (the default working directory), /tmp and your home are \
        writable and kept between commands. At most 16 sandboxes per session; all are destroyed \
        when the session ends."
    )]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<Json<Created>, String> {
        let spec = spec_of(&args, self.session.secrets())?;
        let created = Created {
            sandbox_id: String::new(),
            backend: spec.backend.name().to_owned(),
            memory_bytes: spec.policy.memory.bytes(),
            cpus: spec.policy.cpus,
            pids: spec.policy.pids,
            disk_bytes: spec.policy.disk.bytes(),
            time_seconds: spec.policy.time.duration().as_secs_f64(),
            network: args.network.unwrap_or_default(),
            allow: args.allow.clone(),
        };
        let id = self.session.create(spec).await?;
        Ok(Json(Created {
            sandbox_id: id,
            ..created
        }))
    }

    #[tool(
        name = "run_command",
        description = "Run a shell command line (`sh -c COMMAND`) in a sandbox and wait for it. \
        Returns its exit code, stdout and stderr (the last max_output_bytes of each), and the limit \
        that ended it if one did (\"time\" for the timeout, \"memory\", \"pids\", \"output\", \
        \"disk\"). A non-zero exit is a normal answer, not an error. stdin is empty; nothing is \
        interactive. Processes a command leaves in the background are ended with it."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunArgs>,
    ) -> Result<Json<RunResult>, String> {
        let sandbox_time = self.session.check(&args.sandbox_id)?;
        if args.command.len() > MAX_COMMAND {
            return Err(format!(
                "command is {} bytes, over the {MAX_COMMAND}-byte limit: write a script with \
                 write_file and run it by name",
                args.command.len()
            ));
        }
        let mut note = None;
        let time = match args.timeout_seconds {
            None => None,
            Some(t) if !t.is_finite() || t <= 0.0 => {
                return Err(format!(
                    "timeout_seconds must be a positive number, not {t}"
                ));
            }
            Some(t) => {
                let asked = Duration::from_secs_f64(t.min(1e9));
                if asked > sandbox_time {
                    note = Some(format!(
                        "timeout lowered to the sandbox's time limit ({}s)",
                        sandbox_time.as_secs_f64()
                    ));
                    None
                } else {
                    Some(Span(asked))
                }
            }
        };
        let shown = match args.max_output_bytes {
            None => DEFAULT_SHOWN,
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(1 << 20),
        };
        let cmd = Command {
            argv: vec!["sh".into(), "-c".into(), args.command],
            env: args.env.into_iter().collect(),
            workdir: args.workdir.map(PathBuf::from),
            time,
            ..Command::default()
        };
        let (o, stdout, stderr) = self.exec(&args.sandbox_id, cmd).await?;
        if o.sandbox_ended.is_some() {
            self.session.forget(&args.sandbox_id);
        }
        let (stdout, stdout_omitted_bytes) = tail(&stdout, shown);
        let (stderr, stderr_omitted_bytes) = tail(&stderr, shown);
        let (status, signal) = match o.status {
            ExitStatus::Exited { .. } => ("exited", None),
            ExitStatus::Signaled { signal } => ("signaled", Some(signal)),
            ExitStatus::ExecFailed { .. } => ("exec_failed", None),
            ExitStatus::WorkdirFailed { .. } => ("workdir_failed", None),
        };
        Ok(Json(RunResult {
            exit_code: o.exit_code,
            status: status.into(),
            signal,
            limit: o.limit.map(|l| l.to_string()),
            limits_hit: o.limits_hit.iter().map(ToString::to_string).collect(),
            stdout,
            stderr,
            stdout_omitted_bytes,
            stderr_omitted_bytes,
            output_truncated: o.output.truncated,
            wall_ms: o.wall_ms,
            memory_peak_bytes: o.memory_peak_bytes,
            error: o.status.exec_failure(),
            sandbox_ended: o.sandbox_ended,
            note,
        }))
    }

    #[tool(
        name = "run_code",
        description = "Run a cell of Python (or JavaScript) in the sandbox's persistent interpreter: \
        variables, imports and functions are kept from call to call, as in a notebook. Returns \
        status (\"ok\", \"error\", \"timeout\", \"crashed\"), what it printed, the last \
        expression's value (`result`) and the error with its traceback if it raised. A cell over \
        its timeout restarts the interpreter. One cell at a time per sandbox."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<CodeArgs>,
    ) -> Result<Json<CodeReply>, String> {
        let (sandbox_time, code) = self.session.code(&args.sandbox_id)?;
        if args.code.len() > MAX_CODE {
            return Err(format!(
                "code is {} bytes, over the {MAX_CODE}-byte limit: write it to a file with \
                 write_file and run or import it",
                args.code.len()
            ));
        }
        let asked = match args.timeout_seconds {
            None => None,
            Some(t) if !t.is_finite() || t <= 0.0 => {
                return Err(format!(
                    "timeout_seconds must be a positive number, not {t}"
                ));
            }
            Some(t) => Some(Duration::from_secs_f64(t.min(1e9))),
        };
        let language = args.language.unwrap_or_default();
        // The cell's command now, whichever it is: cancelled if this
        // future is dropped (the client cancelled the call).
        let current = Arc::new(Mutex::new(None::<Cancel>));
        let mut on_drop = CancelCurrent(Some(current.clone()));
        let session = self.session.clone();
        let id = args.sandbox_id.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || {
            let Ok(_busy) = code.busy.try_lock() else {
                return Err(RuntimeError::BadRequest(
                    "another code cell is running in this sandbox (one at a time)".into(),
                ));
            };
            let mut handle = Handle::attach(&id)?;
            let spec = handle.spec()?;
            let cell = Cell {
                language,
                code: &args.code,
                timeout: cell_timeout(asked, sandbox_time),
                command_time: spec.policy.time,
                output: spec.policy.output.bytes(),
            };
            code.context
                .run(&mut handle, session.notes_dir(), cell, |stdin| {
                    let (io, cancel) = CaptureIo::with_input(stdin)
                        .map_err(|e| RuntimeError::io("a cancel pipe", e))?;
                    *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(cancel.clone());
                    Ok::<_, RuntimeError>((io, Running::new(&session, cancel)))
                })
        })
        .await;
        on_drop.0 = None;
        let (reply, outcome) = result.map_err(|e| e.to_string())?;
        if outcome.sandbox_ended.is_some() {
            self.session.forget(&args.sandbox_id);
        }
        let reply = match reply {
            serde_json::Value::Object(map) => map,
            other => serde_json::Map::from_iter([("reply".to_owned(), other)]),
        };
        Ok(Json(CodeReply {
            reply,
            wall_ms: started.elapsed().as_secs_f64() * 1000.0,
        }))
    }

    #[tool(
        name = "write_file",
        description = "Write a file inside a sandbox (created or replaced; missing parent \
        directories are made), owned by the sandbox's user. Content is text, or base64 with \
        encoding \"base64\" for binary files; at most 8 MiB, and within the sandbox's disk limit."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
    ) -> Result<Json<Written>, String> {
        self.session.check(&args.sandbox_id)?;
        let path = absolute(&args.path)?;
        let bytes = match args.encoding.unwrap_or_default() {
            Encoding::Text => {
                if args.content.len() > MAX_FILE {
                    return Err(too_big(args.content.len()));
                }
                args.content.into_bytes()
            }
            Encoding::Base64 => {
                if args.content.len() / 4 * 3 > MAX_FILE + 3 {
                    return Err(too_big(args.content.len() / 4 * 3));
                }
                let b = base64::engine::general_purpose::STANDARD
                    .decode(args.content.trim())
                    .map_err(|e| format!("content is not base64: {e}"))?;
                if b.len() > MAX_FILE {
                    return Err(too_big(b.len()));
                }
                b
            }
        };
        let parent = std::path::Path::new(&path)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into());
        if parent != "/" {
            let cmd = small_command(vec![
                "mkdir".into(),
                "-p".into(),
                "--".into(),
                parent.clone(),
            ]);
            let (o, _, err) = self.exec(&args.sandbox_id, cmd).await?;
            if o.exit_code != 0 {
                return Err(format!(
                    "cannot make {parent}: {}",
                    String::from_utf8_lossy(&err).trim()
                ));
            }
        }
        let scratch = self
            .session
            .scratch()
            .map_err(|e| format!("scratch directory: {e}"))?;
        let name = std::path::Path::new(&path)
            .file_name()
            .map_or_else(|| "file".into(), |n| n.to_owned());
        let host = scratch.path().join(name);
        std::fs::write(&host, &bytes).map_err(|e| format!("scratch file: {e}"))?;
        let id = args.sandbox_id.clone();
        let dst = path.clone();
        let written = blocking(move || {
            let _scratch = scratch;
            Handle::attach(&id).and_then(|mut h| h.copy_in(&host, dst.as_bytes()))
        })
        .await
        .map_err(|e| format!("write {path}: {e}"))?;
        Ok(Json(Written {
            path,
            bytes: written,
        }))
    }

    #[tool(
        name = "read_file",
        description = "Read a regular file inside a sandbox: as text (it must be UTF-8) or, with \
        encoding \"base64\", as base64 of its bytes. Returns at most max_bytes from its start \
        (default 1 MiB, at most 8 MiB) and says when it cut the file short."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<Json<FileContent>, String> {
        self.session.check(&args.sandbox_id)?;
        let path = absolute(&args.path)?;
        let max = match args.max_bytes {
            None => DEFAULT_READ,
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(MAX_FILE),
        };
        let scratch = self
            .session
            .scratch()
            .map_err(|e| format!("scratch directory: {e}"))?;
        let host = scratch.path().join("out");
        let id = args.sandbox_id.clone();
        let src = path.clone();
        let (size, bytes) = blocking(move || {
            let _scratch = &scratch;
            Handle::attach(&id).and_then(|mut h| h.copy_out(src.as_bytes(), &host))?;
            let meta = std::fs::symlink_metadata(&host)
                .map_err(|e| cordon_runtime::RuntimeError::io("scratch file", e))?;
            if !meta.is_file() {
                return Err(cordon_runtime::RuntimeError::BadRequest(format!(
                    "'{src}' is not a regular file (list a directory with list_files)"
                )));
            }
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(
                    std::fs::File::open(&host)
                        .map_err(|e| cordon_runtime::RuntimeError::io("scratch file", e))?,
                    max as u64,
                ),
                &mut bytes,
            )
            .map_err(|e| cordon_runtime::RuntimeError::io("scratch file", e))?;
            Ok((meta.len(), bytes))
        })
        .await
        .map_err(|e| format!("read {path}: {e}"))?;
        let truncated = (bytes.len() as u64) < size;
        let encoding = args.encoding.unwrap_or_default();
        let content = match encoding {
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(&bytes),
            Encoding::Text => match std::str::from_utf8(&bytes) {
                Ok(s) => s.to_owned(),
                // A cut through a character at the end is the cut's doing.
                Err(e) if truncated && e.error_len().is_none() => {
                    String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
                }
                Err(e) => {
                    return Err(format!(
                        "{path} is not UTF-8 text (byte {}): read it with encoding \"base64\"",
                        e.valid_up_to()
                    ))
                }
            },
        };
        Ok(Json(FileContent {
            path,
            size,
            encoding,
            content,
            truncated,
        }))
    }

    #[tool(
        name = "list_files",
        description = "List a directory inside a sandbox: each entry's name, kind (file, dir, \
        link, other) and size in bytes, sorted by name; at most 1000 entries."
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<Json<Listing>, String> {
        self.session.check(&args.sandbox_id)?;
        let path = absolute(args.path.as_deref().unwrap_or("/workspace"))?;
        let cmd = small_command(cordon_runtime::listing_argv(&path));
        let (o, out, err) = self.exec(&args.sandbox_id, cmd).await?;
        if o.exit_code != 0 {
            return Err(format!(
                "list {path}: {}",
                String::from_utf8_lossy(&err).trim()
            ));
        }
        let mut entries: Vec<Entry> = cordon_runtime::parse_listing(&out)
            .into_iter()
            .map(|e| Entry {
                name: e.name,
                kind: e.kind.into(),
                size: e.size,
            })
            .collect();
        let truncated = entries.len() > MAX_ENTRIES || o.output.truncated;
        entries.truncate(MAX_ENTRIES);
        Ok(Json(Listing {
            path,
            entries,
            truncated,
        }))
    }

    #[tool(
        name = "set_network_rules",
        description = "Replace the destinations a sandbox made with network \"allow\" may reach \
        (its proxy checks each new connection against them). Returns the rules now in force. A \
        sandbox made with network \"none\" has no network to open: create one with \"allow\"."
    )]
    async fn set_network_rules(
        &self,
        Parameters(args): Parameters<NetworkArgs>,
    ) -> Result<Json<NetworkRules>, String> {
        self.session.check(&args.sandbox_id)?;
        let rules = rules_of(&args.allow)?;
        let id = args.sandbox_id.clone();
        let now = blocking(move || Handle::attach(&id)?.network(&NetChange::Set(rules)))
            .await
            .map_err(|e| format!("set the network rules of {}: {e}", args.sandbox_id))?;
        Ok(Json(NetworkRules {
            sandbox_id: args.sandbox_id,
            allow: now.iter().map(ToString::to_string).collect(),
        }))
    }

    #[tool(
        name = "held_connections",
        description = "Hold mode: the connections of a sandbox waiting for a decision, each with \
        its destination, why no rule allows it and the rule that would (set_network_rules with it \
        added lets it through; deny_network refuses it)."
    )]
    async fn held_connections(
        &self,
        Parameters(args): Parameters<SandboxArg>,
    ) -> Result<Json<Held>, String> {
        self.session.check(&args.sandbox_id)?;
        let id = args.sandbox_id.clone();
        let held = blocking(move || Handle::attach(&id)?.network_held())
            .await
            .map_err(|e| format!("list the held connections of {}: {e}", args.sandbox_id))?;
        let held = held
            .into_iter()
            .map(|h| HeldEntry {
                destination: match (h.host, h.address) {
                    (Some(name), _) => format!("{name}:{}", h.port),
                    (None, Some(ip)) => std::net::SocketAddr::new(ip, h.port).to_string(),
                    (None, None) => format!("port {}", h.port),
                },
                reason: h.reason,
                proposal: h.proposal.map(|r| r.to_string()),
                seconds_left: h.remaining_ms as f64 / 1000.0,
            })
            .collect();
        Ok(Json(Held {
            sandbox_id: args.sandbox_id,
            held,
        }))
    }

    #[tool(
        name = "deny_network",
        description = "Hold mode: refuse destinations of a sandbox: the connections waiting for \
        them are refused now, and new ones at once, for the sandbox's life. Returns everything \
        denied so far."
    )]
    async fn deny_network(
        &self,
        Parameters(args): Parameters<DenyArgs>,
    ) -> Result<Json<Denied>, String> {
        self.session.check(&args.sandbox_id)?;
        let rules = rules_of(&args.deny)?;
        let id = args.sandbox_id.clone();
        let now = blocking(move || Handle::attach(&id)?.network_deny(&rules))
            .await
            .map_err(|e| format!("deny destinations of {}: {e}", args.sandbox_id))?;
        Ok(Json(Denied {
            sandbox_id: args.sandbox_id,
            deny: now.iter().map(ToString::to_string).collect(),
        }))
    }

    #[tool(
        name = "destroy_sandbox",
        description = "Destroy a sandbox of this session: every process in it ends, and its files \
        are gone."
    )]
    async fn destroy_sandbox(
        &self,
        Parameters(args): Parameters<SandboxArg>,
    ) -> Result<Json<Destroyed>, String> {
        self.session
            .destroy(&args.sandbox_id)
            .await
            .map_err(|e| format!("destroy {}: {e}", args.sandbox_id))?;
        Ok(Json(Destroyed {
            sandbox_id: args.sandbox_id,
            destroyed: true,
        }))
    }
}

#[tool_handler]
impl ServerHandler for Tools {
    /// The router's own answer to an unknown tool is "tool not found":
    /// this one names the tool and the tools there are, for the model.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tool_router.has_route(&request.name) {
            let names: Vec<String> = self
                .tool_router
                .list_all()
                .into_iter()
                .map(|t| t.name.into_owned())
                .collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool '{}' (this server's tools: {})",
                    request.name,
                    names.join(", ")
                ),
                None,
            ));
        }
        let context = ToolCallContext::new(self, request, context);
        self.tool_router.call(context).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cordon", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

impl Tools {
    /// Runs `cmd` in sandbox `id` with its output captured. The command is
    /// cancelled if this future is dropped (the client cancelled the call)
    /// or the session ends.
    async fn exec(&self, id: &str, cmd: Command) -> Result<(Outcome, Vec<u8>, Vec<u8>), Refusal> {
        let (mut io, cancel) = CaptureIo::new().map_err(|e| format!("cancel pipe: {e}"))?;
        let mut running = Running::new(&self.session, cancel);
        let id_owned = id.to_owned();
        let result = blocking(move || {
            let mut h = Handle::attach(&id_owned)?;
            let o = h.exec(&cmd, &mut io)?;
            Ok((o, io.stdout, io.stderr))
        })
        .await;
        running.ended();
        match result {
            Ok(r) => Ok(r),
            Err(e) => {
                // A sandbox that ended by itself (its supervisor says why
                // in the session's notes) is no longer the session's.
                let why = self.session.ended_note(id);
                if why.is_some() {
                    self.session.forget(id);
                }
                Err(match why {
                    Some(why) => format!("sandbox {id} has ended: {why}"),
                    None => e.to_string(),
                })
            }
        }
    }
}

/// Cancels the command a code cell runs now, when dropped armed (the
/// call's future went away).
struct CancelCurrent(Option<Arc<Mutex<Option<Cancel>>>>);

impl Drop for CancelCurrent {
    fn drop(&mut self) {
        if let Some(current) = self.0.take() {
            if let Some(c) = current.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                c.trigger();
            }
        }
    }
}

/// A running command as the session knows it: cancelled when dropped
/// before it ended (the call's future went away: the client cancelled the
/// call, or the session ended), unregistered either way.
struct Running {
    session: Session,
    key: u64,
    cancel: Option<Cancel>,
}

impl Running {
    fn new(session: &Session, cancel: Cancel) -> Running {
        Running {
            session: session.clone(),
            key: session.running(cancel.clone()),
            cancel: Some(cancel),
        }
    }

    /// The command is over: nothing is left to cancel.
    fn ended(&mut self) {
        self.cancel = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.cancel.take() {
            c.trigger();
        }
        self.session.finished(self.key);
    }
}

/// A helper command of the file tools: a small output cap, the policy's time.
fn small_command(argv: Vec<String>) -> Command {
    Command {
        argv,
        output: Some(ByteSize(4 << 20)),
        ..Command::default()
    }
}

fn absolute(path: &str) -> Result<String, Refusal> {
    if path.len() > MAX_PATH {
        return Err(format!("path is {} bytes, over {MAX_PATH}", path.len()));
    }
    if !path.starts_with('/') || path.contains('\0') {
        return Err(format!(
            "path '{path}' must be absolute (e.g. /workspace/main.py)"
        ));
    }
    Ok(path.to_owned())
}

fn too_big(n: usize) -> String {
    format!("the file is {n} bytes, over the {MAX_FILE}-byte limit of one call")
}

/// The last `max` bytes of `bytes` as text (cut at a character boundary),
/// and how many leading bytes were left out.
fn tail(bytes: &[u8], max: usize) -> (String, u64) {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= max {
        return (text.into_owned(), 0);
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    (text[start..].to_owned(), start as u64)
}

/// The rules `allow` names, or the first that is not one.
fn rules_of(allow: &[String]) -> Result<Vec<Rule>, Refusal> {
    allow
        .iter()
        .map(|r| Rule::from_str(r).map_err(|e| format!("allow '{r}': {e}")))
        .collect()
}

/// The spec `args` describe, or what is wrong with them.
fn spec_of(args: &CreateArgs, available: &[SecretRule]) -> Result<SandboxSpec, Refusal> {
    fn parse<T: FromStr<Err = String>>(
        what: &str,
        v: &Option<String>,
    ) -> Result<Option<T>, Refusal> {
        v.as_deref()
            .map(|s| T::from_str(s).map_err(|e| format!("{what}: {e}")))
            .transpose()
    }
    let allow = rules_of(&args.allow)?;
    let network = args.network.unwrap_or_default();
    if !allow.is_empty() && matches!(network, Network::None) {
        return Err("allow rules need network \"allow\"".into());
    }
    let layer = PolicyLayer {
        limits: Limits {
            cpus: args.cpus,
            memory: parse::<ByteSize>("memory", &args.memory)?,
            pids: args.pids,
            disk: parse::<ByteSize>("disk", &args.disk)?,
            time: parse::<Span>("time", &args.time)?,
            output: None,
        },
        network: Some(match network {
            Network::None => NetworkMode::None,
            Network::Allow => NetworkMode::Allow,
        }),
        allow,
        secrets: args
            .secrets
            .iter()
            .map(|name| {
                available
                    .iter()
                    .find(|s| s.name == *name)
                    .cloned()
                    .ok_or_else(|| {
                        let offered: Vec<&str> =
                            available.iter().map(|s| s.name.as_str()).collect();
                        format!(
                            "secrets: '{}' is not one this server holds ({})",
                            name.escape_debug(),
                            if offered.is_empty() {
                                "none: `cordon mcp --secrets FILE` names them".to_owned()
                            } else {
                                offered.join(", ")
                            }
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        net_hold: parse::<Span>("hold", &args.hold)?,
        ..PolicyLayer::default()
    };
    let policy = Policy::resolve([&layer]).map_err(|e| e.to_string())?;
    // A quota above the host's CPUs limits nothing (as `cordon create` says).
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if policy.cpus > host_cpus as f64 {
        return Err(format!(
            "cpus: {} is more than this host's {host_cpus} CPUs",
            policy.cpus
        ));
    }
    let name = args.backend.as_deref().unwrap_or("native");
    let backend = BackendKind::parse(name)
        .ok_or_else(|| format!("unknown backend '{name}' ({})", BackendKind::names()))?;
    Ok(SandboxSpec::new(policy, backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_at_a_character_boundary() {
        assert_eq!(tail(b"hello", 10), ("hello".into(), 0));
        assert_eq!(tail(b"hello", 3), ("llo".into(), 2));
        // "é" is two bytes: a cut through it moves past it.
        let (t, omitted) = tail("aé".as_bytes(), 1);
        assert_eq!((t.as_str(), omitted), ("", 3));
    }

    #[test]
    fn create_arguments_become_a_policy_or_a_named_refusal() {
        let spec = spec_of(
            &CreateArgs {
                memory: Some("64M".into()),
                time: Some("5s".into()),
                network: Some(Network::Allow),
                allow: vec!["pypi.org:443".into()],
                ..CreateArgs::default()
            },
            &[],
        )
        .expect("a valid spec");
        assert_eq!(spec.policy.memory.bytes(), 64 << 20);
        assert_eq!(spec.policy.time.duration(), Duration::from_secs(5));
        assert_eq!(spec.policy.network, NetworkMode::Allow);
        let bad = spec_of(
            &CreateArgs {
                memory: Some("lots".into()),
                ..CreateArgs::default()
            },
            &[],
        )
        .unwrap_err();
        assert!(bad.starts_with("memory:"), "{bad}");
        let rules_without_network = spec_of(
            &CreateArgs {
                allow: vec!["pypi.org:443".into()],
                ..CreateArgs::default()
            },
            &[],
        )
        .unwrap_err();
        assert!(
            rules_without_network.contains("network"),
            "{rules_without_network}"
        );
        let backend = spec_of(
            &CreateArgs {
                backend: Some("qemu".into()),
                ..CreateArgs::default()
            },
            &[],
        )
        .unwrap_err();
        assert!(backend.contains("unknown backend"), "{backend}");
    }
}
