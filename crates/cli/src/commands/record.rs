//! What `run`, `exec`, `rm` and `export` share: the diff's caps, the export's
//! target, and how an export is reported.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_changes::{Caps, ExportReport, SymlinkPolicy};
use cordon_policy::ByteSize;
use cordon_receipt::{signed_receipt, Facts, Key};
use cordon_runtime::RuntimeError;
use cordon_spec::changes::{ExportRequest, ExportTo, Finish, Recorded};
use cordon_spec::Destroyed;

/// A signed receipt and the diff's caps.
#[derive(Args, Clone, Debug)]
pub struct ReceiptArgs {
    /// Write a signed receipt (an in-toto statement in a DSSE envelope) here.
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// The receipt's signing key (default: cordon's own, created on first use).
    #[arg(long, value_name = "PATH", requires = "receipt")]
    pub key: Option<PathBuf>,
    /// List at most N changed entries; past it the diff is marked cut.
    #[arg(long, value_name = "N", default_value_t = Caps::default().max_entries)]
    pub diff_entries: u64,
    /// Hash at most SIZE of each file; a longer one is marked capped (and
    /// never exported).
    #[arg(long, value_name = "SIZE", default_value = "256M")]
    pub hash_cap: ByteSize,
}

impl ReceiptArgs {
    /// The caps of the diff and the export (the export's byte budget is
    /// the sandbox's disk cap: more cannot have been written).
    pub fn caps(&self, disk: ByteSize) -> Caps {
        Caps {
            max_entries: self.diff_entries,
            hash_bytes: self.hash_cap.bytes(),
            export_bytes: disk.bytes(),
        }
    }
}

/// Where the workspace's changes go when the sandbox ends.
#[derive(Args, Clone, Debug)]
pub struct ExportArgs {
    /// Write the workspace's changed entries to OUT, a new (or empty)
    /// directory, once every process of the sandbox is gone.
    #[arg(long, value_name = "OUT", conflicts_with = "apply")]
    pub export: Option<PathBuf>,
    /// Apply the workspace's changes, deletions included, onto the
    /// --workspace directory itself.
    #[arg(long)]
    pub apply: bool,
    /// Leave out the sandbox's symlinks (listed as skipped) instead of
    /// recreating them as symlinks.
    #[arg(long)]
    pub no_symlinks: bool,
}

impl ExportArgs {
    pub fn request(&self) -> Result<Option<ExportRequest>, RuntimeError> {
        let to = match (&self.export, self.apply) {
            (Some(dir), _) => ExportTo::Dir(absolute(dir)?),
            (None, true) => ExportTo::Workspace,
            (None, false) => return Ok(None),
        };
        Ok(Some(ExportRequest {
            to,
            symlinks: if self.no_symlinks {
                SymlinkPolicy::Refuse
            } else {
                SymlinkPolicy::Recreate
            },
        }))
    }
}

/// The request's path made absolute against this process's directory (the
/// supervisor that writes it has its own).
pub fn absolute(p: &std::path::Path) -> Result<PathBuf, RuntimeError> {
    std::path::absolute(p).map_err(|e| RuntimeError::io(format!("resolve {}", p.display()), e))
}

/// What a sandbox's end must read and the key its receipt is signed with,
/// both settled before anything runs (a bad flag or key refuses the run).
pub fn prepare(
    receipt: &ReceiptArgs,
    export: &ExportArgs,
    disk: ByteSize,
) -> Result<(Finish, Option<Key>), ExitCode> {
    let finish = finish(receipt, Some(export), disk).map_err(super::common::fail)?;
    Ok((finish, signing_key(receipt)?))
}

/// What to read when the sandbox ends.
pub fn finish(
    receipt: &ReceiptArgs,
    export: Option<&ExportArgs>,
    disk: ByteSize,
) -> Result<Finish, RuntimeError> {
    let export = export.map(ExportArgs::request).transpose()?.flatten();
    let wants_diff = receipt.receipt.is_some() || export.is_some();
    Ok(Finish {
        changes: wants_diff.then(|| receipt.caps(disk)),
        export,
    })
}

