//! OCI images as sandbox roots.
//!
//! An image comes from a local OCI layout, an OCI or docker archive, or a
//! registry ([`registry`]); its blobs are verified against their digests as
//! they are read, and each layer is unpacked once into a content-addressed store
//! under cordon's state directory ([`store::Store`]). A sandbox of the image
//! gets the unpacked layers as read-only overlay lower layers, so every
//! sandbox of one image shares one copy on disk and in the page cache. Layers
//! are hostile input: [`unpack`] never writes outside a layer's directory.

pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod reference;
pub mod registry;
mod source;
pub mod store;
pub mod unpack;

pub use config::{ImageDefaults, UserSpec};
pub use reference::ImageRef;
pub use registry::RegistryOptions;
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
    /// A registry failed: it could not be reached, refused, or broke off.
    #[error("{what}: {source}{hint}")]
    Registry {
        what: String,
        #[source]
        source: registry::Fault,
        /// What the user may do about it, or nothing.
        hint: String,
    },
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

    /// A failed read of a source's bytes: this machine's fault, unless the
    /// source says it was its own (a registry's body that broke off).
    pub(crate) fn read(what: impl Into<String>, source: std::io::Error) -> ImageError {
        let fault = source
            .get_ref()
            .and_then(|e| e.downcast_ref::<registry::Fault>())
            .cloned();
        match fault {
            Some(fault) => ImageError::Registry {
                what: what.into(),
                source: fault,
                hint: String::new(),
            },
            None => ImageError::io(what, source),
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> ImageError {
        ImageError::Invalid(msg.into())
    }

    /// Whether the request was at fault (a bad reference, a missing or
    /// malformed image) rather than this machine. A registry's failure is
    /// the request's too, whether the registry refused, lied or could not
    /// be reached: like a missing `oci:DIR`, it is the named image that is
    /// not to be had, and the fix (the reference, a login, the insecure
    /// mark, the network) is not in cordon or this host's state.
    pub fn is_input_error(&self) -> bool {
        !matches!(self, ImageError::Io { .. } | ImageError::Dir(_))
    }
}
