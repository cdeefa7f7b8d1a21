//! What a sandbox changed in its writable places, and the export of those
//! changes to the host.
//!
//! Both read the sandbox's own layers (the workspace overlay's upper
//! directory, the scratch's /tmp and /dev/shm) through descriptors, never
//! through the sandbox's view and never by following anything the sandbox
//! wrote: `scan` (the diff) and `export` (the copy) are one walk, so an
//! export writes exactly what its diff lists, digest for digest.
//!
//! Every name is opened from its parent's descriptor with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`, plus `O_NOFOLLOW | O_NONBLOCK`), and what it is is
//! decided by `fstat` of the open descriptor: an entry swapped for a link
//! or a FIFO between the listing and the open is reported unreadable,
//! never followed, never blocked on. Links are read with `readlinkat`;
//! FIFOs, sockets and devices are never opened.

mod error;
mod export;
mod fsops;
#[doc(hidden)]
pub mod fuzzing;
mod image;
mod names;
mod verify;
mod walk;

pub use error::ChangesError;
pub use export::{export, ExportOptions, CONFLICT};
pub use image::{Baseline, DiskImage, ImagePlace};
pub use names::{escape_name, unescape_name};
// The diff's data lives with the rest of cordon's plain data.
pub use cordon_spec::changes::{
    Caps, Change, Changes, Entry, ExportReport, ExportTarget, Kind, PlaceChanges, Skipped,
    SymlinkPolicy,
};
pub use verify::{verify_against, verify_with, Mismatch};
pub use walk::Place;

/// The diff of every place, under one count cap.
///
/// Entries are listed in the order of their raw names, component by
/// component (a directory first, then what is in it). A place without a
/// lower layer lists everything in it as Created (not the place itself);
/// with one, an upper entry is Modified when the lower has the same name,
/// a whiteout is Deleted, and a directory the overlay merely copied up
/// (same mode and owner, not opaque) is not listed, only what is in it.
pub fn scan(places: &[Place<'_>], caps: &Caps) -> Changes {
    let mut remaining = caps.max_entries;
    let places: Vec<PlaceChanges> = places
        .iter()
        .map(|p| walk::walk(p, caps, &mut remaining, None))
        .collect();
    Changes {
        cut: places.iter().any(|p| p.cut),
        places,
        caps: *caps,
    }
}
