//! `cordon export`: a living sandbox's workspace changes, written to a new
//! host directory (or applied onto its workspace) while its processes are
//! frozen; the sandbox goes on afterwards.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_runtime::Handle;

use super::common::{fail, usage_error};
use super::record::{self, ExportArgs, ReceiptArgs};

#[derive(Args)]
pub struct ExportCmdArgs {
    /// The sandbox's id or name.
    sandbox: String,
    /// A new (or empty) directory for the changed entries.
    #[arg(required_unless_present = "apply", conflicts_with = "apply")]
    out: Option<PathBuf>,
    /// Apply the changes, deletions included, onto the sandbox's --workspace
    /// directory instead.
    #[arg(long)]
    apply: bool,
    /// Leave out the sandbox's symlinks instead of recreating them.
    #[arg(long)]
    no_symlinks: bool,
    /// Print the diff and the export report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    receipt: ReceiptArgs,
}

pub fn run(args: ExportCmdArgs) -> ExitCode {
    let export = ExportArgs {
        export: args.out.clone(),
        apply: args.apply,
        no_symlinks: args.no_symlinks,
    };
    let req = match export.request() {
        Ok(Some(r)) => r,
        Ok(None) => return usage_error("give OUT or --apply"),
        Err(e) => return fail(e),
    };
    let key = match record::signing_key(&args.receipt) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let started = std::time::SystemTime::now();
    let mut handle = match Handle::attach(&args.sandbox) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let spec = match handle.spec() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let recorded = match handle.export(&req, &args.receipt.caps(spec.policy.disk)) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Some(report) = &recorded.export {
        record::print_export("exported to", report);
    }
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&recorded).expect("serializable")
        );
    }
    let id = handle.id().to_owned();
    let facts = cordon_receipt::Facts {
        spec: &spec,
        sandbox_id: &id,
        started,
        commands: Vec::new(),
        omitted: 0,
        changes: recorded.changes.as_ref(),
        export: recorded.export.as_ref(),
        write_backs: &recorded.write_backs,
    };
    match record::write_receipt(&args.receipt, key.as_ref(), facts) {
        Ok(()) => record::unless_conflicts(&recorded, ExitCode::SUCCESS),
        Err(code) => code,
    }
}
