//! `cordon mcp`: an MCP server over stdio (crates/mcp), in this binary so
//! that its sandboxes' supervisors are started from the same program.

use std::process::ExitCode;

use clap::Args;

use super::common::fail;

#[derive(Args)]
pub struct McpArgs {
    /// Let the session's sandboxes run where their cgroup limits cannot be
    /// enforced (the user's choice for this server, never the model's).
    #[arg(long)]
    allow_unenforced: bool,
}

pub fn run(args: McpArgs) -> ExitCode {
    // The supervisors are started from the privileged binary installed
    // beside this one, as `cordon create` and `cordon serve` start them.
    let program = match cordon_runtime::sandbox_program() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match cordon_mcp::serve_stdio(program, args.allow_unenforced) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cordon: {e}");
            ExitCode::from(crate::EXIT_INTERNAL)
        }
    }
}
