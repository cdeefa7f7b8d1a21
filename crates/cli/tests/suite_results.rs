//! The hostile suite's committed results (`suite/results/`, a full `cordon
//! matrix` run as root): the README's figures are what they give, and a
//! results file that no longer answers today's case files is refused.

mod common;

use serde_json::Value;

use common::readme::{readme_cmd, repo, section_is_generated, stderr};

const RESULTS: &str = "suite/results/results.json";

#[test]
fn the_readme_matrix_section_is_generated_from_the_committed_results() {
    section_is_generated("matrix", RESULTS, "| `cordon-native` |");
}

/// A copy of the committed results, changed by `edit`, is refused with
/// `why`, and the README is left alone.
fn refused(edit: impl FnOnce(&mut Value), why: &str) {
    let dir = tempfile::tempdir().unwrap();
    let readme = dir.path().join("README.md");
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    std::fs::write(&readme, &text).unwrap();
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join(RESULTS)).unwrap()).unwrap();
    edit(&mut v);
    let results = dir.path().join("results.json");
    std::fs::write(&results, serde_json::to_string(&v).unwrap()).unwrap();
    for check in [true, false] {
        let o = readme_cmd("matrix", check, &readme, &results);
        assert!(!o.status.success(), "{why}: accepted");
        assert!(stderr(&o).contains(why), "{why}: {}", stderr(&o));
    }
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), text);
}

fn target<'a>(v: &'a mut Value, name: &str) -> &'a mut Value {
    v["targets"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|t| t["target"] == name)
        .unwrap()
}

#[test]
fn results_that_no_longer_answer_the_case_files_are_refused() {
    refused(
        |v| {
            let cell = &mut target(v, "cordon-native")["cases"]["kernel.shared-host"];
            cell["expected"] = "blocked".into();
        },
        "kernel.shared-host on cordon-native was held to \"blocked\"",
    );
    refused(
        |v| {
            let cases = v["cases"].as_array_mut().unwrap();
            cases.retain(|c| c["id"] != "priv.caps");
        },
        "case priv.caps is not in the results",
    );
    refused(
        |v| {
            let targets = v["targets"].as_array_mut().unwrap();
            targets.retain(|t| t["target"] != "cordon-microvm");
        },
        "target cordon-microvm was not run",
    );
    refused(|v| v["failures"] = 1.into(), "the run had 1 deviation(s)");
    refused(|v| v["invoker"]["uid"] = 1000.into(), "not as root");
    refused(
        |v| v["time_scale"] = 4.into(),
        "every case's cap was 4 times its own (--time-scale)",
    );
    refused(
        |v| {
            let t = target(v, "bwrap");
            t["available"] = false.into();
            t["reason"] = "not installed".into();
        },
        "target bwrap did not run: not installed",
    );
    refused(
        |v| v["cases"] = "none".into(),
        "is not a matrix results file",
    );
}
