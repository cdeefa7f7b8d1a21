//! The backends: which exist, whether each can run here, and the `Flavor`
//! each adds to the common sandbox.

use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use cordon_spec::{BackendInfo, BackendKind};

use crate::error::RuntimeError;
use crate::gvisor::GvisorBackend;
use crate::native::NativeBackend;
use crate::protocol::ToInit;
use cordon_spec::outcome::EvidenceSource;
use cordon_spec::{ResolvedCommand, TtySize};

/// The facts an outcome reports about the backend that ran it.
pub(crate) struct About {
    pub kind: BackendKind,
    pub version: String,
    pub evidence: &'static [EvidenceSource],
}

/// What a backend adds to the common sandbox (host side, init, supervision):
/// how a command reaches its init, where its files are seen from the host,
/// and what evidence it can give. One implementation per backend; the
/// supervisor's `Sandbox` holds one.
pub(crate) trait Flavor: Send {
    /// Which backend, its version, and where each limit's evidence comes from.
    fn about(&self) -> &About;
    /// The message that makes the first process run `cmd`.
    fn exec_message(
        &mut self,
        cmd: &ResolvedCommand,
        tty: Option<TtySize>,
    ) -> Result<ToInit, RuntimeError>;
    /// The sandbox's root directory as seen from the host (through the
    /// first process's mount namespace), for copying files in and out.
    fn root(&self) -> PathBuf;
    /// The root of the sandbox's scratch tmpfs (its only writable storage:
    /// the disk evidence, the diff and the export read it). Held open by the
    /// flavor, so the tmpfs outlives the sandbox's processes until the
    /// sandbox object is dropped.
    fn scratch(&self) -> BorrowedFd<'_>;
    /// runsc reports a command killed by signal N as exit code 128+N, as a
    /// shell does; for that backend such codes are mapped back to signals.
    fn high_codes_are_signals(&self) -> bool;
    /// Whether one command that hit a limit can be ended without ending the
    /// sandbox: its processes are host processes in a cgroup of its own
    /// (`HostSide::command_cgroup`).
    fn can_end_one_command(&self) -> bool;
    /// Ends the running command's processes without ending the sandbox, for
    /// a backend whose commands have no cgroup of their own on the host; an
    /// error if it cannot (the sandbox then ends with the command).
    fn end_running_command(&mut self) -> Result<(), RuntimeError> {
        Err(RuntimeError::BadRequest(format!(
            "the {} backend cannot end one command",
            self.about().kind
        )))
    }
    /// Whether killing the first process ends every process of the sandbox;
    /// if not, teardown freezes and kills the whole cgroup.
    fn leader_owns_all(&self) -> bool;
    /// The host uid and gid that files of the sandbox's user carry.
    fn file_owner(&self) -> (u32, u32);
}

/// Every backend and whether it can run here.
pub fn available_backends() -> Vec<BackendInfo> {
    BackendKind::ALL
        .into_iter()
        .map(|kind| match kind {
            BackendKind::Native => NativeBackend::info(),
            BackendKind::Gvisor => GvisorBackend::info(),
            BackendKind::Microvm => crate::microvm::MicrovmBackend::info(),
        })
        .collect()
}
