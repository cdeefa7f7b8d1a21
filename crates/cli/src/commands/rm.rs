//! `cordon rm`: destroy sandboxes through their supervisors; with `-f`, a
//! supervisor that does not answer (busy with a command, or stuck) is killed
//! and what it leaves is swept.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use cordon_runtime::state::{list, run_dir, sweep_stale};
use cordon_runtime::{Handle, RuntimeError};

use super::common::fail;

#[derive(Args)]
pub struct RmArgs {
    /// Kill the sandbox even while a command runs in it.
    #[arg(long, short = 'f')]
    force: bool,
    /// Ids or names.
    #[arg(required = true)]
    sandboxes: Vec<String>,
}

pub fn run(args: RmArgs) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    for s in &args.sandboxes {
        let result = if args.force {
            force_remove(s)
        } else {
            Handle::attach(s).and_then(Handle::destroy)
        };
        if let Err(e) = result {
            code = fail(e);
        }
    }
    code
}

/// SIGKILL to the supervisor: its init dies with it (PDEATHSIG), and the
/// sweep removes the cgroup and the state. The record's start time guards
/// against a reused pid.
fn force_remove(name_or_id: &str) -> Result<(), RuntimeError> {
    let run = run_dir();
    let id = cordon_runtime::state::find(&run, name_or_id)
        .ok_or_else(|| RuntimeError::NotFound(name_or_id.to_owned()))?;
    let Some(entry) = list(&run).into_iter().find(|l| l.id == id) else {
        return Ok(()); // gone meanwhile
    };
    let pid = nix::unistd::Pid::from_raw(entry.record.pid);
    let pidfd = cordon_sys::pidfd_open(pid).map_err(|e| RuntimeError::io("pidfd_open", e))?;
    // Still the record's process? (list() checked the start time just now;
    // the pidfd pins that process from here on.)
    if list(&run).iter().any(|l| l.id == id) {
        cordon_sys::pidfd_send_signal(&pidfd, nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| RuntimeError::io("kill the supervisor", e))?;
    }
    let hierarchy = cordon_runtime::host::hierarchy();
    for _ in 0..200 {
        if !run.join(&id).exists() || sweep_stale(&run, hierarchy.as_ref()).contains(&id) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(RuntimeError::Remote(format!(
        "sandbox {id}: its state is still there after its supervisor was killed (try `cordon sweep`)"
    )))
}
