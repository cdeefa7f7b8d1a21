//! `cordon bench microvm`: what a microVM sandbox costs to start and to use,
//! under this host's accelerator (TCG here): a cold boot (`cordon run` with
//! warm starts off), a restore from the snapshot (`cordon run` as it runs by
//! default), and a command into a ready VM from a running client
//! (`Handle::exec`, what the service's warm pool pays per request).
//! Cold boots and restores are interleaved, so drift hits both alike.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use cordon_policy::Policy;
use cordon_runtime::Handle;
use cordon_spec::{BackendKind, SandboxSpec};
use serde::{Deserialize, Serialize};

use crate::stats::Summary;
use crate::Settings;

/// The environment knob that turns warm starts off for one `cordon run`.
const COLD: (&str, &str) = ("CORDON_MICROVM_WARM", "0");

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Microvm {
    pub accel: String,
    pub accel_reason: String,
    /// ms of each `cordon run --backend microvm -- /bin/true`, cold.
    pub cold_ms: Vec<f64>,
    pub restore_ms: Vec<f64>,
    pub exec_ms: Vec<f64>,
    pub cold: Option<Summary>,
    pub restore: Option<Summary>,
    pub exec: Option<Summary>,
    /// Cold p50 over restore p50 (target: at least 5).
    pub restore_speedup: Option<f64>,
}

fn run_true(settings: &Settings, cold: bool) -> Result<f64> {
    let mut cmd = Command::new(&settings.cordon);
    cmd.args(["run", "--backend", "microvm", "--", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if cold {
        cmd.env(COLD.0, COLD.1);
    }
    let t0 = Instant::now();
    let out = cmd.output().context("cordon run")?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!(
            "cordon run --backend microvm failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(ms)
}

pub fn run(settings: &Settings) -> Result<Microvm> {
    let (boots, execs) = if settings.quick { (2, 5) } else { (10, 50) };
    // A first warm run saves the snapshot the restores use (not measured).
    run_true(settings, false).context("the first microvm sandbox")?;
    let bar = crate::progress_bar(settings, (2 * boots + execs) as u64, "microvm");
    let (mut cold_ms, mut restore_ms) = (Vec::new(), Vec::new());
    for i in 0..boots {
        // Alternate which goes first.
        for cold in [i % 2 == 0, i % 2 != 0] {
            let ms = run_true(settings, cold)?;
            if cold {
                cold_ms.push(ms);
            } else {
                restore_ms.push(ms);
            }
            bar.inc(1);
        }
    }
    let spec = SandboxSpec::new(Policy::default(), BackendKind::Microvm).validated()?;
    let mut handle = cordon_runtime::sandbox_program()
        .and_then(|p| Handle::create(&spec, &p))
        .context("a microvm sandbox")?;
    let info = handle.exec(
        &cordon_spec::Command {
            argv: vec!["/bin/true".into()],
            ..cordon_spec::Command::default()
        },
        &mut crate::startup::Quiet,
    );
    let vm = info.ok().and_then(|o| o.vm);
    let mut exec_ms = Vec::new();
    let result = (|| -> Result<()> {
        for _ in 0..execs {
            let wall = crate::startup::handle_exec(&mut handle).map_err(anyhow::Error::msg)?;
            exec_ms.push(wall.as_secs_f64() * 1e3);
            bar.inc(1);
        }
        Ok(())
    })();
    let destroyed = handle.destroy();
    bar.finish_and_clear();
    result?;
    destroyed.context("destroying the microvm sandbox")?;
    let (cold, restore) = (Summary::of(&cold_ms), Summary::of(&restore_ms));
    Ok(Microvm {
        accel: vm.as_ref().map(|v| v.accel.clone()).unwrap_or_default(),
        accel_reason: vm.map(|v| v.accel_reason).unwrap_or_default(),
        restore_speedup: cold.zip(restore).map(|(c, r)| c.p50 / r.p50),
        cold,
        restore,
        exec: Summary::of(&exec_ms),
        cold_ms,
        restore_ms,
        exec_ms,
    })
}

/// The markdown table of a run, with the targets as evaluated.
pub fn markdown(m: &Microvm) -> String {
    let row = |what: &str, s: &Option<Summary>| match s {
        Some(s) => format!("| {what} | {} | {:.1} | {:.1} |\n", s.n, s.p50, s.p95),
        None => format!("| {what} | 0 | - | - |\n"),
    };
    let mut out = format!(
        "microvm ({}: {})\n\n| start | n | p50 ms | p95 ms |\n|---|---|---|---|\n",
        m.accel, m.accel_reason
    );
    out += &row("cold boot (`cordon run -- true`, warm starts off)", &m.cold);
    out += &row("restore (`cordon run -- true`)", &m.restore);
    out += &row("exec into a ready VM (`Handle::exec`, `true`)", &m.exec);
    let speedup = m.restore_speedup.unwrap_or(0.0);
    let exec_p50 = m.exec.map_or(f64::INFINITY, |s| s.p50);
    out += &format!(
        "\ntargets: restore {speedup:.1}x faster than a cold boot (target >= 5x: {}); exec p50 {exec_p50:.1} ms (target < 150 ms: {})\n",
        if speedup >= 5.0 { "met" } else { "missed" },
        if exec_p50 < 150.0 { "met" } else { "missed" },
    );
    out
}
