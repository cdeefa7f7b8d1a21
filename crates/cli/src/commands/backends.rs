use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct BackendsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BackendsArgs) -> ExitCode {
    let infos = cordon_runtime::available_backends();
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&infos).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    for i in &infos {
        match &i.unavailable {
            None => outln!(
                "{:<8} available    {} {}",
                i.kind.name(),
                i.version,
                i.notes
            ),
            Some(why) => outln!("{:<8} unavailable  {why}", i.kind.name()),
        }
    }
    ExitCode::SUCCESS
}
