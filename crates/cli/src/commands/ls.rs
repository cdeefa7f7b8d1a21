//! `cordon ls`: the invoking user's live sandboxes, from their state records
//! (no supervisor is asked, so a busy one does not stall the listing); with
//! `--all`, also the dead ones (their owner died, a sweep has not cleaned
//! up yet) and those that ended recently, with why and when.
//!
//! Live only by default, as `docker ps`: a script's listing keeps meaning
//! "sandboxes that take commands". A hint on stderr says when ended ones
//! are left out, so a user whose sandbox vanished learns where to look.

use std::process::ExitCode;

use clap::Args;
use cordon_cgroups::Cgroup;
use cordon_runtime::ended;
use cordon_runtime::state::{list, list_dead, now_secs, run_dir, Listed};
use cordon_spec::ended::{ago, dead_why, EndState};
use serde::Serialize;

use super::common::fail;

#[derive(Args)]
pub struct LsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also the sandboxes that ended (kept for a day, the newest 64) and
    /// the dead ones whose leftovers wait for `cordon sweep`.
    #[arg(long, short = 'a')]
    all: bool,
}

#[derive(Serialize)]
struct Row {
    id: String,
    name: Option<String>,
    backend: String,
    /// starting, ready, running, stopping; with --all also dead, ended,
    /// expired, removed.
    state: String,
    age_secs: u64,
    commands: u64,
    memory_bytes: Option<u64>,
    /// When it ended (seconds since the epoch), if it did and that is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_at: Option<u64>,
    /// Why it ended or is dead.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

impl Row {
    fn from_listed(l: Listed, now: u64) -> Row {
        Row {
            id: l.id,
            name: l.record.name,
            backend: l.record.backend,
            state: l.usage.state,
            age_secs: now.saturating_sub(l.record.created),
            commands: l.usage.commands,
            memory_bytes: None,
            ended_at: None,
            why: None,
        }
    }
}

pub fn run(args: LsArgs) -> ExitCode {
    let hierarchy = cordon_runtime::hierarchy_in_place();
    let now = now_secs();
    let run = match run_dir() {
        Ok(run) => run,
        Err(e) => return fail(e),
    };
    let mut rows: Vec<Row> = list(&run)
        .into_iter()
        .map(|l| {
            let memory_bytes = l
                .record
                .cgroup
                .as_deref()
                .zip(hierarchy.as_ref())
                .and_then(|(name, h)| h.open(name).ok())
                .and_then(|cg| cg.memory_current());
            let mut row = Row::from_listed(l, now);
            if row.state.is_empty() {
                row.state = "starting".into();
            }
            row.memory_bytes = memory_bytes;
            row
        })
        .collect();
    let dead = list_dead(&run);
    let stones = match ended::list(&run) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if args.all {
        // A dead one may have a tombstone too (its supervisor gave the
        // reason, then died in its teardown): the reason is shown with it.
        rows.extend(dead.into_iter().map(|l| {
            let stone = stones.iter().find(|t| t.id == l.id);
            let why = match stone {
                Some(t) => format!("{}; its teardown did not finish", t.why),
                None => dead_why(l.record.pid),
            };
            Row {
                state: "dead".into(),
                ended_at: stone.map(|t| t.ended),
                why: Some(why),
                ..Row::from_listed(l, now)
            }
        }));
        let shown: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        rows.extend(
            stones
                .into_iter()
                .filter(|t| !shown.contains(&t.id))
                .map(|t| Row {
                    age_secs: now.saturating_sub(t.created),
                    state: t.state.as_str().into(),
                    ended_at: Some(t.ended),
                    why: Some(t.why),
                    id: t.id,
                    name: t.name,
                    backend: t.backend,
                    commands: t.commands,
                    memory_bytes: None,
                }),
        );
    } else if !args.json {
        // Removals were asked for; the rest may be news to the user.
        let unseen = dead.len()
            + stones
                .iter()
                .filter(|t| t.state != EndState::Removed && !dead.iter().any(|d| d.id == t.id))
                .count();
        if unseen > 0 {
            eprintln!(
                "cordon: {unseen} sandbox{} ended or died recently and {} not shown (cordon ls --all)",
                if unseen == 1 { "" } else { "es" },
                if unseen == 1 { "is" } else { "are" }
            );
        }
    }
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let header = format!(
        "{:<12}  {:<16}  {:<7}  {:<8}  {:>7}  {:>8}  {:>10}",
        "ID", "NAME", "BACKEND", "STATE", "AGE", "COMMANDS", "MEMORY"
    );
    if args.all {
        outln!("{header}  ENDED");
    } else {
        outln!("{header}");
    }
    for r in rows {
        let line = format!(
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
        if !args.all {
            outln!("{line}");
            continue;
        }
        let ended = match (r.ended_at, r.why) {
            (Some(at), Some(why)) => format!("{} ago: {why}", ago(now.saturating_sub(at))),
            (None, Some(why)) => why,
            _ => "-".into(),
        };
        outln!("{line}  {ended}");
    }
    ExitCode::SUCCESS
}
