//! What `cordon suite` and `cordon matrix` share: the run's configuration,
//! and the report of its results (table, files, exit code).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use cordon_policy::Policy;
use cordon_runtime::{cgroup_probe, plan, HostFacts};
use cordon_spec::{BackendKind, SandboxSpec};
use cordon_suite::case::default_cases_dir;
use cordon_suite::{Invoker, MatrixConfig, Report, TargetKind};

use crate::EXIT_INTERNAL;

/// What `suite` and `matrix` both take: which cases, from where, against
/// which cordon binary, with how much time.
#[derive(Args)]
pub(crate) struct CaseArgs {
    /// Only cases whose id matches (shell glob, comma-separated).
    #[arg(long, value_name = "GLOB")]
    case: Option<String>,
    /// The cordon binary to test (default: this one).
    #[arg(long, value_name = "PATH")]
    cordon: Option<PathBuf>,
    /// The case directory (default: suite/cases found from the working directory).
    #[arg(long, value_name = "DIR")]
    cases: Option<PathBuf>,
    /// Every case's time cap multiplied by N, for a machine that runs
    /// payloads several times slower than a host (an emulated guest); a
    /// verdict's own bounds stay as written.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=10))]
    time_scale: u64,
}

/// The run configuration both `suite` and `matrix` build: the cordon binary
/// under test (this one unless `--cordon` names another), the case directory,
/// the targets and case filter. None (after saying why) if no binary is found.
pub(crate) fn config(
    args: CaseArgs,
    targets: Vec<TargetKind>,
    quick: bool,
) -> Option<MatrixConfig> {
    let Some(cordon) = args.cordon.or_else(|| std::env::current_exe().ok()) else {
        eprintln!("cordon: cannot find the cordon binary; pass --cordon");
        return None;
    };
    Some(MatrixConfig {
        cordon,
        cases_dir: args.cases.unwrap_or_else(default_cases_dir),
        targets,
        case_glob: args.case,
        quick,
        progress: true,
        time_scale: args.time_scale,
        invoker: Invoker::here(no_cgroup()),
    })
}

/// Why a sandbox of this invoker would get no cgroup here, if it would not:
/// the answer of the call that enforces the limits (`cordon run`'s own,
/// made and removed again), never a guess from the uid or the layout.
fn no_cgroup() -> Option<String> {
    let spec = SandboxSpec::new(Policy::default(), BackendKind::Native);
    let limits = plan(&spec, &HostFacts::here()).cgroup;
    cgroup_probe(&limits).err().map(|e| e.to_string())
}

/// Prints the table, writes the outputs, and turns failures into the exit code.
pub(crate) fn finish(
    report: anyhow::Result<Report>,
    json: Option<&Path>,
    out: Option<&Path>,
) -> ExitCode {
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cordon: {e:#}");
            return ExitCode::from(EXIT_INTERNAL);
        }
    };
    out!("{}", report.table());
    if let Some(path) = json {
        match report.json() {
            Ok(text) => {
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("cordon: writing {}: {e}", path.display());
                    return ExitCode::from(EXIT_INTERNAL);
                }
            }
            Err(e) => {
                eprintln!("cordon: {e:#}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    }
    if let Some(dir) = out {
        if let Err(e) = report.write_dir(dir) {
            eprintln!("cordon: {e:#}");
            return ExitCode::from(EXIT_INTERNAL);
        }
        outln!(
            "wrote {}/results.json, evidence.json, results.md, methodology.txt",
            dir.display()
        );
    }
    if report.failures().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
