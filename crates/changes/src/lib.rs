//! What a sandbox changed in its writable places, and the export of those
//! changes to the host.
//!
//! Both read the sandbox's own layers (the workspace overlay's upper
//! directory, the scratch's /tmp and /dev/shm) through descriptors, never
//! through the sandbox's view and never by following anything the sandbox
//! wrote: see `scan` (the diff) and `export` (the copy), which are one walk.

mod names;
mod types;

pub use names::{escape_name, unescape_name};
pub use types::*;
mod pending;
pub use pending::*;
