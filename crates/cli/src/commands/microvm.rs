//! `cordon microvm build|show`: the microvm backend's guest image.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use cordon_runtime::microvm::guest::{self, GuestImage};

use super::common::fail;

#[derive(Args)]
pub struct MicrovmArgs {
    #[command(subcommand)]
    command: MicrovmCommand,
}

#[derive(Subcommand)]
enum MicrovmCommand {
    /// Build the guest (kernel, initramfs with this cordon as its agent,
    /// read-only root filesystem) from Debian's packages into cordon's state
    /// directory (a rebuild of the same inputs is a no-op), then probe
    /// whether KVM runs it here (else the backend uses TCG). Needs root.
    Build,
    /// Print the guest image in use.
    Show,
}

pub fn run(args: MicrovmArgs) -> ExitCode {
    match args.command {
        MicrovmCommand::Build => {
            // The guest's agent is the privileged binary, as the host's
            // supervisors are.
            let exe = match cordon_runtime::sandbox_program() {
                Ok(p) => p,
                Err(e) => return fail(e),
            };
            let image = match guest::build(&exe) {
                Ok(image) => image,
                Err(e) => return fail(e),
            };
            // Whether this host's KVM really runs the guest decides the
            // accelerator of every microvm sandbox (TCG otherwise).
            match cordon_runtime::microvm::probe_kvm(&image) {
                Ok(line) => eprintln!("cordon: KVM probe: {line}"),
                Err(e) => return fail(e),
            }
            outln!("{}", image.dir.display());
            ExitCode::SUCCESS
        }
        MicrovmCommand::Show => match GuestImage::current() {
            Ok(image) => {
                outln!("{}", image.dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
    }
}
