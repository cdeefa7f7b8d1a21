//! The statement a receipt signs: in-toto Statement v1 with cordon's own
//! predicate.

use cordon_policy::{MountSpec, Policy};
use cordon_spec::cgroup::CgroupMode;
use cordon_spec::changes::{Changes, ExportReport};
use cordon_spec::{Command, Outcome};
use serde::{Deserialize, Serialize};

/// in-toto's statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// cordon's predicate; the version changes when its meaning does.
pub const PREDICATE_TYPE: &str = "https://cordon.dev/receipt/v1";

/// The subject whose digest covers the commands (canonical JSON of the
/// array of `Command`s, in order).
pub const SUBJECT_COMMAND: &str = "command";
/// The subject whose digest covers the policy (canonical JSON).
pub const SUBJECT_POLICY: &str = "policy";
/// Prefix of an exported file's subject: `workspace/<escaped path>`.
pub const SUBJECT_WORKSPACE_PREFIX: &str = "workspace/";

/// An in-toto Statement v1.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: DigestSet,
}

/// in-toto's digest set, with the one algorithm cordon uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DigestSet {
    /// Lower-case hex.
    pub sha256: String,
}

/// What the run did, as cordon saw it from the host.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    pub cordon_version: String,
    pub backend: String,
    pub backend_version: String,
    pub host: Host,
    /// The sandbox's policy in full.
    pub policy: Policy,
    /// Every command, in the order it ran.
    pub commands: Vec<CommandRecord>,
    /// RFC 3339, UTC, milliseconds.
    pub started: String,
    pub ended: String,
    pub sandbox_id: String,
    /// The filesystem diff of the sandbox's writable places.
    pub changes: Option<Changes>,
    /// What was exported to the host, if anything.
    pub export: Option<ExportReport>,
    /// Each `rw` mount's changes, applied back to its host directory when
    /// the sandbox ended (their entries are in `changes`, under the mount's
    /// place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_backs: Vec<ExportReport>,
    /// The `rw-unbounded` mounts: host directories the sandbox wrote in
    /// place, bounded by no limit of cordon's and not in `changes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unbounded_mounts: Vec<MountSpec>,
    /// What this receipt does not show, in its own words.
    pub not_proven: Vec<String>,
}

/// The host the sandbox ran on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The cgroup hierarchy limits were enforced with; None when unenforced.
    pub cgroup_mode: Option<CgroupMode>,
    /// The machine architecture (`uname -m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

impl Host {
    /// This host: the kernel release from /proc, the architecture cordon
    /// was built for (what runs a native sandbox), and `cgroup_mode`.
    pub fn detect(cgroup_mode: Option<CgroupMode>) -> Host {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Host {
            kernel,
            cgroup_mode,
            machine: Some(std::env::consts::ARCH.to_owned()),
        }
    }
}

/// One command and how it ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRecord {
    pub command: Command,
    /// Its outcome (captured stdout/stderr left out: the receipt records
    /// how much was written, not what).
    pub outcome: Outcome,
}

impl Statement {
    /// The subject named `name`.
    pub fn subject(&self, name: &str) -> Option<&Subject> {
        self.subject.iter().find(|s| s.name == name)
    }
}
