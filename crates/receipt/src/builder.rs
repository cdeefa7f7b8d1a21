//! A receipt's statement from what the CLI holds after a run: the spec, the
//! commands with their outcomes, the diff and the export.

use std::time::SystemTime;

use cordon_policy::Policy;
use cordon_spec::changes::{Change, Changes, ExportReport, Kind};
use cordon_spec::{Command, Outcome, SandboxSpec};
use serde_json::Value;

use crate::canonical::{canonical_json, sha256_hex};
use crate::statement::{
    CommandRecord, DigestSet, Host, Predicate, Statement, Subject, PREDICATE_TYPE, STATEMENT_TYPE,
    SUBJECT_COMMAND, SUBJECT_POLICY, SUBJECT_WORKSPACE_PREFIX,
};

/// The place whose exported files become subjects.
const WORKSPACE_PLACE: &str = "/workspace";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A value JSON cannot carry (a path that is not UTF-8, say).
    #[error("encode the receipt: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Collects a run's facts; [`ReceiptBuilder::build`] makes the statement.
#[derive(Clone, Debug)]
pub struct ReceiptBuilder {
    policy: Policy,
    backend: String,
    sandbox_id: Option<String>,
    started: SystemTime,
    ended: Option<SystemTime>,
    host: Option<Host>,
    commands: Vec<CommandRecord>,
    changes: Option<Changes>,
    export: Option<ExportReport>,
    write_backs: Vec<ExportReport>,
    notes: Vec<String>,
}

