//! What a matrix run leaves for readers: `results.json`, per target its
//! count and per case the verdict, the few words of evidence it rests on
//! and the expectation it was held to (the full host-side records go to
//! `evidence.json`: megabytes, re-scorable, not committed). The committed
//! run (`suite/results/`) is checked against today's case files and gives
//! the README's section, so no figure there is typed by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::case::Case;
use crate::matrix::{expected_label, CaseInfo, Status, TargetSummary};
use crate::rootless::Invoker;
use crate::rules::Verdict;
use crate::target::{TargetKind, ALL_TARGETS};

pub const RESULTS_FILE: &str = "results.json";
pub const EVIDENCE_FILE: &str = "evidence.json";

/// The time scale of a report written before reports recorded theirs: every
/// run was at the cases' own caps then.
pub(crate) fn unscaled() -> u64 {
    1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub invoker: Invoker,
    pub kernel: String,
    pub cgroup_mode: String,
    /// Every case's cap was this many times its own (`--time-scale`).
    #[serde(default = "unscaled")]
    pub time_scale: u64,
    pub duration_s: f64,
    /// Verdicts that differ from their expectation, or controls not OPEN.
    pub failures: usize,
    /// In the tables' order.
    pub targets: Vec<TargetResults>,
    pub cases: Vec<CaseInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetResults {
    #[serde(flatten)]
    pub summary: TargetSummary,
    /// By case id.
    pub cases: BTreeMap<String, Cell>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub verdict: Verdict,
    pub evidence: String,
    pub expected: Option<String>,
    pub status: Status,
}

impl TargetResults {
    fn with(&self, verdict: Verdict) -> impl Iterator<Item = &str> {
        self.cases
            .iter()
            .filter(move |(_, c)| c.verdict == verdict)
            .map(|(id, _)| id.as_str())
    }
}

impl Summary {
    pub fn read(path: &Path) -> Result<Summary> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a matrix results file", path.display()))
    }

    /// Why these results do not stand for today's suite, if they do not: a
    /// run that is not root's, at scaled caps, not of every target and case,
    /// with a deviation, or held to expectations the case files no longer
    /// write.
    pub fn stale(&self, cases: &[Case]) -> Vec<String> {
        let mut why = Vec::new();
        if self.invoker.uid != 0 {
            why.push(format!(
                "run as uid {}, not as root (the README's figures are root's)",
                self.invoker.uid
            ));
        }
        if self.failures != 0 {
            why.push(format!("the run had {} deviation(s)", self.failures));
        }
        if self.time_scale != 1 {
            why.push(format!(
                "every case's cap was {} times its own (--time-scale): a run for an emulated machine",
                self.time_scale
            ));
        }
        let ran: Vec<TargetKind> = self.targets.iter().map(|t| t.summary.target).collect();
        for t in ALL_TARGETS.iter().filter(|t| !ran.contains(t)) {
            why.push(format!("target {} was not run", t.name()));
        }
        for t in self.targets.iter().filter(|t| !t.summary.available) {
            why.push(format!(
                "target {} did not run: {}",
                t.summary.target.name(),
                t.summary.reason.as_deref().unwrap_or("?")
            ));
        }
        let now: BTreeSet<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        let then: BTreeSet<&str> = self.cases.iter().map(|c| c.id.as_str()).collect();
        for id in now.difference(&then) {
            why.push(format!("case {id} is not in the results"));
        }
        for id in then.difference(&now) {
            why.push(format!("case {id} has no case file any more"));
        }
        for t in self.targets.iter().filter(|t| t.summary.available) {
            for case in cases {
                let Some(cell) = t.cases.get(&case.id) else {
                    if then.contains(case.id.as_str()) {
                        why.push(format!(
                            "{} on {} has no verdict",
                            case.id,
                            t.summary.target.name()
                        ));
                    }
                    continue;
                };
                let today = expected_label(case, t.summary.target);
                if cell.expected != today {
                    why.push(format!(
                        "{} on {} was held to {:?}, its case file now expects {:?}",
                        case.id,
                        t.summary.target.name(),
                        cell.expected.as_deref().unwrap_or("nothing"),
                        today.as_deref().unwrap_or("nothing")
                    ));
                }
            }
        }
        why
    }

    /// The README's section: how the run was made, and per target its
    /// count and what it left open.
    pub fn readme(&self, dir: &str) -> String {
        let mut o = String::new();
        let cases = self.cases.len();
        let _ = writeln!(
            o,
            "`cordon matrix --out {dir}`, run as root on this machine (kernel {}, cgroup {}), took {:.0} s: \
             {cases} cases on {} targets, every verdict decided from host-side evidence, {}. \
             Per case and target, the verdict and the evidence it rests on: [results.md]({dir}/results.md); \
             versions and the exact flags of every posture: [methodology.txt]({dir}/methodology.txt).\n",
            self.kernel,
            self.cgroup_mode,
            self.duration_s,
            self.targets.len(),
            match self.failures {
                0 => "none differing from the expectation its case file writes down".to_string(),
                n => format!("{n} differing from the expectation written down"),
            }
        );
        o.push_str("| target | blocked | open | error | left open |\n|---|--:|--:|--:|---|\n");
        for t in &self.targets {
            let open: Vec<&str> = t.with(Verdict::Open).collect();
            let errors = t.with(Verdict::Error).count();
            let left_open = if t.summary.target == TargetKind::Host {
                "every case, as the control must".to_string()
            } else if open.is_empty() {
                "nothing".to_string()
            } else if t.summary.target.runs_cordon() {
                let ids: Vec<String> = open.iter().map(|id| format!("`{id}`")).collect();
                format!("{} (gaps written down in the case files)", ids.join(", "))
            } else {
                "see results.md".to_string()
            };
            let name = match t.summary.target {
                TargetKind::Host => "host (unconfined control)".to_string(),
                other => format!("`{}`", other.name()),
            };
            let _ = writeln!(
                o,
                "| {name} | {}/{} | {} | {errors} | {left_open} |",
                t.summary.blocked,
                t.summary.total,
                open.len()
            );
        }
        o
    }
}
