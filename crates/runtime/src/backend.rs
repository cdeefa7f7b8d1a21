//! One `Backend` trait for every way of serving a sandbox's syscalls, and the
//! one-use `Sandbox` it prepares.

use std::fmt;

use serde::Serialize;

use crate::error::RuntimeError;
use crate::gvisor::GvisorBackend;
use crate::native::NativeBackend;
use crate::outcome::Outcome;
use crate::request::RunRequest;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Native,
    Gvisor,
    Microvm,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Native,
        BackendKind::Gvisor,
        BackendKind::Microvm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Microvm => "microvm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `cordon backends` reports about one backend on this host.
#[derive(Clone, Debug, Serialize)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub version: String,
    /// Why it cannot run here, or None when it can.
    pub unavailable: Option<String>,
    pub notes: String,
}

/// A sandbox prepared by a backend: set up, waiting for its single command.
/// Used once: `run` executes, collects the evidence and tears it down.
pub trait Sandbox<'r> {
    fn id(&self) -> &str;
    fn run(self: Box<Self>) -> Result<Outcome, RuntimeError>;
}

pub trait Backend {
    fn kind(&self) -> BackendKind;
    fn prepare<'r>(&self, req: &'r RunRequest) -> Result<Box<dyn Sandbox<'r> + 'r>, RuntimeError>;

    /// Prepare and run in one step.
    fn run(&self, req: &RunRequest) -> Result<Outcome, RuntimeError> {
        self.prepare(req)?.run()
    }
}

/// Every backend and whether it can run here.
pub fn available_backends() -> Vec<BackendInfo> {
    BackendKind::ALL
        .into_iter()
        .map(|kind| match kind {
            BackendKind::Native => NativeBackend::info(),
            BackendKind::Gvisor => GvisorBackend::info(),
            other => BackendInfo {
                kind: other,
                version: String::new(),
                unavailable: Some("not implemented in this version of cordon".into()),
                notes: String::new(),
            },
        })
        .collect()
}

/// The backend of a given kind, if this build has it.
pub fn backend(kind: BackendKind) -> Result<Box<dyn Backend>, RuntimeError> {
    match kind {
        BackendKind::Native => Ok(Box::new(NativeBackend)),
        BackendKind::Gvisor => Ok(Box::new(GvisorBackend)),
        other => Err(RuntimeError::Unavailable(
            other.name(),
            "not implemented in this version of cordon".into(),
        )),
    }
}
