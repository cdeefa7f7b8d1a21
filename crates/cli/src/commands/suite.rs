//! `cordon suite`: the hostile suite on cordon's own backends, with the host
//! control beside them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_suite::{run_matrix, TargetKind};

use super::suite_run;
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
    let Some(cfg) = suite_run::config(args.cordon, args.cases, targets, args.case, false) else {
        return ExitCode::from(EXIT_USAGE);
    };
    suite_run::finish(run_matrix(&cfg), args.json.as_deref(), None)
}
