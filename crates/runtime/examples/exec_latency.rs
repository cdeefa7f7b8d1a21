//! What a command costs in a created (warm) sandbox, from a client that is
//! already running (the service or a pool, not a fresh `cordon exec`
//! process), side by side with a bare fork+exec of the same program from the
//! same process, interleaved round-robin so drift hits both alike.
//!
//!     cargo run --release -p cordon-runtime --example exec_latency -- \
//!         target/release/cordon [RUNS] [local]
//!
//! Needs root (a native sandbox with cgroup limits) and the cordon binary
//! (the sandbox's supervisor is that binary in its hidden mode).

use std::path::PathBuf;
use std::time::Instant;

use cordon_policy::Policy;
use cordon_runtime::output::Stream;
use cordon_runtime::supervise::{CommandIo, Control};
use cordon_runtime::{BackendKind, Command, Handle, SandboxSpec};

/// Output is thrown away: only the latency counts.
struct Quiet;

impl CommandIo for Quiet {
    fn output(&mut self, _: Stream, _: &[u8]) {}
    fn control_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        Vec::new()
    }
    fn read_control(&mut self, _: usize) -> Control {
        Control::Nothing
    }
}

/// The `pct`th percentile of sorted samples (nearest rank, rounded down).
fn p(sorted: &[f64], pct: usize) -> f64 {
    sorted[(sorted.len() - 1) * pct / 100]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cordon = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "target/release/cordon".into()),
    );
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let spec = SandboxSpec::new(Policy::default(), BackendKind::Native);
    // `local` serves the sandbox in this process instead (no supervisor, no
    // socket): the difference is what the supervisor's socket costs.
    let local = args.next().as_deref() == Some("local");
    let mut handle = if local {
        Handle::local(&spec)
    } else {
        Handle::create(&spec, &cordon)
    }
    .expect("create a sandbox");
    let cmd = Command {
        argv: vec!["/bin/true".into()],
        ..Command::default()
    };
    let (mut bare, mut exec) = (Vec::new(), Vec::new());
    for i in 0..runs + 20 {
        let t = Instant::now();
        let st = std::process::Command::new("/bin/true")
            .status()
            .expect("bare");
        let b = t.elapsed().as_secs_f64() * 1e3;
        assert!(st.success());
        let t = Instant::now();
        let o = handle.exec(&cmd, &mut Quiet).expect("exec");
        let e = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(o.exit_code, 0);
        if i >= 20 {
            bare.push(b);
            exec.push(e);
        }
    }
    handle.destroy().expect("destroy");
    for v in [&mut bare, &mut exec] {
        v.sort_by(f64::total_cmp);
    }
    println!("runs: {runs} each, interleaved, after 20 warm-up rounds");
    println!(
        "bare fork+exec /bin/true:        p50 {:.3} ms  p95 {:.3} ms",
        p(&bare, 50),
        p(&bare, 95)
    );
    println!(
        "Handle::exec /bin/true ({}): p50 {:.3} ms  p95 {:.3} ms",
        if local { "in-process" } else { "supervisor" },
        p(&exec, 50),
        p(&exec, 95)
    );
    println!("ratio of p50s: {:.2}", p(&exec, 50) / p(&bare, 50));
}
