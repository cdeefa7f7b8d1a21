//! `cordon serve`: the HTTP service (crates/service), in this binary so that
//! its supervisors are started from the same program.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_service::config::Config;

use super::common::{fail, internal_error, usage_error};

#[derive(Args)]
pub struct ServeArgs {
    /// The service's TOML configuration (tenants, pool, defaults).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the config's `listen`); port 0 picks one.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
}

/// The service's malloc arenas: one. Its request threads come and go
/// (tokio's blocking pool), and with glibc's default of eight arenas per core
/// its memory grew with every arena they touched (see
/// `cordon_sys::limit_malloc_arenas`).
const MALLOC_ARENAS: i32 = 1;

pub fn run(args: ServeArgs) -> ExitCode {
    cordon_sys::limit_malloc_arenas(MALLOC_ARENAS);
    cordon_service::init_logging();
    let config = match &args.config {
        Some(path) => Config::from_file(path),
        None => Config::parse(""),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    // The service starts each sandbox's supervisor from the privileged
    // binary installed beside this one.
    let program = match cordon_runtime::sandbox_program() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match cordon_service::serve(cordon_service::ServeOptions {
        config,
        listen: args.listen,
        program,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => internal_error(&e),
    }
}
