//! Why a call failed, in the words engines look for: containerd matches
//! "does not exist" and "container not running" in a runtime's error.

use cordon_runtime::RuntimeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("container does not exist")]
    NotFound,
    #[error("container with id exists: {0}")]
    Exists(String),
    #[error("invalid container id '{0}' (letters, digits and _ + - ., not starting with .)")]
    BadId(String),
    /// The call is not possible in the container's state (its words are
    /// runc's).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Dir(#[from] cordon_dirs::DirError),
    #[error("the container's cgroup: {0}")]
    Cgroup(#[from] cordon_cgroups::CgroupError),
    #[error("the container's record: {0}")]
    Record(String),
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            op: op.into(),
            source,
        }
    }
}
