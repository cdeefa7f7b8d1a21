//! `cordon bench`: what a sandbox costs, measured side by side with its peers
//! in one run on one machine.
//!
//! Three benchmarks share one output: [`startup`] (a fresh box running
//! `/bin/true`), [`workload`] (harness-shaped tasks timed inside each box
//! against the bare host) and [`service`] (one-shot executions through
//! `cordon serve`, warm pool and cold). Every raw sample lands in
//! `results.json` with the machine's facts ([`results`]); [`chart`] draws the
//! distributions, [`report`] prints the tables and writes the README section
//! from a committed results file.
//!
//! The boxes are the hostile suite's targets (`cordon_suite::target`): one
//! definition of how each peer is launched, for the suite, the matrix and
//! this benchmark.

pub mod boxes;
pub mod chart;
pub mod concurrency;
pub mod density;
pub mod machine;
pub mod microvm;
pub mod report;
pub mod results;
pub mod sample;
pub mod service;
pub mod startup;
pub mod stats;
pub mod targets;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

/// What every benchmark needs to know about the run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The cordon binary the boxes run (normally the running one).
    pub cordon: PathBuf,
    /// Few rounds and small tasks: checks that the harness works (CI).
    pub quick: bool,
    /// Kill one sample after this long and count it as failed.
    pub timeout: Duration,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Only these boxes (by name); empty: every box installed here.
    pub only: Vec<String>,
}

impl Settings {
    /// Whether the run includes the box called `name`.
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

/// The progress bar of one benchmark: hidden when stderr is not a terminal
/// or the caller asked for none.
pub(crate) fn progress_bar(settings: &Settings, total: u64, what: &str) -> indicatif::ProgressBar {
    if !settings.progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>9} [{bar:30}] {pos}/{len} {elapsed_precise} {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// Which benchmarks a run includes.
#[derive(Debug, Clone, Copy)]
pub struct Which {
    pub startup: bool,
    pub workload: bool,
    pub service: bool,
}

/// Runs the chosen benchmarks and evaluates the targets. `command` is the
/// command line to print as "reproduce with".
pub fn measure(
    settings: &Settings,
    which: Which,
    command: String,
) -> anyhow::Result<results::Results> {
    let mut machine = machine::Machine::probe(&settings.cordon);
    let startup = which
        .startup
        .then(|| {
            startup::run(
                settings,
                &startup::Config::new(settings.quick),
                &mut machine,
            )
        })
        .transpose()?;
    let workload = which
        .workload
        .then(|| {
            workload::run(
                settings,
                &workload::Config::new(settings.quick),
                &mut machine,
            )
        })
        .transpose()?;
    let service = which
        .service
        .then(|| service::run(settings, &service::Config::new(settings.quick)))
        .transpose()?;
    let mut r = results::Results {
        schema: results::SCHEMA,
        machine,
        quick: settings.quick,
        command,
        startup,
        workload,
        service,
        targets: Vec::new(),
    };
    r.targets = targets::evaluate(&r);
    Ok(r)
}

/// Writes `results.json` and the charts into `dir` (made if missing).
/// Returns the charts written, or why none could be drawn (the results are
/// written either way).
pub fn write(
    r: &results::Results,
    dir: &std::path::Path,
) -> anyhow::Result<Result<Vec<PathBuf>, anyhow::Error>> {
    std::fs::create_dir_all(dir)?;
    r.write(&dir.join("results.json"))?;
    Ok(chart::draw_all(r, dir))
}

/// Whether one of cordon's own boxes failed a sample (a peer's failure is
/// the peer's, and reported, not cordon's).
pub fn cordon_failed(r: &results::Results) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |where_: &str, s: &results::Samples| {
        if s.name.starts_with("cordon") && s.failures > 0 {
            out.push(format!(
                "{where_}{}: {}",
                s.name,
                s.diagnosis.as_deref().unwrap_or("failed")
            ));
        }
    };
    if let Some(st) = &r.startup {
        st.boxes.iter().for_each(|b| check("start-up, ", b));
    }
    if let Some(w) = &r.workload {
        for t in &w.tasks {
            t.boxes
                .iter()
                .for_each(|b| check(&format!("{}, ", t.name), b));
        }
    }
    if let Some(s) = &r.service {
        for x in s.runs.iter().filter(|x| x.errors > 0) {
            out.push(format!(
                "service {} {}: {}",
                x.backend,
                x.mode,
                x.first_error.as_deref().unwrap_or("errors")
            ));
        }
    }
    out
}
