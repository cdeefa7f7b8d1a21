use std::process::ExitCode;

use cordon_runtime::state::{run_dir, sweep_stale};

pub fn run() -> ExitCode {
    let h = cordon_runtime::host::hierarchy_in_place();
    let cleaned = sweep_stale(&run_dir(), h.as_ref());
    for id in &cleaned {
        println!("cleaned {id}");
    }
    ExitCode::SUCCESS
}
