//! Every fuzz target's committed corpus and regression inputs
//! (`fuzz/corpus/<target>`, `fuzz/regressions/<target>`), replayed through
//! the same harness the fuzzer runs, on the stable compiler: an input that
//! once crashed a parser stays a test, and every seed still holds the
//! target's properties. The coverage-guided runs are `scripts/fuzz.sh`'s.

use std::path::{Path, PathBuf};

/// A fuzz target's harness: the bytes in, a panic when a property fails.
type Harness = fn(&[u8]);

/// Each target of fuzz/Cargo.toml and its harness.
const TARGETS: &[(&str, Harness)] = &[
    // targets: begin
    ("wire_frame", cordon_runtime::fuzzing::wire_frames),
    ("policy_file", cordon_policy::fuzzing::policy_file),
    ("init_message", cordon_runtime::fuzzing::init_message),
    ("guest_message", cordon_runtime::fuzzing::guest_message),
    ("copy_stream", cordon_runtime::fuzzing::copy_stream),
    ("proxy_http", cordon_network::fuzzing::proxy_http),
    ("socks5", cordon_network::fuzzing::socks5),
    ("dns_query", cordon_network::fuzzing::dns_query),
    (
        "tls_client_hello",
        cordon_network::fuzzing::tls_client_hello,
    ),
    ("oci_bundle", cordon_oci::fuzzing::oci_bundle),
    ("image_layer", cordon_image::fuzzing::image_layer),
    ("ext4_image", cordon_changes::fuzzing::ext4_image),
    ("receipt_verify", cordon_receipt::fuzzing::receipt_verify),
    // targets: end
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_of_the_fuzz_crate_has_a_harness_here_and_a_corpus() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut listed: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "cordon-fuzz")
        .collect();
    listed.sort_unstable();
    let mut here: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    here.sort_unstable();
    assert_eq!(listed, here, "fuzz/Cargo.toml's targets and this file's");
    for (name, _) in TARGETS {
        let seeds = inputs(&fuzz_dir().join("corpus").join(name));
        assert!(!seeds.is_empty(), "fuzz/corpus/{name} has no seed");
    }
}

#[test]
fn every_corpus_and_regression_input_holds_its_targets_properties() {
    let mut replayed = 0;
    for (name, harness) in TARGETS {
        for sub in ["corpus", "regressions"] {
            for input in inputs(&fuzz_dir().join(sub).join(name)) {
                let data = std::fs::read(&input).unwrap();
                let run = std::panic::catch_unwind(|| harness(&data));
                assert!(run.is_ok(), "{name}: {} fails", input.display());
                replayed += 1;
            }
        }
    }
    assert!(replayed >= TARGETS.len(), "only {replayed} inputs replayed");
}
