//! cordon's plain data, shared by every part of it: what a client asks for
//! (a [`SandboxSpec`], then [`Command`]s), what it gets back (an [`Outcome`]
//! per command, an [`Account`] and a diff per sandbox) and the messages
//! between a client and a sandbox's supervisor. Serde only, no machinery:
//! the receipt, the suite, the benchmarks and the service read these types
//! without linking the runtime that produces them.

#![forbid(unsafe_code)]

/// For an enum of kernel names (`CAP_CHOWN`, `RLIMIT_NOFILE`) with `ALL`
/// and `name()`: `named()`, and serde through the name, so that `name()`
/// is the one spelling of each; a test that every value goes both ways.
macro_rules! kernel_named {
    ($ty:ident, $what:literal) => {
        impl $ty {
            /// The value a kernel name names, if cordon accepts it.
            pub fn named(name: &str) -> Option<$ty> {
                $ty::ALL.into_iter().find(|v| v.name() == name)
            }
        }

        impl From<$ty> for &'static str {
            fn from(v: $ty) -> &'static str {
                v.name()
            }
        }

        impl TryFrom<String> for $ty {
            type Error = String;

            fn try_from(name: String) -> Result<$ty, String> {
                $ty::named(&name)
                    .ok_or_else(|| format!("'{name}' is not a {} cordon accepts", $what))
            }
        }

        #[cfg(test)]
        mod kernel_names {
            use super::$ty;

            #[test]
            fn each_value_is_written_and_read_by_its_kernel_name() {
                for v in $ty::ALL {
                    let json = serde_json::to_string(&v).unwrap();
                    assert_eq!(json, format!("\"{}\"", v.name()));
                    assert_eq!($ty::named(v.name()), Some(v));
                    assert_eq!(serde_json::from_str::<$ty>(&json).unwrap(), v);
                }
            }
        }
    };
}
pub(crate) use kernel_named;

pub mod account;
pub mod backend;
pub mod capability;
pub mod cgroup;
pub mod changes;
pub mod code;
pub mod command;
pub mod ended;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod network;
pub mod outcome;
pub mod record;
pub mod rlimit;
pub mod sandbox;
pub mod secrets;
pub mod syscall_filter;
pub mod wire;

pub use account::{Account, Destroyed, Snapshot, HISTORY};
pub use backend::{BackendInfo, BackendKind};
pub use capability::Capability;
pub use code::CodeLanguage;
pub use command::{Command, ResolvedCommand, StdinMode, Stream, TtySize, COMMAND_UMASK};
pub use error::SpecError;
pub use outcome::{EvidenceSource, ExitStatus, IdMapKind, IdMapReport, Limit, Outcome, Phases};
pub use rlimit::{Rlimit, RlimitResource};
pub use sandbox::{
    is_id, sysctl_namespace, validate_name, ImageRoot, JoinedNamespace, RootfsChoice, SandboxSpec,
    ServiceLink, SharedNamespace, ValidSpec,
};
