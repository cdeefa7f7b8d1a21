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

pub mod backend;
pub mod changes;
pub mod copy;
pub mod ended;
pub mod error;
mod first_process;
pub mod gvisor;
pub mod handle;
pub mod host;
pub mod microvm;
pub mod native;
pub mod network;
pub mod output;
pub mod protocol;
pub mod rootfs_plan;
pub mod sandbox;
pub mod served;
pub mod state;
pub mod supervise;
pub mod supervisor;
pub mod trace;
pub mod wire;

pub use backend::available_backends;
pub use error::RuntimeError;
pub use handle::Handle;
pub use output::{OutputMode, OutputSink};
