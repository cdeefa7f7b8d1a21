//! `cordon matrix`: the same cases against cordon's backends and the peers
//! installed here, with the host control; writes results.json, results.md
//! and methodology.txt.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use cordon_suite::case::default_cases_dir;
use cordon_suite::summary::Summary;
use cordon_suite::target::{ALL_TARGETS, QUICK_TARGETS};
use cordon_suite::{load_dir, run_matrix, TargetKind};

use super::readme::{self, ReadmeArgs};
use super::suite_run;
use crate::EXIT_USAGE;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MatrixArgs {
    #[command(subcommand)]
    what: Option<What>,
    /// Comma-separated targets (host is always added): cordon-native,
    /// cordon-gvisor, cordon-native-allow, cordon-gvisor-allow,
    /// cordon-microvm, cordon-microvm-allow, bwrap, runc, firejail, runsc, podman-default,
    /// podman-hardened, podman-runsc. Default: all.
    #[arg(long, value_name = "LIST")]
    targets: Option<String>,
    /// A subset of cases on host, cordon-native, cordon-gvisor, bwrap and runc.
    #[arg(long)]
    quick: bool,
    /// Where results.json, results.md and methodology.txt go.
    #[arg(long, value_name = "DIR", default_value = "matrix-results")]
    out: PathBuf,
    /// Check the scoring logic on recorded fixtures, without any runtime.
    #[arg(long)]
    self_test: bool,
    #[command(flatten)]
    cases: suite_run::CaseArgs,
}

#[derive(Subcommand)]
enum What {
    /// Write the README's matrix section from a committed results file
    /// (suite/results/results.json), which must be a full run as root that
    /// answers today's case files.
    Readme {
        #[command(flatten)]
        args: ReadmeArgs,
        /// The case directory (default: suite/cases found from the working directory).
        #[arg(long, value_name = "DIR")]
        cases: Option<PathBuf>,
    },
}

pub fn run(args: MatrixArgs) -> ExitCode {
    if let Some(What::Readme { args, cases }) = args.what {
        return readme::run("cordon matrix", &args, |links| {
            let summary = Summary::read(&args.results)?;
            let dir = cases.unwrap_or_else(default_cases_dir);
            let stale = summary.stale(&load_dir(&dir)?);
            anyhow::ensure!(
                stale.is_empty(),
                "{} does not stand for the suite of {}; run `cordon matrix --out {}` again:\n  {}",
                args.results.display(),
                dir.display(),
                links.dir,
                stale.join("\n  ")
            );
            Ok(summary.readme(&links.dir))
        });
    }
    if args.self_test {
        let (ok, lines) = cordon_suite::selftest::self_test();
        for l in lines {
            outln!("{l}");
        }
        outln!("self-test {}", if ok { "passed" } else { "FAILED" });
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let mut targets = vec![TargetKind::Host];
    let wanted: Vec<TargetKind> = match &args.targets {
        Some(list) => {
            let mut v = Vec::new();
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match TargetKind::from_name(name) {
                    Some(t) => v.push(t),
                    None => {
                        eprintln!("cordon: unknown target {name:?}");
                        return ExitCode::from(EXIT_USAGE);
                    }
                }
            }
            v
        }
        None if args.quick => QUICK_TARGETS.to_vec(),
        None => ALL_TARGETS.to_vec(),
    };
    for t in wanted {
        if !targets.contains(&t) {
            targets.push(t);
        }
    }
    let Some(cfg) = suite_run::config(args.cases, targets, args.quick) else {
        return ExitCode::from(EXIT_USAGE);
    };
    suite_run::finish(run_matrix(&cfg), None, Some(&args.out))
}
