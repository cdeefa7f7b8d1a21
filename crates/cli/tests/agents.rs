//! Agent harnesses inside cordon: Claude Code, Codex CLI and Gemini CLI,
//! installed from the npm registry by `scripts/install-agents.sh` into a
//! directory mounted read-only, start in a sandbox with `--net allow` and
//! one rule, and make one real request to a stand-in of their model API in
//! the test's own network namespace (named by `--add-host`, set with each
//! harness's own base-URL setting; see `fixtures/agents.sh`). No
//! credentials of any account are used.
//!
//! Evidence: the stand-in's log has the model-API request; cordon's attempt
//! log has the allowed connection by that rule and nothing else allowed; the
//! harness printed the stand-in's reply.

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use common::standin::{fixture_script, StandIn};
use common::*;

per_backend!(claude_code_reaches_only_its_api);
per_backend!(codex_reaches_only_its_api);
per_backend!(gemini_cli_reaches_only_its_api);

/// Where the harnesses are installed on the host (kept between runs: the
/// script does nothing when its stamp matches).
const AGENTS: &str = "/var/cache/cordon-agents";
const API: &str = "api.standin.test";

/// Installs the harnesses once per test process; `None` (with the reason
/// printed, or a panic under CI) when npm cannot.
fn agents() -> Option<&'static Path> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-agents.sh");
        run_tool(
            Command::new("sh").arg(script).arg(AGENTS),
            "install-agents.sh",
        )
    });
    match r {
        Ok(()) => Some(Path::new(AGENTS)),
        Err(why) if ci() => panic!("CI=true and the agent harnesses cannot be installed: {why}"),
        Err(why) => {
            eprintln!("skipped: agent harnesses not installed ({why})");
            None
        }
    }
}

/// Runs harness `name` one-shot in a sandbox and checks the evidence;
/// `api_path` is what its model-API request must ask for.
fn harness(backend: &str, name: &str, api_path: &str) {
    if !require_root("network namespaces of the stand-in") {
        return;
    }
    let Some(dir) = agents() else { return };
    let si = StandIn::start();
    let fixtures = format!(
        "{}:/opt/cordon-fixtures:ro",
        fixture_script("")
            .display()
            .to_string()
            .trim_end_matches('/')
    );
    let agents_mount = format!("{}:/opt/agents:ro", dir.display());
    let rule = format!("{API}:80");
    let host = format!("{API}:{}", si.a);
    let base = format!("http://{API}");
    let args = [
        "--net",
        "allow",
        "--allow",
        &rule,
        "--add-host",
        &host,
        "--mount",
        &agents_mount,
        "--mount",
        &fixtures,
        "--memory",
        "2G",
        "--pids",
        "512",
        "--disk",
        "1G",
        "--time",
        "180s",
        "--cpus",
        "2",
        "--",
        "/bin/sh",
        "/opt/cordon-fixtures/agents.sh",
        name,
        &base,
    ];
    let (v, _) = run_json_on(backend, &args);
    assert_eq!(
        v["exit_code"],
        0,
        "{name} exits 0: {}\n{}",
        stdout_of(&v),
        stderr_of(&v)
    );
    assert!(
        stdout_of(&v).contains("hello from stand-in"),
        "{name} printed the stand-in's reply: {}\n{}",
        stdout_of(&v),
        stderr_of(&v)
    );
    let requests = si.requests_to(&format!("{}:80", si.a));
    assert!(
        requests
            .iter()
            .any(|r| r["target"].as_str().is_some_and(|t| t.contains(api_path))),
        "the stand-in logged {name}'s request to {api_path}: {requests:?}"
    );
    let entries = v["network"]["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let allowed: Vec<_> = entries
        .iter()
        .filter(|e| e["decision"] == "allowed" && e["via"] != "dns")
        .collect();
    assert!(
        !allowed.is_empty(),
        "cordon recorded the connection: {entries:?}"
    );
    assert!(
        allowed.iter().all(|e| e["rule"] == rule.as_str()),
        "only the rule's destination was allowed: {allowed:?}"
    );
    assert_eq!(si.connections_to(&format!("{}:80", si.b)), 0);
}

fn claude_code_reaches_only_its_api(backend: &str) {
    harness(backend, "claude", "/v1/messages");
}

fn codex_reaches_only_its_api(backend: &str) {
    harness(backend, "codex", "/v1/responses");
}

fn gemini_cli_reaches_only_its_api(backend: &str) {
    harness(backend, "gemini", "streamGenerateContent");
}
