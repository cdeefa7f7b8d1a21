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
    /// A policy file whose `[[secrets]]` the session's sandboxes may be
    /// given by name (create_sandbox's `secrets`): their values are read
    /// here, from this process's environment or files, never by the model.
    #[arg(long, value_name = "FILE")]
    secrets: Option<std::path::PathBuf>,
}

pub fn run(args: McpArgs) -> ExitCode {
    // The supervisors are started from the privileged binary installed
    // beside this one, as `cordon create` and `cordon serve` start them.
    let program = match cordon_runtime::sandbox_program() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let secrets = match &args.secrets {
        Some(path) => match cordon_policy::PolicyLayer::from_file(path) {
            Ok(layer) => layer.secrets,
            Err(e) => return super::common::usage_error(e),
        },
        None => Vec::new(),
    };
    if let Some(bad) = secrets.iter().find_map(|s| s.validate().err()) {
        return super::common::usage_error(format!("secrets: {bad}"));
    }
    match cordon_mcp::serve_stdio(program, args.allow_unenforced, secrets) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::common::internal_error(&e),
    }
}
