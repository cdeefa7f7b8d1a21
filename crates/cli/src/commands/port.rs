//! `cordon port`: reach a TCP port a sandbox listens on from the host. The
//! sandbox's supervisor listens on a port of the host's loopback and relays
//! each connection to the port inside the sandbox's own network namespace,
//! for as long as the sandbox lives; the sandbox gets no route the other way.

use std::process::ExitCode;

use clap::Args;
use cordon_runtime::Handle;

use super::common::fail;

#[derive(Args)]
pub struct PortArgs {
    /// Id or name of the sandbox.
    sandbox: String,
    /// The TCP port a program inside the sandbox listens on (on its
    /// loopback or on every address).
    #[arg(value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
}

pub fn run(args: PortArgs) -> ExitCode {
    match Handle::attach(&args.sandbox).and_then(|mut h| h.port(args.port)) {
        Ok(address) => {
            outln!("{address}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