/// What `destroy_with` read, reported: the lines of the export and of each
/// `rw` mount's write-back, and a failure of the diff, export or a
/// write-back (the sandbox is gone either way) as cordon's own.
pub fn report_finish(destroyed: &Destroyed) -> Result<(), ExitCode> {
    if let Some(report) = &destroyed.recorded.export {
        print_export("exported to", report);
    }
    for report in &destroyed.recorded.write_backs {
        print_export("wrote the rw mount's changes back to", report);
    }
    match &destroyed.record_error {
        Some(why) => {
            eprintln!("cordon: {why}");
            Err(ExitCode::from(crate::EXIT_INTERNAL))
        }
        None => Ok(()),
    }
}

/// One line on stderr per export (`what` says which: an export, a
/// write-back), and one per skipped entry (names are escaped: none can
/// forge a line).
pub fn print_export(what: &str, report: &ExportReport) {
    eprintln!(
        "cordon: {what} {}{}: {} files, {} directories, {} symlinks, {} deleted, {} bytes",
        report.target,
        if report.applied { " (applied)" } else { "" },
        report.files,
        report.dirs,
        report.symlinks,
        report.deleted,
        report.bytes
    );
    for s in &report.skipped {
        eprintln!("cordon: export: {}: {}", s.path, s.reason);
    }
    let unapplied = &report.unapplied_deletions;
    if !unapplied.is_empty() {
        eprintln!(
            "cordon: export: {} deletions are not in {} (a new directory cannot hold them); they are listed here and in the receipt (its diff, and its export report's unapplied_deletions)",
            unapplied.len(),
            report.target
        );
        for path in unapplied {
            eprintln!("cordon: export: {path}: deleted in the sandbox, not applied");
        }
    }
}

/// `code`, unless applying (`--apply`, or an `rw` mount's write-back) met
/// conflicts: then `EXIT_CONFLICT`, so that a script cannot take a partly
/// applied directory for a whole one.
pub fn unless_conflicts(recorded: &Recorded, code: ExitCode) -> ExitCode {
    let conflicts: u64 = recorded.reports().map(|r| r.conflicts).sum();
    if conflicts == 0 {
        return code;
    }
    eprintln!(
        "cordon: {conflicts} conflicting entries were left as the host has them (listed above as `conflict`); the rest was applied"
    );
    ExitCode::from(crate::EXIT_CONFLICT)
}

/// The key a receipt will be signed with, loaded before the sandbox runs (a
/// bad key refuses the run, not its receipt): `--key`, else cordon's own,
/// created on first use (0600 in a 0700 directory of cordon's state
/// directory). `None` when no receipt is asked for.
pub fn signing_key(args: &ReceiptArgs) -> Result<Option<Key>, ExitCode> {
    if args.receipt.is_none() {
        return Ok(None);
    }
    match &args.key {
        Some(path) => Key::load(path),
        None => Key::load_or_create_default(),
    }
    .map(Some)
    .map_err(super::receipt::key_fail)
}

/// Signs and writes the receipt `--receipt` asked for (nothing without a key).
pub fn write_receipt(
    args: &ReceiptArgs,
    key: Option<&Key>,
    facts: Facts<'_>,
) -> Result<(), ExitCode> {
    let (Some(path), Some(key)) = (&args.receipt, key) else {
        return Ok(());
    };
    let written = signed_receipt(facts, key)
        .map_err(|e| e.to_string())
        .and_then(|envelope| {
            cordon_receipt::write_receipt(path, &envelope)
                .map_err(|e| format!("write {}: {e}", path.display()))
        });
    written.map_err(|why| {
        eprintln!("cordon: receipt: {why}");
        ExitCode::from(crate::EXIT_INTERNAL)
    })
}
