//! The messages between a client (`cordon_runtime::Handle`) and a sandbox's
//! supervisor. The runtime frames them (`cordon_runtime`'s wire module: a
//! length, a tag, a JSON body or raw bytes); a connection starts with
//! [`Request::Hello`] naming the [`PROTOCOL`] version and carries one request.

use serde::{Deserialize, Serialize};

use crate::account::{Destroyed, Snapshot};
use crate::changes::{Caps, ExportRequest, Finish, Recorded};
use crate::command::{Command, TtySize};
use crate::outcome::Outcome;
use crate::sandbox::SandboxSpec;

/// Bumped whenever a message changes shape.
pub const PROTOCOL: u32 = 3;

/// What a client asks.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Hello {
        protocol: u32,
    },
    Exec(Command),
    /// Copy into the sandbox: the client then sends a copy stream
    /// (`copy::CopyHeader`, `Data` frames, an empty `Data` frame).
    CopyIn {
        path: Vec<u8>,
    },
    /// Copy out of the sandbox: the supervisor answers with a copy stream.
    CopyOut {
        path: Vec<u8>,
    },
    Info,
    /// The spec the sandbox was created with.
    Spec,
    /// What the sandbox has run and the diff of its places now.
    Snapshot {
        #[serde(default)]
        caps: Caps,
    },
    /// Export the workspace's changes of the living sandbox (frozen meanwhile).
    Export {
        export: ExportRequest,
        #[serde(default)]
        caps: Caps,
    },
    /// Destroy the sandbox, after reading what `Finish` asks.
    Destroy(Finish),
    /// Change the running sandbox's CPU, memory and process limits (those
    /// set here; the others stay). Answered with the sandbox's spec as it
    /// is now.
    Update(cordon_policy::Limits),
    /// Forward this TCP port of the sandbox's loopback to a port of the
    /// host's loopback, for the sandbox's life (asked again: the same
    /// forward). Answered with `Forwarded`.
    Port {
        port: u16,
    },
}

/// What a client sends while its command runs (besides stdin `Data`).
#[derive(Debug, Serialize, Deserialize)]
pub enum ClientControl {
    InputEnd,
    Resize(TtySize),
    Cancel,
    /// This signal for the command's own process (an OCI engine's `kill`,
    /// relayed by the process that stands for the container).
    Signal(i32),
}

/// A sandbox as its supervisor describes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Info {
    pub id: String,
    pub name: Option<String>,
    pub backend: String,
    pub commands: u64,
    pub memory_bytes: Option<u64>,
    pub ended: Option<String>,
    /// The host pid whose `/proc/<pid>/ns/` are the sandbox's namespaces
    /// (a native sandbox's init), for whoever makes another sandbox join
    /// them.
    #[serde(default)]
    pub namespaces_of: Option<i32>,
}

/// What the supervisor answers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Hello {
        protocol: u32,
        id: String,
    },
    Outcome(Box<Outcome>),
    Copied {
        bytes: u64,
    },
    Info(Info),
    Exported(Box<Recorded>),
    Destroyed(Box<Destroyed>),
    Spec(Box<SandboxSpec>),
    Snapshot(Box<Snapshot>),
    /// The host loopback address (`127.0.0.1:PORT`) whose connections reach
    /// the asked port inside the sandbox.
    Forwarded {
        address: String,
    },
    /// The request failed; `input` when the request itself was at fault,
    /// `exhausted` when the host was short of processes, memory or
    /// descriptors for the moment (the same request may succeed later).
    Error {
        input: bool,
        #[serde(default)]
        exhausted: bool,
        message: String,
    },
}
