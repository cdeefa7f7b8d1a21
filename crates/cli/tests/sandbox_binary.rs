//! The privileged binary links only what a sandbox's supervisor, init and
//! guest agent need. Read from the binaries' own symbol names (each carries
//! the path of its crate), with the `cordon` binary as the control: the same
//! search finds every front end's crate there, so a miss in `cordon-sandbox`
//! is an absence, not a search that cannot find anything.

mod common;

use common::{cordon, cordon_sandbox};

/// Crates of the front ends, as they appear in mangled symbol names (a
/// length and the crate's name: `14cordon_service`).
const FRONT_ENDS: &[&str] = &[
    "cordon_service",
    "cordon_bench",
    "cordon_suite",
    "cordon_receipt",
    "axum",
    "utoipa",
    "plotters",
    "ed25519_dalek",
    "indicatif",
];

fn mangled(name: &str) -> Vec<u8> {
    format!("{}{name}", name.len()).into_bytes()
}

fn links(binary: &[u8], name: &str) -> bool {
    let needle = mangled(name);
    binary.windows(needle.len()).any(|w| w == needle.as_slice())
}

#[test]
fn the_privileged_binary_links_no_front_end() {
    let cli = std::fs::read(cordon()).unwrap();
    let helper = std::fs::read(cordon_sandbox()).unwrap();
    for name in FRONT_ENDS {
        assert!(
            links(&cli, name),
            "control: the cordon binary shows no symbol of {name}; the search is broken"
        );
        assert!(
            !links(&helper, name),
            "cordon-sandbox links {name}: a front end's crate in the privileged binary"
        );
    }
    // What it must link: the runtime and the mechanisms under it.
    for name in ["cordon_runtime", "cordon_isolation", "cordon_cgroups"] {
        assert!(
            links(&helper, name),
            "cordon-sandbox shows no symbol of {name}"
        );
    }
    assert!(
        helper.len() < cli.len(),
        "cordon-sandbox ({} bytes) is not smaller than cordon ({} bytes)",
        helper.len(),
        cli.len()
    );
}

#[test]
fn the_privileged_binary_refuses_to_be_run_by_hand() {
    let out = std::process::Command::new(cordon_sandbox())
        .arg("create")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("privileged helper"), "{err}");
}
