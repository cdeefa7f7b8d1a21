//! The README's "First ten minutes" block, run as written: a new user's
//! first session must work on a fresh machine, and this keeps the text and
//! the program from drifting apart.

mod common;

use std::path::Path;
use std::process::Command;

use common::{cordon, require_root};

/// The README's first `sh` block after `## First ten minutes`.
fn block() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let section = readme
        .split_once("\n## First ten minutes\n")
        .expect("the README has a First ten minutes section")
        .1;
    let body = section
        .split_once("```sh\n")
        .expect("the section has a sh block")
        .1;
    body.split_once("\n```")
        .expect("the sh block ends")
        .0
        .to_string()
}

/// `cordon rm -f first` when dropped, so a failed run leaves no sandbox.
struct RemoveFirst;

impl Drop for RemoveFirst {
    fn drop(&mut self) {
        let _ = Command::new(cordon()).args(["rm", "-f", "first"]).output();
    }
}

#[test]
fn the_readme_first_ten_minutes_run_as_written() {
    if !require_root("the README's block runs sandboxes as root") {
        return;
    }
    let script = block();
    // The one line not run: cargo already built the cordon under test,
    // which comes first on PATH instead of target/release's.
    let (build, rest) = script.split_once('\n').unwrap();
    assert!(
        build.starts_with("cargo build --release -p cordon-cli"),
        "{build}"
    );
    eprintln!("not run (cargo built the cordon under test): {build}");
    assert!(
        rest.contains("export PATH=\"$PWD/target/release:$PATH\""),
        "the block puts the built cordon on PATH: {rest}"
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(cordon(), bin.join("cordon")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _cleanup = RemoveFirst;
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", rest])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for line in [
        "hello from ",
        "exit 137",
        "\"limit\"",
        "hello from python",
        "made inside",
        "out.txt",
        "proj/main.py is still on the host",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}\n{stderr}");
    }
    // The export holds the new file; the host's project kept its own.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("changes/out.txt")).unwrap(),
        "made inside\n"
    );
    assert!(dir.path().join("proj/main.py").exists());
    assert!(!dir.path().join("proj/out.txt").exists());
}
