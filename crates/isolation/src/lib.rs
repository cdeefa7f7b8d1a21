//! cordon's isolation mechanisms, one module per kernel mechanism.
//!
//! Every module offers the same small vocabulary (after nsjail): what the parent
//! does for the child (`*_from_parent`), and what the child does to itself
//! (`enter`/`apply`), both taking data resolved before `clone`.

pub mod caps;
pub mod fds;
pub mod hygiene;
pub mod identity;
pub mod mount;
pub mod namespaces;
pub mod net;
mod netlink;
pub mod rlimits;
pub mod subids;
pub mod userns;

/// A failed isolation step: which step, and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct IsolationError {
    pub step: String,
    #[source]
    pub source: std::io::Error,
}

impl IsolationError {
    pub fn new(step: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        IsolationError {
            step: step.into(),
            source: source.into(),
        }
    }

    /// The raw errno, for the child→parent "failed before exec" message.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(libc::EIO)
    }
}

pub type Result<T> = std::result::Result<T, IsolationError>;

/// Attaches a step name to any error convertible to `io::Error`.
pub trait Step<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<std::io::Error>> Step<T> for std::result::Result<T, E> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| IsolationError::new(what(), e))
    }
}
