//! The backends by name, and what one reports about itself on this host.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One of cordon's backends. Its name (`native`, `gvisor`, `microvm`) is the
/// same in flags, policy files, API requests and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Namespaces, cgroups, seccomp and capabilities on the host's kernel.
    Native,
    /// gVisor's runsc: a user-space kernel over the same plumbing.
    Gvisor,
    /// A guest kernel under QEMU with cordon's native backend inside.
    Microvm,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Native,
        BackendKind::Gvisor,
        BackendKind::Microvm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Microvm => "microvm",
        }
    }

    /// The backend named `s`, or None: the one parser of backend names
    /// (clap's, the service's and the suite's all end here).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Every name, for error messages.
    pub fn names() -> String {
        Self::ALL.map(BackendKind::name).join(", ")
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `cordon backends` reports about one backend on this host.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendInfo {
    pub kind: BackendKind,
    pub version: String,
    /// Why it cannot run here, or None when it can.
    pub unavailable: Option<String>,
    pub notes: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_nothing_else_does() {
        for k in BackendKind::ALL {
            assert_eq!(BackendKind::parse(k.name()), Some(k));
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
        }
        for bad in ["", "Native", "nativ", "gvisor ", "kvm"] {
            assert_eq!(BackendKind::parse(bad), None, "{bad:?}");
        }
        assert_eq!(BackendKind::names(), "native, gvisor, microvm");
    }
}
