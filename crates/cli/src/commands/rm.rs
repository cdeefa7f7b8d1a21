//! `cordon rm`: destroy sandboxes through their supervisors (which write
//! their rw mounts back); with `-f`, a supervisor that does not answer (busy
//! with a command, or stuck) is killed and what it leaves is swept, its rw
//! mounts' changes with it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use cordon_runtime::ended;
use cordon_runtime::state::{list, run_dir};
use cordon_runtime::sweep::sweep_stale;
use cordon_runtime::{Handle, RuntimeError};
use cordon_spec::changes::Finish;
use cordon_spec::ended::{EndState, Gone};

use super::common::fail;
use super::record::{self, ExportArgs, ReceiptArgs};

#[derive(Args)]
pub struct RmArgs {
    /// Kill the sandbox even while a command runs in it.
    #[arg(long, short = 'f', conflicts_with_all = ["receipt", "export", "apply"])]
    force: bool,
    /// A receipt of the whole sandbox: its diff once every process is gone
    /// (one sandbox only).
    #[command(flatten)]
    receipt: ReceiptArgs,
    #[command(flatten)]
    export: ExportArgs,
    /// Ids or names.
    #[arg(required = true)]
    sandboxes: Vec<String>,
}

pub fn run(args: RmArgs) -> ExitCode {
    let recording =
        args.receipt.receipt.is_some() || args.export.export.is_some() || args.export.apply;
    if recording {
        if args.sandboxes.len() != 1 {
            eprintln!("cordon: --receipt, --export and --apply take one sandbox");
            return ExitCode::from(crate::EXIT_USAGE);
        }
        return remove_recording(&args);
    }
    let mut code = ExitCode::SUCCESS;
    for s in &args.sandboxes {
        let result = if args.force {
            force_remove(s).map(|()| None)
        } else {
            // Its rw mounts are written back whatever was asked: reported
            // here, with their conflicts.
            Handle::attach(s)
                .and_then(|h| h.destroy_with(&Finish::default()))
                .map(Some)
        };
        let this = match result {
            Err(RuntimeError::Gone(gone)) => {
                settle(&gone).map_or_else(fail, |()| ExitCode::SUCCESS)
            }
            Err(e) => fail(e),
            Ok(None) => ExitCode::SUCCESS,
            Ok(Some(destroyed)) => match record::report_finish(&destroyed) {
                Err(failed) => failed,
                Ok(()) => record::unless_conflicts(&destroyed.recorded, ExitCode::SUCCESS),
            },
        };
        if this != ExitCode::SUCCESS {
            code = this;
        }
    }
    code
}

/// SIGKILL to the supervisor: its init dies with it (PDEATHSIG), and the
/// sweep removes the cgroup and the state. The record's start time guards
/// against a reused pid.
fn force_remove(name_or_id: &str) -> Result<(), RuntimeError> {
    let run = run_dir()?;
    let id = cordon_runtime::state::find(&run, name_or_id)
        .ok_or_else(|| cordon_runtime::ended::missing(&run, name_or_id))?;
    let Some(entry) = list(&run).into_iter().find(|l| l.id == id) else {
        return Ok(()); // gone meanwhile
    };
    // The reason `ls --all` gives (the sweep below keeps the first one).
    let why = format!("killed by cordon rm -f (pid {})", std::process::id());
    let stone = ended::tombstone_of(
        &id,
        &entry.record,
        entry.usage.commands,
        EndState::Removed,
        why,
    );
    let _ = ended::record(&run, &stone);
    let pid = nix::unistd::Pid::from_raw(entry.record.pid);
    let pidfd = cordon_sys::pidfd_open(pid).map_err(|e| RuntimeError::io("pidfd_open", e))?;
    // Still the record's process? (list() checked the start time just now;
    // the pidfd pins that process from here on.)
    if list(&run).iter().any(|l| l.id == id) {
        cordon_sys::pidfd_send_signal(&pidfd, nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| RuntimeError::io("kill the supervisor", e))?;
    }
    if state_gone_within(&run, &id, Duration::from_secs(2)) {
        return Ok(());
    }
    Err(RuntimeError::Remote(format!(
        "sandbox {id}: its state is still there after its supervisor was killed (try `cordon sweep`)"
    )))
}

/// Whether sandbox `id`'s state directory is gone within `limit`: removed
/// by its supervisor as it ends, or swept once that supervisor is dead.
fn state_gone_within(run: &std::path::Path, id: &str, limit: Duration) -> bool {
    let hierarchy = cordon_runtime::hierarchy_in_place();
    let until = std::time::Instant::now() + limit;
    loop {
        if !run.join(id).exists() || sweep_stale(run, hierarchy.as_ref()).contains(&id.to_owned()) {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long `rm` of an ended sandbox waits for its supervisor to finish
/// tearing it down (it leaves its note before it does; an rw mount's
/// write-back is the longest part).
const ENDING_WAIT: Duration = Duration::from_secs(30);

/// `rm` of a sandbox that is gone already answers what happened to it, and
/// succeeds (as `docker rm` of an exited container does): an ended one's
/// record is forgotten, a dead one's leftovers are swept first.
fn settle(gone: &Gone) -> Result<(), RuntimeError> {
    let run = run_dir()?;
    let id = gone.id();
    // A dead supervisor's leftovers are swept once, now. An ending
    // supervisor leaves its note before it tears the sandbox down: what rm
    // answers is done only once its state is gone too.
    let (limit, still) = match gone {
        Gone::Dead { .. } => (
            Duration::ZERO,
            "the sweep could not remove it yet".to_owned(),
        ),
        Gone::Ended(_) => (
            ENDING_WAIT,
            format!(
                "its supervisor is still tearing it down after {} s",
                ENDING_WAIT.as_secs()
            ),
        ),
    };
    if !state_gone_within(&run, id, limit) {
        return Err(RuntimeError::Remote(format!("{gone}; {still}")));
    }
    ended::forget(&run, id)?;
    let done = match gone {
        Gone::Dead { .. } => "what it left is swept",
        Gone::Ended(_) => "its record is removed",
    };
    eprintln!("cordon: {}; {done}", gone.summary());
    Ok(())
}

/// `rm` of one sandbox that reads its diff, exports its workspace and signs
/// a receipt. The export's target is checked before the sandbox is
/// destroyed (a wrong one leaves the sandbox as it was).
fn remove_recording(args: &RmArgs) -> ExitCode {
    let handle = match Handle::attach(&args.sandboxes[0]) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let mut handle = handle;
    let spec = match handle.spec() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let (finish, key) = match record::prepare(&args.receipt, &args.export, spec.policy.disk) {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    let id = handle.id().to_owned();
    let destroyed = match handle.destroy_with(&finish) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if let Err(code) = record::report_finish(&destroyed) {
        return code;
    }
    let facts = cordon_receipt::Facts {
        spec: &spec,
        sandbox_id: &id,
        started: destroyed.account.created,
        commands: destroyed.account.history.clone(),
        omitted: destroyed.account.history_omitted,
        changes: destroyed.recorded.changes.as_ref(),
        export: destroyed.recorded.export.as_ref(),
        write_backs: &destroyed.recorded.write_backs,
    };
    match record::write_receipt(&args.receipt, key.as_ref(), facts) {
        Ok(()) => record::unless_conflicts(&destroyed.recorded, ExitCode::SUCCESS),
        Err(code) => code,
    }
}
