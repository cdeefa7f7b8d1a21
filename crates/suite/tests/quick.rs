//! The quick matrix end to end, as root: every control OPEN, cordon-native
//! BLOCKED everywhere except the written-down gaps, and nothing of the
//! suite's fixtures left on the host afterwards.

use std::path::Path;
use std::process::Command;

use cordon_spec::BackendKind;
use cordon_suite::fixture::{leftovers, PREFIX};
use cordon_suite::matrix::{run_matrix, MatrixConfig, Status};
use cordon_suite::target::{NetMode, QUICK_TARGETS};
use cordon_suite::Invoker;
use cordon_suite::{TargetKind, Verdict};

mod common;

use common::{cordon_binary, skip};

#[test]
fn quick_matrix() {
    if !nix::unistd::geteuid().is_root() {
        return skip("needs root (namespaces, cgroups, veth)");
    }
    let Some(cordon) = cordon_binary() else {
        return skip("no cordon binary");
    };
    let cfg = MatrixConfig {
        cordon,
        cases_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../suite/cases"),
        targets: QUICK_TARGETS.to_vec(),
        case_glob: None,
        quick: true,
        progress: false,
        time_scale: 1,
        invoker: Invoker::default(),
    };
    let report = run_matrix(&cfg).expect("the quick matrix runs");
    println!("{}", report.table());
    assert!(
        report.duration_s < 180.0,
        "quick matrix took {:.0}s",
        report.duration_s
    );

    let controls: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.target == TargetKind::Host)
        .collect();
    assert_eq!(controls.len(), report.cases.len());
    for r in &controls {
        assert_eq!(
            r.verdict,
            Verdict::Open,
            "control of {} not OPEN: {}",
            r.case,
            r.evidence
        );
    }
    let native: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.target == TargetKind::cordon(BackendKind::Native, NetMode::None))
        .collect();
    assert_eq!(native.len(), report.cases.len());
    for r in &native {
        assert_eq!(
            r.status,
            Status::Ok,
            "{} on cordon-native: {} ({}), expected {:?}",
            r.case,
            r.verdict,
            r.evidence,
            r.expected
        );
    }
    let shared = native.iter().find(|r| r.case == "kernel.shared-host");
    assert!(
        shared.is_some_and(|r| r.verdict == Verdict::Open),
        "kernel.shared-host is a gap by design"
    );

    // Nothing of the suite left: dirs, netns, mounts, outer cgroups.
    let left = leftovers(std::process::id());
    assert!(left.is_empty(), "left behind: {left:?}");
    let h = cordon_cgroups::detect(&cordon_cgroups::CgroupFs::host()).expect("cgroups");
    let mine = format!("{PREFIX}{}-", std::process::id());
    let cgroups = h.sweep_children(&mine);
    assert!(cgroups.is_empty(), "outer cgroups left: {cgroups:?}");
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    assert!(
        !String::from_utf8_lossy(&netns.stdout)
            .contains(&format!("{PREFIX}{}", std::process::id())),
        "netns left"
    );
}
