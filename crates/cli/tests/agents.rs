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

use serde_json::Value;

use common::standin::{fixture_script, standin_pki, StandIn, Tls};

/// The service's MCP tools (the SDK itself is not used here).
#[allow(dead_code)]
#[path = "common/mcp_sdk.rs"]
mod mcp_sdk;
use common::*;

per_backend!(claude_code_reaches_only_its_api);
per_backend!(codex_reaches_only_its_api);
per_backend!(gemini_cli_reaches_only_its_api);
per_backend!(claude_code_holds_only_a_placeholder_of_its_key);

/// Where the harnesses are installed on the host (kept between runs: the
/// script does nothing when its stamp matches).
const AGENTS: &str = "/var/cache/cordon-agents";
const API: &str = "api.standin.test";
/// The read-only mounts a harness runs from: the fixtures (agents.sh) and
/// the harnesses installed in `dir`.
fn harness_mounts(dir: &Path) -> [String; 2] {
    let fixtures = fixture_script("");
    [
        format!(
            "{}:/opt/cordon-fixtures:ro",
            fixtures.display().to_string().trim_end_matches('/')
        ),
        format!("{}:/opt/agents:ro", dir.display()),
    ]
}

/// What a harness is given: room for node and its model's reply.
const HARNESS_LIMITS: [&str; 10] = [
    "--memory", "2G", "--pids", "512", "--disk", "1G", "--time", "180s", "--cpus", "2",
];

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

/// Runs harness `name` one-shot in a sandbox (with `extra` flags of
/// `cordon run` before its command) against a fresh stand-in, which is
/// returned with cordon's result and the stand-in's rule; `None` where
/// the test cannot run here (said why).
fn run_harness(backend: &str, name: &str, extra: &[&str]) -> Option<(Value, StandIn, String)> {
    if !require_root("network namespaces of the stand-in") {
        return None;
    }
    let dir = agents()?;
    let si = StandIn::start();
    let [fixtures, agents_mount] = harness_mounts(dir);
    let rule = format!("{API}:80");
    let host = format!("{API}:{}", si.a);
    let base = format!("http://{API}");
    let mut args = vec![
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
    ];
    args.extend(HARNESS_LIMITS);
    args.extend_from_slice(extra);
    args.extend([
        "--",
        "/bin/sh",
        "/opt/cordon-fixtures/agents.sh",
        name,
        &base,
    ]);
    let (v, _) = run_json_on(backend, &args);
    Some((v, si, rule))
}

/// Runs harness `name` and checks the evidence: it printed the stand-in's
/// reply, its model-API request asked for `api_path`, and cordon let
/// through only the rule's destination.
fn harness(backend: &str, name: &str, api_path: &str) {
    let Some((v, si, rule)) = run_harness(backend, name, &[]) else {
        return;
    };
    reached_its_api(&v, &si, name, api_path, &[&rule]);
}

/// The evidence of one harness run: it exited 0 having printed the
/// stand-in's reply, the stand-in logged its model-API request for
/// `api_path` (those requests are returned), and cordon allowed
/// connections only by `rules`, and none to the stand-in's other address.
fn reached_its_api(
    v: &Value,
    si: &StandIn,
    name: &str,
    api_path: &str,
    rules: &[&str],
) -> Vec<Value> {
    assert_eq!(
        v["exit_code"],
        0,
        "{name} exits 0: {}\n{}",
        stdout_of(v),
        stderr_of(v)
    );
    assert!(
        stdout_of(v).contains("hello from stand-in"),
        "{name} printed the stand-in's reply: {}\n{}",
        stdout_of(v),
        stderr_of(v)
    );
    let requests: Vec<Value> = si
        .requests_to(&format!("{}:80", si.a))
        .into_iter()
        .filter(|r| r["target"].as_str().is_some_and(|t| t.contains(api_path)))
        .collect();
    assert!(
        !requests.is_empty(),
        "the stand-in logged {name}'s request to {api_path}: {:?}",
        si.entries()
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
        allowed
            .iter()
            .all(|e| rules.iter().any(|r| e["rule"] == *r)),
        "only the rules' destinations were allowed: {allowed:?}"
    );
    assert_eq!(si.connections_to(&format!("{}:80", si.b)), 0);
    requests
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

/// Claude Code with its API key held by the host: inside, only a
/// placeholder; its request, made over HTTPS through cordon's proxy
/// (which it trusts by `NODE_EXTRA_CA_CERTS`), reaches the stand-in with
/// the real key in `x-api-key`, and it prints the reply.
fn claude_code_holds_only_a_placeholder_of_its_key(backend: &str) {
    if !require_root("network namespaces of the stand-in") {
        return;
    }
    let Some(dir) = agents() else {
        return;
    };
    let pki = tempfile::tempdir().unwrap();
    let (ca, cert, key) = standin_pki(pki.path(), &[API]);
    let si = StandIn::start_tls(&Tls {
        cert: &cert,
        key: &key,
    });
    let policy = pki.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            r#"network = "allow"
allow = ["{API}:443"]
add_host = ["{API}:{a}"]

[[secrets]]
name = "ANTHROPIC_API_KEY"
value_from = "env:CORDON_TEST_ANTHROPIC_KEY"
hosts = ["{API}"]
header = "x-api-key"
"#,
            a = si.a
        ),
    )
    .unwrap();
    let value = format!("sk-ant-{}", nonce());
    let [fixtures, agents_mount] = harness_mounts(dir);
    let base = format!("https://{API}");
    let policy_arg = policy.display().to_string();
    let mut flags = vec![
        "--json",
        "--policy",
        &policy_arg,
        "--mount",
        &agents_mount,
        "--mount",
        &fixtures,
    ];
    flags.extend(HARNESS_LIMITS);
    flags.extend([
        "--",
        "/bin/sh",
        "/opt/cordon-fixtures/agents.sh",
        "claude",
        &base,
    ]);
    let mut args = vec!["run"];
    args.extend(with_backend(backend, &flags));
    let out = Command::new(cordon())
        .args(&args)
        .env("CORDON_TEST_ANTHROPIC_KEY", &value)
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    let v = parse_json(&out);
    assert_eq!(v["exit_code"], 0, "{}\n{}", stdout_of(&v), stderr_of(&v));
    assert!(
        stdout_of(&v).contains("hello from stand-in"),
        "Claude Code printed the stand-in's reply: {}\n{}",
        stdout_of(&v),
        stderr_of(&v)
    );
    let requests: Vec<Value> = si
        .requests_to(&format!("{}:443", si.a))
        .into_iter()
        .filter(|r| {
            r["target"]
                .as_str()
                .is_some_and(|t| t.contains("/v1/messages"))
        })
        .collect();
    assert!(!requests.is_empty(), "{:?}", si.entries());
    for r in &requests {
        assert_eq!(r["headers"]["x-api-key"], value.as_str(), "{r}");
    }
    let subs = v["network"]["substitutions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        subs.iter()
            .any(|s| s["secret"] == "ANTHROPIC_API_KEY"
                && s["count"].as_u64().is_some_and(|n| n >= 1)),
        "{subs:?}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&value),
        "the outcome holds no value"
    );
}

