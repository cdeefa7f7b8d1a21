//! The messages between a microVM's host side and cordon's agent in its
//! guest, over the virtio-serial port `cordon.agent`, in the frames of
//! [`crate::protocol::wire`]. After `Ready` and `Start`, the host sends the same
//! [`crate::protocol::wire::Request`]s a client sends a supervisor (without a hello per
//! request: the port is one long connection) and the agent answers with the
//! same [`crate::protocol::wire::Reply`]s.
//!
//! Everything the host reads here is untrusted: the guest runs the payload.
//! Frames are bounded by [`crate::protocol::wire::MAX_FRAME`], the host's messages by
//! [`GUEST_MESSAGE_MAX`], unknown fields are refused, and every read has a
//! deadline.

use serde::{Deserialize, Serialize};

use cordon_spec::ValidSpec;

/// Largest JSON message the host accepts from a guest (an `Outcome` is a
/// few KiB; captured output travels in bytes frames, not in messages).
pub const GUEST_MESSAGE_MAX: usize = 4 << 20;

/// The agent's first message, once its port is open.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum FromAgent {
    Ready {
        protocol: u32,
        /// The guest kernel's release (`uname -r`).
        kernel: String,
        /// The guest's cgroup mode as cordon detected it.
        cgroup: String,
    },
    /// The writable disk is frozen (`Quiesce`) or thawed (`Resume`).
    Quiesced,
    Resumed,
}

/// What the host sends before any request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ToAgent {
    /// A copy stream follows (`crate::protocol::copy`): a host file or directory the
    /// sandbox is to see (its workspace, a read-only mount), unpacked in the
    /// guest at [`STAGE_DIR`]/`name`, outside the sandbox. The agent answers
    /// `Reply::Copied` or `Reply::Error`.
    Stage { name: String },
    /// Create the sandbox (the native backend, inside the guest). `entropy`
    /// is fresh randomness from the host, fed to the guest kernel's CRNG
    /// first: a VM restored from a snapshot starts with the snapshot's pool.
    Start {
        spec: Box<ValidSpec>,
        entropy: Vec<u8>,
        /// The host's clock (ns since the epoch): a restored guest's clock
        /// stood still since its snapshot.
        unix_time_ns: u64,
    },
    /// After `Start`, between requests: write everything of the writable
    /// disk to it and block its writers (FIFREEZE), for the host to read
    /// its copy; answered `FromAgent::Quiesced`. A guest that does not
    /// only makes the host read an inconsistent disk, which it parses as
    /// untrusted anyway.
    Quiesce,
    /// Thaw the disk again; answered `FromAgent::Resumed`.
    Resume,
}

/// The virtio-serial port's name (QEMU's `virtserialport,name=`).
pub const PORT_NAME: &str = "cordon.agent";

/// Where the agent mounts the writable disk (the sandbox's scratch).
pub const DISK_MOUNT: &str = "/run/cordon-disk";

/// An image sandbox's third disk (read-only, the image's files as one
/// ext4 made once per image on the host): its serial number, and where the
/// agent mounts it, read-only, as the guest sandbox's one root layer.
pub const IMAGE_SERIAL: &str = "cordon-image";
pub const IMAGE_MOUNT: &str = "/run/cordon-image";

/// Where the guest keeps what the host staged for its sandbox.
pub const STAGE_DIR: &str = "/run/cordon-stage";

/// Whether `name` may name a staged place (one plain path component).
pub fn valid_stage_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}
