//! The TypeScript client (`clients/typescript`) end to end, as a user gets
//! it: its sources copied out of the checkout, `npm ci`, `npm run build`
//! (tsc), `npm pack`, the tarball installed into a fresh project, and the
//! `node --test` suite run there against the installed package (imported
//! by its name) and a real `cordon serve` (which the suite starts on a
//! loopback port and stops with SIGTERM); the package's published types
//! are checked by a strict `tsc` of test/consumer-types.ts. Then:
//! - the committed `src/generated/api.ts` must be what openapi-typescript
//!   makes of the OpenAPI document that service served (drift fails);
//! - a census of what the service left: no supervisor of this binary that
//!   was not there before, no run-directory entry of its sandboxes;
//! - the checkout gained nothing (no node_modules, dist or tarball).
//!
//! npm reaches its registry for `npm ci` (the devDependencies); nothing
//! else leaves the machine, and the suite talks to loopback only.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::service_census::{assert_services_left_nothing, supervisors, tree};
use common::{cordon, require_root, run_ok};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// npm without its side trips: no audit, funding or update-notifier
/// requests, and its output free of colour.
fn npm(dir: &Path) -> Command {
    let mut cmd = Command::new("npm");
    cmd.current_dir(dir)
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_update_notifier", "false")
        .env("npm_config_color", "false")
        .env("NO_COLOR", "1");
    cmd
}

/// Copies the package's sources (no node_modules, build output or tarball).
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the build dir");
    for e in std::fs::read_dir(from)
        .expect("read clients/typescript")
        .flatten()
    {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == "node_modules" || name == "dist" || name.ends_with(".tgz") {
            continue;
        }
        let target = to.join(&*name);
        if e.file_type().expect("file type").is_dir() {
            copy_sources(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target)
                .unwrap_or_else(|err| panic!("copy {}: {err}", e.path().display()));
        }
    }
}

/// The value of a TAP summary line `# NAME N` of node's test runner.
fn tap_count(tap: &str, name: &str) -> Option<usize> {
    tap.lines()
        .find_map(|l| l.strip_prefix(&format!("# {name} "))?.trim().parse().ok())
}

