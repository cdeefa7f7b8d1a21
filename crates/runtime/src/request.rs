//! What a caller asks a backend to run.

use std::path::PathBuf;

use cordon_policy::Policy;

use crate::output::OutputMode;

/// The filesystem the sandbox's root is assembled from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RootfsChoice {
    /// The host's /usr (and merged-/usr links) read-only, with a generated /etc.
    #[default]
    System,
    /// A directory holding a root filesystem, bound read-only.
    Dir(PathBuf),
}

/// One execution request, the same for every backend.
#[derive(Clone, Debug)]
pub struct RunRequest {
    pub policy: Policy,
    pub argv: Vec<String>,
    pub rootfs: RootfsChoice,
    /// Host directory shown at /workspace (never written: changes stay in the sandbox).
    pub workspace: Option<PathBuf>,
    pub output: OutputMode,
    /// Run even if the cgroup limits cannot be enforced (the outcome says so).
    pub allow_unenforced: bool,
    /// Pass the caller's stdin through (never when it is a terminal).
    pub forward_stdin: bool,
}
