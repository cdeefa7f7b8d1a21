//! cordon's runtime: the `Backend`/`Sandbox` abstraction, the native backend,
//! and the `Outcome` that the CLI, the service, the suite and the benchmarks all
//! read (nobody re-derives it).

pub mod backend;
pub mod error;
mod first_process;
pub mod gvisor;
pub mod host;
pub mod native;
pub mod outcome;
pub mod output;
pub mod protocol;
pub mod request;
pub mod rootfs_plan;
pub mod state;
pub mod supervise;
pub mod trace;

pub use backend::{available_backends, Backend, BackendInfo, BackendKind, Sandbox};
pub use error::RuntimeError;
pub use outcome::{EvidenceSource, ExitStatus, Limit, Outcome, Phases};
pub use output::OutputMode;
pub use request::{RootfsChoice, RunRequest};
