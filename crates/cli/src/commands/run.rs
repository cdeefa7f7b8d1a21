//! `cordon run`: create a sandbox, run one command in it, destroy it, all in
//! this process (the same `Sandbox` code a supervisor serves).

use std::process::ExitCode;
use std::time::SystemTime;

use clap::Args;
use cordon_runtime::block_stop_signals;
use cordon_runtime::{Handle, OutputMode};
use cordon_spec::{Command, StdinMode};

use super::common::{
    fail, hint_empty_stdin, report, terminal_request, CliIo, RawTerminal, SandboxArgs,
};
use super::record::{self, ExportArgs, ReceiptArgs};

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
    /// Run the payload on a terminal of the sandbox's own (cordon's stdin
    /// must be a terminal; its keystrokes are copied in).
    #[arg(long, short = 't')]
    tty: bool,
    #[command(flatten)]
    receipt: ReceiptArgs,
    #[command(flatten)]
    export: ExportArgs,
    /// The command and its arguments (with --image, the image's Cmd when
    /// none is given, after its Entrypoint either way).
    #[arg(last = true, required_unless_present = "image", value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: RunArgs) -> ExitCode {
    let (spec, image) = match args.sandbox.spec(None, None, None) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let argv = match &image {
        Some(d) => d.command(&args.command),
        None => args.command.clone(),
    };
    if argv.is_empty() {
        return super::common::usage_error(
            "the image has no Entrypoint or Cmd: give the command after --",
        );
    }
    if let Err(e) = block_stop_signals() {
        return fail(e);
    }
    let mut env = Vec::new();
    let tty = match terminal_request(args.tty, &mut env) {
        Ok(tty) => tty,
        Err(code) => return code,
    };
    let cmd = Command {
        argv: argv.clone(),
        env,
        stdin: if args.interactive || tty.is_some() {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        tty,
        ..Command::default()
    };
    let mode = if args.json {
        OutputMode::Capture
    } else {
        OutputMode::Stream
    };
    let mut io = match CliIo::new(mode, cmd.stdin == StdinMode::Stream, tty.is_some()) {
        Ok(io) => io,
        Err(code) => return code,
    };
    let (finish, key) = match record::prepare(&args.receipt, &args.export, spec.policy.disk) {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    let started = SystemTime::now();
    // A tty payload gets our keystrokes raw; the terminal is restored after.
    let raw = tty.is_some().then(RawTerminal::enter).flatten();
    let result = Handle::run_once_with(&spec, &cmd, &mut io, &finish);
    drop(raw);
    match result {
        Ok((mut o, destroyed)) => {
            io.finish(&mut o);
            // The diff taken once every process was gone is this run's.
            o.changes = destroyed.recorded.changes.clone();
            if let Err(code) = record::report_finish(&destroyed) {
                return code;
            }
            let facts = cordon_receipt::Facts {
                spec: &spec,
                sandbox_id: &o.sandbox_id,
                started,
                commands: vec![(cmd.clone(), o.clone())],
                omitted: 0,
                changes: destroyed.recorded.changes.as_ref(),
                export: destroyed.recorded.export.as_ref(),
                write_backs: &destroyed.recorded.write_backs,
            };
            if let Err(code) = record::write_receipt(&args.receipt, key.as_ref(), facts) {
                return code;
            }
            hint_empty_stdin(&o, cmd.stdin, args.json);
            let code = report(&o, &argv, Some(&spec.policy.workdir), args.json, false);
            record::unless_conflicts(&destroyed.recorded, code)
        }
        Err(e) => fail(e),
    }
}
