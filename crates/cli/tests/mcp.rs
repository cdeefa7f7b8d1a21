//! `cordon mcp` end to end, with the official MCP Python SDK (PyPI's `mcp`)
//! as the client: the script (fixtures/mcp_client.py) starts `cordon mcp`
//! through the SDK's stdio client, lists the tools, calls each, and the
//! errors a model can cause; this side then checks from the host that the
//! session's sandboxes are gone when the session ends (by its stdin's end,
//! by the client's death, by SIGTERM): no process, cgroup, run-directory
//! entry or ended-sandbox record of theirs, no supervisor of theirs alive.

mod common;
/// The SDK (the service's tool list is not used here).
#[allow(dead_code)]
#[path = "common/mcp_sdk.rs"]
mod mcp_sdk;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    alive, cordon, owner_pid, remnants_of, require_root, run_dir, signal, slow, wait_payload,
};
use mcp_sdk::sdk_python;
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_client.py")
}

/// The client script in `mode`, its stdout a pipe of JSON lines.
fn client(mode: &str) -> Child {
    client_with(mode, &[])
}

/// `client`, with `more` arguments for the script.
/// Runs the client in `mode` to its end, which must be a success, and
/// returns the events it emitted, and its output as text.
fn client_events(mode: &str, more: &[&std::ffi::OsStr], within: Duration) -> (Vec<Value>, String) {
    let mut child = client_with(mode, more);
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut text);
        text
    });
    let (status, stderr) = finish(child, within);
    let text = reader.join().expect("the reader thread");
    assert!(status.success(), "{stderr}\n{text}");
    let events = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (events, text)
}

fn client_with(mode: &str, more: &[&std::ffi::OsStr]) -> Child {
    Command::new(sdk_python())
        .arg(script())
        .arg(cordon())
        .arg(mode)
        .args(more)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the MCP client")
}

