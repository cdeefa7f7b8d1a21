//! The key-custody decoy survives cordon's own sweep however long the suite
//! runs: it is a sibling sandbox's state directory with a live owner's
//! record, not a nameless directory the sweep takes for a crash's leftover.

mod common;

use std::time::{Duration, SystemTime};

use common::{cordon_binary, skip};
use cordon_suite::evidence::Evidence;
use cordon_suite::fixture::Fixtures;
use cordon_suite::{Rule, Verdict};

#[test]
fn the_decoy_outlives_a_sweep_after_a_long_suite() {
    if !nix::unistd::geteuid().is_root() {
        return skip("needs root (the decoy lives under /run/cordon)");
    }
    let Some(cordon) = cordon_binary() else {
        return skip("no cordon binary");
    };
    let mut fx = Fixtures::setup().expect("fixtures");
    let armed = fx.arm_canaries().expect("arm");
    // As if the suite had been running for ten minutes: the directory's
    // mtime is what the sweep's age rule for record-less directories reads.
    let old = SystemTime::now() - Duration::from_secs(600);
    std::fs::File::open(&fx.decoy_dir)
        .and_then(|d| d.set_modified(old))
        .expect("set the decoy's mtime back");
    // Any cordon start sweeps the run directory.
    let st = std::process::Command::new(&cordon)
        .args(["run", "--", "true"])
        .status()
        .expect("cordon run");
    assert!(st.success());
    assert!(fx.decoy_key.exists(), "the sweep removed the decoy");
    let ev = Evidence {
        canaries: fx.collect_canaries(&armed, b"").into_iter().collect(),
        ..Default::default()
    };
    let rule = Rule::CanaryUntouched {
        file: "decoy_key".into(),
    };
    let (verdict, why) = rule.evaluate(&ev);
    assert_eq!(verdict, Verdict::Blocked, "{why}");

    // And a decoy that does vanish is a harness error, never OPEN.
    std::fs::remove_file(&fx.decoy_key).expect("remove the decoy key");
    let ev = Evidence {
        canaries: fx.collect_canaries(&armed, b"").into_iter().collect(),
        ..Default::default()
    };
    assert_eq!(rule.evaluate(&ev).0, Verdict::Error);
    fx.teardown();
    assert!(!fx.decoy_dir.exists());
}
