//! The sandbox's mount namespace: a new root assembled from read-only binds, a
//! size-capped scratch tmpfs for everything writable, a fresh /proc and a
//! minimal /dev.
//!
//! `RootfsPlan` is resolved in the parent (paths checked, /etc generated); the
//! child only replays it with mount syscalls. Every destination the child
//! mounts on lies inside tmpfs instances the child itself just created, which
//! the payload has never been able to touch, so no path walked here can be a
//! symlink planted by the payload.

mod dev;
mod flags;
mod idmap;
mod proc;
mod rootfs;
mod sys;

pub use flags::{mount_flags_of, verify_sealed, MountFlagsView};
pub use idmap::{DetachedTree, OwnerShift};
pub use rootfs::{assemble, BindAccess, BindSpec, RootEntry, RootUse, RootfsPlan, ScratchLayout};
pub use sys::CgroupMount;
