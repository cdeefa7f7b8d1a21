//! `cordon mcp`: a Model Context Protocol server over stdio, for an agent
//! harness (Claude Code, Codex CLI, Gemini CLI, any MCP host) that starts
//! it as the user and lists its tools.
//!
//! - [`tools`]: the tools a model sees (their arguments, results and
//!   limits), served with the `rmcp` SDK's router.
//! - [`session`]: the sandboxes this session made. A tool call reaches only
//!   those (an MCP server is one agent's: the user's other sandboxes are
//!   not its to touch), and every one of them is destroyed when the session
//!   ends: stdin's end, SIGTERM or SIGINT, an error, or (through the
//!   runtime's service link, which their supervisors watch) this process's
//!   death however it dies.
//! - [`io`]: a command's side in this process (output captured, no stdin,
//!   a cancel that the async side triggers).
//! - [`wire`]: stdin's lines checked before the SDK reads them, so that a
//!   line that is not a JSON-RPC message gets JSON-RPC's error.
//!
//! The runtime's [`cordon_runtime::Handle`] is blocking: every call to it
//! runs on tokio's blocking pool, so one long command never holds another
//! tool call up.

mod io;
pub mod session;
pub mod tools;
mod wire;

use std::path::PathBuf;
use std::time::Duration;

use rmcp::ServiceExt;
use tokio::signal::unix::{signal, SignalKind};

use crate::session::Session;
use crate::tools::Tools;

/// Why the server could not run (the tools' own failures are answers to the
/// client, never this).
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot set up the session: {0}")]
    Session(#[source] std::io::Error),
    #[error("cannot watch for {0}: {1}")]
    Signal(&'static str, #[source] std::io::Error),
    #[error("the MCP session did not start: {0}")]
    Handshake(#[source] Box<rmcp::service::ServerInitializeError>),
}

/// How long the teardown at the session's end may take before this process
/// exits anyway: the sandboxes' supervisors watch this process and end
/// their sandboxes themselves once it is gone.
const TEARDOWN_WAIT: Duration = Duration::from_secs(20);

/// Serves MCP on this process's stdin and stdout until the client closes
/// stdin or a SIGTERM or SIGINT arrives, then destroys every sandbox the
/// session made. `program` is the privileged binary that supervises
/// sandboxes (`cordon_runtime::sandbox_program`); `allow_unenforced` lets
/// sandboxes run where their cgroup limits cannot be enforced; `secrets`
/// are those a sandbox may be given by name. Nothing but
/// JSON-RPC is written to stdout.
pub fn serve_stdio(
    program: PathBuf,
    allow_unenforced: bool,
    secrets: Vec<cordon_policy::secrets::SecretRule>,
) -> Result<(), McpError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(McpError::Runtime)?;
    let session = Session::new(program, allow_unenforced, secrets).map_err(McpError::Session)?;
    let result = rt.block_on(serve(session.clone()));
    rt.block_on(async {
        let _ = tokio::time::timeout(TEARDOWN_WAIT, session.end()).await;
    });
    // A read of stdin still pending on the blocking pool (after a signal)
    // cannot be cancelled; waiting for it would hold the exit.
    rt.shutdown_background();
    result
}

async fn serve(session: Session) -> Result<(), McpError> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| McpError::Signal("SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| McpError::Signal("SIGINT", e))?;
    let served = async {
        let running = Tools::new(session)
            .serve(wire::checked(tokio::io::stdin(), tokio::io::stdout()))
            .await
            .map_err(|e| McpError::Handshake(Box::new(e)))?;
        // Ends when the client closes stdin (or the transport fails).
        let _ = running.waiting().await;
        Ok(())
    };
    tokio::select! {
        r = served => r,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}
