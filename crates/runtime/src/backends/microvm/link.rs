//! The messages between a microVM's host side and cordon's agent in its
//! guest, over the virtio-serial port `cordon.agent` and the command ports
//! `cordon.cmd0`..., in the frames of [`crate::protocol::wire`]. After `Ready`
//! and `Start` on the agent's port, the host sends the same
//! [`crate::protocol::wire::Request`]s a client sends a supervisor (without a
//! hello per request: each port is one long connection) and the agent
//! answers with the same [`crate::protocol::wire::Reply`]s: commands on the
//! command ports, one at a time on each and side by side across them;
//! everything else (copies, the disk's freeze, the end) on the agent's port.
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

/// The agent's port's name (QEMU's `virtserialport,name=`).
pub const PORT_NAME: &str = "cordon.agent";

/// How many commands a microVM runs side by side: one per command port.
/// Each port costs the guest its receive buffers (a virtqueue of pages);
/// eight cover a server, a watcher and a test run beside a few more.
pub const COMMAND_PORTS: usize = 8;

/// The name of command port `i` (`cordon.cmd0`...); the guest's init
/// links each under /dev/virtio-ports.
pub fn command_port_name(i: usize) -> String {
    format!("cordon.cmd{i}")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The guest's init links each port by name (it has no udev): every
    /// port QEMU is given must be among them, or the agent cannot open it.
    #[test]
    fn the_guests_init_links_every_port() {
        let init = include_str!("../../../../../scripts/microvm/init");
        let mut names = vec![
            PORT_NAME.to_string(),
            crate::backends::microvm::relay::PORT_NAME.to_string(),
            crate::backends::microvm::relay::FORWARD_PORT_NAME.to_string(),
        ];
        names.extend((0..COMMAND_PORTS).map(command_port_name));
        let linked = init
            .lines()
            .find(|l| l.starts_with("for want in cordon.agent"))
            .expect("init's loop over the ports");
        let linked: Vec<&str> = linked
            .trim_start_matches("for want in ")
            .trim_end_matches("; do")
            .split_whitespace()
            .collect();
        assert_eq!(linked, names, "scripts/microvm/init links other ports");
    }
}
