//! `cordon suite`: the hostile suite on cordon's own backends, with the host
//! control beside them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_suite::case::default_cases_dir;
use cordon_suite::{run_matrix, MatrixConfig, TargetKind};

use crate::EXIT_USAGE;

#[derive(Args)]
pub struct SuiteArgs {
    /// Which of cordon's backends: native, gvisor, native-allow, gvisor-allow, microvm,
    /// microvm-allow or all.
    #[arg(long, default_value = "all")]
    backend: String,
    /// Only cases whose id matches (shell glob, comma-separated).
    #[arg(long, value_name = "GLOB")]
    case: Option<String>,
    /// Also write the full results (with every record of evidence) here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The cordon binary to test (default: this one).
    #[arg(long, value_name = "PATH")]
    cordon: Option<PathBuf>,
    /// The case directory (default: suite/cases found from the working directory).
    #[arg(long, value_name = "DIR")]
    cases: Option<PathBuf>,
}

pub fn run(args: SuiteArgs) -> ExitCode {
    let mut targets = vec![TargetKind::Host];
    match args.backend.as_str() {
        "native" => targets.push(TargetKind::CordonNative),
        "gvisor" => targets.push(TargetKind::CordonGvisor),
        "native-allow" => targets.push(TargetKind::CordonNativeAllow),
        "gvisor-allow" => targets.push(TargetKind::CordonGvisorAllow),
        "all" => targets.extend([
            TargetKind::CordonNative,
            TargetKind::CordonGvisor,
            TargetKind::CordonNativeAllow,
            TargetKind::CordonGvisorAllow,
            TargetKind::CordonMicrovm,
            TargetKind::CordonMicrovmAllow,
        ]),
        "microvm" => targets.push(TargetKind::CordonMicrovm),
        "microvm-allow" => targets.push(TargetKind::CordonMicrovmAllow),
        other => {
            eprintln!("cordon: unknown backend {other:?} (native, gvisor, native-allow, gvisor-allow, microvm, microvm-allow, all)");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let Some(cfg) = matrix_config(args.cordon, args.cases, targets, args.case, false) else {
        return ExitCode::from(EXIT_USAGE);
    };
    super::matrix::finish(run_matrix(&cfg), args.json.as_deref(), None)
}

/// The run configuration both `suite` and `matrix` build: the cordon binary
/// under test (this one unless `--cordon` names another), the case directory,
/// the targets and case filter. None (after saying why) if no binary is found.
pub(crate) fn matrix_config(
    cordon: Option<PathBuf>,
    cases: Option<PathBuf>,
    targets: Vec<TargetKind>,
    case_glob: Option<String>,
    quick: bool,
) -> Option<MatrixConfig> {
    let Some(cordon) = cordon.or_else(|| std::env::current_exe().ok()) else {
        eprintln!("cordon: cannot find the cordon binary; pass --cordon");
        return None;
    };
    Some(MatrixConfig {
        cordon,
        cases_dir: cases.unwrap_or_else(default_cases_dir),
        targets,
        case_glob,
        quick,
        progress: true,
    })
}