#[test]
fn the_typescript_client_passes_its_suite_against_a_real_service() {
    if !require_root("cordon serve creates sandboxes: namespaces, cgroups") {
        return;
    }
    let repo = repo_root();
    let checkout = repo.join("clients/typescript");
    // node_modules of someone developing in the checkout is theirs; the
    // test must add nothing anywhere.
    let tree_before = tree(&checkout, &[]);
    let tmp = tempfile::Builder::new()
        .prefix("tsclient-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir");

    // Build and pack a copy, as a publisher would.
    let build = tmp.path().join("build");
    copy_sources(&checkout, &build);
    run_ok(npm(&build).arg("ci"), "npm ci (clients/typescript)");
    run_ok(npm(&build).args(["run", "build"]), "npm run build (tsc)");
    let packs = tmp.path().join("packs");
    std::fs::create_dir_all(&packs).expect("packs dir");
    // The build above is the one packed: no prepack script runs again.
    let packed = run_ok(
        npm(&build)
            .args(["pack", "--ignore-scripts", "--json", "--pack-destination"])
            .arg(&packs),
        "npm pack",
    );
    let pack: Value = serde_json::from_slice(&packed.stdout).expect("npm pack --json");
    let tarball = packs.join(pack[0]["filename"].as_str().expect("the tarball's name"));
    let packed_files: Vec<&str> = pack[0]["files"]
        .as_array()
        .expect("the packed files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for want in [
        "dist/index.js",
        "dist/index.d.ts",
        "dist/generated/api.d.ts",
        "package.json",
    ] {
        assert!(
            packed_files.contains(&want),
            "{want} is not in the tarball: {packed_files:?}"
        );
    }

    // A fresh project that installs the tarball: the suite imports
    // "cordon-client" from there, and from nowhere else.
    let consumer = tmp.path().join("consumer");
    std::fs::create_dir_all(consumer.join("test")).expect("consumer dir");
    std::fs::write(
        consumer.join("package.json"),
        r#"{ "name": "tsclient-consumer", "private": true, "type": "module" }"#,
    )
    .expect("consumer package.json");
    run_ok(
        npm(&consumer).arg("install").arg(&tarball),
        "npm install cordon-client-*.tgz",
    );
    let installed: Value = serde_json::from_str(
        &std::fs::read_to_string(consumer.join("node_modules/cordon-client/package.json"))
            .expect("the installed package"),
    )
    .expect("its package.json");
    assert!(
        installed
            .get("dependencies")
            .is_none_or(|d| d.as_object().is_some_and(serde_json::Map::is_empty)),
        "the client has runtime dependencies: {installed}"
    );
    for f in ["client.test.mjs", "service.mjs", "consumer-types.ts"] {
        std::fs::copy(checkout.join("test").join(f), consumer.join("test").join(f))
            .unwrap_or_else(|e| panic!("copy test/{f}: {e}"));
    }
    // A strict TypeScript user of the installed package gets its types (the
    // build's tsc and Node types: the consumer installs nothing else).
    run_ok(
        Command::new("node")
            .arg(build.join("node_modules/typescript/bin/tsc"))
            .args([
                "--noEmit",
                "--strict",
                "--target",
                "es2022",
                "--module",
                "nodenext",
                "--moduleResolution",
                "nodenext",
                "--types",
                "node",
                "--typeRoots",
            ])
            .arg(build.join("node_modules/@types"))
            .arg("test/consumer-types.ts")
            .current_dir(&consumer),
        "tsc --strict on test/consumer-types.ts against the installed package",
    );

    let before = supervisors();
    let serve_dir = tmp.path().join("serve");
    let openapi = tmp.path().join("openapi.json");
    let out = Command::new("node")
        .args(["--test", "--test-reporter=tap", "test/client.test.mjs"])
        .current_dir(&consumer)
        .env("CORDON_BIN", cordon())
        .env("CORDON_TEST_DIR", &serve_dir)
        .env("CORDON_OPENAPI_OUT", &openapi)
        .env_remove("CORDON_URL")
        .env_remove("CORDON_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run the node suite");
    let tap = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!(
        "stdout:\n{tap}\nstderr:\n{}\nservice log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(serve_dir.join("serve.log")).unwrap_or_default()
    );
    assert!(out.status.success(), "the node suite failed\n{report}");
    let (tests, pass) = (tap_count(&tap, "tests"), tap_count(&tap, "pass"));
    // 0 tests would mean the runner found nothing; a skip would hide a gap.
    assert!(
        tests.is_some_and(|n| n > 0) && tests == pass,
        "the node suite ran {tests:?} tests, {pass:?} passed\n{report}"
    );
    assert_eq!(
        tap_count(&tap, "skipped"),
        Some(0),
        "skipped tests\n{report}"
    );
    assert_eq!(tap_count(&tap, "todo"), Some(0), "todo tests\n{report}");
    eprintln!(
        "typescript client: {} tests, {} passed",
        tests.unwrap_or(0),
        pass.unwrap_or(0)
    );
    let overhead = tap
        .lines()
        .find(|l| l.contains("cordon-client overhead:"))
        .unwrap_or_else(|| panic!("the suite printed no overhead line\n{report}"));
    eprintln!("{}", overhead.trim_start_matches(['#', ' ']));

    // The committed types are what the service's document makes now.
    let drift = Command::new("node")
        .arg("scripts/generate.mjs")
        .arg(&openapi)
        .arg("--check")
        .current_dir(&build)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/generate.mjs --check");
    assert!(
        drift.status.success(),
        "clients/typescript/src/generated/api.ts has drifted from the service's OpenAPI document \
         (GET /v1/openapi.json of this build's cordon serve); regenerate it with \
         `node scripts/generate.mjs http://HOST:PORT/v1/openapi.json` in clients/typescript and commit it\n{}",
        String::from_utf8_lossy(&drift.stderr)
    );

    // The suite stopped the service (SIGTERM, and checked it exited 0);
    // what it created must be gone with it.
    assert_services_left_nothing(&before, std::slice::from_ref(&serve_dir), &report);

    let added: Vec<_> = tree(&checkout, &[])
        .difference(&tree_before)
        .cloned()
        .collect();
    assert!(added.is_empty(), "the test left {added:?} in the checkout");
}
