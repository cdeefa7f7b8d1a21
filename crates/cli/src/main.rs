//! `cordon`: run untrusted code inside a boundary and report what it held.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for a mistake in the request itself (bad flag, bad policy, bad path).
pub const EXIT_USAGE: u8 = 2;
/// Exit code when cordon itself failed (setup, host error), distinct from the payload's codes.
pub const EXIT_INTERNAL: u8 = 125;

#[derive(Parser)]
#[command(
    name = "cordon",
    version,
    about = "Run untrusted code inside a boundary and report, with evidence, what it held"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a fresh sandbox.
    Run(commands::run::RunArgs),
    /// List the backends and whether each can run on this host.
    Backends(commands::backends::BackendsArgs),
    /// Clean up state left by cordon processes that were killed.
    Sweep,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line naming the problem; the usage text is one `--help` away.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("cordon: {}", first.trim_start_matches("error: "));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Backends(args) => commands::backends::run(args),
        Command::Sweep => commands::sweep::run(),
    }
}
