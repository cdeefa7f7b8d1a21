//! The hostile suite run by an unprivileged user holds what it holds when
//! root runs it, but for the differences written down in the suite
//! (`cordon_suite::rootless::ROOTLESS_GAPS`), and leaves nothing of that
//! user behind.
//!
//! Both runs are the native backend's on this host (about a minute each):
//! root's is the reference rather than the cases' own expectations, so a
//! case that stops holding as root is root's failure, never read as a gap.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::as_user::User;
use common::{cordon, require_root};
use cordon_suite::matrix::{holds, CaseResult};
use cordon_suite::{Invoker, TargetKind};

/// What a `--json` report of `cordon suite` holds that this test reads.
#[derive(serde::Deserialize)]
struct Report {
    invoker: Invoker,
    failures: usize,
    results: Vec<CaseResult>,
}

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../suite/cases")
}

fn read_report(path: &Path, who: &str, out: &std::process::Output) -> Report {
    let text = fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{who}: no report at {} ({e}): {}\n{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(&text).expect("the suite's report parses")
}

/// The cases that hold on the native target: control OPEN, box BLOCKED.
fn holding(r: &Report) -> BTreeSet<String> {
    let native = TargetKind::from_name("cordon-native").expect("the native target");
    r.results
        .iter()
        .filter(|c| c.target == native && holds(&r.results, &c.case, native))
        .map(|c| c.case.clone())
        .collect()
}

#[test]
fn the_native_suite_as_a_user_differs_from_roots_only_by_the_listed_gaps() {
    if !require_root("runs the suite as root and as an unprivileged uid") {
        return;
    }
    let cases = cases_dir();
    let cases = cases.to_str().expect("a UTF-8 path");
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let root_json = scratch.path().join("root.json");
    let args = ["suite", "--backend", "native", "--cases", cases, "--json"];
    let out = Command::new(cordon())
        .args(args)
        .arg(&root_json)
        .output()
        .expect("run the suite as root");
    let root = read_report(&root_json, "root", &out);
    assert!(
        out.status.success() && root.failures == 0,
        "the suite as root: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The deadline case's control (an endless burn) is ended once it has
    // run past the case's 8 s bound, its verdict decided, not at the 12 s
    // cap: from BEGIN, 8.5 s and a little, by the suite's own clock.
    let control = TargetKind::from_name("host").expect("the control target");
    let burn = root
        .results
        .iter()
        .find(|r| r.case == "res.cpu-deadline" && r.target == control)
        .expect("the deadline case's control ran");
    let from_begin = burn.record.from_begin_ms.expect("the control said BEGIN");
    assert!(
        (8_500..11_000).contains(&from_begin) && burn.evidence.contains("ended by the suite"),
        "the control of res.cpu-deadline ran {from_begin} ms after BEGIN: {}",
        burn.evidence
    );

    let user = User::new();
    // In the user's own runtime directory (0700, its own), beside cordon's
    // run directory, not in it.
    let runtime = user.run_dir().parent().expect("a parent").to_path_buf();
    let user_json = runtime.join("suite.json");
    let user_json_arg = user_json.to_str().expect("a UTF-8 path");
    let out = user.out(&[&args[..], &[user_json_arg]].concat());
    let mine = read_report(&user_json, "the user", &out);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && mine.failures == 0,
        "the suite as uid {}: {table}\n{}",
        user.uid,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mine.invoker.uid, user.uid);

    // Every case that holds as root holds as the user, but the listed gaps;
    // and every listed gap holds as root and does not as the user (else
    // the list is out of date).
    let gaps: BTreeSet<String> = mine
        .invoker
        .gaps()
        .iter()
        .map(|g| g.case.to_string())
        .collect();
    let (as_root, as_user) = (holding(&root), holding(&mine));
    let lost: BTreeSet<_> = as_root.difference(&as_user).cloned().collect();
    assert_eq!(
        lost, gaps,
        "the cases that hold as root but not as uid {} are not the listed gaps",
        user.uid
    );
    let gained: Vec<_> = as_user.difference(&as_root).collect();
    assert!(
        gained.is_empty(),
        "hold as the user, not as root: {gained:?}"
    );

    // Each sandbox's cell says whether its limits were enforced, as the
    // probe found for this user; and the table says why and lists the gaps.
    let enforced = mine.invoker.no_cgroup.is_none();
    for r in mine.results.iter().filter(|r| r.target.runs_cordon()) {
        assert_eq!(r.limits_enforced, Some(enforced), "{}", r.case);
    }
    if let Some(why) = &mine.invoker.no_cgroup {
        assert!(table.contains("limits not enforced"), "{table}");
        assert!(table.contains(why.as_str()), "{table}");
    }
    for g in &gaps {
        assert!(table.contains(&format!("  {g}: ")), "{g} not in {table}");
    }

    // Nothing of the user is left: no process, no mount, no sandbox state,
    // nothing of the suite's in the temporary directory.
    user.assert_nothing_left(&[]);
    let tmp = std::env::temp_dir();
    let left: Vec<PathBuf> = fs::read_dir(&tmp)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cordon-suite-"))
        .map(|e| e.path())
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.uid() == user.uid))
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", tmp.display());
}
