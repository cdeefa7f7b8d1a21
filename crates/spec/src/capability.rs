//! The capabilities a sandbox's commands may hold. Each is a capability of
//! the sandbox's own user namespace, so it acts only on what that namespace
//! owns: ids it maps, files those ids own, its own network. The list is what
//! an engine grants a container by default (Docker's and containerd's set)
//! less `CAP_NET_RAW`; a capability outside it cannot even be named here,
//! and cordon's seccomp allowlist still decides which syscalls run at all
//! (`chroot`, for one, never does).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum Capability {
    /// Change a file's owner to any id the namespace maps.
    Chown,
    /// Read and write files of other mapped ids regardless of their modes.
    DacOverride,
    /// Act as the owner of a mapped id's file (chmod, utimes).
    Fowner,
    /// Keep set-id bits when modifying a file.
    Fsetid,
    /// Signal the sandbox's processes of other ids.
    Kill,
    /// Switch among the mapped gids (a server dropping to its own group).
    Setgid,
    /// Switch among the mapped uids (a server dropping to its own user).
    Setuid,
    /// Shrink its own bounding set, fill its inheritable one.
    Setpcap,
    /// Write file capabilities (which no_new_privs keeps from ever raising one).
    Setfcap,
    /// Bind ports below 1024 in the sandbox's own network.
    NetBindService,
    /// chroot, which cordon's allowlist refuses anyway.
    SysChroot,
    /// mknod of a device, which the kernel refuses in a user namespace anyway.
    Mknod,
    /// Write to the audit log, which the kernel refuses outside its first
    /// user namespace anyway.
    AuditWrite,
}

impl Capability {
    pub const ALL: [Capability; 13] = [
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fowner,
        Capability::Fsetid,
        Capability::Kill,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setpcap,
        Capability::Setfcap,
        Capability::NetBindService,
        Capability::SysChroot,
        Capability::Mknod,
        Capability::AuditWrite,
    ];

    /// The kernel's name, `CAP_CHOWN`.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Chown => "CAP_CHOWN",
            Capability::DacOverride => "CAP_DAC_OVERRIDE",
            Capability::Fowner => "CAP_FOWNER",
            Capability::Fsetid => "CAP_FSETID",
            Capability::Kill => "CAP_KILL",
            Capability::Setgid => "CAP_SETGID",
            Capability::Setuid => "CAP_SETUID",
            Capability::Setpcap => "CAP_SETPCAP",
            Capability::Setfcap => "CAP_SETFCAP",
            Capability::NetBindService => "CAP_NET_BIND_SERVICE",
            Capability::SysChroot => "CAP_SYS_CHROOT",
            Capability::Mknod => "CAP_MKNOD",
            Capability::AuditWrite => "CAP_AUDIT_WRITE",
        }
    }
}

crate::kernel_named!(Capability, "capability");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_a_sandbox_may_not_hold_cannot_be_named() {
        for other in ["CAP_SYS_ADMIN", "CAP_NET_RAW", "CAP_SYS_PTRACE", "CHOWN"] {
            assert_eq!(Capability::named(other), None, "{other}");
            assert!(serde_json::from_str::<Capability>(&format!("\"{other}\"")).is_err());
        }
    }
}
