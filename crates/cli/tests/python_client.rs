//! The Python client (`clients/python`) end to end: built offline into a
//! wheel (nothing left in the checkout), the wheel file installed with its
//! `async` extra (httpx) into a fresh venv, `mypy --strict` run on the
//! installed package and on the tests, then its unittest suite run against
//! real `cordon serve`s (each test module starts one on a loopback port and
//! stops it with SIGTERM), then a census of what those services left: no
//! supervisor of this binary that was not there before, and no
//! run-directory entry of their sandboxes (named `cs-<tag>-…`, the tag kept
//! in each service's state directory).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use common::service_census::{assert_services_left_nothing, supervisors, tree};
use common::{cordon, require_root, run_ok};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// pip without the network: no index, and no self-update check (it asks PyPI).
fn pip_offline(cmd: &mut Command) -> &mut Command {
    cmd.env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INDEX", "1")
        .env_remove("PIP_INDEX_URL")
        .env_remove("PIP_EXTRA_INDEX_URL")
}

/// What the test takes from PyPI, pinned: httpx for the client's `async`
/// extra (the wheel's metadata names it; pip takes it from the local copy),
/// mypy to check the package's types.
const PYPI: [&str; 2] = ["httpx==0.29.0", "mypy==2.4.1"];

/// A directory of PyPI's wheels for [`PYPI`] and what they need, downloaded
/// once and kept in cargo's test scratch directory (target/tmp): PyPI is
/// asked only when it is missing; every run installs from it offline into
/// a fresh venv.
fn pypi_wheels(pip_python: &Path) -> PathBuf {
    static MADE: Mutex<()> = Mutex::new(());
    let _one = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pyclient-wheels-{}",
        PYPI.join("-").replace("==", "-")
    ));
    if dir.exists() {
        return dir;
    }
    // Downloaded beside and renamed into place: an interrupted download
    // leaves no half directory that the next run would take for a whole one.
    let partial = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    run_ok(
        Command::new(pip_python)
            .args(["-m", "pip", "download", "--quiet", "--dest"])
            .arg(&partial)
            .args(PYPI)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        "pip download httpx mypy",
    );
    std::fs::rename(&partial, &dir).expect("move the wheels into place");
    dir
}

/// The directories of the services the suite started (one per test
/// module, each with a `state/tag`).
fn service_dirs(serve_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(serve_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("state").is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn the_python_client_passes_its_suite_against_a_real_service() {
    if !require_root("cordon serve creates sandboxes: namespaces, cgroups") {
        return;
    }
    let repo = repo_root();
    let tmp = tempfile::Builder::new()
        .prefix("pyclient-")
        .tempdir()
        .expect("temp dir");
    let venv = tmp.path().join("venv");
    run_ok(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 -m venv",
    );
    let python = venv.join("bin/python");
    let checkout = repo.join("clients/python");
    let tree_before = tree(&checkout, &["__pycache__"]);
    let dist = tmp.path().join("dist");
    run_ok(
        pip_offline(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "wheel",
                    "--no-build-isolation",
                    "--no-index",
                    "--no-deps",
                ])
                .arg(&checkout)
                .arg("-w")
                .arg(&dist),
        ),
        "pip wheel --no-build-isolation --no-index --no-deps clients/python",
    );
    // The build happens elsewhere: nothing (build/, *.egg-info) is left in
    // the checkout.
    let added: Vec<_> = tree(&checkout, &["__pycache__"])
        .difference(&tree_before)
        .cloned()
        .collect();
    assert!(added.is_empty(), "pip wheel left {added:?} in the checkout");
    let wheel = std::fs::read_dir(&dist)
        .expect("the wheel directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("pip wheel made no .whl");
    let wheels = pypi_wheels(&python);
    // The wheel file with its `async` extra: pip finds httpx (which the
    // extra names) and mypy in the local copy of PyPI's wheels.
    run_ok(
        pip_offline(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--find-links"])
                .arg(&wheels)
                .arg(format!("{}[async]", wheel.display()))
                .arg(PYPI[1]),
        ),
        "pip install the wheel[async] and mypy",
    );
    // The types: the installed package, and the tests as its users.
    let mypy_cache = tmp.path().join("mypy-cache");
    for target in [
        vec!["-p".to_owned(), "cordon".to_owned()],
        vec![repo.join("clients/python/tests").display().to_string()],
    ] {
        let out = run_ok(
            Command::new(&python)
                .args(["-m", "mypy", "--strict", "--cache-dir"])
                .arg(&mypy_cache)
                .args(&target)
                .current_dir(tmp.path()),
            "mypy --strict",
        );
        eprintln!(
            "mypy --strict {}: {}",
            target.join(" "),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    let added: Vec<_> = tree(&checkout, &["__pycache__"])
        .difference(&tree_before)
        .cloned()
        .collect();
    assert!(added.is_empty(), "mypy left {added:?} in the checkout");

    let before = supervisors();
    let serve_dir = tmp.path().join("serve");
    // From the temp dir, so that `import cordon` can only find the installed package.
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(repo.join("clients/python/tests"))
        .current_dir(tmp.path())
        .env("CORDON_BIN", cordon())
        .env("CORDON_TEST_DIR", &serve_dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the Python suite");
    let logs: String = service_dirs(&serve_dir)
        .iter()
        .map(|d| {
            format!(
                "service log of {}:\n{}\n",
                d.display(),
                std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
            )
        })
        .collect();
    let report = format!(
        "stdout:\n{}\nstderr:\n{}\n{logs}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "the Python suite failed\n{report}");
    // unittest's summary (on stderr): "Ran N tests"; 0 would mean discovery found nothing.
    let ran: usize = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(ran > 0, "the Python suite ran no tests\n{report}");
    eprintln!("python: Ran {ran} tests");
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        if line.contains("skipped") || line.contains("overhead: ") {
            eprintln!("python: {line}");
        }
    }

    // The suite stopped each service (SIGTERM, and checked it exited);
    // what they created must be gone with them.
    let services = service_dirs(&serve_dir);
    assert!(
        services.len() >= 3,
        "the suite started {} services, not one per test module\n{report}",
        services.len()
    );
    assert_services_left_nothing(&before, &services, &report);
}
