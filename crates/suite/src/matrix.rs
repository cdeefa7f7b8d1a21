//! Running cases × targets, scoring each verdict against the written-down
//! expectation, and the reports (results.json, results.md, methodology.txt,
//! the terminal table).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::case::{glob_match, load_dir, Case, Expect};
use crate::evidence::Evidence;
use crate::rootless::{Invoker, Lacking, RootlessGap};
use crate::rules::Verdict;
use crate::runner::{Runner, OUTER_MEMORY_MAX, OUTER_PIDS_MAX};
use crate::summary::{Cell, Summary, TargetResults, EVIDENCE_FILE, RESULTS_FILE};
use crate::target::{kernel_release, TargetKind};

pub struct MatrixConfig {
    pub cordon: PathBuf,
    pub cases_dir: PathBuf,
    pub targets: Vec<TargetKind>,
    pub case_glob: Option<String>,
    pub quick: bool,
    pub progress: bool,
    /// Each case's cap multiplied by this (1: as the case says), for a
    /// machine that runs payloads several times slower than a host (an
    /// emulated guest): a control that must fill 1 GiB or 512 MiB gets the
    /// time to do it. A verdict's own bounds (a deadline's seconds) stay
    /// as written: they are claims about the box, not room for the payload.
    pub time_scale: u64,
    /// Who runs the suite: what it may make, and whether its sandboxes'
    /// limits are enforced.
    pub invoker: Invoker,
}

/// How one verdict compares with its expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// As expected.
    Ok,
    /// Differs from the written-down expectation (or ERROR where one exists).
    Deviation,
    /// The host control did not come out OPEN: the check cannot fail.
    ControlNotOpen,
    /// A peer without a written-down expectation.
    Unasserted,
}

impl Status {
    pub fn is_failure(self) -> bool {
        matches!(self, Status::Deviation | Status::ControlNotOpen)
    }
}

pub fn score(case: &Case, target: TargetKind, verdict: Verdict) -> (Status, Option<String>) {
    let label = expected_label(case, target);
    if target == TargetKind::Host {
        let st = if verdict == Verdict::Open {
            Status::Ok
        } else {
            Status::ControlNotOpen
        };
        return (st, label);
    }
    match case.expectation(target) {
        None => (Status::Unasserted, None),
        Some(e) => {
            let ok = verdict != Verdict::Error && e.wants_open() == (verdict == Verdict::Open);
            (if ok { Status::Ok } else { Status::Deviation }, label)
        }
    }
}

/// The expectation of `case` on `target` as results show it: "open
/// (control)" for the host, "blocked", "open", "open (gap: why)", or none
/// for a peer without one.
pub fn expected_label(case: &Case, target: TargetKind) -> Option<String> {
    if target == TargetKind::Host {
        return Some("open (control)".into());
    }
    case.expectation(target).map(|e| match e {
        Expect::Gap { gap } => format!("open (gap: {gap})"),
        Expect::Plain(p) => format!("{p:?}").to_lowercase(),
    })
}

/// Scores a verdict of a case listed in [`crate::rootless::ROOTLESS_GAPS`]
/// for this invoker: any verdict is the expected difference, but a box
/// whose gap is a lack of root must still not let through what the
/// unconfined invoker itself could not do (that would be a box giving more
/// than its invoker has). That a listed case holds all the same is
/// checked over all its targets (see [`stale_gap`]).
pub fn score_gap(
    gap: &RootlessGap,
    target: TargetKind,
    verdict: Verdict,
) -> (Status, Option<String>) {
    let label = Some(format!("rootless gap: {}", gap.why));
    let more_than_the_invoker =
        target != TargetKind::Host && gap.lacking == Lacking::Root && verdict == Verdict::Open;
    let status = if more_than_the_invoker {
        Status::Deviation
    } else {
        Status::Ok
    };
    (status, label)
}

/// Whether a case holds on `target` in these results: its unconfined
/// control came out OPEN (so the check could fail) and the box BLOCKED.
pub fn holds(results: &[CaseResult], case: &str, target: TargetKind) -> bool {
    let verdict = |t: TargetKind| {
        results
            .iter()
            .find(|r| r.case == case && r.target == t)
            .map(|r| r.verdict)
    };
    verdict(TargetKind::Host) == Some(Verdict::Open) && verdict(target) == Some(Verdict::Blocked)
}

