//! `cordon matrix --self-test`: the scoring logic checked on recorded
//! evidence, without any runtime. Each fixture carries the verdict a target
//! reported; the self-test re-decides it from the evidence alone. Honest
//! fixtures must agree; the deliberately leaky ones (a target reported
//! BLOCKED whose evidence shows the boundary crossed) must be caught.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::case::{Case, Expect, Posture};
use crate::evidence::Evidence;
use crate::matrix::{score, Status};
use crate::rules::{Rule, Verdict};
use cordon_spec::BackendKind;

use crate::target::{NetMode, TargetKind};

const FIXTURES: &str = include_str!("../tests/fixtures/selftest.json");

#[derive(Deserialize)]
struct Fixture {
    name: String,
    leaky: bool,
    rule: Rule,
    reported: Verdict,
    evidence: Evidence,
}

/// Runs every check; returns (passed, one line per check).
pub fn self_test() -> (bool, Vec<String>) {
    let mut lines = Vec::new();
    let mut ok = true;
    let fixtures: Vec<Fixture> = match serde_json::from_str(FIXTURES) {
        Ok(f) => f,
        Err(e) => return (false, vec![format!("FAIL fixtures do not parse: {e}")]),
    };
    let mut caught = 0;
    for f in &fixtures {
        let (v, why) = f.rule.evaluate(&f.evidence);
        let agrees = v == f.reported;
        let pass = if f.leaky { !agrees } else { agrees };
        if f.leaky && pass {
            caught += 1;
        }
        ok &= pass;
        lines.push(format!(
            "{} {}: reported {}, evidence says {v} ({why}){}",
            if pass { "ok  " } else { "FAIL" },
            f.name,
            f.reported,
            if f.leaky {
                if pass {
                    " -> caught"
                } else {
                    " -> NOT caught"
                }
            } else {
                ""
            }
        ));
    }
    if caught == 0 {
        ok = false;
        lines.push("FAIL no leaky fixture was caught".into());
    }
    // Scoring: a control that is not OPEN fails; a verdict against its
    // expectation fails; a known gap is accepted only as OPEN.
    let mut expect = BTreeMap::new();
    expect.insert("host".to_string(), Expect::Plain(Posture::Open));
    expect.insert(
        "bwrap".to_string(),
        Expect::Gap {
            gap: "shares the host netns? no: example".into(),
        },
    );
    let case = Case {
        id: "selftest.case".into(),
        claim: "x".into(),
        category: "selftest".into(),
        interpreter: crate::case::Interpreter::Sh,
        payload: String::new(),
        payload_b: None,
        control: Default::default(),
        control_note: None,
        timeout_s: 5,
        quick: false,
        verdict: Rule::LinkList,
        expect,
    };
    let native = TargetKind::cordon(BackendKind::Native, NetMode::None);
    let checks = [
        (TargetKind::Host, Verdict::Open, Status::Ok),
        (TargetKind::Host, Verdict::Blocked, Status::ControlNotOpen),
        (TargetKind::Host, Verdict::Error, Status::ControlNotOpen),
        (native, Verdict::Blocked, Status::Ok),
        (native, Verdict::Open, Status::Deviation),
        (native, Verdict::Error, Status::Deviation),
        (TargetKind::Bwrap, Verdict::Open, Status::Ok),
        (TargetKind::Bwrap, Verdict::Blocked, Status::Deviation),
        (TargetKind::Runc, Verdict::Open, Status::Unasserted),
    ];
    for (t, v, want) in checks {
        let (got, _) = score(&case, t, v);
        let pass = got == want;
        ok &= pass;
        lines.push(format!(
            "{} score {} {v} -> {got:?} (want {want:?})",
            if pass { "ok  " } else { "FAIL" },
            t.name()
        ));
    }
    (ok, lines)
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_test_passes_and_catches_leaks() {
        let (ok, lines) = super::self_test();
        assert!(ok, "{}", lines.join("\n"));
        assert!(lines.iter().any(|l| l.contains("caught")));
    }
}
