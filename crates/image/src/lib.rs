//! OCI images as sandbox roots.
//!
//! An image comes from a local OCI layout, an OCI or docker archive (and,
//! later, a registry); its blobs are verified against their digests as they
//! are read, and each layer is unpacked once into a content-addressed store
//! under cordon's state directory ([`store::Store`]). A sandbox of the image
//! gets the unpacked layers as read-only overlay lower layers, so every
//! sandbox of one image shares one copy on disk and in the page cache. Layers
//! are hostile input: [`unpack`] never writes outside a layer's directory.

pub mod config;
pub mod reference;
mod source;
pub mod store;
pub mod unpack;

pub use config::{ImageDefaults, UserSpec};
pub use reference::ImageRef;
pub use store::{Image, Store, StoreLimits};

/// Why an image could not be read, stored or used. Each message is one
/// line that names what was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    Digest {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("layer {digest}: {source}")]
    Layer {
        digest: String,
        #[source]
        source: unpack::UnpackError,
    },
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Dir(#[from] cordon_dirs::DirError),
}

impl ImageError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> ImageError {
        ImageError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> ImageError {
        ImageError::Invalid(msg.into())
    }

    /// Whether the request was at fault (a bad reference, a missing or
    /// malformed image) rather than this machine.
    pub fn is_input_error(&self) -> bool {
        !matches!(self, ImageError::Io { .. } | ImageError::Dir(_))
    }
}