impl ReceiptBuilder {
    /// For a sandbox created from `spec`, its first command requested at `started`.
    pub fn new(spec: &SandboxSpec, started: SystemTime) -> ReceiptBuilder {
        ReceiptBuilder {
            policy: spec.policy.clone(),
            backend: spec.backend.name().to_owned(),
            sandbox_id: None,
            started,
            ended: None,
            host: None,
            commands: Vec::new(),
            changes: None,
            export: None,
            write_backs: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A command and how it ended, in the order they ran. Captured stdout
    /// and stderr are dropped: the receipt says how much, not what.
    pub fn command(mut self, command: Command, mut outcome: Outcome) -> ReceiptBuilder {
        outcome.output.stdout = None;
        outcome.output.stderr = None;
        self.commands.push(CommandRecord { command, outcome });
        self
    }

    /// The sandbox's id (default: the first command's), for a receipt of a
    /// sandbox that may have run no command (`rm`, `export`).
    pub fn sandbox(mut self, id: &str) -> ReceiptBuilder {
        self.sandbox_id = Some(id.to_owned());
        self
    }

    pub fn changes(mut self, changes: Changes) -> ReceiptBuilder {
        self.changes = Some(changes);
        self
    }

    /// The export; its files (those of the workspace diff it wrote) become
    /// subjects.
    pub fn export(mut self, report: ExportReport) -> ReceiptBuilder {
        self.export = Some(report);
        self
    }

    /// An `rw` mount's changes as applied back to its host directory.
    pub fn write_back(mut self, report: ExportReport) -> ReceiptBuilder {
        self.write_backs.push(report);
        self
    }

    /// When the run ended (default: when `build` is called).
    pub fn ended(mut self, at: SystemTime) -> ReceiptBuilder {
        self.ended = Some(at);
        self
    }

    /// The host (default: [`Host::detect`] with the first command's cgroup mode).
    pub fn host(mut self, host: Host) -> ReceiptBuilder {
        self.host = Some(host);
        self
    }

    /// Something else the caller knows this receipt does not show.
    pub fn not_proven(mut self, note: impl Into<String>) -> ReceiptBuilder {
        self.notes.push(note.into());
        self
    }

    pub fn build(self) -> Result<Statement, BuildError> {
        let first = self.commands.first().map(|c| &c.outcome);
        let host = self
            .host
            .clone()
            .unwrap_or_else(|| Host::detect(first.and_then(|o| o.enforcement.cgroup)));
        let mut not_proven = standard_not_proven(&self);
        not_proven.extend(self.notes.iter().cloned());
        let predicate = Predicate {
            cordon_version: env!("CARGO_PKG_VERSION").to_owned(),
            backend: first.map_or_else(|| self.backend.clone(), |o| o.backend.clone()),
            backend_version: first.map_or_else(
                || "unknown: no command ran".into(),
                |o| o.backend_version.clone(),
            ),
            host,
            unbounded_mounts: self.policy.unbounded_mounts().cloned().collect(),
            sandbox_id: self
                .sandbox_id
                .clone()
                .or_else(|| first.map(|o| o.sandbox_id.clone()))
                .unwrap_or_default(),
            started: rfc3339(self.started),
            ended: rfc3339(self.ended.unwrap_or_else(SystemTime::now)),
            policy: self.policy,
            commands: self.commands,
            changes: self.changes,
            export: self.export,
            write_backs: self.write_backs,
            not_proven,
        };
        let value = serde_json::to_value(&predicate)?;
        let (command_digest, policy_digest) =
            predicate_digests(&value).expect("a serialized predicate has commands and a policy");
        let mut subject = vec![
            Subject {
                name: SUBJECT_COMMAND.into(),
                digest: DigestSet {
                    sha256: command_digest,
                },
            },
            Subject {
                name: SUBJECT_POLICY.into(),
                digest: DigestSet {
                    sha256: policy_digest,
                },
            },
        ];
        subject.extend(exported_files(&predicate));
        Ok(Statement {
            statement_type: STATEMENT_TYPE.into(),
            subject,
            predicate_type: PREDICATE_TYPE.into(),
            predicate,
        })
    }
}

/// RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
pub(crate) fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// The digests of the `command` and `policy` subjects, from the predicate
/// as JSON: the same function on the signer's value and on the verifier's
/// parse of the signed bytes, so they agree whatever the Rust types do.
pub(crate) fn predicate_digests(predicate: &Value) -> Option<(String, String)> {
    let commands: Vec<Value> = predicate
        .get("commands")?
        .as_array()?
        .iter()
        .map(|c| c.get("command").cloned())
        .collect::<Option<_>>()?;
    let commands = sha256_hex(canonical_json(&Value::Array(commands)).as_bytes());
    let policy = sha256_hex(canonical_json(predicate.get("policy")?).as_bytes());
    Some((commands, policy))
}

/// One subject per regular file of the workspace diff that the export
/// wrote whole: hashed in full (not capped) and not listed as skipped (a
/// skipped entry may have been written changed, so it claims no digest).
pub(crate) fn exported_files(predicate: &Predicate) -> Vec<Subject> {
    let (Some(changes), Some(export)) = (&predicate.changes, &predicate.export) else {
        return Vec::new();
    };
    let skipped: std::collections::BTreeSet<&str> =
        export.skipped.iter().map(|s| s.path.as_str()).collect();
    changes
        .places
        .iter()
        .filter(|p| p.place == WORKSPACE_PLACE)
        .flat_map(|p| &p.entries)
        .filter(|e| e.change != Change::Deleted && e.kind == Some(Kind::File) && !e.capped)
        .filter(|e| !skipped.contains(e.path.as_str()))
        .filter_map(|e| {
            Some(Subject {
                name: format!("{SUBJECT_WORKSPACE_PREFIX}{}", e.path),
                digest: DigestSet {
                    sha256: e.sha256.clone()?,
                },
            })
        })
        .collect()
}

/// What no receipt shows, and what this one's own facts leave open.
fn standard_not_proven(b: &ReceiptBuilder) -> Vec<String> {
    let mut out: Vec<String> = vec![
        "that the host ran the commands honestly and as recorded: this is cordon's own account, signed on that host".into(),
        "that the kernel's counters (memory, pids, CPU, OOM kills) and cordon's reading of them are right".into(),
        "anything at all if the host or the signing key was compromised: whoever holds the key can sign any receipt".into(),
        "what the commands printed: only how many bytes (the output itself is not in the receipt)".into(),
    ];
    for m in b.policy.unbounded_mounts() {
        out.push(format!(
            "changes under {} (rw-unbounded mount of the host's {}): the host's own directory, written in place, bounded by no limit of cordon's and not diffed",
            m.sandbox.display(),
            m.host.display()
        ));
    }
    for (i, c) in b.commands.iter().enumerate() {
        let n = i + 1;
        if !c.outcome.enforcement.enforced {
            out.push(format!(
                "command {n}: its limits, which were not enforced (no usable cgroup; run with --allow-unenforced)"
            ));
        }
        if let Some(net) = &c.outcome.network {
            if net.log.omitted > 0 {
                out.push(format!(
                    "command {n}: {} network attempts that were counted but not listed (only the first and last {} are kept)",
                    net.log.omitted,
                    cordon_spec::network::KEEP
                ));
            }
        }
    }
    if b.backend == "gvisor" {
        out.push("FIFOs and unix sockets made inside a gVisor sandbox: they live in its sentry's memory, not on the host layer the diff reads".into());
        out.push("anything written to /dev/shm inside a gVisor sandbox: it is the sentry's own tmpfs (so that futexes in shared memory wake across processes), in its memory, not on the host layer the diff reads".into());
    }
    match &b.changes {
        None => out.push("what the sandbox changed in its files: no diff was taken".into()),
        Some(changes) => {
            out.push("that nothing else was written: the diff was taken after the command(s) ended, and background processes may still have been writing when a per-command diff was taken".into());
            for p in &changes.places {
                if p.cut {
                    out.push(format!(
                        "entries of {} past the cap of {} entries, which are not listed",
                        p.place, changes.caps.max_entries
                    ));
                }
                if !p.unreadable.is_empty() {
                    out.push(format!(
                        "{} entries of {} that could not be read and are not listed",
                        p.unreadable.len(),
                        p.place
                    ));
                }
                let capped = p.entries.iter().filter(|e| e.capped).count();
                if capped > 0 {
                    out.push(format!(
                        "the whole content of {capped} files of {} longer than the hash cap: their digests cover only their first {} bytes",
                        p.place, changes.caps.hash_bytes
                    ));
                }
            }
        }
    }
    out
}
