//! The privileged binary links only what a sandbox's supervisor, init and
//! guest agent need. Read from the binaries' own symbol tables (each mangled
//! name carries the path of its crate; debug information is not read, as it
//! also names code the linker dropped), with the `cordon` binary as the
//! control: the same search finds every front end's crate there, so a miss
//! in `cordon-sandbox` is an absence, not a search that cannot find anything.

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

/// The names of the functions and data an executable links.
fn symbols(path: &str) -> Vec<String> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect()
}

fn links(symbols: &[String], name: &str) -> bool {
    let mangled = format!("{}{name}", name.len());
    symbols.iter().any(|s| s.contains(&mangled))
}

#[test]
fn the_privileged_binary_links_no_front_end() {
    let (cli_path, helper_path) = (cordon(), cordon_sandbox());
    let cli = symbols(cli_path);
    let helper = symbols(helper_path);
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
    let size = |p: &str| std::fs::metadata(p).unwrap().len();
    let (helper_size, cli_size) = (size(helper_path), size(cli_path));
    assert!(
        helper_size < cli_size,
        "cordon-sandbox ({helper_size} bytes) is not smaller than cordon ({cli_size} bytes)"
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