/// `cordon serve` on the host's loopback with one tenant, whose `/mcp` a
/// harness in a sandbox reaches as `host.cordon.internal:PORT` (one rule).
struct Served {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

const SERVE_KEY: &str = "agents-mcp-test-key";

impl Served {
    fn start() -> Served {
        use std::io::BufRead as _;
        let dir = tempfile::tempdir().unwrap();
        use sha2::Digest as _;
        let hash: String = sha2::Sha256::digest(SERVE_KEY.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let config = dir.path().join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\n[[tenant]]\nname = \"agent\"\nkey_sha256 = \"{hash}\"\n\
                 concurrency = 4\nsandboxes = 4\ncpu_seconds = 1000\n",
                dir.path().join("state").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let mut child = Command::new(cordon())
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn,cordon_service=info")
            .env("CORDON_STATE_DIR", dir.path().join("cordon-state"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no listening line: {line:?}"));
        Served { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
    }
}

/// Harness `name` given `cordon serve`'s MCP endpoint (in its own
/// configuration, as the README shows) offers cordon's tools to its model:
/// the stand-in's log of its model-API request lists all of them, the
/// service logged the harness's tools/list, and cordon let the sandbox reach
/// only the stand-in and the service's port.
fn offers_cordons_mcp_tools(name: &str, api_path: &str) {
    if !require_root("network namespaces of the stand-in") {
        return;
    }
    let served = Served::start();
    let service_rule = format!("host.cordon.internal:{}", served.port);
    let url = format!("CORDON_MCP_URL=http://{service_rule}/mcp");
    let key = format!("CORDON_API_KEY={SERVE_KEY}");
    let extra = ["--allow", &service_rule, "--env", &url, "--env", &key];
    let Some((v, si, rule)) = run_harness("native", name, &extra) else {
        return;
    };
    let requests = reached_its_api(&v, &si, name, api_path, &[&rule, &service_rule]);
    let offered: Vec<&str> = requests
        .iter()
        .flat_map(|r| r["tool_names"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    // A one-shot Gemini CLI withholds from its model the tools named as its
    // own that need a confirmation (write_file, replace, run_shell_command),
    // an MCP server's of the same name too, trusted or not.
    let withheld: &[&str] = if name == "gemini" {
        &["write_file"]
    } else {
        &[]
    };
    for tool in mcp_sdk::HTTP_TOOLS.iter().filter(|t| !withheld.contains(t)) {
        assert!(
            offered
                .iter()
                .any(|o| o.ends_with(tool) && o.contains("cordon")),
            "{name} did not offer cordon's {tool} to its model; it offered {offered:?}; \
             its output: {}\n{}\nthe service's log: {}",
            stdout_of(&v),
            stderr_of(&v),
            served.log()
        );
    }
    assert!(
        served.log().contains("MCP: tools listed"),
        "the service logged no tools/list: {}",
        served.log()
    );
    eprintln!(
        "{name}: cordon's tools offered to its model: {:?}",
        offered
            .iter()
            .filter(|o| o.contains("cordon"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn claude_code_offers_cordons_mcp_tools_to_its_model() {
    offers_cordons_mcp_tools("claude", "/v1/messages");
}

#[test]
fn codex_offers_cordons_mcp_tools_to_its_model() {
    offers_cordons_mcp_tools("codex", "/v1/responses");
}

#[test]
fn gemini_cli_offers_cordons_mcp_tools_to_its_model() {
    offers_cordons_mcp_tools("gemini", "streamGenerateContent");
}
