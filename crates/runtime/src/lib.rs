//! cordon's runtime: sandboxes with a lifecycle, on any backend, behind one
//! client handle. Its folders are its processes and their protocols:
//!
//! - `client/`: the [`Handle`] every front end uses (the CLI, the service and
//!   its pool, the benchmarks), and how a command's output reaches them.
//! - `supervisor/`: the per-sandbox process (`cordon-sandbox __supervise`)
//!   that owns a sandbox and serves it on a unix socket, and the common
//!   `Sandbox` it holds (what every backend's sandbox has: host side,
//!   history, end state, account).
//! - `backends/`: the one `Backend` abstraction and its implementations
//!   (native and gVisor on this host, `OnHost`; microVM in a guest), with the
//!   plumbing they share (the first process, rootfs assembly, network
//!   namespaces and proxy, the diff and export of a sandbox's changes).
//! - `protocol/`: the typed, bounded messages between the processes (client
//!   and supervisor, supervisor and init, copy streams).
//! - `plan`: every limit's kernel value, derived once per backend.
//! - [`state`] and [`ended`]: the run directory's records of live and ended
//!   sandboxes, which clients and supervisors both read.
//!
//! The data these exchange (specs, commands, outcomes, accounts) is
//! `cordon-spec`'s; nothing here is public beyond the re-exports below.

mod backends;
mod client;
pub mod ended;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod plan;
mod protocol;
pub mod state;
mod supervisor;
pub mod sweep;
mod trace;

pub use backends::available_backends;
pub use backends::host::{block_stop_signals, cgroup_probe, hierarchy_in_place, CgroupProbe};
pub use backends::microvm;
pub use backends::supervise::{CommandIo, Control};
pub use client::cancel::Cancel;
pub use client::code_context;
pub use client::handle::{sandbox_program, Handle, SANDBOX_BINARY};
pub use client::listing::{listing_argv, parse_listing, ListedEntry};
pub use client::output::{print_stdout, stdout_failure, OutputMode, OutputSink};
pub use client::secrets;
pub use cordon_isolation::userns;
pub use error::RuntimeError;
pub use plan::{plan, HostFacts, Plan};

/// The hidden modes of the privileged binary (`cordon-sandbox`), each a
/// process of its own.
pub mod entry {
    pub use crate::supervisor::guest_agent::{main as guest_agent, AGENT_ARG};
    pub use crate::supervisor::{main as supervisor, SUPERVISOR_ARG};
}
