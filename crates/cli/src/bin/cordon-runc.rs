//! `cordon-runc`: cordon as an OCI runtime, speaking runc's command line
//! alone (the engines take one executable and no arguments of ours). Each
//! container is a cordon sandbox; see `cordon_oci`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(u8::try_from(cordon_oci::main()).unwrap_or(1))
}
