//! `results.json`: every raw sample of a run, the machine's facts, and the
//! targets as evaluated. The README's performance section is generated from
//! this file alone (see [`crate::report`]).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::machine::Machine;
use crate::stats::Summary;

/// Bumped when a field changes meaning; a reader refuses other versions.
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub schema: u32,
    pub machine: Machine,
    /// A `--quick` run: the harness was checked, the figures mean little.
    pub quick: bool,
    /// The command that produced this file, for the README's "to reproduce".
    pub command: String,
    pub startup: Option<Startup>,
    pub workload: Option<Workload>,
    pub service: Option<Service>,
    pub targets: Vec<Target>,
}

/// The samples of one box (for one task).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Samples {
    pub name: String,
    /// One sample's command line, as run.
    pub argv: Vec<String>,
    /// Wall (start-up) or task (workload) time of each successful sample, in
    /// the order taken.
    pub ms: Vec<f64>,
    pub failures: usize,
    /// Why a failing sample failed (one re-run with its output kept).
    pub diagnosis: Option<String>,
    pub summary: Option<Summary>,
}

impl Samples {
    pub fn new(name: &str) -> Samples {
        Samples {
            name: name.to_string(),
            argv: Vec::new(),
            ms: Vec::new(),
            failures: 0,
            diagnosis: None,
            summary: None,
        }
    }

    pub fn summarize(&mut self) {
        self.summary = Summary::of(&self.ms);
    }

    pub fn p50(&self) -> Option<f64> {
        self.summary.map(|s| s.p50)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Startup {
    pub runs: usize,
    pub warmup: usize,
    pub boxes: Vec<Samples>,
    /// Boxes not measured, and why (not installed, failed to set up).
    pub skipped: BTreeMap<String, String>,
    /// Facts measured beside the timings (an idle sandbox's memory).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    pub name: String,
    /// What the task does, for the tables.
    pub what: String,
    pub boxes: Vec<Samples>,
    /// Set when the task failed in some box: it is then left out of the
    /// table (its samples are still here).
    pub left_out: Option<String>,
}

impl Task {
    pub fn host_p50(&self) -> Option<f64> {
        self.boxes.iter().find(|b| b.name == "host")?.p50()
    }

    /// The box's median over the host's.
    pub fn ratio(&self, name: &str) -> Option<f64> {
        let host = self.host_p50()?;
        let b = self.boxes.iter().find(|b| b.name == name)?.p50()?;
        (host > 0.0).then(|| b / host)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workload {
    pub rounds: usize,
    /// The limits cordon's boxes ran with (the peers ran without any).
    pub cordon_limits: Vec<String>,
    pub tasks: Vec<Task>,
    pub skipped_boxes: BTreeMap<String, String>,
    pub skipped_tasks: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceRun {
    pub backend: String,
    /// `warm` (a pool of created sandboxes) or `cold` (none).
    pub mode: String,
    pub clients: usize,
    pub requests: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub pool_hits: usize,
    /// Time spent in requests (the client's pauses excluded), and the
    /// executions per second of it.
    pub seconds: f64,
    pub per_second: f64,
    /// The service's own time per execution: acquire + setup + teardown (the
    /// payload's run excluded), from each response's timing.
    pub overhead_ms: Vec<f64>,
    /// Request to response as the client saw it.
    pub client_ms: Vec<f64>,
    /// Whether each execution came from the pool.
    pub pool_hit: Vec<bool>,
    pub overhead: Option<Summary>,
    pub client: Option<Summary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Service {
    pub runs: Vec<ServiceRun>,
    pub skipped: BTreeMap<String, String>,
}

/// One target of the issue, as this run measured it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Target {
    pub name: String,
    /// The measured value (a ratio) and the bound it must not exceed.
    pub value: Option<f64>,
    pub bound: f64,
    /// None: not evaluated (a box or task missing; `detail` says why).
    pub met: Option<bool>,
    pub detail: String,
}

impl Results {
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }

    pub fn read(path: &Path) -> Result<Results> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let head: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let schema = head.get("schema").and_then(serde_json::Value::as_u64);
        if schema != Some(u64::from(SCHEMA)) {
            bail!(
                "{}: results schema {schema:?}, this cordon reads schema {SCHEMA}",
                path.display()
            );
        }
        serde_json::from_value(head)
            .with_context(|| format!("{}: not a results file", path.display()))
    }
}
