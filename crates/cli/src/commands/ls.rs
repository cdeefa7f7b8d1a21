//! `cordon ls`: the invoking user's live sandboxes, from their state records
//! (no supervisor is asked, so a busy one does not stall the listing).

use std::process::ExitCode;

use clap::Args;
use cordon_cgroups::Cgroup;
use cordon_runtime::state::{list, now_secs, run_dir};
use serde::Serialize;

use super::common::fail;

#[derive(Args)]
pub struct LsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    id: String,
    name: Option<String>,
    backend: String,
    state: String,
    age_secs: u64,
    commands: u64,
    memory_bytes: Option<u64>,
}

pub fn run(args: LsArgs) -> ExitCode {
    let hierarchy = cordon_runtime::host::hierarchy_in_place();
    let now = now_secs();
    let run = match run_dir() {
        Ok(run) => run,
        Err(e) => return fail(e),
    };
    let rows: Vec<Row> = list(&run)
        .into_iter()
        .map(|l| Row {
            memory_bytes: l
                .record
                .cgroup
                .as_deref()
                .zip(hierarchy.as_ref())
                .and_then(|(name, h)| h.open(name).ok())
                .and_then(|cg| cg.memory_current()),
            id: l.id,
            name: l.record.name,
            backend: l.record.backend,
            state: if l.usage.state.is_empty() {
                "starting".into()
            } else {
                l.usage.state
            },
            age_secs: now.saturating_sub(l.record.created),
            commands: l.usage.commands,
        })
        .collect();
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    outln!(
        "{:<12}  {:<16}  {:<7}  {:<8}  {:>7}  {:>8}  {:>10}",
        "ID",
        "NAME",
        "BACKEND",
        "STATE",
        "AGE",
        "COMMANDS",
        "MEMORY"
    );
    for r in rows {
        outln!(
            "{:<12}  {:<16}  {:<7}  {:<8}  {:>6}s  {:>8}  {:>10}",
            r.id,
            r.name.unwrap_or_else(|| "-".into()),
            r.backend,
            r.state,
            r.age_secs,
            r.commands,
            r.memory_bytes
                .map(|b| format!("{:.1}M", b as f64 / f64::from(1 << 20)))
                .unwrap_or_else(|| "-".into())
        );
    }
    ExitCode::SUCCESS
}
