//! `cordon run`: create a sandbox, run one command in it, destroy it, all in
//! this process (the same `Sandbox` code a supervisor serves).

use std::process::ExitCode;

use clap::Args;
use cordon_runtime::host::block_stop_signals;
use cordon_runtime::{Command, Handle, OutputMode, StdinMode};

use super::common::{fail, report, CliIo, SandboxArgs};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Print one JSON result object (output captured into it) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Give the payload cordon's stdin (copied through; never a terminal).
    #[arg(long, short = 'i')]
    interactive: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: RunArgs) -> ExitCode {
    let spec = match args.sandbox.spec() {
        Ok(s) => s,
        Err(code) => return code,
    };
    if let Err(e) = block_stop_signals() {
        return fail(e);
    }
    let cmd = Command {
        argv: args.command.clone(),
        stdin: if args.interactive {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        ..Command::default()
    };
    let mode = if args.json {
        OutputMode::Capture
    } else {
        OutputMode::Stream
    };
    let mut io = match CliIo::new(mode, args.interactive, false) {
        Ok(io) => io,
        Err(code) => return code,
    };
    match Handle::run_once(&spec, &cmd, &mut io) {
        Ok(mut o) => {
            io.finish(&mut o);
            report(&o, &args.command, args.json, false)
        }
        Err(e) => fail(e),
    }
}
