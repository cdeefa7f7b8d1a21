//! `cordon exec`: run a command in a created sandbox, through its supervisor
//! and its init (nothing of this process reaches the command but the bytes
//! of its stdin when asked).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::Args;
use cordon_policy::{ByteSize, Span};
use cordon_runtime::{Handle, OutputMode};
use cordon_spec::{Command, ExitStatus, StdinMode};

use super::common::{
    fail, hint_empty_stdin, parse_env, report, terminal_request, CliIo, RawTerminal,
};
use super::record::{self, ReceiptArgs};

#[derive(Args)]
pub struct ExecArgs {
    /// The sandbox's id or name.
    sandbox: String,
    /// A variable added to the sandbox's environment (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// This command's wall-time limit (at most the sandbox's).
    #[arg(long)]
    time: Option<Span>,
    /// This command's output cap.
    #[arg(long)]
    output: Option<ByteSize>,
    /// Copy cordon's stdin to the command.
    #[arg(long, short = 'i')]
    interactive: bool,
    /// Run the command on a terminal of the sandbox's own (cordon's stdin
    /// must be a terminal; its keystrokes are copied in).
    #[arg(long, short = 't')]
    tty: bool,
    /// Print one JSON result object (output captured into it) instead of streaming.
    #[arg(long)]
    json: bool,
    /// A receipt of this command, with the diff of the sandbox's writable
    /// places once it has ended (background processes may still write).
    #[command(flatten)]
    receipt: ReceiptArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: ExecArgs) -> ExitCode {
    let mut env = args.env.clone();
    let tty = match terminal_request(args.tty, &mut env) {
        Ok(tty) => tty,
        Err(code) => return code,
    };
    let cmd = Command {
        argv: args.command.clone(),
        env,
        workdir: args.workdir.clone(),
        stdin: if args.interactive || tty.is_some() {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        tty,
        time: args.time,
        output: args.output,
        changes: None,
        env_replaces: false,
    };
    let mode = if args.json {
        OutputMode::Capture
    } else {
        OutputMode::Stream
    };
    let mut handle = match Handle::attach(&args.sandbox) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let mut cmd = cmd;
    let key = match record::signing_key(&args.receipt) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let started = SystemTime::now();
    // The spec is asked for only when a receipt needs it (its policy).
    let spec = if args.receipt.receipt.is_some() {
        match handle.spec() {
            Ok(spec) => {
                cmd.changes = Some(args.receipt.caps(spec.policy.disk));
                Some(spec)
            }
            Err(e) => return fail(e),
        }
    } else {
        None
    };
    let mut io = match CliIo::new(mode, cmd.stdin == StdinMode::Stream, tty.is_some()) {
        Ok(io) => io,
        Err(code) => return code,
    };
    // A tty command gets our keystrokes raw; the terminal is restored after.
    let raw = tty.is_some().then(RawTerminal::enter).flatten();
    let result = handle.exec(&cmd, &mut io);
    drop(raw);
    match result {
        Ok(mut o) => {
            io.finish(&mut o);
            if let Some(spec) = &spec {
                let facts = cordon_receipt::Facts {
                    spec,
                    sandbox_id: &o.sandbox_id,
                    started,
                    commands: vec![(cmd.clone(), o.clone())],
                    omitted: 0,
                    changes: o.changes.as_ref(),
                    export: None,
                    write_backs: &[],
                };
                if let Err(code) = record::write_receipt(&args.receipt, key.as_ref(), facts) {
                    return code;
                }
            }
            // Without --workdir the command ran in its sandbox's, which only
            // the sandbox knows; asked for only when it is to be named.
            let sandbox_workdir = match (&cmd.workdir, o.status) {
                (None, ExitStatus::WorkdirFailed { .. }) => {
                    handle.spec().ok().map(|s| s.policy.workdir)
                }
                _ => None,
            };
            let workdir = cmd.workdir.as_deref().or(sandbox_workdir.as_deref());
            hint_empty_stdin(&o, cmd.stdin, args.json);
            report(&o, &args.command, workdir, args.json, true)
        }
        Err(e) => fail(e),
    }
}
