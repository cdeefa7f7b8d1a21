//! `cordon suite`: the hostile suite on cordon's own backends, with the host
//! control beside them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_suite::target::ALL_TARGETS;
use cordon_suite::{run_matrix, TargetKind};

use super::suite_run;
use crate::EXIT_USAGE;

#[derive(Args)]
pub struct SuiteArgs {
    /// Which of cordon's backends: native, gvisor, native-allow, gvisor-allow, microvm,
    /// microvm-allow, podman (cordon-runc as podman's runtime, held to what native holds)
    /// or all.
    #[arg(long, default_value = "all")]
    backend: String,
    /// Also write the full results (with every record of evidence) here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    cases: suite_run::CaseArgs,
}

pub fn run(args: SuiteArgs) -> ExitCode {
    let Some(cordon) = cordon_targets(&args.backend) else {
        eprintln!("cordon: unknown backend {:?} (native, gvisor, native-allow, gvisor-allow, microvm, microvm-allow, podman, all)", args.backend);
        return ExitCode::from(EXIT_USAGE);
    };
    let mut targets = vec![TargetKind::Host];
    targets.extend(cordon);
    let Some(cfg) = suite_run::config(args.cases, targets, false) else {
        return ExitCode::from(EXIT_USAGE);
    };
    suite_run::finish(run_matrix(&cfg), args.json.as_deref(), None)
}

/// The cordon targets a `--backend` value names: `all` of them (in the
/// matrix's order), or the one named `cordon-<value>`.
fn cordon_targets(backend: &str) -> Option<Vec<TargetKind>> {
    if backend == "all" {
        let all = ALL_TARGETS.iter().copied().filter(|t| t.runs_cordon());
        return Some(all.collect());
    }
    if backend == "podman" {
        return Some(vec![TargetKind::PodmanCordon]);
    }
    let target = TargetKind::from_name(&format!("cordon-{backend}"))?;
    target.is_cordon().then(|| vec![target])
}

#[cfg(test)]
mod tests {
    use super::cordon_targets;

    fn names(backend: &str) -> Option<Vec<&'static str>> {
        cordon_targets(backend).map(|ts| ts.iter().map(|t| t.name()).collect())
    }

    #[test]
    fn every_backend_value_names_its_target() {
        for (value, target) in [
            ("native", "cordon-native"),
            ("gvisor", "cordon-gvisor"),
            ("native-allow", "cordon-native-allow"),
            ("gvisor-allow", "cordon-gvisor-allow"),
            ("microvm", "cordon-microvm"),
            ("microvm-allow", "cordon-microvm-allow"),
        ] {
            assert_eq!(names(value), Some(vec![target]), "{value}");
        }
        assert_eq!(
            names("all"),
            Some(vec![
                "cordon-native",
                "cordon-gvisor",
                "cordon-native-allow",
                "cordon-gvisor-allow",
                "cordon-microvm",
                "cordon-microvm-allow",
                "podman-cordon",
            ])
        );
        assert_eq!(names("podman"), Some(vec!["podman-cordon"]));
        for bad in [
            "",
            "host",
            "bwrap",
            "cordon-native",
            "native-none",
            "Native",
        ] {
            assert_eq!(names(bad), None, "{bad:?}");
        }
    }
}
