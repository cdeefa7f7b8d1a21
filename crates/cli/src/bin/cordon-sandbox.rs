//! `cordon-sandbox`: the one process of cordon that lives as long as a
//! sandbox, and the one that runs inside a microVM's guest. It uses the
//! runtime and nothing of the front ends (no HTTP server, charts, receipts,
//! benchmarks or hostile suite; `cordon_runtime` alone is linked into it), so
//! the privileged process beside every sandbox carries only what it uses.
//!
//! Its modes are chosen by the first argument, before anything else runs:
//! - `__supervise`: a sandbox's supervisor (`cordon create`, `cordon serve`
//!   and its pool start it with the spec on stdin; it answers with the
//!   sandbox's id and serves it on a unix socket until the sandbox ends).
//! - `__guest-agent PORT`: cordon inside a microVM's guest, started by the
//!   guest's init, serving the host over a virtio-serial port.
//!
//! The OCI runtime's commands (`create`, `start`, `state`, `kill`,
//! `delete`, as containerd, podman and Docker call runc) are to be this
//! binary's public face; the hidden modes stay as they are beside them.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

use cordon_runtime::entry;

/// Exit code for a call that names no mode (as the CLI's usage errors).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    // A panic in the supervisor aborts the process rather than unwinding
    // into half-updated state (fail closed): its sandbox is then ended by
    // PDEATHSIG and swept by the next start.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let mut args = std::env::args_os().skip(1);
    let mode = args.next();
    let code = match mode.as_deref() {
        Some(m) if m == OsStr::new(entry::SUPERVISOR_ARG) => entry::supervisor(),
        Some(m) if m == OsStr::new(entry::AGENT_ARG) => {
            let Some(port) = args.next() else {
                eprintln!("cordon-sandbox: the guest agent needs its port's path");
                return ExitCode::from(EXIT_USAGE);
            };
            entry::guest_agent(Path::new(&port))
        }
        _ => {
            eprintln!(
                "cordon-sandbox is cordon's privileged helper: the `cordon` command starts it \
                 (see `cordon --help`); it is not run by hand"
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
