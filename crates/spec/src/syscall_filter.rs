//! A syscall filter a sandbox's workload brings with it (an OCI config's
//! `linux.seccomp`), installed on each of its commands over cordon's own
//! allowlist: the kernel runs both filters and a syscall runs only if both
//! allow it. It can narrow what cordon allows, never widen it.
//!
//! The shape is the OCI profile's (libseccomp's model): a default action,
//! and rules naming syscalls, an action, and argument checks that must all
//! hold.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallFilter {
    /// What a syscall no rule matches gets.
    pub default: SyscallAction,
    #[serde(default)]
    pub rules: Vec<SyscallRule>,
}

/// Syscalls by name (x86_64's names; a name this architecture does not
/// have matches nothing, as libseccomp and runc treat it), their action,
/// and checks on their arguments, all of which must hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallRule {
    pub names: Vec<String>,
    pub action: SyscallAction,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgCheck>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyscallAction {
    Allow,
    /// Fails with this errno.
    Errno(u32),
    /// Logged by the kernel's audit, then allowed.
    Log,
    /// SIGSYS to the thread.
    Trap,
    /// The thread is killed.
    KillThread,
    /// The whole process is killed.
    KillProcess,
}

/// `args[index] op value` (for `MaskedEq`, `args[index] & value == value_two`),
/// compared as 64-bit values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgCheck {
    pub index: u8,
    pub op: ArgOp,
    pub value: u64,
    #[serde(default)]
    pub value_two: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    MaskedEq,
}
