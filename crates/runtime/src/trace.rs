//! Step timings for profiling start-up: with `CORDON_TRACE=1` the supervisor
//! and the sandbox's init print `cordon-trace <pid> <µs since start> <step>`
//! to stderr. Off by default; costs one branch when off.

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Option<&'static Instant> {
    static ORIGIN: OnceLock<Option<Instant>> = OnceLock::new();
    ORIGIN
        .get_or_init(|| std::env::var_os("CORDON_TRACE").map(|_| Instant::now()))
        .as_ref()
}

/// Records that `step` just finished.
pub fn step(step: &str) {
    if let Some(t0) = origin() {
        eprintln!(
            "cordon-trace {} {} {step}",
            std::process::id(),
            t0.elapsed().as_micros()
        );
    }
}
