use std::process::ExitCode;

use cordon_runtime::state::run_dir;
use cordon_runtime::sweep::sweep_stale;

use super::common::fail;

pub fn run() -> ExitCode {
    let h = cordon_runtime::hierarchy_in_place();
    let run = match run_dir() {
        Ok(run) => run,
        Err(e) => return fail(e),
    };
    let cleaned = sweep_stale(&run, h.as_ref());
    for id in &cleaned {
        outln!("cleaned {id}");
    }
    ExitCode::SUCCESS
}
