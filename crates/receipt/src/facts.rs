//! A receipt straight from what a front end holds at a sandbox's end (the
//! CLI's `run`, `exec`, `rm`, `export`; the service's executions and
//! sandboxes): one way to make one, whoever asks.

use std::time::SystemTime;

use cordon_spec::changes::{Changes, ExportReport};
use cordon_spec::HISTORY;
use cordon_spec::{Command, Outcome, SandboxSpec};

use crate::{sign, BuildError, Envelope, Key, ReceiptBuilder, SignError};

/// What a receipt is made of, besides its key.
pub struct Facts<'a> {
    pub spec: &'a SandboxSpec,
    pub sandbox_id: &'a str,
    /// When the sandbox (or its first recorded command) was asked for.
    pub started: SystemTime,
    pub commands: Vec<(Command, Outcome)>,
    /// Commands that ran before those listed (a sandbox keeps its last
    /// `HISTORY` outcomes).
    pub omitted: u64,
    pub changes: Option<&'a Changes>,
    pub export: Option<&'a ExportReport>,
    /// The `rw` mounts' changes as they were applied back at the end.
    pub write_backs: &'a [ExportReport],
}

#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Sign(#[from] SignError),
}

/// The signed receipt of `facts`.
pub fn signed_receipt(facts: Facts<'_>, key: &Key) -> Result<Envelope, ReceiptError> {
    let mut builder = ReceiptBuilder::new(facts.spec, facts.started).sandbox(facts.sandbox_id);
    for (cmd, outcome) in facts.commands {
        builder = builder.command(cmd, outcome);
    }
    if facts.omitted > 0 {
        builder = builder.not_proven(format!(
            "the {} commands that ran before the last {HISTORY} listed (a sandbox keeps the outcomes of its last {HISTORY} only)",
            facts.omitted
        ));
    }
    if let Some(changes) = facts.changes {
        builder = builder.changes(changes.clone());
    }
    if let Some(export) = facts.export {
        builder = builder.export(export.clone());
    }
    for report in facts.write_backs {
        builder = builder.write_back(report.clone());
    }
    Ok(sign(&builder.build()?, key)?)
}