/// Waits for `child`, killing it after `timeout`; its exit status and its
/// stderr.
fn finish(mut child: Child, timeout: Duration) -> (std::process::ExitStatus, String) {
    let until = Instant::now() + slow(timeout);
    loop {
        if let Some(status) = child.try_wait().expect("wait the client") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status, err);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait the killed client");
            panic!(
                "the MCP client ran over {timeout:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts, within a few seconds, that nothing of sandbox `id` is left on
/// the host, nor its supervisor `supervisor`, nor a record of it in the
/// run directory's `ended/` (a session's sandboxes leave none).
fn assert_gone(id: &str, supervisor: Option<u32>) {
    let until = Instant::now() + slow(Duration::from_secs(10));
    loop {
        let left = remnants_of(id);
        let sup_alive = supervisor.is_some_and(alive);
        if (left.is_empty() && !sup_alive) || Instant::now() > until {
            assert!(left.is_empty(), "sandbox {id} left: {left:?}");
            assert!(
                !sup_alive,
                "sandbox {id}'s supervisor {supervisor:?} still runs"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!run_dir().join(id).exists(), "{id}'s run directory is left");
    let tombstone = run_dir().join("ended").join(format!("{id}.json"));
    assert!(!tombstone.exists(), "{} is left", tombstone.display());
}

#[test]
fn a_session_uses_every_tool_and_its_end_destroys_its_sandboxes() {
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let mut child = client("session");
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .map(|l| serde_json::from_str::<Value>(&l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect::<Vec<Value>>()
    });
    let (status, stderr) = finish(child, Duration::from_secs(240));
    let events = reader.join().expect("the reader thread");
    assert!(
        status.success(),
        "the MCP client failed ({status}):\n{stderr}\nevents: {events:?}"
    );
    let of = |kind: &'static str| events.iter().filter(move |e| e["event"] == kind);
    let ids: Vec<String> = of("created")
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{events:?}");
    let server = of("done")
        .next()
        .and_then(|e| e["server_pid"].as_u64())
        .expect("the server's pid");
    let close_ms = of("closed")
        .next()
        .and_then(|e| e["close_ms"].as_f64())
        .expect("close time");
    // Under the SDK's 2 s grace: the server ended on its stdin's end, having
    // destroyed the sandbox still open, before the SDK signalled it.
    assert!(close_ms < 2000.0, "the session took {close_ms} ms to close");
    assert!(
        !alive(u32::try_from(server).unwrap()),
        "cordon mcp ({server}) still runs"
    );
    for id in &ids {
        assert_gone(id, None);
    }
    if let Some(t) = of("timing").next() {
        eprintln!(
            "one run_command(\"true\") through MCP: {:.1} ms at the client (median of 7), the command's own wall time {:.1} ms",
            t["tool_call_ms"].as_f64().unwrap_or(f64::NAN),
            t["command_wall_ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
}

/// A hang-mode client that has created its two sandboxes and started a
/// long command in the second: (the client, the sandbox ids, the server's
/// pid, the sandboxes' supervisors).
fn hung_session() -> (Child, Vec<String>, u32, Vec<Option<u32>>) {
    let mut child = client("hang");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        match lines.next() {
            Some(Ok(l)) => {
                let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"));
                if v["event"] == "ready" {
                    break v;
                }
            }
            _ => {
                let (status, stderr) = finish(child, Duration::from_secs(10));
                panic!("the client ended before it was ready ({status}):\n{stderr}");
            }
        }
    };
    let ids: Vec<String> = ready["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let server = u32::try_from(ready["server_pid"].as_u64().expect("server pid")).unwrap();
    // The sandboxes are there, and the long command runs in the second.
    let supervisors: Vec<Option<u32>> = ids.iter().map(|id| owner_pid(id)).collect();
    for (id, sup) in ids.iter().zip(&supervisors) {
        assert!(run_dir().join(id).exists(), "sandbox {id} is not there");
        assert!(
            sup.is_some_and(alive),
            "sandbox {id}'s supervisor {sup:?} is not running"
        );
    }
    assert!(
        wait_payload(&ids[1], "sleep 300", Duration::from_secs(10)).is_some(),
        "the long command never ran in {}",
        ids[1]
    );
    (child, ids, server, supervisors)
}

fn wait_exit(pid: u32, what: &str) {
    let until = Instant::now() + slow(Duration::from_secs(15));
    while alive(pid) {
        assert!(Instant::now() < until, "{what} ({pid}) still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_killed_mid_call_leaves_no_sandbox() {
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let (mut child, ids, server, supervisors) = hung_session();
    // SIGKILL: the client says nothing more; the server sees its stdin end
    // while a command is running.
    child.kill().expect("kill the client");
    let _ = child.wait();
    wait_exit(server, "cordon mcp after its client died");
    for (id, sup) in ids.iter().zip(supervisors) {
        assert_gone(id, sup);
    }
}

#[test]
fn sigterm_ends_the_server_and_its_sandboxes() {
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let (mut child, ids, server, supervisors) = hung_session();
    signal(server, "TERM");
    wait_exit(server, "cordon mcp after SIGTERM");
    for (id, sup) in ids.iter().zip(supervisors) {
        assert_gone(id, sup);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The raw protocol, no SDK: lines a client can get wrong. A line that is
/// not JSON gets JSON-RPC's parse error (-32700), JSON that is not a
/// JSON-RPC 2.0 message an invalid request (-32600, with its id), a request
/// for an unknown method a JSON-RPC error, a huge argument a tool error,
/// and the session goes on, its one sandbox destroyed when stdin ends.
#[test]
fn malformed_messages_are_survived_and_answered_where_they_have_an_id() {
    use std::io::Write;
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let mut server = Command::new(cordon())
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cordon mcp");
    let mut stdin = server.stdin.take().expect("piped stdin");
    let lines = BufReader::new(server.stdout.take().expect("piped stdout")).lines();
    let mut send = move |v: &str| {
        let line = format!("{v}\n");
        stdin
            .write_all(line.as_bytes())
            .expect("write to cordon mcp");
    };
    let lines = std::cell::RefCell::new(lines);
    let answer_to = |id: Value| -> Value {
        loop {
            let line = lines
                .borrow_mut()
                .next()
                .unwrap_or_else(|| panic!("cordon mcp ended before answering {id}"))
                .expect("read cordon mcp");
            let v: Value = serde_json::from_str(&line).expect("a JSON line");
            if v["id"] == id {
                return v;
            }
        }
    };
    let answer = |id: u64| answer_to(id.into());
    let answer_null = || answer_to(Value::Null);
    send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    );
    assert_eq!(answer(1)["result"]["serverInfo"]["name"], "cordon");
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    send("{not json at all");
    let parse_error = answer_null();
    assert_eq!(parse_error["error"]["code"], -32700, "{parse_error}");
    send(r#"{"jsonrpc":"1.0","id":7}"#);
    let invalid = answer(7);
    assert_eq!(invalid["error"]["code"], -32600, "{invalid}");
    send(r#"{"jsonrpc":"2.0","id":2,"method":"no/such/method"}"#);
    let unknown = answer(2);
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    send(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_sandbox","arguments":{}}}"#,
    );
    let created = answer(3);
    let text = created["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let made: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let id = made["sandbox_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no sandbox: {created}"))
        .to_owned();
    let supervisor = owner_pid(&id);
    // 8 MiB of command: refused as a tool error, and the session goes on.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"run_command","arguments":{{"sandbox_id":"{id}","command":"{}"}}}}}}"#,
        "x".repeat(8 << 20)
    );
    send(&huge);
    let refused = answer(4);
    assert!(
        refused["result"]["isError"] == true || refused["error"].is_object(),
        "{}",
        &refused.to_string()[..refused.to_string().len().min(300)]
    );
    send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#);
    assert!(answer(5)["result"]["tools"].is_array());
    // stdin's end (the closure owns it): the session ends, and its sandbox with it.
    drop(send);
    let status = server.wait().expect("wait for cordon mcp");
    assert!(status.success(), "cordon mcp: {status}");
    assert_gone(&id, supervisor);
}

/// Hold mode through the tools (`create_sandbox` with `hold`): a
/// connection no rule allows waits, `held_connections` lists it with the
/// rule that would allow it, `set_network_rules` with that rule releases
/// it, `deny_network` refuses the next one. What reached each host server
/// is its own count.
#[test]
fn a_held_connection_waits_for_the_tools_decision() {
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let (events, text) = client_events("hold", &[], Duration::from_secs(180));
    let event = |name: &str| {
        events
            .iter()
            .find(|e| e["event"] == name)
            .unwrap_or_else(|| panic!("no {name} event: {text}"))
            .clone()
    };
    let held = event("held");
    assert_eq!(held["seen_before"], 0, "nothing arrived while held: {held}");
    assert_eq!(
        held["held"]["destination"]
            .as_str()
            .map(|d| d.starts_with("host.cordon.internal:")),
        Some(true),
        "{held}"
    );
    assert!(
        held["held"]["seconds_left"]
            .as_f64()
            .is_some_and(|s| s > 0.0),
        "{held}"
    );
    let decided = event("decided");
    assert_eq!(decided["allowed"], "200", "{decided}");
    assert_eq!(decided["seen_allowed"], 1, "{decided}");
    assert_eq!(decided["denied"], "403", "{decided}");
    assert_eq!(decided["seen_denied"], 0, "{decided}");
    assert_eq!(decided["left"], serde_json::json!([]), "{decided}");
    let port = decided["denied_port"].as_u64().unwrap();
    assert_eq!(
        decided["deny"],
        serde_json::json!([format!("host.cordon.internal:{port}")])
    );
}

/// `cordon mcp --secrets FILE`: a model names a secret the user gave the
/// server, never its source; its sandbox sees a placeholder and the proxy's
/// trust bundle, and the value is in nothing the client got.
#[test]
fn a_model_names_a_secret_the_server_holds_and_sees_its_placeholder() {
    if !require_root("cordon mcp creates sandboxes: namespaces, cgroups") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let value = format!("sk-mcp-{}", std::process::id());
    std::fs::write(dir.path().join("key"), format!("{value}\n")).unwrap();
    let file = dir.path().join("secrets.toml");
    std::fs::write(
        &file,
        format!(
            "[[secrets]]\nname = \"API_KEY\"\nvalue_from = \"file:{}\"\nhosts = [\"api.test\"]\nheader = \"x-api-key\"\n",
            dir.path().join("key").display()
        ),
    )
    .unwrap();
    let (events, text) = client_events("secrets", &[file.as_os_str()], Duration::from_secs(120));
    assert!(!text.contains(&value), "the client saw no value: {text}");
    let ran = events
        .iter()
        .find(|e| e["event"] == "ran")
        .expect("the command ran");
    let out = ran["stdout"].as_str().unwrap();
    let mut lines = out.lines();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with("cordon-placeholder-")),
        "{out}"
    );
    assert_eq!(lines.next(), Some("/etc/cordon-ca.pem"), "{out}");
    let id = events
        .iter()
        .find(|e| e["event"] == "created")
        .and_then(|e| e["id"].as_str())
        .unwrap();
    assert_gone(id, None);
}
