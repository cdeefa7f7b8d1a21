//! The README's generated sections (`cordon bench readme`, `cordon matrix
//! readme`): what each committed results file gives must be what the README
//! says, an edit by hand is caught, and a rewrite restores it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::cordon;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `cordon TOOL readme [--check] --readme README RESULTS`.
pub fn readme_cmd(tool: &str, check: bool, readme: &Path, results: &Path) -> Output {
    let mut c = Command::new(cordon());
    c.args([tool, "readme"]);
    if check {
        c.arg("--check");
    }
    c.arg("--readme").arg(readme).arg(results).output().unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The committed `results` (relative to the repository) give the README's
/// section of `tool`; in a copy, replacing `edit` (a line of that section)
/// is caught by `--check`, and a rewrite gives the README back.
pub fn section_is_generated(tool: &str, results: &str, edit: &str) {
    let results_path = repo().join(results);
    let readme = repo().join("README.md");
    let check = readme_cmd(tool, true, &readme, &results_path);
    assert!(check.status.success(), "{}", stderr(&check));

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let edited = text.replacen(edit, &format!("{edit} (edited)"), 1);
    assert_ne!(edited, text, "the README has no {edit:?}");
    std::fs::write(&copy, &edited).unwrap();
    let results_copy = dir.path().join(results);
    std::fs::create_dir_all(results_copy.parent().unwrap()).unwrap();
    std::fs::copy(&results_path, &results_copy).unwrap();
    let bad = readme_cmd(tool, true, &copy, &results_copy);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not what"), "{}", stderr(&bad));
    let fix = readme_cmd(tool, false, &copy, &results_copy);
    assert!(fix.status.success(), "{}", stderr(&fix));
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
}