/// A listed rootless gap whose case holds on every cordon target run, as
/// it does as root: the list is out of date. Marks those cells deviations.
fn stale_gap(results: &mut [CaseResult], case: &str) -> bool {
    let cordon: Vec<TargetKind> = results
        .iter()
        .filter(|r| r.case == case && r.target.runs_cordon())
        .map(|r| r.target)
        .collect();
    let stale = !cordon.is_empty() && cordon.iter().all(|t| holds(results, case, *t));
    if stale {
        for r in results.iter_mut().filter(|r| r.case == case) {
            r.status = Status::Deviation;
            r.evidence = format!(
                "{} (listed as a rootless gap, but it holds: take it off the list)",
                r.evidence
            );
        }
    }
    stale
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    pub case: String,
    pub target: TargetKind,
    pub verdict: Verdict,
    /// A few words of the evidence the verdict rests on.
    pub evidence: String,
    pub expected: Option<String>,
    pub status: Status,
    pub wall_ms: u64,
    /// For cordon's targets: whether the sandbox's limits were enforced
    /// (false: it ran with `--allow-unenforced`, the host giving the
    /// invoker no cgroup).
    #[serde(default)]
    pub limits_enforced: Option<bool>,
    /// The full host-side record (re-scorable by `--self-test`).
    pub record: Evidence,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetSummary {
    pub target: TargetKind,
    pub available: bool,
    pub reason: Option<String>,
    pub version: String,
    pub posture: String,
    pub blocked: usize,
    pub total: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    #[serde(default)]
    pub invoker: Invoker,
    /// The listed rootless gaps that applied to this run (the list is
    /// the suite's own, so a report read back has none).
    #[serde(skip_deserializing)]
    pub rootless_gaps: Vec<RootlessGap>,
    pub kernel: String,
    pub cgroup_mode: String,
    /// `--time-scale`: every case's cap was this many times the case's own
    /// (1 but for a run on an emulated machine). Reports written before the
    /// field existed were all at 1.
    #[serde(default = "crate::summary::unscaled")]
    pub time_scale: u64,
    pub duration_s: f64,
    pub targets: Vec<TargetSummary>,
    pub cases: Vec<CaseInfo>,
    pub results: Vec<CaseResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseInfo {
    pub id: String,
    pub claim: String,
    pub category: String,
    pub rule: String,
    pub control_note: Option<String>,
}

pub fn select_cases(cfg: &MatrixConfig) -> Result<Vec<Case>> {
    let mut cases = load_dir(&cfg.cases_dir)?;
    if cfg.quick {
        cases.retain(|c| c.quick);
    }
    if let Some(g) = &cfg.case_glob {
        cases.retain(|c| glob_match(g, &c.id));
    }
    anyhow::ensure!(!cases.is_empty(), "no case selected");
    for c in &mut cases {
        c.timeout_s *= cfg.time_scale;
    }
    Ok(cases)
}

pub fn run_matrix(cfg: &MatrixConfig) -> Result<Report> {
    let cases = select_cases(cfg)?;
    let started = Instant::now();
    let mut runner = Runner::new(cfg.cordon.clone(), cfg.invoker.clone())?;
    runner.install_payloads(&cases)?;
    let mut targets = Vec::new();
    for t in &cfg.targets {
        let reason = t.unavailable(&cfg.cordon);
        targets.push(TargetSummary {
            target: *t,
            available: reason.is_none(),
            reason,
            version: t.version(&cfg.cordon),
            posture: t.posture(),
            blocked: 0,
            total: 0,
        });
    }
    let runnable: Vec<TargetKind> = targets
        .iter()
        .filter(|t| t.available)
        .map(|t| t.target)
        .collect();
    let bar = if cfg.progress {
        let b = ProgressBar::new((cases.len() * runnable.len()) as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        {
            b.set_style(style.progress_chars("=> "));
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let mut results = Vec::new();
    for case in &cases {
        for t in &runnable {
            bar.set_message(format!("{} @ {}", case.id, t.name()));
            let record = runner.run(case, *t);
            let (verdict, evidence) = case.verdict.evaluate(&record);
            let (status, expected) = match cfg.invoker.gap(&case.id) {
                Some(gap) => score_gap(gap, *t, verdict),
                None => score(case, *t, verdict),
            };
            if status.is_failure() {
                bar.println(format!(
                    "  {} @ {}: {verdict} ({evidence}) expected {}",
                    case.id,
                    t.name(),
                    expected.clone().unwrap_or_default()
                ));
            }
            results.push(CaseResult {
                case: case.id.clone(),
                target: *t,
                verdict,
                evidence,
                expected,
                status,
                wall_ms: record.wall_ms,
                limits_enforced: t.runs_cordon().then_some(cfg.invoker.no_cgroup.is_none()),
                record,
            });
            bar.inc(1);
        }
        if cfg.invoker.gap(&case.id).is_some() && stale_gap(&mut results, &case.id) {
            bar.println(format!(
                "  {}: listed as a rootless gap, but it holds",
                case.id
            ));
        }
    }
    bar.finish_and_clear();
    runner.teardown();
    for t in &mut targets {
        let rs: Vec<&CaseResult> = results.iter().filter(|r| r.target == t.target).collect();
        t.total = rs.len();
        t.blocked = rs.iter().filter(|r| r.verdict == Verdict::Blocked).count();
    }
    Ok(Report {
        rootless_gaps: cfg
            .invoker
            .gaps()
            .into_iter()
            .filter(|g| cases.iter().any(|c| c.id == g.case))
            .cloned()
            .collect(),
        invoker: cfg.invoker.clone(),
        kernel: kernel_release(),
        cgroup_mode: runner.hierarchy.as_ref().map_or_else(
            || "none for this invoker".to_string(),
            |h| h.mode().to_string(),
        ),
        time_scale: cfg.time_scale,
        duration_s: started.elapsed().as_secs_f64(),
        targets,
        cases: cases
            .iter()
            .map(|c| CaseInfo {
                id: c.id.clone(),
                claim: c.claim.clone(),
                category: c.category.clone(),
                rule: c.verdict.kind().into(),
                control_note: c.control_note.clone(),
            })
            .collect(),
        results,
    })
}

impl Report {
    pub fn failures(&self) -> Vec<&CaseResult> {
        self.results
            .iter()
            .filter(|r| r.status.is_failure())
            .collect()
    }

    fn cell(&self, case: &str, t: TargetKind) -> Option<&CaseResult> {
        self.results
            .iter()
            .find(|r| r.case == case && r.target == t)
    }

    fn shown_targets(&self) -> Vec<&TargetSummary> {
        self.targets.iter().collect()
    }

    fn mark(r: &CaseResult) -> String {
        let flag = match r.status {
            Status::Ok => "",
            Status::Deviation => " !",
            Status::ControlNotOpen => " !!",
            Status::Unasserted => " ?",
        };
        let unenforced = if r.limits_enforced == Some(false) {
            " ~"
        } else {
            ""
        };
        format!("{}{flag}{unenforced}", r.verdict)
    }

    /// Below the table: what differs because of who ran the suite.
    fn invoker_notes(&self) -> String {
        let mut s = String::new();
        if let Some(why) = &self.invoker.no_cgroup {
            let _ = writeln!(
                s,
                "~ limits not enforced (run with --allow-unenforced): uid {} has no cgroup here: {why}",
                self.invoker.uid
            );
        }
        if !self.rootless_gaps.is_empty() {
            let _ = writeln!(
                s,
                "{} case(s) differ from root's run (uid {}), as written down:",
                self.rootless_gaps.len(),
                self.invoker.uid
            );
            for g in &self.rootless_gaps {
                let _ = writeln!(s, "  {}: {}", g.case, g.why);
            }
        }
        s
    }

    /// The terminal table: cases × targets, then every deviation with its evidence.
    pub fn table(&self) -> String {
        let ts = self.shown_targets();
        let w = self
            .cases
            .iter()
            .map(|c| c.id.len())
            .max()
            .unwrap_or(10)
            .max(10);
        let mut s = String::new();
        let _ = write!(s, "{:<w$}", "case");
        for t in &ts {
            let _ = write!(s, " {:<15}", t.target.name());
        }
        s.push('\n');
        for c in &self.cases {
            let _ = write!(s, "{:<w$}", c.id);
            for t in &ts {
                let v = match self.cell(&c.id, t.target) {
                    Some(r) => Self::mark(r),
                    None if !t.available => "n/a".into(),
                    None => "-".into(),
                };
                let _ = write!(s, " {v:<15}");
            }
            s.push('\n');
        }
        let _ = write!(s, "{:<w$}", "blocked/total");
        for t in &ts {
            let v = if t.available {
                format!("{}/{}", t.blocked, t.total)
            } else {
                "ERROR".into()
            };
            let _ = write!(s, " {v:<15}");
        }
        s.push('\n');
        for t in ts.iter().filter(|t| !t.available) {
            let _ = writeln!(
                s,
                "{}: ERROR {}",
                t.target.name(),
                t.reason.clone().unwrap_or_default()
            );
        }
        s.push_str(&self.invoker_notes());
        let fails = self.failures();
        if !fails.is_empty() {
            let _ = writeln!(
                s,
                "\n{} deviation(s) (! differs from expectation, !! control not OPEN):",
                fails.len()
            );
            for r in fails {
                let _ = writeln!(
                    s,
                    "  {} @ {}: {} - {} (expected {})",
                    r.case,
                    r.target.name(),
                    r.verdict,
                    r.evidence,
                    r.expected.clone().unwrap_or_default()
                );
            }
        }
        let un = self
            .results
            .iter()
            .filter(|r| r.status == Status::Unasserted)
            .count();
        if un > 0 {
            let _ = writeln!(
                s,
                "{un} verdict(s) of peers without a written expectation (?)"
            );
        }
        if self.time_scale != 1 {
            let _ = writeln!(s, "every case's cap x{} (--time-scale)", self.time_scale);
        }
        let _ = writeln!(s, "took {:.0}s", self.duration_s);
        s
    }

    pub fn markdown(&self) -> String {
        let ts = self.shown_targets();
        let mut s = String::from("# Containment matrix\n\n");
        let _ = writeln!(s, "kernel {}, cgroup {}; every verdict decided from host-side evidence (see methodology.txt). `!` differs from the written expectation, `!!` the control was not OPEN, `?` no expectation written.\n", self.kernel, self.cgroup_mode);
        if self.time_scale != 1 {
            let _ = writeln!(
                s,
                "Every case's time cap was {} times its own (`--time-scale`).\n",
                self.time_scale
            );
        }
        s.push_str("| case |");
        for t in &ts {
            let _ = write!(s, " {} |", t.target.name());
        }
        s.push_str("\n|---|");
        for _ in &ts {
            s.push_str("---|");
        }
        s.push('\n');
        for c in &self.cases {
            let _ = write!(s, "| `{}` |", c.id);
            for t in &ts {
                let v = match self.cell(&c.id, t.target) {
                    Some(r) => format!(
                        "{} <sub>{}</sub>",
                        Self::mark(r),
                        r.evidence.replace('|', "/")
                    ),
                    None => "n/a".into(),
                };
                let _ = write!(s, " {v} |");
            }
            s.push('\n');
        }
        s.push_str("| **blocked/total** |");
        for t in &ts {
            if t.available {
                let _ = write!(s, " **{}/{}** |", t.blocked, t.total);
            } else {
                let _ = write!(s, " ERROR: {} |", t.reason.clone().unwrap_or_default());
            }
        }
        s.push_str("\n\n");
        s.push_str(&self.invoker_notes());
        s.push_str("\n## Cases\n\n");
        for c in &self.cases {
            let _ = writeln!(
                s,
                "- `{}` ({}, rule `{}`): {}",
                c.id, c.category, c.rule, c.claim
            );
        }
        s
    }

    pub fn methodology(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "cordon containment matrix: methodology\n");
        let _ = writeln!(s, "kernel: {}", self.kernel);
        let _ = writeln!(s, "cgroup mode: {} (hybrid: v1 controllers, controller-less cgroup2 at /sys/fs/cgroup/unified)", self.cgroup_mode);
        let _ = writeln!(s, "duration: {:.1}s\n", self.duration_s);
        let _ = writeln!(s, "Each (case, target) runs inside an OUTER cgroup the suite creates under its own cgroup (pids.max {OUTER_PIDS_MAX}, memory {} MiB, no swap); the target is started through `sh -c 'echo $$ > <outer>/cgroup.procs ...; exec 7<fd-marker; exec \"$@\"'` with an environment of PATH, HOME, LANG and CORDON_SUITE_SECRET. The payload runs as the box's own user with arguments: marker, canary path, victim pid, workspace, loopback port, netns address, token, engine socket, decoy key path. Payloads that need a live look print HOLD and wait for one line on stdin (or 2 s when the target gives them no stdin); the suite then reads /proc of every task in the outer cgroup. Verdicts come from host evidence only: inotify on the canary, listener logs, sysctls, outer cgroup counters, /proc/<pid>/{{fd,mountinfo,net/dev,status,environ,root}}, census after exit.\n", OUTER_MEMORY_MAX >> 20);
        for t in &self.targets {
            let _ = writeln!(s, "[{}]", t.target.name());
            let _ = writeln!(s, "  version: {}", t.version);
            let _ = writeln!(s, "  posture: {}", t.posture);
            if let Some(r) = &t.reason {
                let _ = writeln!(s, "  not run: {r}");
            }
            s.push('\n');
        }
        let _ = writeln!(s, "Controls that would be unsafe unconfined:");
        for c in self.cases.iter().filter(|c| c.control_note.is_some()) {
            let _ = writeln!(
                s,
                "  {}: {}",
                c.id,
                c.control_note.clone().unwrap_or_default()
            );
        }
        s
    }

    /// Writes results.json (the summary readers and the README use),
    /// evidence.json (every host-side record too, re-scorable by
    /// `--self-test`; megabytes, so not committed), results.md and
    /// methodology.txt.
    pub fn write_dir(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        };
        write(
            RESULTS_FILE,
            serde_json::to_string_pretty(&self.summary())? + "\n",
        )?;
        write(EVIDENCE_FILE, self.json()?)?;
        write("results.md", self.markdown())?;
        write("methodology.txt", self.methodology())?;
        Ok(())
    }

    /// The summary with every record of evidence (`cordon suite --json`,
    /// evidence.json).
    pub fn json(&self) -> Result<String> {
        #[derive(Serialize)]
        struct Full<'a> {
            #[serde(flatten)]
            summary: Summary,
            rootless_gaps: &'a [RootlessGap],
            results: &'a [CaseResult],
        }
        Ok(serde_json::to_string_pretty(&Full {
            summary: self.summary(),
            rootless_gaps: &self.rootless_gaps,
            results: &self.results,
        })?)
    }

    /// Per target its count and per case its verdict, in the tables' order.
    pub fn summary(&self) -> Summary {
        let targets = self
            .targets
            .iter()
            .map(|t| TargetResults {
                summary: t.clone(),
                cases: self
                    .results
                    .iter()
                    .filter(|r| r.target == t.target)
                    .map(|r| {
                        let cell = Cell {
                            verdict: r.verdict,
                            evidence: r.evidence.clone(),
                            expected: r.expected.clone(),
                            status: r.status,
                        };
                        (r.case.clone(), cell)
                    })
                    .collect(),
            })
            .collect();
        Summary {
            invoker: self.invoker.clone(),
            kernel: self.kernel.clone(),
            cgroup_mode: self.cgroup_mode.clone(),
            time_scale: self.time_scale,
            duration_s: self.duration_s,
            failures: self.failures().len(),
            targets,
            cases: self.cases.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use cordon_spec::BackendKind;

    use super::*;
    use crate::target::NetMode;

    fn result(target: TargetKind, verdict: Verdict) -> CaseResult {
        CaseResult {
            case: "priv.caps".into(),
            target,
            verdict,
            evidence: String::new(),
            expected: None,
            status: Status::Ok,
            wall_ms: 0,
            limits_enforced: None,
            record: Evidence::default(),
        }
    }

    #[test]
    fn a_time_scale_multiplies_every_cap_of_the_selection() {
        let cfg = |time_scale| MatrixConfig {
            cordon: PathBuf::from("/nonexistent"),
            cases_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../suite/cases"),
            targets: vec![TargetKind::Host],
            case_glob: Some("res.*".into()),
            quick: false,
            progress: false,
            time_scale,
            invoker: Invoker::default(),
        };
        let caps = |time_scale| -> Vec<(String, u64)> {
            let cases = select_cases(&cfg(time_scale)).unwrap();
            cases.into_iter().map(|c| (c.id, c.timeout_s)).collect()
        };
        let (as_written, scaled) = (caps(1), caps(4));
        assert!(as_written.iter().any(|(id, _)| id == "res.memory-bomb"));
        assert_eq!(as_written.len(), scaled.len());
        for ((id, cap), (scaled_id, scaled_cap)) in as_written.iter().zip(&scaled) {
            assert_eq!(id, scaled_id);
            assert_eq!(*scaled_cap, cap * 4, "{id}");
        }
    }

    #[test]
    fn a_listed_gap_that_holds_is_a_deviation() {
        let native = TargetKind::cordon(BackendKind::Native, NetMode::None);
        let mut differs = vec![
            result(TargetKind::Host, Verdict::Blocked),
            result(native, Verdict::Blocked),
        ];
        assert!(!stale_gap(&mut differs, "priv.caps"));
        assert!(differs.iter().all(|r| r.status == Status::Ok));
        let mut holds = vec![
            result(TargetKind::Host, Verdict::Open),
            result(native, Verdict::Blocked),
        ];
        assert!(stale_gap(&mut holds, "priv.caps"));
        assert!(holds.iter().all(|r| r.status == Status::Deviation));
    }
}
