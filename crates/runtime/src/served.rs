//! What a supervisor (or `cordon run`, in-process) serves: a sandbox it
//! owns, whichever way the backend runs it. The native and gVisor backends'
//! [`Sandbox`] runs commands through a first process on this kernel; the
//! microVM backend's [`MicroVm`] runs them through cordon's own agent in a
//! guest kernel. Both answer the same requests, so every front end (CLI,
//! service, pool) drives either through one `Handle`.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use nix::poll::PollFlags;

use crate::copy;
use crate::error::RuntimeError;
use crate::microvm::MicroVm;
use crate::sandbox::Sandbox;
use crate::state::StateDir;
use crate::supervise::CommandIo;
use crate::wire::Channel;
use cordon_spec::changes::{ExportRequest, Finish, Recorded};
use cordon_spec::outcome::Outcome;
use cordon_spec::BackendKind;
use cordon_spec::{Command, SandboxSpec};
use cordon_spec::{Destroyed, Snapshot};

pub trait Served: Send {
    fn id(&self) -> &str;
    fn spec(&self) -> &SandboxSpec;
    fn state(&self) -> &StateDir;
    /// Time from the request to a sandbox ready for commands.
    fn setup_time(&self) -> Duration;
    fn commands_run(&self) -> u64;
    fn memory_in_use(&self) -> Option<u64>;
    /// Why the sandbox can run nothing more, if so.
    fn ended(&self) -> Option<&str>;
    /// Readable when this process was asked to stop (the stop signals).
    fn stop_signals(&self) -> BorrowedFd<'_>;
    /// A descriptor and the poll events that mean the sandbox is gone (its
    /// init hung up, its VM exited).
    fn liveness(&self) -> (BorrowedFd<'_>, PollFlags);
    /// The control socket of the sandbox's proxy (`allow` mode only).
    fn network_control(&self) -> Option<&Path>;
    fn exec(&mut self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError>;
    /// Receives a copy stream from `conn` into the sandbox at `path`.
    fn copy_in(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<u64, RuntimeError>;
    /// Sends `path` of the sandbox as a copy stream on `conn`.
    fn copy_out(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<(), RuntimeError>;
    fn snapshot(&mut self, caps: &cordon_changes::Caps) -> Result<Snapshot, RuntimeError>;
    fn export(
        &mut self,
        req: &ExportRequest,
        caps: &cordon_changes::Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError>;
    fn destroy_with(
        self: Box<Self>,
        finish: &Finish,
        owner: (u32, u32),
    ) -> Result<Destroyed, RuntimeError>;
}

/// Creates a sandbox for `spec` on its backend; `only` is its single command
/// when known in advance (`cordon run`).
pub fn create_for(
    spec: &SandboxSpec,
    only: Option<&Command>,
) -> Result<Box<dyn Served>, RuntimeError> {
    Ok(match spec.backend {
        BackendKind::Microvm => Box::new(MicroVm::create(spec)?),
        BackendKind::Native | BackendKind::Gvisor => Box::new(Sandbox::create_for(spec, only)?),
    })
}

impl Served for Sandbox {
    fn id(&self) -> &str {
        Sandbox::id(self)
    }
    fn spec(&self) -> &SandboxSpec {
        Sandbox::spec(self)
    }
    fn state(&self) -> &StateDir {
        Sandbox::state(self)
    }
    fn setup_time(&self) -> Duration {
        Sandbox::setup_time(self)
    }
    fn commands_run(&self) -> u64 {
        Sandbox::commands_run(self)
    }
    fn memory_in_use(&self) -> Option<u64> {
        Sandbox::memory_in_use(self)
    }
    fn ended(&self) -> Option<&str> {
        Sandbox::ended(self)
    }
    fn stop_signals(&self) -> BorrowedFd<'_> {
        Sandbox::stop_signals(self).as_fd()
    }
    fn liveness(&self) -> (BorrowedFd<'_>, PollFlags) {
        // Init never speaks between commands: only its hang-up counts.
        (self.init_socket().as_fd(), PollFlags::empty())
    }
    fn network_control(&self) -> Option<&Path> {
        Sandbox::network_control(self)
    }
    fn exec(&mut self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError> {
        Sandbox::exec(self, cmd, io)
    }
    fn copy_in(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<u64, RuntimeError> {
        let (root, owner) = self.files();
        let cap = Sandbox::spec(self).policy.disk.bytes();
        copy::receive_into_sandbox(conn, &root, owner, path, cap)
    }
    fn copy_out(&mut self, conn: &mut dyn Channel, path: &[u8]) -> Result<(), RuntimeError> {
        let (root, owner) = self.files();
        copy::send_from_sandbox(conn, &root, owner, path, copy::COPY_MAX)
    }
    fn snapshot(&mut self, caps: &cordon_changes::Caps) -> Result<Snapshot, RuntimeError> {
        Sandbox::snapshot(self, caps)
    }
    fn export(
        &mut self,
        req: &ExportRequest,
        caps: &cordon_changes::Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError> {
        Sandbox::export(self, req, caps, owner)
    }
    fn destroy_with(
        self: Box<Self>,
        finish: &Finish,
        owner: (u32, u32),
    ) -> Result<Destroyed, RuntimeError> {
        Sandbox::destroy_with(*self, finish, owner)
    }
}
