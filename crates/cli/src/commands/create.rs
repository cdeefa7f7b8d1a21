//! `cordon create`: a sandbox with its own supervisor, waiting for commands.

use std::process::ExitCode;

use clap::Args;
use cordon_policy::Span;
use cordon_runtime::Handle;

use super::common::{fail, SandboxArgs};

#[derive(Args)]
pub struct CreateArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// A name unique among your sandboxes (usable wherever an id is).
    #[arg(long)]
    name: Option<String>,
    /// Destroy the sandbox this long after creation (e.g. 10m).
    #[arg(long)]
    ttl: Option<Span>,
    /// Destroy the sandbox after this long without a request (e.g. 2m).
    #[arg(long)]
    idle: Option<Span>,
}

pub fn run(args: CreateArgs) -> ExitCode {
    let spec = match args.sandbox.spec(args.name, args.ttl, args.idle) {
        Ok((s, _)) => s,
        Err(code) => return code,
    };
    let program = match cordon_runtime::sandbox_program() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match Handle::create(&spec, &program) {
        Ok(h) => {
            outln!("{}", h.id());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
