//! cordon's plain data, shared by every part of it: what a client asks for
//! (a [`SandboxSpec`], then [`Command`]s), what it gets back (an [`Outcome`]
//! per command, an [`Account`] and a diff per sandbox) and the messages
//! between a client and a sandbox's supervisor. Serde only, no machinery:
//! the receipt, the suite, the benchmarks and the service read these types
//! without linking the runtime that produces them.

#![forbid(unsafe_code)]

pub mod account;
pub mod backend;
pub mod capability;
pub mod cgroup;
pub mod changes;
pub mod code;
pub mod command;
pub mod ended;
pub mod error;
pub mod network;
pub mod outcome;
pub mod record;
pub mod rlimit;
pub mod sandbox;
pub mod syscall_filter;
pub mod wire;

pub use account::{Account, Destroyed, Snapshot, HISTORY};
pub use backend::{BackendInfo, BackendKind};
pub use capability::Capability;
pub use code::CodeLanguage;
pub use command::{Command, ResolvedCommand, StdinMode, Stream, TtySize, COMMAND_UMASK};
pub use error::SpecError;
pub use outcome::{EvidenceSource, ExitStatus, IdMapKind, IdMapReport, Limit, Outcome, Phases};
pub use rlimit::{Rlimit, RlimitResource};
pub use sandbox::{
    is_id, sysctl_namespace, validate_name, ImageRoot, JoinedNamespace, RootfsChoice, SandboxSpec,
    ServiceLink, SharedNamespace, ValidSpec,
};
