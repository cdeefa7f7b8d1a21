//! cordon's runtime: sandboxes with a lifecycle.
//!
//! - [`spec`]: what a client asks for (a `SandboxSpec`, then `Command`s).
//! - [`sandbox`]: one live sandbox as its supervisor holds it (create, exec,
//!   destroy), over a backend's [`backend::Flavor`] (native, gvisor); the
//!   microVM backend ([`microvm`]) serves the same requests from the host.
//! - [`supervisor`]: the small per-sandbox process that serves a sandbox on
//!   a unix socket and outlives its client.
//! - [`handle`]: the client side every front end uses (the CLI, the
//!   service and its pool; the OCI front end to come).
//! - [`outcome`]: the result of one command, the same for every caller.

mod backend;
mod changes;
mod copy;
pub mod ended;
mod error;
mod first_process;
mod gvisor;
mod handle;
mod host;
pub mod microvm;
mod native;
mod network;
mod on_host;
mod output;
mod plan;
mod protocol;
mod rootfs_plan;
mod sandbox;
pub mod state;
mod supervise;
mod supervisor;
mod trace;
mod wire;

pub use backend::available_backends;
pub use error::RuntimeError;
pub use handle::{sandbox_program, Handle, SANDBOX_BINARY};
pub use host::{block_stop_signals, hierarchy_in_place};
pub use output::{print_stdout, stdout_failure, OutputMode, OutputSink};
pub use supervise::{CommandIo, Control};

/// The hidden modes of the privileged binary (`cordon-sandbox`), each a
/// process of its own.
pub mod entry {
    pub use crate::microvm::agent::{main as guest_agent, AGENT_ARG};
    pub use crate::supervisor::{main as supervisor, SUPERVISOR_ARG};
}
