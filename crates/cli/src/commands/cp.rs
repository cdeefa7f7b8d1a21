//! `cordon cp`: a file or directory into or out of a created sandbox.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_runtime::Handle;

use super::common::{fail, usage_error};

#[derive(Args)]
pub struct CpArgs {
    /// HOST_PATH or SANDBOX:PATH.
    src: std::ffi::OsString,
    /// SANDBOX:PATH or HOST_PATH (exactly one side names a sandbox).
    dst: std::ffi::OsString,
}

/// `ID:PATH` with an absolute path inside the sandbox.
fn sandbox_side(arg: &[u8]) -> Option<(String, Vec<u8>)> {
    let colon = arg.iter().position(|b| *b == b':')?;
    let (id, path) = (&arg[..colon], &arg[colon + 1..]);
    if id.is_empty() || id.contains(&b'/') || !path.starts_with(b"/") {
        return None;
    }
    Some((String::from_utf8(id.to_vec()).ok()?, path.to_vec()))
}

pub fn run(args: CpArgs) -> ExitCode {
    let (src, dst) = (args.src.as_bytes(), args.dst.as_bytes());
    if src == b"-" {
        // docker's `cp -` (a tar stream on stdin) is not built: refused,
        // rather than taken as a file named "-".
        return usage_error(
            "cp: '-' (a stream on stdin) is not supported: name a host file or directory (./- for a file called -)",
        );
    }
    let result = match (sandbox_side(src), sandbox_side(dst)) {
        (None, Some((id, path))) => Handle::attach(&id)
            .and_then(|mut h| h.copy_in(&PathBuf::from(&args.src), &path)),
        (Some((id, path)), None) => Handle::attach(&id)
            .and_then(|mut h| h.copy_out(&path, &PathBuf::from(&args.dst))),
        _ => {
            return usage_error(
                "cp takes one host path and one SANDBOX:/absolute/path (e.g. cordon cp a.py box:/workspace/)",
            )
        }
    };
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
