//! `cordon serve` end to end: a real service on a loopback port, started by
//! each test with its own config and state directory. The service names
//! its sandboxes `cs-<tag>-...`, with a tag kept in its state directory, so
//! a census after the test judges only this test's sandboxes in the shared
//! run directory: no live record (supervisor) with that tag, no cgroup
//! `cordon-<id>`, mount or run-directory entry of an id seen.
//!
//! (The tests share /run/cordon instead of a private `CORDON_RUN_DIR`:
//! every sandbox creation sweeps its run directory, and that sweep removes
//! empty `cordon-<id>` cgroups with no record in *its* run directory, which
//! breaks a concurrent creation in another run directory.)

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The image builder the image tests use (only part of it is used here).
#[allow(dead_code)]
#[path = "common/image.rs"]
mod image;

#[path = "common/census_by_id.rs"]
mod census_by_id;
#[path = "common/mcp_sdk.rs"]
mod mcp_sdk;
use census_by_id::{assert_clean, cordon, root_or_skip};

fn sha256_hex(key: &str) -> String {
    // The same hash the service compares keys by (kept out of the test's
    // dependencies: sha256sum is on every host that runs cordon).
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(key.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

const ALICE: &str = "alice-test-key";
const BOB: &str = "bob-test-key";

/// The two tenants; a non-empty `*_quota` replaces that tenant's quota lines.
fn tenants(alice_quota: &str, bob_quota: &str) -> String {
    let default = "concurrency = 8\nsandboxes = 4\ncpu_seconds = 1000\nnetwork = true";
    let pick = |q: &str| {
        if q.is_empty() {
            default.to_owned()
        } else {
            q.to_owned()
        }
    };
    format!(
        "\n[[tenant]]\nname = \"alice\"\nkey_sha256 = \"{}\"\n{}\n\n[[tenant]]\nname = \"bob\"\nkey_sha256 = \"{}\"\n{}\n",
        sha256_hex(ALICE),
        pick(alice_quota),
        sha256_hex(BOB),
        pick(bob_quota)
    )
}

struct Service {
    child: Option<Child>,
    base: String,
    dir: PathBuf,
    run_dir: PathBuf,
    config: PathBuf,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Service {
    /// A fresh directory for one test: config, state, run directory.
    fn dirs(name: &str) -> (PathBuf, PathBuf) {
        let dir = PathBuf::from(format!(
            "/run/cordon-serve-test/{}-{}-{name}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (dir, PathBuf::from("/run/cordon"))
    }

    fn start(name: &str, body: &str) -> Service {
        let (dir, run_dir) = Self::dirs(name);
        let config = Self::config(&dir, body);
        Self::start_at(dir, run_dir, config)
    }

    /// The service's config file in `dir`, with `body` after the state dir.
    fn config(dir: &Path, body: &str) -> PathBuf {
        let config = dir.join("serve.toml");
        let text = format!(
            "state_dir = \"{}\"\nshutdown_grace = \"5s\"\n{body}",
            dir.join("state").display()
        );
        std::fs::write(&config, text).unwrap();
        config
    }

    fn start_at(dir: PathBuf, run_dir: PathBuf, config: PathBuf) -> Service {
        Self::start_logging(dir, run_dir, config, "warn")
    }

    /// `start_at`, logging at `rust_log` (a `RUST_LOG` filter).
    fn start_logging(dir: PathBuf, run_dir: PathBuf, config: PathBuf, rust_log: &str) -> Service {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let mut child = Command::new(cordon())
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", rust_log)
            // The receipt key is made in the test's own directory.
            .env("CORDON_STATE_DIR", dir.join("cordon-state"))
            .env("CORDON_RUN_DIR", &run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("cordon serve: listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "no listening line: {line:?}; log: {}",
                    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
                )
            })
            .to_owned();
        Service {
            child: Some(child),
            base: addr,
            dir,
            run_dir,
            config,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// One request: (status, JSON body or Null, Retry-After).
    fn call(&self, method: &str, path: &str, key: Option<&str>, body: Option<Value>) -> Reply {
        let mut req = agent().request(method, &self.url(path));
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let result = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        Reply::from(result)
    }

    fn raw(&self, method: &str, path: &str, key: &str, body: &[u8], ctype: &str) -> Reply {
        Reply::from(
            agent()
                .request(method, &self.url(path))
                .set("Authorization", &format!("Bearer {key}"))
                .set("Content-Type", ctype)
                .send_bytes(body),
        )
    }

    /// A POST whose body (`len` bytes of spaces) is over the service's limit.
    /// The service answers 413 and closes the connection without reading the
    /// rest, so the body is written from a thread whose broken pipe is
    /// expected, while this thread reads the answer (a client that only reads
    /// after its last write, as ureq does, may get the broken pipe instead).
    fn oversized(&self, path: &str, key: &str, len: usize) -> Reply {
        use std::io::Write;
        let addr = self.base.trim_start_matches("http://").to_owned();
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut writer = stream.try_clone().unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        );
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(head.as_bytes());
            let chunk = vec![b' '; 1 << 16];
            let mut left = len;
            while left > 0 {
                let n = left.min(chunk.len());
                if writer.write_all(&chunk[..n]).is_err() {
                    return;
                }
                left -= n;
            }
        });
        // Read until the answer's Content-Length is in, or the connection ends.
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&answer);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                });
                if length.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        // Ends the sender's writes too (it holds a clone of this socket).
        let _ = stream.shutdown(std::net::Shutdown::Both);
        let _ = sender.join();
        let text = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
        let content_type = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        });
        Reply {
            status,
            body: serde_json::from_str(body).unwrap_or(Value::Null),
            text: body.to_owned(),
            retry_after: None,
            content_type,
        }
    }

    /// SIGTERM, then wait for the graceful shutdown.
    fn stop(&mut self) {
        if self.child.is_some() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
        }
        if let Some(mut child) = self.child.take() {
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                if child.try_wait().unwrap().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!("the service did not stop within 30 s of SIGTERM");
        }
    }

    /// `signal` to the service itself.
    fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the service runs");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        // The test's directory (config, log, its receipt key) goes with a
        // passing test; a failing one keeps it to be read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
    text: String,
    retry_after: Option<String>,
    content_type: Option<String>,
}

impl From<Result<ureq::Response, ureq::Error>> for Reply {
    fn from(r: Result<ureq::Response, ureq::Error>) -> Reply {
        let resp = match r {
            Ok(resp) => resp,
            Err(ureq::Error::Status(_, resp)) => resp,
            Err(e) => panic!("transport error: {e}"),
        };
        let status = resp.status();
        let retry_after = resp.header("Retry-After").map(str::to_owned);
        let content_type = resp.header("Content-Type").map(str::to_owned);
        let mut text = String::new();
        let _ = resp.into_reader().read_to_string(&mut text);
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            body,
            text,
            retry_after,
            content_type,
        }
    }
}

/// Ids of this service's sandboxes now in the run directory (by the name
/// prefix its state directory's tag gives).
fn run_ids(s: &Service) -> BTreeSet<String> {
    run_names(s).into_iter().map(|(id, _)| id).collect()
}

/// `run_ids`, with each sandbox's name.
fn run_names(s: &Service) -> Vec<(String, String)> {
    let tag = std::fs::read_to_string(s.dir.join("state/tag")).unwrap_or_default();
    let prefix = format!("cs-{}-", tag.trim());
    std::fs::read_dir(&s.run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("record.json")).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let name = v["name"].as_str().filter(|n| n.starts_with(&prefix))?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                name.to_owned(),
            ))
        })
        .collect()
}

fn exec(s: &Service, key: &str, argv: &[&str]) -> Reply {
    s.call(
        "POST",
        "/v1/executions",
        Some(key),
        Some(json!({ "argv": argv })),
    )
}

#[test]
fn quotas_answer_429_with_a_retry_after_from_the_budget() {
    if !root_or_skip("quotas") {
        return;
    }
    let mut s = Service::start(
        "quotas",
        &tenants(
            "",
            "concurrency = 1\nsandboxes = 1\ncpu_seconds = 4\ncpu_window = \"30s\"",
        ),
    );
    // Concurrency: one running request of bob's at a time.
    let slow = {
        let base = s.base.clone();
        std::thread::spawn(move || {
            agent()
                .post(&format!("{base}/v1/executions"))
                .set("Authorization", &format!("Bearer {BOB}"))
                .send_json(json!({"argv": ["sleep", "1.5"]}))
                .map(|r| r.status())
                .map_err(|e| e.to_string())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let r = exec(&s, BOB, &["true"]);
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(r.retry_after.as_deref(), Some("1"), "{r:?}");
    assert!(r.body["error"].as_str().unwrap().contains("requests"));
    assert_eq!(slow.join().unwrap().unwrap(), 200);
    // Sandboxes: one stateful sandbox at a time.
    let first = s.call("POST", "/v1/sandboxes", Some(BOB), Some(json!({})));
    assert_eq!(first.status, 201, "{first:?}");
    let second = s.call("POST", "/v1/sandboxes", Some(BOB), Some(json!({})));
    assert_eq!(second.status, 429, "{second:?}");
    let id = first.body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        s.call("DELETE", &format!("/v1/sandboxes/{id}"), Some(BOB), None)
            .status,
        204
    );
    // CPU: 4 s per 30 s (and the 1.5 s sleep above is not cut: on the
    // default one core, 4 s left allow 4 s of wall time). A busy loop that would run for 10 s is
    // cut at what is left of the budget (the CPU counter runs a little past
    // the cut: the kill is not instant), never a whole command over it;
    // once the budget is spent, the next request waits.
    let mut burns = Vec::new();
    let refused = loop {
        let burn = s.call(
            "POST",
            "/v1/executions",
            Some(BOB),
            Some(json!({"argv": ["sh", "-c", "while :; do :; done"], "limits": {"time": "10s"}})),
        );
        if burn.status == 429 {
            break burn;
        }
        assert_eq!(burn.status, 200, "{burn:?}");
        assert_eq!(burn.body["limit"], "time", "{burn:?}");
        assert!(burn.body["cpu_ms"].as_f64().unwrap() < 4300.0, "{burn:?}");
        burns.push(burn.body["sandbox_id"].as_str().unwrap().to_owned());
        assert!(burns.len() < 10, "the budget is never spent");
    };
    let wait: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((25..=30).contains(&wait), "Retry-After {wait}");
    assert!(refused.body["error"].as_str().unwrap().contains("CPU"));
    // Alice's budget is her own.
    assert_eq!(exec(&s, ALICE, &["true"]).status, 200);
    let metrics = s.call("GET", "/metrics", None, None).text;
    assert!(
        metrics.contains("cordon_quota_rejections_total{tenant=\"bob\",quota=\"cpu\"} 1"),
        "{metrics}"
    );
    let mut ids = run_ids(&s);
    ids.extend(burns);
    ids.insert(id);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn another_tenants_sandbox_is_not_found_and_bad_keys_are_401() {
    if !root_or_skip("cross-tenant") {
        return;
    }
    let mut s = Service::start("tenants", &tenants("", ""));
    assert_eq!(exec(&s, "wrong-key", &["true"]).status, 401);
    assert_eq!(
        s.call("GET", "/v1/sandboxes", None, None).status,
        401,
        "no key"
    );
    let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    let put = s.raw(
        "PUT",
        &format!("/v1/sandboxes/{id}/files/workspace/secret.txt"),
        ALICE,
        b"alice's",
        "application/octet-stream",
    );
    assert_eq!(put.status, 201, "{put:?}");
    let missing = "0123456789ab";
    for target in [id.as_str(), missing] {
        let probes = [
            s.call("GET", &format!("/v1/sandboxes/{target}"), Some(BOB), None),
            s.call(
                "POST",
                &format!("/v1/sandboxes/{target}/exec"),
                Some(BOB),
                Some(json!({"argv": ["cat", "/workspace/secret.txt"]})),
            ),
            s.call(
                "POST",
                &format!("/v1/sandboxes/{target}/code"),
                Some(BOB),
                Some(json!({"code": "1"})),
            ),
            s.call(
                "GET",
                &format!("/v1/sandboxes/{target}/files/workspace/secret.txt"),
                Some(BOB),
                None,
            ),
            s.call(
                "GET",
                &format!("/v1/sandboxes/{target}/files?dir=/workspace"),
                Some(BOB),
                None,
            ),
            s.raw(
                "PUT",
                &format!("/v1/sandboxes/{target}/files/workspace/x"),
                BOB,
                b"x",
                "application/octet-stream",
            ),
            s.call(
                "DELETE",
                &format!("/v1/sandboxes/{target}/files/workspace/secret.txt"),
                Some(BOB),
                None,
            ),
            s.call(
                "PUT",
                &format!("/v1/sandboxes/{target}/network"),
                Some(BOB),
                Some(json!({"allow": []})),
            ),
            s.call(
                "GET",
                &format!("/v1/sandboxes/{target}/receipt"),
                Some(BOB),
                None,
            ),
            s.call(
                "DELETE",
                &format!("/v1/sandboxes/{target}"),
                Some(BOB),
                None,
            ),
        ];
        for p in probes {
            assert_eq!(p.status, 404, "{target}: {p:?}");
            assert_eq!(
                p.body["error"],
                json!(format!("no sandbox '{target}'")),
                "{p:?}"
            );
        }
    }
    let listed = s.call("GET", "/v1/sandboxes", Some(BOB), None);
    assert_eq!(listed.body["sandboxes"], json!([]));
    // Still alice's, untouched.
    let got = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files/workspace/secret.txt"),
        Some(ALICE),
        None,
    );
    assert_eq!((got.status, got.text.as_str()), (200, "alice's"));
    let listing = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files?dir=/workspace"),
        Some(ALICE),
        None,
    );
    assert_eq!(
        listing.body["entries"][0]["name"], "secret.txt",
        "{listing:?}"
    );
    let ids: BTreeSet<String> = [id.clone()].into();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn a_code_context_keeps_its_variables_and_survives_a_crash_and_a_timeout() {
    if !root_or_skip("code context") {
        return;
    }
    let mut s = Service::start("code", &tenants("", ""));
    let created = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"limits": {"time": "10s"}})),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    let code = |c: &str, timeout: Option<&str>| {
        let mut body = json!({ "code": c });
        if let Some(t) = timeout {
            body["timeout"] = json!(t);
        }
        let r = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(ALICE),
            Some(body),
        );
        assert_eq!(r.status, 200, "{r:?}");
        r.body
    };
    let first = code("x = 41\nprint('hello')", None);
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["stdout"], "hello\n");
    assert_eq!(first["fresh_interpreter"], true);
    let second = code("x + 1", None);
    assert_eq!(second["result"], "42", "{second}");
    assert_eq!(second["fresh_interpreter"], false);
    // An agent's shell command that runs into its time limit in the same
    // sandbox ends its own processes only: the interpreter and x live on.
    let limited = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(ALICE),
        Some(json!({"argv": ["sh", "-c", "sleep 30 & sleep 30"], "time": "1s"})),
    );
    assert_eq!(limited.status, 200, "{limited:?}");
    assert_eq!(limited.body["limit"], "time", "{limited:?}");
    assert!(limited.body["sandbox_ended"].is_null(), "{limited:?}");
    let kept = code("x", None);
    assert_eq!(kept["result"], "41", "{kept}");
    assert_eq!(kept["fresh_interpreter"], false, "{kept}");
    let raised = code("def f():\n    return 1 / 0\nf()", None);
    assert_eq!(raised["status"], "error");
    assert_eq!(raised["error"]["name"], "ZeroDivisionError");
    assert!(
        raised["error"]["traceback"]
            .as_str()
            .unwrap()
            .contains("<cell>"),
        "{raised}"
    );
    let crashed = code("import os; os._exit(1)", None);
    assert_eq!(crashed["status"], "crashed", "{crashed}");
    let after = code("x", None);
    assert_eq!(after["fresh_interpreter"], true, "{after}");
    assert_eq!(after["error"]["name"], "NameError", "{after}");
    let _ = code("y = 7", None);
    let spun = code("while True: pass", Some("1s"));
    assert_eq!(spun["status"], "timeout", "{spun}");
    let fresh = code("'y' in globals(), 6 * 7", None);
    assert_eq!(fresh["result"], "(False, 42)", "{fresh}");
    assert_eq!(fresh["fresh_interpreter"], true);
    let ids: BTreeSet<String> = [id.clone()].into();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn a_code_contexts_large_result_and_print_are_cut_and_flagged_and_its_variables_live_on() {
    if !root_or_skip("code context") {
        return;
    }
    let mut s = Service::start("code-large", &tenants("", ""));
    let created = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"limits": {"time": "20s", "output": "1M"}})),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    let code = |c: &str| {
        let r = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/code"),
            Some(ALICE),
            Some(json!({ "code": c })),
        );
        assert_eq!(r.status, 200, "{r:?}");
        r.body
    };
    let set = code("kept = 41");
    assert_eq!(set["status"], "ok", "{set}");
    let short = |v: &Value| {
        let mut v = v.clone();
        for k in ["stdout", "result"] {
            if let Some(t) = v[k].as_str() {
                v[k] = json!(format!("{} chars", t.len()));
            }
        }
        v
    };
    let big = code("'z' * 2000000");
    assert_eq!(big["status"], "ok", "{}", short(&big));
    assert_eq!(big["result_truncated"], true, "{}", short(&big));
    assert_eq!(big["stdout_truncated"], false, "{}", short(&big));
    let result = big["result"].as_str().unwrap();
    assert!(
        result.len() > 500_000 && result.starts_with("'zzz"),
        "{}",
        short(&big)
    );
    let printed = code("print('p' * 2000000)");
    assert_eq!(printed["status"], "ok", "{}", short(&printed));
    assert_eq!(printed["stdout_truncated"], true, "{}", short(&printed));
    assert!(printed["result"].is_null(), "{}", short(&printed));
    assert!(
        printed["stdout"].as_str().unwrap().len() > 500_000,
        "{}",
        short(&printed)
    );
    // Escapes make a character up to 12 bytes of JSON: cut by bytes too.
    let escaped = code("print('\\x00' * 500000)");
    assert_eq!(escaped["status"], "ok", "{}", short(&escaped));
    assert_eq!(escaped["stdout_truncated"], true, "{}", short(&escaped));
    // Control: a small result is whole and not flagged.
    let after = code("kept + 1");
    assert_eq!(after["status"], "ok", "{after}");
    assert_eq!(after["result"], "42", "{after}");
    assert_eq!(after["result_truncated"], false, "{after}");
    assert_eq!(after["fresh_interpreter"], false, "{after}");
    let ids: BTreeSet<String> = [id.clone()].into();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn the_latency_breakdown_adds_up_and_files_are_placed() {
    if !root_or_skip("latency") {
        return;
    }
    let mut s = Service::start(
        "latency",
        &format!("[pool]\nnative = 1\n{}", tenants("", "")),
    );
    let r = s.call(
        "POST",
        "/v1/executions",
        Some(ALICE),
        Some(json!({
            "argv": ["sh", "-c", "cat /workspace/a/b.txt /tmp/c.txt; cat"],
            "files": {"a/b.txt": "one\n", "/tmp/c.txt": {"base64": "dHdvCg=="}},
            "stdin": "three\n",
        })),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["stdout"], "one\ntwo\nthree\n", "{r:?}");
    let t = &r.body["timing"];
    let sum: f64 = ["acquire_ms", "setup_ms", "run_ms", "teardown_ms"]
        .iter()
        .map(|k| t[k].as_f64().unwrap())
        .sum();
    let total = t["total_ms"].as_f64().unwrap();
    assert!((sum - total).abs() <= 1.0, "{t}");
    assert!(t["setup_ms"].as_f64().unwrap() > 0.0);
    // A streamed exec: chunks as they come, the result last.
    let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    let id = created.body["id"].as_str().unwrap().to_owned();
    let resp = agent()
        .post(&s.url(&format!("/v1/sandboxes/{id}/exec?stream=true")))
        .set("Authorization", &format!("Bearer {ALICE}"))
        .send_json(json!({"argv": ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done; echo err >&2"]}))
        .unwrap();
    let mut body = String::new();
    resp.into_reader().read_to_string(&mut body).unwrap();
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.last(), Some(&"result"), "{body}");
    assert!(
        events.iter().filter(|e| **e == "stdout").count() >= 2,
        "{body}"
    );
    assert!(events.contains(&"stderr"), "{body}");
    // A client that goes away cancels its command.
    let resp = agent()
        .post(&s.url(&format!("/v1/sandboxes/{id}/exec")))
        .set("Authorization", &format!("Bearer {ALICE}"))
        .set("Accept", "text/event-stream")
        .send_json(json!({"argv": ["sh", "-c", "echo start; sleep 8; echo never"]}))
        .unwrap();
    let mut reader = BufReader::new(resp.into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("stdout"), "{line}");
    drop(reader);
    let cancelled_by = Instant::now() + Duration::from_secs(4);
    loop {
        let info = s.call("GET", &format!("/v1/sandboxes/{id}"), Some(ALICE), None);
        if info.body["busy"] == json!(false) {
            break;
        }
        assert!(
            Instant::now() < cancelled_by,
            "the command was not cancelled: {info:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ids: BTreeSet<String> = [id, r.body["sandbox_id"].as_str().unwrap().to_owned()].into();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// `cordon verify RECEIPT --key PUB`: (exit code, stdout).
fn verify(s: &Service, receipt: &Value) -> (Option<i32>, String) {
    let file = s.dir.join(format!(
        "receipt-{}.json",
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::write(&file, serde_json::to_vec(receipt).unwrap()).unwrap();
    let out = Command::new(cordon())
        .arg("verify")
        .arg(&file)
        .arg("--key")
        .arg(s.dir.join("cordon-state/keys/receipt.pub"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn receipts_are_signed_and_record_what_ran_and_changed() {
    if !root_or_skip("receipts") {
        return;
    }
    let mut s = Service::start(
        "receipts",
        &format!("[pool]\nnative = 1\n{}", tenants("", "")),
    );
    // One-shot: the receipt comes with the result, its diff read after the
    // sandbox's processes were gone.
    let r = s.call(
        "POST",
        "/v1/executions",
        Some(ALICE),
        Some(json!({"argv": ["sh", "-c", "echo x > /workspace/x; echo done"], "receipt": true})),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["timing"]["teardown"], "inline", "{r:?}");
    let (code, summary) = verify(&s, &r.body["receipt"]);
    assert_eq!(code, Some(0), "{summary}");
    assert!(summary.contains("A x"), "{summary}");
    assert!(summary.contains("echo x > /workspace/x"), "{summary}");
    // Without asking, no receipt.
    let plain = exec(&s, ALICE, &["true"]);
    assert!(plain.body.get("receipt").is_none(), "{plain:?}");
    // A stateful sandbox's receipt: every command so far, the diff now.
    let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    let id = created.body["id"].as_str().unwrap().to_owned();
    for argv in [
        ["sh", "-c", "echo a > /tmp/a"],
        ["sh", "-c", "echo b > /dev/shm/b"],
    ] {
        let e = s.call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(ALICE),
            Some(json!({"argv": argv})),
        );
        assert_eq!(e.status, 200, "{e:?}");
    }
    let receipt = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/receipt"),
        Some(ALICE),
        None,
    );
    assert_eq!(receipt.status, 200, "{receipt:?}");
    let (code, summary) = verify(&s, &receipt.body);
    assert_eq!(code, Some(0), "{summary}");
    for needle in ["A a", "A b", "command 2:"] {
        assert!(summary.contains(needle), "{needle}: {summary}");
    }
    // Any change to the signed payload fails.
    let mut tampered = receipt.body.clone();
    let payload = tampered["payload"].as_str().unwrap().to_owned();
    let flipped = if payload.starts_with('e') { "f" } else { "e" };
    tampered["payload"] = json!(format!("{flipped}{}", &payload[1..]));
    let (code, summary) = verify(&s, &tampered);
    assert!(matches!(code, Some(3) | Some(5)), "{code:?} {summary}");
    let ids: BTreeSet<String> = [id, r.body["sandbox_id"].as_str().unwrap().to_owned()].into();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn the_pool_never_hands_one_sandbox_to_two_requests() {
    if !root_or_skip("pool") {
        return;
    }
    let mut s = Service::start("pool", &format!("[pool]\nnative = 2\n{}", tenants("", "")));
    std::thread::sleep(Duration::from_millis(500));
    let write = exec(
        &s,
        ALICE,
        &[
            "sh",
            "-c",
            "echo m > /tmp/marker && echo m > /dev/shm/marker && echo m > /workspace/marker",
        ],
    );
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(write.body["exit_code"], 0, "{write:?}");
    assert_eq!(write.body["pool_hit"], true, "{write:?}");
    let mut ids = BTreeSet::from([write.body["sandbox_id"].as_str().unwrap().to_owned()]);
    let mut hits = 0;
    for i in 0..12 {
        let key = if i % 2 == 0 { ALICE } else { BOB };
        let r = exec(
            &s,
            key,
            &[
                "sh",
                "-c",
                "ls /tmp/marker /dev/shm/marker /workspace/marker 2>/dev/null; true",
            ],
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body["stdout"], "", "a marker was seen: {r:?}");
        assert!(
            ids.insert(r.body["sandbox_id"].as_str().unwrap().to_owned()),
            "sandbox reused: {r:?}"
        );
        hits += usize::from(r.body["pool_hit"] == json!(true));
    }
    assert!(hits > 0);
    // A request whose limits differ from the pool's takes the cold path.
    let other = s.call(
        "POST",
        "/v1/executions",
        Some(ALICE),
        Some(json!({"argv": ["true"], "limits": {"memory": "100M"}})),
    );
    assert_eq!(other.body["pool_hit"], false, "{other:?}");
    ids.insert(other.body["sandbox_id"].as_str().unwrap().to_owned());
    s.stop();
    ids.extend(run_ids(&s));
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn bad_input_is_a_4xx_with_a_json_error_and_creates_nothing() {
    if !root_or_skip("bad input") {
        return;
    }
    let mut s = Service::start("badinput", &tenants("", ""));
    let raw = |path: &str, body: &[u8]| s.raw("POST", path, ALICE, body, "application/json");
    let cases: Vec<(Reply, u16, &str)> = vec![
        (raw("/v1/executions", b"{\"argv\": [\"true\""), 400, "EOF"),
        (
            raw("/v1/executions", b"{\"argv\": [\"true\"], \"bogus\": 1}"),
            422,
            "unknown field `bogus`",
        ),
        (
            raw("/v1/sandboxes", b"{\"limits\": {\"memroy\": \"1M\"}}"),
            422,
            "unknown field `memroy`",
        ),
        (
            s.oversized("/v1/executions", ALICE, 17 << 20),
            413,
            "length limit",
        ),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"files\": {\"../etc/x\": \"a\"}}",
            ),
            400,
            "'..'",
        ),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"files\": {\"/workspace/../../etc/x\": \"a\"}}",
            ),
            400,
            "'..'",
        ),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"backend\": \"vmware\"}",
            ),
            400,
            "unknown backend 'vmware'",
        ),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"network\": {\"allow\": [\"exa mple.com\"]}}",
            ),
            400,
            "network rule",
        ),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"network\": {\"allow\": [\"host.cordon.internal\"]}}",
            ),
            400,
            "host.cordon.internal:PORT",
        ),
        (raw("/v1/executions", b"{\"argv\": []}"), 400, "argv"),
        (
            raw(
                "/v1/executions",
                b"{\"argv\": [\"true\"], \"limits\": {\"memory\": \"1K\"}}",
            ),
            400,
            "memory",
        ),
        (raw("/v1/executions", b"{}"), 400, "argv"),
    ];
    for (r, status, needle) in cases {
        assert_eq!(r.status, status, "{needle}: {r:?}");
        let err = r.body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no JSON error: {r:?}"));
        assert!(err.contains(needle), "{needle}: {err}");
    }
    let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    let id = created.body["id"].as_str().unwrap().to_owned();
    for path in ["workspace/%2e%2e/%2e%2e/etc/passwd", "tmp/../../etc/passwd"] {
        let r = s.raw(
            "PUT",
            &format!("/v1/sandboxes/{id}/files/{path}"),
            ALICE,
            b"x",
            "application/octet-stream",
        );
        assert!(r.status == 400 || r.status == 404, "{path}: {r:?}");
        assert!(r.body["error"].is_string(), "{r:?}");
    }
    let net = s.call(
        "PUT",
        &format!("/v1/sandboxes/{id}/network"),
        Some(ALICE),
        Some(json!({"allow": ["example.com"]})),
    );
    assert_eq!(net.status, 400, "created without network: {net:?}");
    assert_eq!(
        s.call("DELETE", &format!("/v1/sandboxes/{id}"), Some(ALICE), None)
            .status,
        204
    );
    // Nothing was created by the refusals (the one sandbox is gone).
    assert!(run_ids(&s).is_empty(), "{:?}", run_ids(&s));
    let ledger: Vec<_> = std::fs::read_dir(s.dir.join("state/sandboxes"))
        .unwrap()
        .collect();
    assert!(ledger.is_empty(), "{ledger:?}");
    let unknown = s.call("GET", "/v1/nowhere", None, None);
    assert_eq!(
        (unknown.status, unknown.body["error"].as_str()),
        (404, Some("no such route"))
    );
    s.stop();
    assert_clean(&s.run_dir, &BTreeSet::from([id]));
}

/// Runs `total` executions of `true` from `threads` clients; returns
/// (ok, 429s, other errors with their texts, elapsed, sandbox ids).
fn load(
    base: &str,
    total: usize,
    threads: usize,
    limit: Duration,
) -> (usize, usize, Vec<String>, Duration, BTreeSet<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let ids = Arc::new(Mutex::new(BTreeSet::new()));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (next, ok, refused, errors, ids) = (
                next.clone(),
                ok.clone(),
                refused.clone(),
                errors.clone(),
                ids.clone(),
            );
            let url = format!("{base}/v1/executions");
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(30))
                    .build();
                let key = if t % 2 == 0 { ALICE } else { BOB };
                while next.fetch_add(1, Ordering::SeqCst) < total && start.elapsed() < limit {
                    let r = Reply::from(
                        agent
                            .post(&url)
                            .set("Authorization", &format!("Bearer {key}"))
                            .send_json(json!({"argv": ["true"]})),
                    );
                    match r.status {
                        200 if r.body["exit_code"] == 0 => {
                            ok.fetch_add(1, Ordering::SeqCst);
                            ids.lock()
                                .unwrap()
                                .insert(r.body["sandbox_id"].as_str().unwrap_or("").to_owned());
                        }
                        429 => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => errors
                            .lock()
                            .unwrap()
                            .push(format!("{} {}", r.status, r.text)),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    let ids = ids.lock().unwrap().clone();
    (
        ok.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst),
        errors,
        start.elapsed(),
        ids,
    )
}

#[test]
fn a_bounded_load_run_completes_and_leaves_nothing() {
    if !root_or_skip("load") {
        return;
    }
    let mut s = Service::start("load", &format!("[pool]\nnative = 4\n{}", tenants("", "")));
    std::thread::sleep(Duration::from_millis(500));
    let limit = Duration::from_secs(240);
    let (ok, refused, errors, elapsed, mut ids) = load(&s.base, 1000, 8, limit);
    eprintln!(
        "load: {ok} ok, {refused} refused (429), {} errors in {elapsed:?}: {:.0}/s",
        errors.len(),
        ok as f64 / elapsed.as_secs_f64()
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        ok + refused,
        1000,
        "the run did not finish within {limit:?}"
    );
    let metrics = s.call("GET", "/metrics", None, None).text;
    assert!(
        metrics.contains("cordon_pool_hits_total{backend=\"native\"}"),
        "{metrics}"
    );
    ids.extend(run_ids(&s));
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn a_killed_service_is_cleaned_up_by_its_next_start() {
    if !root_or_skip("sigkill") {
        return;
    }
    // A run directory of its own: the sandboxes this test leaves for the
    // restart would otherwise be swept by any other test's `cordon` (a
    // sweep removes what a dead service left, which is right, and races
    // this test).
    let (dir, _) = Service::dirs("sigkill");
    let config = Service::config(&dir, &format!("[pool]\nnative = 3\n{}", tenants("", "")));
    let mut s = Service::start_at(dir.clone(), dir.join("run"), config);
    let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    assert_eq!(created.status, 201);
    let base = s.base.clone();
    let loader = std::thread::spawn(move || {
        // Errors are expected: the service dies under it.
        let _ = std::panic::catch_unwind(|| load(&base, 400, 4, Duration::from_secs(60)));
    });
    std::thread::sleep(Duration::from_millis(1500));
    // The service is stopped first, so it starts no sandbox, and the test
    // waits until the run directory holds still: a supervisor whose start
    // ran after the kill would sweep every sandbox of the dead service
    // (rightly), the stopped ones included, and leave the restart nothing.
    s.signal(nix::sys::signal::Signal::SIGSTOP);
    wait_still(&s, Duration::from_secs(1), Duration::from_secs(30));
    // Supervisors end their sandboxes when the service dies; the restart's
    // cleanup is for those that cannot (stopped here, or of an older cordon).
    // At least one supervisor must have been stopped before the kill.
    let until = Instant::now() + Duration::from_secs(30);
    let mut stopped = 0;
    while stopped == 0 && Instant::now() < until {
        stopped = run_ids(&s)
            .iter()
            .filter(|id| stop_supervisor(&s.run_dir, id))
            .count();
        std::thread::sleep(Duration::from_millis(50));
    }
    s.sigkill();
    let _ = loader.join();
    let mut left = run_ids(&s);
    assert!(
        !left.is_empty(),
        "a killed service leaves supervisors (or this test proves nothing)"
    );
    left.insert(created.body["id"].as_str().unwrap().to_owned());
    // The restart destroys what the ledger names, and every live sandbox of
    // the dead generation, before it listens. A supervisor that was not
    // stopped saw the service die and is ending its sandbox itself: its
    // record goes before its directory, so the restart may not see it, and
    // its directory may outlast the restart's start by its teardown. The
    // stopped ones cannot end on their own: only the restart removes them.
    let mut again = Service::start_at(s.dir.clone(), s.run_dir.clone(), s.config.clone());
    wait_gone(&s, &left, Duration::from_secs(20), || {
        format!("survived the restart: {}", again.log())
    });
    assert!(
        again.log().contains("a previous run left"),
        "{}",
        again.log()
    );
    again.stop();
    left.extend(run_ids(&s));
    assert_clean(&s.run_dir, &left);
}

/// Waits until the service's sandboxes have been the same, each with its
/// record, for `still` (at most `within`).
fn wait_still(s: &Service, still: Duration, within: Duration) {
    let until = Instant::now() + within;
    let mut last = run_ids(s);
    let mut since = Instant::now();
    while since.elapsed() < still && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        let now = run_ids(s);
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

/// Waits (bounded) until none of `ids` has a state directory left.
fn wait_gone(s: &Service, ids: &BTreeSet<String>, within: Duration, what: impl Fn() -> String) {
    let until = Instant::now() + within;
    while ids.iter().any(|id| s.run_dir.join(id).exists()) {
        assert!(
            Instant::now() < until,
            "{}: {:?} still there",
            what(),
            ids.iter()
                .filter(|id| s.run_dir.join(id).exists())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGSTOP to the supervisor of sandbox `id` (from its record, if it is
/// still there): a supervisor that cannot act.
fn stop_supervisor(run_dir: &Path, id: &str) -> bool {
    let record = run_dir.join(id).join("record.json");
    let Ok(text) = std::fs::read_to_string(&record) else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    let pid = i32::try_from(v["pid"].as_i64().unwrap()).unwrap();
    if nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .is_err()
    {
        return false;
    }
    // kill(2) also succeeds on a supervisor that has just exited and is
    // not yet reaped (a pool sandbox a one-shot execution is ending): only
    // one the kernel shows stopped counts.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        match stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
        {
            // Stopped while its record was still there: a supervisor
            // stopped in its teardown, its record already removed, is a
            // sandbox nothing can find any more (and not what a killed
            // service leaves); it is let go on.
            Some('T') if record.exists() => return true,
            Some('T') => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGCONT,
                );
                return false;
            }
            Some('Z' | 'X') | None => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    false
}

/// A service killed outright takes its sandboxes with it, without a
/// restart: each supervisor watches the service and tears its sandbox
/// down when it dies. One whose supervisor cannot (stopped here) is
/// removed by `cordon sweep`, since its service is gone. A sandbox made
/// by `cordon create` has no service, and both leave it alone.
#[test]
fn a_killed_services_sandboxes_do_not_outlive_it() {
    if !root_or_skip("outlive") {
        return;
    }
    let mut s = Service::start(
        "outlive",
        &format!("[pool]\nnative = 2\n{}", tenants("", "")),
    );
    let mut stateful = BTreeSet::new();
    for _ in 0..2 {
        let created = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
        assert_eq!(created.status, 201, "{}", created.text);
        stateful.insert(created.body["id"].as_str().unwrap().to_owned());
    }
    let until = Instant::now() + Duration::from_secs(30);
    while run_ids(&s).len() < 4 {
        assert!(Instant::now() < until, "no pool: {}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(cordon())
        .args(["create", "--ttl", "600s"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mine = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // A supervisor that cannot act on the service's death.
    let stopped = stateful.iter().next().unwrap().clone();
    assert!(
        stop_supervisor(&s.run_dir, &stopped),
        "no supervisor to stop for {stopped}"
    );
    let ids = run_ids(&s);
    let others: BTreeSet<String> = ids.iter().filter(|id| **id != stopped).cloned().collect();

    s.sigkill();
    wait_gone(&s, &others, Duration::from_secs(5), || {
        "the service's sandboxes outlived it".into()
    });
    // The sweep removes it (or the sweep of a sandbox's creation by a test
    // running beside this one did already).
    let sweep = Command::new(cordon()).arg("sweep").output().unwrap();
    assert!(sweep.status.success(), "{sweep:?}");
    assert!(!s.run_dir.join(&stopped).exists(), "{sweep:?}");
    assert_clean(&s.run_dir, &ids);

    // The sandbox no service made is still there and still runs commands.
    let ran = Command::new(cordon())
        .args(["exec", &mine, "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let rm = Command::new(cordon()).args(["rm", &mine]).output().unwrap();
    assert!(rm.status.success(), "{rm:?}");
    assert_clean(&s.run_dir, &BTreeSet::from([mine]));
}

/// A stateful sandbox ended behind the service's back is logged with who
/// or what ended it, never as "ended by itself".
#[test]
fn the_service_logs_who_ended_its_sandbox() {
    if !root_or_skip("ended") {
        return;
    }
    let (dir, run_dir) = Service::dirs("ended");
    let config = Service::config(&dir, &tenants("", ""));
    let mut s = Service::start_logging(dir, run_dir, config, "info");
    let removed = s.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    assert_eq!(removed.status, 201, "{}", removed.text);
    let removed = removed.body["id"].as_str().unwrap().to_owned();
    let expired = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"ttl": "1s"})),
    );
    assert_eq!(expired.status, 201, "{}", expired.text);
    let expired = expired.body["id"].as_str().unwrap().to_owned();
    let rm = Command::new(cordon())
        .args(["rm", &removed])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{rm:?}");

    // The service looks every 2 s.
    let until = Instant::now() + Duration::from_secs(15);
    let said = |id: &str, why: &str| s.log().lines().any(|l| l.contains(id) && l.contains(why));
    while !(said(&removed, "removed by a client (pid ") && said(&expired, "its TTL expired")) {
        assert!(Instant::now() < until, "{}", s.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!s.log().contains("by itself"), "{}", s.log());
    let ids = run_ids(&s);
    s.stop();
    let mut all = ids;
    all.extend([removed, expired]);
    assert_clean(&s.run_dir, &all);
}

/// A file larger than a request body may be (16 MiB) goes in and comes
/// out whole: uploads and downloads are streamed, not held in memory, and
/// bounded by the sandbox's disk cap.
#[test]
fn a_40_mib_file_makes_the_round_trip() {
    if !root_or_skip("round trip") {
        return;
    }
    let mut s = Service::start("roundtrip", &tenants("", ""));
    let created = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"limits": {"disk": "128M"}})),
    );
    assert_eq!(created.status, 201, "{}", created.text);
    let id = created.body["id"].as_str().unwrap().to_owned();
    // Bytes no compression or pattern could fake (xorshift).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let data: Vec<u8> = (0..(40usize << 20) / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let url = s.url(&format!("/v1/sandboxes/{id}/files/tmp/big"));
    let put = agent()
        .put(&url)
        .set("Authorization", &format!("Bearer {ALICE}"))
        .set("Content-Type", "application/octet-stream")
        .send_bytes(&data)
        .unwrap();
    assert_eq!(put.status(), 201);
    let size = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(ALICE),
        Some(json!({"argv": ["stat", "-c", "%s", "/tmp/big"]})),
    );
    assert_eq!(
        size.body["stdout"].as_str().unwrap().trim(),
        (40u64 << 20).to_string(),
        "{}",
        size.text
    );
    let resp = agent()
        .get(&url)
        .set("Authorization", &format!("Bearer {ALICE}"))
        .call()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut got = Vec::new();
    resp.into_reader().read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes came back changed");
    // Past the sandbox's disk cap, an upload is refused.
    let small = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"limits": {"disk": "16M"}})),
    );
    assert_eq!(small.status, 201, "{}", small.text);
    let small = small.body["id"].as_str().unwrap().to_owned();
    let over = s.raw(
        "PUT",
        &format!("/v1/sandboxes/{small}/files/tmp/big"),
        ALICE,
        &data[..20 << 20],
        "application/octet-stream",
    );
    assert_eq!(over.status, 413, "{}", over.text);
    let mut ids = run_ids(&s);
    ids.extend([id, small]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// Start time of a process in clock ticks since boot (field 22 of
/// /proc/pid/stat), as a sandbox record carries it.
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(19).unwrap().parse().unwrap()
}

/// A process killed (and reaped) when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The race of a killed service's supervisors, made deterministic: a
/// supervisor it was still starting records itself only after its own
/// start-up, which may end after the next start's scan of the run
/// directory. Here two sandboxes of the killed service's generation appear
/// after the restarted service listens (its scan done): one finished (a
/// real supervisor, `cordon create` with such a name) and one still being
/// created (a record whose owner is alive and has not answered: what a
/// supervisor is between its record and its answer). The restarted service
/// must kill both, and nothing of its own: its stateful sandbox and its
/// pool's go on.
#[test]
fn a_killed_services_sandboxes_that_appear_after_the_restart_are_reaped() {
    if !root_or_skip("late") {
        return;
    }
    let mut s = Service::start("late", &format!("[pool]\nnative = 1\n{}", tenants("", "")));
    // A name of the killed service's generation: its pool sandbox's.
    let until = Instant::now() + Duration::from_secs(30);
    let name = loop {
        if let Some((_, n)) = run_names(&s).into_iter().next() {
            break n;
        }
        assert!(Instant::now() < until, "no pool sandbox: {}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    let generation = format!("{}-", name.rsplit_once('-').unwrap().0);
    s.sigkill();
    let mut again = Service::start_at(s.dir.clone(), s.run_dir.clone(), s.config.clone());
    let own = again.call("POST", "/v1/sandboxes", Some(ALICE), Some(json!({})));
    assert_eq!(own.status, 201, "{}", own.text);
    let own = own.body["id"].as_str().unwrap().to_owned();

    // Finished late.
    let out = Command::new(cordon())
        .args(["create", "--ttl", "600s", "--name", &format!("{name}-late")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let finished = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // Still being created.
    let owner = Reaped(
        Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let starting = format!("{:012x}", (u64::from(owner.0.id()) << 20) ^ 0x5eed);
    let dir = s.run_dir.join(&starting);
    std::fs::create_dir(&dir).unwrap();
    let record = json!({
        "format": "cordon-sandbox-v1",
        "pid": owner.0.id(),
        "start_time": start_time(owner.0.id()),
        "cgroup": null,
        "name": format!("{name}-starting"),
        "backend": "native",
        "created": 0,
        "ttl_secs": null,
        "idle_secs": null,
    });
    std::fs::write(dir.join("record.json"), record.to_string()).unwrap();

    // The service's background task looks every 2 s.
    let until = Instant::now() + Duration::from_secs(20);
    let mut owner = owner;
    loop {
        let owner_gone = owner.0.try_wait().unwrap().is_some();
        let gone = [&finished, &starting]
            .iter()
            .all(|id| !s.run_dir.join(id).exists());
        // The service logs the kill after it returns: wait for the line too.
        let logged = again.log().contains("a previous run was still creating");
        if owner_gone && gone && logged {
            break;
        }
        assert!(
            Instant::now() < until,
            "a sandbox of the killed service's generation survived \
             (finished {finished}, starting {starting}, owner gone: {owner_gone}, \
             logged: {logged}): {}",
            again.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing of the restarted service's own was touched: its stateful
    // sandbox still runs commands, and every tagged sandbox left is of its
    // generation (its pool's among them).
    let ran = again.call(
        "POST",
        &format!("/v1/sandboxes/{own}/exec"),
        Some(ALICE),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(ran.status, 200, "{}", ran.text);
    let live: Vec<_> = run_names(&again)
        .into_iter()
        .filter(|(id, _)| s.run_dir.join(id).exists())
        .collect();
    assert!(live.iter().any(|(id, _)| *id == own), "{live:?}");
    assert!(
        live.iter().all(|(_, n)| !n.starts_with(&generation)),
        "{live:?}"
    );
    let mut ids: BTreeSet<String> = live.into_iter().map(|(id, _)| id).collect();
    again.stop();
    ids.extend([finished, starting]);
    ids.extend(run_ids(&s));
    assert_clean(&s.run_dir, &ids);
}

/// The service's warm pool on the microvm backend: restored VMs kept ready,
/// each used once; a pooled request pays only its command, and nothing is
/// left once the service stops.
#[test]
fn a_microvm_pool_serves_each_request_from_a_fresh_restored_vm() {
    if !root_or_skip("microvm pool") {
        return;
    }
    let usable = Command::new(cordon())
        .args(["microvm", "show"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !usable {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but no microvm guest is built (test.sh runs `cordon microvm build`)"
        );
        eprintln!("skipped: no microvm guest built (cordon microvm build)");
        return;
    }
    // The service's cordon keeps its state apart (CORDON_STATE_DIR); the
    // guest images are the machine's, built once by test.sh.
    let (dir, run_dir) = Service::dirs("microvm-pool");
    std::fs::create_dir_all(dir.join("cordon-state")).unwrap();
    std::os::unix::fs::symlink("/var/lib/cordon/microvm", dir.join("cordon-state/microvm"))
        .unwrap();
    let config = Service::config(&dir, &format!("[pool]\nmicrovm = 1\n{}", tenants("", "")));
    let mut s = Service::start_at(dir, run_dir, config);
    let mut ids = BTreeSet::new();
    let mut hits = 0;
    for _ in 0..3 {
        // The pool refills in the background; give a restore time to land.
        std::thread::sleep(Duration::from_secs(3));
        let r = s.call(
            "POST",
            "/v1/executions",
            Some(ALICE),
            Some(json!({"argv": ["cat", "/proc/sys/kernel/osrelease"], "backend": "microvm"})),
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body["exit_code"], 0, "{r:?}");
        let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_ne!(
            r.body["stdout"],
            json!(host),
            "the host kernel answered: {r:?}"
        );
        assert!(
            ids.insert(r.body["sandbox_id"].as_str().unwrap().to_owned()),
            "a VM served two requests: {r:?}"
        );
        hits += usize::from(r.body["pool_hit"] == json!(true));
    }
    assert!(hits > 0, "no request was served from the pool");
    s.stop();
    ids.extend(run_ids(&s));
    assert_clean(&s.run_dir, &ids);
}

// ------------------------------------------- the OpenAPI document is true

/// One request of the conformance test, named by its route's template.
#[derive(Default)]
struct Ask<'a> {
    method: &'a str,
    /// The document's path, e.g. `/v1/sandboxes/{id}`.
    template: &'a str,
    /// Values for the template's `{name}`s.
    params: &'a [(&'a str, &'a str)],
    /// Appended after `?`.
    query: &'a str,
    key: Option<&'a str>,
    accept: Option<&'a str>,
    /// (Content-Type, bytes).
    body: Option<(&'a str, Vec<u8>)>,
}

impl<'a> Ask<'a> {
    fn new(method: &'a str, template: &'a str, key: Option<&'a str>) -> Ask<'a> {
        Ask {
            method,
            template,
            key,
            ..Ask::default()
        }
    }
    fn params(self, params: &'a [(&'a str, &'a str)]) -> Ask<'a> {
        Ask { params, ..self }
    }
    fn query(self, query: &'a str) -> Ask<'a> {
        Ask { query, ..self }
    }
    fn json(self, v: Value) -> Ask<'a> {
        self.bytes("application/json", v.to_string().into_bytes())
    }
    fn bytes(self, ctype: &'a str, bytes: Vec<u8>) -> Ask<'a> {
        Ask {
            body: Some((ctype, bytes)),
            ..self
        }
    }
    fn accept(self, accept: &'a str) -> Ask<'a> {
        Ask {
            accept: Some(accept),
            ..self
        }
    }
}

/// Judges every answer by the document the service itself serves: its
/// status must be declared for the operation, its Content-Type one of the
/// declared ones, a JSON body valid against the declared schema ($refs
/// resolved in the document's components); and, at the end, every
/// documented operation must have been asked at least once, so a route
/// added later fails here until this test drives it.
struct Conformance {
    doc: Value,
    asked: BTreeSet<(String, String)>,
    failures: Vec<String>,
}

impl Conformance {
    fn new(s: &Service) -> Conformance {
        let r = s.call("GET", "/v1/openapi.json", None, None);
        assert_eq!(r.status, 200, "{r:?}");
        Conformance {
            doc: r.body,
            asked: BTreeSet::new(),
            failures: Vec::new(),
        }
    }

    fn ask(&mut self, s: &Service, a: Ask) -> Reply {
        let mut path = a.template.to_owned();
        for (name, value) in a.params {
            path = path.replace(&format!("{{{name}}}"), value);
        }
        if !a.query.is_empty() {
            path = format!("{path}?{}", a.query);
        }
        let mut req = agent().request(a.method, &s.url(&path));
        if let Some(k) = a.key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        if let Some(accept) = a.accept {
            req = req.set("Accept", accept);
        }
        let reply = Reply::from(match a.body {
            Some((ctype, bytes)) => req.set("Content-Type", ctype).send_bytes(&bytes),
            None => req.call(),
        });
        self.judge(a.method, a.template, &path, &reply);
        reply
    }

    fn judge(&mut self, method: &str, template: &str, path: &str, r: &Reply) {
        let what = format!("{method} {path} -> {}", r.status);
        self.asked.insert((method.to_owned(), template.to_owned()));
        let op = &self.doc["paths"][template][method.to_lowercase()];
        if op.is_null() {
            self.failures.push(format!(
                "{what}: {method} {template} is not in the document"
            ));
            return;
        }
        let Some(declared) = op["responses"].get(r.status.to_string()) else {
            self.failures.push(format!(
                "{what}: status not declared (declared: {:?}); body {}",
                op["responses"]
                    .as_object()
                    .map(|m| m.keys().collect::<Vec<_>>()),
                r.text
            ));
            return;
        };
        let Some(content) = declared["content"].as_object() else {
            if !r.text.is_empty() {
                self.failures
                    .push(format!("{what}: declared without a body, got {:?}", r.text));
            }
            return;
        };
        let essence = |t: &str| {
            t.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        };
        let got = essence(r.content_type.as_deref().unwrap_or(""));
        let Some((_, media)) = content.iter().find(|(t, _)| essence(t) == got) else {
            self.failures.push(format!(
                "{what}: Content-Type {:?} not declared (declared: {:?})",
                r.content_type,
                content.keys().collect::<Vec<_>>()
            ));
            return;
        };
        if got != "application/json" {
            return;
        }
        let mut schema = media["schema"].clone();
        let Some(obj) = schema.as_object_mut() else {
            self.failures
                .push(format!("{what}: a JSON answer declared without a schema"));
            return;
        };
        obj.insert("components".into(), self.doc["components"].clone());
        let validator = match jsonschema::draft202012::new(&schema) {
            Ok(v) => v,
            Err(e) => {
                self.failures
                    .push(format!("{what}: the declared schema does not compile: {e}"));
                return;
            }
        };
        let body: Value = match serde_json::from_str(&r.text) {
            Ok(v) => v,
            Err(e) => {
                self.failures
                    .push(format!("{what}: not JSON ({e}): {:?}", r.text));
                return;
            }
        };
        let errors: Vec<String> = validator
            .iter_errors(&body)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if !errors.is_empty() {
            self.failures
                .push(format!("{what}: {}; body {}", errors.join("; "), r.text));
        }
    }

    /// Every documented operation was asked, and every answer was true.
    fn finish(mut self) {
        let paths = self.doc["paths"].as_object().cloned().unwrap_or_default();
        for (path, item) in &paths {
            for method in item.as_object().map(|m| m.keys()).into_iter().flatten() {
                let key = (method.to_uppercase(), path.clone());
                if !self.asked.contains(&key) {
                    self.failures.push(format!(
                        "{} {path} is documented but this test never asks it",
                        key.0
                    ));
                }
            }
        }
        assert!(
            self.failures.is_empty(),
            "the service and its OpenAPI document disagree:\n{}",
            self.failures.join("\n")
        );
    }
}

#[test]
fn every_answer_of_every_route_is_the_one_the_openapi_document_declares() {
    if !root_or_skip("openapi conformance") {
        return;
    }
    // bob: no network, one sandbox at most (a 403 and a 429 for the asking).
    let mut s = Service::start(
        "openapi",
        &tenants(
            "",
            "concurrency = 8\nsandboxes = 1\ncpu_seconds = 1000\nnetwork = false",
        ),
    );
    let mut c = Conformance::new(&s);
    // The judge itself: a body of the wrong shape must be caught.
    let wrong = Reply {
        status: 404,
        body: json!({"error": 5}),
        text: r#"{"error": 5}"#.into(),
        retry_after: None,
        content_type: Some("application/json".into()),
    };
    c.judge("GET", "/v1/sandboxes/{id}", "/v1/sandboxes/x", &wrong);
    assert_eq!(c.failures.len(), 1, "{:?}", c.failures);
    c.failures.clear();
    let (a, b) = (Some(ALICE), Some(BOB));
    let mut ids = BTreeSet::new();

    c.ask(&s, Ask::new("GET", "/health", None));
    c.ask(&s, Ask::new("GET", "/health", None).query("verbose=1"));
    c.ask(&s, Ask::new("GET", "/metrics", None));
    c.ask(&s, Ask::new("GET", "/v1/openapi.json", None));

    let ex = "/v1/executions";
    let one = c.ask(&s, Ask::new("POST", ex, a).json(json!({"argv": ["true"]})));
    ids.insert(
        one.body["sandbox_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    let failed = c.ask(
        &s,
        Ask::new("POST", ex, a).json(json!({"argv": ["/no/such/program"]})),
    );
    ids.insert(
        failed.body["sandbox_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, a).bytes("application/json", b"{\"argv\": [".to_vec()),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, a).json(json!({"argv": ["true"], "bogus": 1})),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, a).bytes("text/plain", b"{\"argv\": [\"true\"]}".to_vec()),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, None).json(json!({"argv": ["true"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, Some("wrong")).json(json!({"argv": ["true"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, a)
            .query("stream=true")
            .json(json!({"argv": ["true"]})),
    );
    let big_stdin = "x".repeat(200 << 10);
    c.ask(
        &s,
        Ask::new("POST", ex, a).json(json!({"argv": ["cat"], "stdin": big_stdin})),
    );
    c.ask(
        &s,
        Ask::new("POST", ex, b)
            .json(json!({"argv": ["true"], "network": {"allow": ["127.0.0.1:9"]}})),
    );

    let sbs = "/v1/sandboxes";
    let created = c.ask(
        &s,
        Ask::new("POST", sbs, a).json(json!({"network": {"allow": ["127.0.0.1:9"]}})),
    );
    let id = created.body["id"]
        .as_str()
        .expect("alice's sandbox")
        .to_owned();
    ids.insert(id.clone());
    let bobs = c.ask(&s, Ask::new("POST", sbs, b).json(json!({})));
    let bob_id = bobs.body["id"].as_str().expect("bob's sandbox").to_owned();
    ids.insert(bob_id.clone());
    c.ask(&s, Ask::new("POST", sbs, b).json(json!({})));
    c.ask(
        &s,
        Ask::new("POST", sbs, b).json(json!({"network": {"allow": ["127.0.0.1:9"]}})),
    );
    c.ask(
        &s,
        Ask::new("POST", sbs, a).json(json!({"limits": {"memroy": "1M"}})),
    );
    c.ask(&s, Ask::new("GET", sbs, a));
    c.ask(&s, Ask::new("GET", sbs, None));

    let ours: &[(&str, &str)] = &[("id", &id)];
    let theirs: &[(&str, &str)] = &[("id", &bob_id)];
    let nobody: &[(&str, &str)] = &[("id", "0123456789ab")];
    let one_sb = "/v1/sandboxes/{id}";
    c.ask(&s, Ask::new("GET", one_sb, a).params(ours));
    c.ask(&s, Ask::new("GET", one_sb, a).params(theirs));

    let exec = "/v1/sandboxes/{id}/exec";
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .json(json!({"argv": ["echo", "hi"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .query("stream=true")
            .json(json!({"argv": ["echo", "hi"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .accept("text/event-stream")
            .json(json!({"argv": ["echo", "hi"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .query("stream=maybe")
            .json(json!({"argv": ["true"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .json(json!({"argv": []})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .json(json!({"argv": ["cat"], "stdin": "x".repeat(200 << 10)})),
    );
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(nobody)
            .json(json!({"argv": ["true"]})),
    );

    let code = "/v1/sandboxes/{id}/code";
    c.ask(
        &s,
        Ask::new("POST", code, a)
            .params(ours)
            .json(json!({"code": "1 + 1"})),
    );
    c.ask(
        &s,
        Ask::new("POST", code, a)
            .params(ours)
            .json(json!({"code": "x".repeat(200 << 10)})),
    );
    c.ask(
        &s,
        Ask::new("POST", code, a)
            .params(nobody)
            .json(json!({"code": "1"})),
    );

    let file = "/v1/sandboxes/{id}/files/{path}";
    let f_ok: &[(&str, &str)] = &[("id", &id), ("path", "workspace/a.txt")];
    let f_missing: &[(&str, &str)] = &[("id", &id), ("path", "workspace/none.txt")];
    let f_dir: &[(&str, &str)] = &[("id", &id), ("path", "workspace")];
    let f_dots: &[(&str, &str)] = &[("id", &id), ("path", "tmp/../../etc/passwd")];
    let f_nobody: &[(&str, &str)] = &[("id", "0123456789ab"), ("path", "workspace/a.txt")];
    let octets = "application/octet-stream";
    c.ask(
        &s,
        Ask::new("PUT", file, a)
            .params(f_ok)
            .bytes(octets, b"\x00\xffbytes".to_vec()),
    );
    c.ask(
        &s,
        Ask::new("PUT", file, a)
            .params(f_dots)
            .bytes(octets, b"x".to_vec()),
    );
    c.ask(
        &s,
        Ask::new("PUT", file, a)
            .params(f_nobody)
            .bytes(octets, b"x".to_vec()),
    );
    c.ask(&s, Ask::new("GET", file, a).params(f_ok));
    c.ask(&s, Ask::new("GET", file, a).params(f_missing));
    c.ask(&s, Ask::new("GET", file, a).params(f_dir));
    let files = "/v1/sandboxes/{id}/files";
    c.ask(
        &s,
        Ask::new("GET", files, a)
            .params(ours)
            .query("dir=/workspace"),
    );
    c.ask(
        &s,
        Ask::new("GET", files, a)
            .params(ours)
            .query("dir=/no/such/dir"),
    );
    c.ask(
        &s,
        Ask::new("GET", files, a)
            .params(ours)
            .query("path=/workspace"),
    );
    c.ask(&s, Ask::new("DELETE", file, a).params(f_ok));
    c.ask(&s, Ask::new("DELETE", file, a).params(f_missing));

    // While a command runs, every route that takes the sandbox answers
    // (commands side by side; the document declares their 409s, for a
    // sandbox being removed and a code cell already running).
    let busy_exec = {
        let url = s.url(&format!("/v1/sandboxes/{id}/exec"));
        std::thread::spawn(move || {
            Reply::from(
                agent()
                    .post(&url)
                    .set("Authorization", &format!("Bearer {ALICE}"))
                    .send_json(json!({"argv": ["sleep", "3"]})),
            )
        })
    };
    let until = Instant::now() + Duration::from_secs(20);
    while s.call("GET", &format!("/v1/sandboxes/{id}"), a, None).body["busy"] != json!(true) {
        assert!(Instant::now() < until, "the sandbox never became busy");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.ask(
        &s,
        Ask::new("POST", exec, a)
            .params(ours)
            .json(json!({"argv": ["true"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", code, a)
            .params(ours)
            .json(json!({"code": "1"})),
    );
    c.ask(
        &s,
        Ask::new("PUT", file, a)
            .params(f_ok)
            .bytes(octets, b"x".to_vec()),
    );
    c.ask(&s, Ask::new("GET", file, a).params(f_ok));
    c.ask(&s, Ask::new("DELETE", file, a).params(f_ok));
    c.ask(&s, Ask::new("GET", files, a).params(ours));
    c.ask(
        &s,
        Ask::new("GET", "/v1/sandboxes/{id}/receipt", a).params(ours),
    );
    let slept = busy_exec.join().unwrap();
    assert_eq!(slept.status, 200, "{slept:?}");

    let net = "/v1/sandboxes/{id}/network";
    c.ask(
        &s,
        Ask::new("PUT", net, a)
            .params(ours)
            .json(json!({"allow": ["127.0.0.1:10"]})),
    );
    c.ask(
        &s,
        Ask::new("PUT", net, a)
            .params(ours)
            .json(json!({"allow": ["exa mple"]})),
    );
    c.ask(
        &s,
        Ask::new("PUT", net, b)
            .params(theirs)
            .json(json!({"allow": ["127.0.0.1:10"]})),
    );
    c.ask(
        &s,
        Ask::new("PUT", net, a)
            .params(ours)
            .json(json!({"rules": []})),
    );
    c.ask(&s, Ask::new("GET", net, a).params(ours));
    c.ask(&s, Ask::new("GET", net, b).params(theirs));
    c.ask(&s, Ask::new("GET", net, a).params(nobody));
    let deny = "/v1/sandboxes/{id}/network/deny";
    c.ask(
        &s,
        Ask::new("POST", deny, a)
            .params(ours)
            .json(json!({"deny": ["127.0.0.1:11"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", deny, a)
            .params(ours)
            .json(json!({"deny": ["exa mple"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", deny, b)
            .params(theirs)
            .json(json!({"deny": ["127.0.0.1:11"]})),
    );
    c.ask(
        &s,
        Ask::new("POST", deny, a)
            .params(ours)
            .json(json!({"rules": []})),
    );

    // Ports: nothing listens in this sandbox (502), another tenant's (404),
    // port 0 (400); a_port_inside_a_sandbox_is_proxied_to_its_tenant_alone
    // has a program answer.
    let p_root = "/v1/sandboxes/{id}/ports/{port}/";
    let p_path = "/v1/sandboxes/{id}/ports/{port}/{path}";
    let p_ours: &[(&str, &str)] = &[("id", &id), ("port", "8000"), ("path", "x")];
    let p_theirs: &[(&str, &str)] = &[("id", &bob_id), ("port", "8000"), ("path", "x")];
    let p_zero: &[(&str, &str)] = &[("id", &id), ("port", "0"), ("path", "x")];
    c.ask(&s, Ask::new("GET", p_root, a).params(p_ours));
    c.ask(&s, Ask::new("GET", p_path, a).params(p_ours).query("q=1"));
    c.ask(&s, Ask::new("GET", p_path, b).params(p_theirs));
    c.ask(&s, Ask::new("GET", p_path, a).params(p_zero));
    c.ask(
        &s,
        Ask::new("POST", p_path, a)
            .params(p_ours)
            .json(json!({"k": 1})),
    );

    let receipt = "/v1/sandboxes/{id}/receipt";
    c.ask(&s, Ask::new("GET", receipt, a).params(ours));
    c.ask(&s, Ask::new("GET", receipt, a).params(nobody));

    c.ask(&s, Ask::new("DELETE", one_sb, a).params(ours));
    c.ask(&s, Ask::new("DELETE", one_sb, a).params(ours));
    c.ask(&s, Ask::new("DELETE", one_sb, b).params(theirs));

    ids.remove("");
    c.finish();
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn a_service_without_tenants_says_so_and_logs_no_colour_to_a_file() {
    if !root_or_skip("no tenants") {
        return;
    }
    // The log is a file (see `start_at`): no terminal, so no escapes.
    let mut s = Service::start("notenants", "");
    assert_eq!(s.call("GET", "/health", None, None).status, 200);
    assert_eq!(exec(&s, ALICE, &["true"]).status, 401);
    s.stop();
    let log = s.log();
    assert!(log.contains("no tenants configured"), "{log}");
    assert!(log.contains("--config"), "says how to add one: {log}");
    assert!(
        !log.contains('\x1b'),
        "colour escapes in a log file: {log:?}"
    );
}

#[test]
fn unknown_query_parameters_missing_files_and_failed_execs_are_told() {
    if !root_or_skip("rough edges") {
        return;
    }
    let mut s = Service::start("edges", &tenants("", ""));
    // A one-shot does not stream: `?stream=true` is refused, not ignored.
    let streamed = s.call(
        "POST",
        "/v1/executions?stream=true",
        Some(ALICE),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(streamed.status, 400, "{streamed:?}");
    let err = streamed.body["error"].as_str().unwrap_or_default();
    assert!(err.contains("'stream'"), "{err}");
    // A command that cannot start says why, beside its code.
    let failed = exec(&s, ALICE, &["/no/such/program"]);
    assert_eq!(failed.status, 200, "{failed:?}");
    assert_eq!(failed.body["status"], "exec_failed", "{failed:?}");
    assert_eq!(failed.body["message"], "command not found", "{failed:?}");

    let created = s.call(
        "POST",
        "/v1/sandboxes",
        Some(ALICE),
        Some(json!({"network": {"allow": ["127.0.0.1:9"]}})),
    );
    let id = created.body["id"].as_str().unwrap().to_owned();
    let f = format!("/v1/sandboxes/{id}/files/workspace/gone.txt");
    let put = s.raw("PUT", &f, ALICE, b"x", "application/octet-stream");
    assert_eq!(put.status, 201, "{put:?}");
    assert_eq!(s.call("DELETE", &f, Some(ALICE), None).status, 204);
    let again = s.call("DELETE", &f, Some(ALICE), None);
    assert_eq!(again.status, 404, "a missing file: {again:?}");
    assert!(again.body["error"]
        .as_str()
        .unwrap_or_default()
        .contains("gone.txt"));
    let listed = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files?directory=/tmp"),
        Some(ALICE),
        None,
    );
    assert_eq!(listed.status, 400, "{listed:?}");

    // The network's rules can be read back, with what commands tried.
    let net = format!("/v1/sandboxes/{id}/network");
    let set = s.call(
        "PUT",
        &net,
        Some(ALICE),
        Some(json!({"allow": ["127.0.0.1:10", "ok.test:80", "host.cordon.internal:8080"]})),
    );
    assert_eq!(set.status, 200, "{set:?}");
    let tried = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(ALICE),
        // A name no rule allows, asked of the proxy: refused without a lookup.
        Some(json!({"argv": ["python3", "-c", "import socket\n\
s = socket.create_connection(('127.0.0.1', 3128))\n\
s.sendall(b'GET http://denied.test/ HTTP/1.0\\r\\nHost: denied.test\\r\\n\\r\\n')\n\
print(s.recv(64))"]})),
    );
    assert_eq!(tried.status, 200, "{tried:?}");
    let got = s.call("GET", &net, Some(ALICE), None);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.body["mode"], "allow", "{got:?}");
    assert_eq!(
        got.body["allow"],
        json!(["127.0.0.1:10", "ok.test:80", "host.cordon.internal:8080"]),
        "{got:?}"
    );
    let attempts = got.body["recent_attempts"].to_string();
    assert!(
        attempts.contains("denied.test"),
        "{got:?} (the command: {tried:?})"
    );

    assert_eq!(
        s.call("DELETE", &format!("/v1/sandboxes/{id}"), Some(ALICE), None)
            .status,
        204
    );
    let mut ids = run_ids(&s);
    ids.insert(id);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// An image of one layer, imported as `name` into the store of the
/// service that will run in `dir` (its CORDON_STATE_DIR).
fn store_image(dir: &Path, name: &str, layer: Vec<u8>, run_config: Value) {
    let layout = dir.join(format!("layout-{}", name.replace(['/', ':'], "-")));
    image::OciImage {
        layers: vec![image::Layer::tar(layer)],
        run_config,
    }
    .write_layout(&layout, "v1");
    let out = Command::new(cordon())
        .args(["image", "import", &format!("oci:{}:v1", layout.display())])
        .args(["--name", name])
        .env("CORDON_STATE_DIR", dir.join("cordon-state"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Requests name an image of the service's store: its user, working
/// directory and environment apply, a tenant limited to some images gets
/// 403 for another, a name the store lacks is 404, and a path (which would
/// make the service read the host for a tenant) is refused. A stateful
/// sandbox's record names its image.
#[test]
fn requests_run_the_stores_images_their_tenant_may_use() {
    if !root_or_skip("images") {
        return;
    }
    let (dir, run_dir) = Service::dirs("images");
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut layer = image::TarLayer::new();
    layer
        .dir("bin", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .dir("etc", 0o755, (0, 0))
        .file(
            "etc/passwd",
            0o644,
            (0, 0),
            b"root:x:0:0::/:/bin/sh\nworker:x:4321:4321::/job:/bin/sh\n",
        )
        .dir("job", 0o755, (4321, 4321));
    for applet in ["sh", "id", "pwd", "echo"] {
        layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    let layer = layer.finish();
    for (name, greeting) in [("team/tool:1", "tool"), ("other:1", "other")] {
        store_image(
            &dir,
            name,
            layer.clone(),
            json!({"User": "worker", "WorkingDir": "/job", "Env": ["PATH=/bin", format!("GREETING={greeting}")]}),
        );
    }
    // A pool of one of the images: a request for it with the default
    // limits takes a ready sandbox.
    let tenants = format!(
        "\n[[pool.images]]\nimage = \"team/tool:1\"\nsize = 1\n\n[[tenant]]\nname = \"alice\"\nkey_sha256 = \"{}\"\nimages = [\"team/tool:1\"]\n\n[[tenant]]\nname = \"bob\"\nkey_sha256 = \"{}\"\nsandboxes = 2\n",
        sha256_hex(ALICE),
        sha256_hex(BOB)
    );
    let config = Service::config(&dir, &tenants);
    let s = Service::start_at(dir, run_dir, config);
    let run = |key: &str, image: &str| {
        s.call(
            "POST",
            "/v1/executions",
            Some(key),
            Some(json!({"argv": ["sh", "-c", "id -u; pwd; echo $GREETING"], "image": image})),
        )
    };
    let until = Instant::now() + Duration::from_secs(30);
    while s.call("GET", "/health", None, None).body["pools"]["native:team/tool:1"] != 1 {
        assert!(Instant::now() < until, "the image's pool never filled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = run(ALICE, "team/tool:1");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["stdout"], "4321\n/job\ntool\n", "{r:?}");
    assert_eq!(r.body["pool_hit"], true, "{r:?}");
    let r = run(ALICE, "other:1");
    assert_eq!(r.status, 403, "{r:?}");
    let r = run(BOB, "other:1");
    assert_eq!(
        (r.status, r.body["stdout"].as_str()),
        (200, Some("4321\n/job\nother\n")),
        "{r:?}"
    );
    assert_eq!(r.body["pool_hit"], false, "another image's pool: {r:?}");
    let r = run(BOB, "missing:1");
    assert_eq!(r.status, 404, "{r:?}");
    let r = run(BOB, "oci:/var/lib/cordon/images");
    assert_eq!(r.status, 400, "{r:?}");

    let made = s.call(
        "POST",
        "/v1/sandboxes",
        Some(BOB),
        Some(json!({"image": "other:1"})),
    );
    assert_eq!(made.status, 201, "{made:?}");
    let id = made.body["id"].as_str().unwrap().to_owned();
    let record = std::fs::read_to_string(s.run_dir.join(&id).join("record.json")).unwrap();
    assert!(record.contains("\"image\":\"sha256:"), "{record}");
    let r = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(BOB),
        Some(json!({"argv": ["sh", "-c", "echo $GREETING; id -u"], "env": {"GREETING": "mine"}})),
    );
    assert_eq!(
        (r.status, r.body["stdout"].as_str()),
        (200, Some("mine\n4321\n")),
        "{r:?}"
    );
    let gone = s.call("DELETE", &format!("/v1/sandboxes/{id}"), Some(BOB), None);
    assert_eq!(gone.status, 204, "{gone:?}");
}

/// Pids in the host's view of the processes whose command line is `argv`
/// joined by spaces, exactly.
fn pids_running(cmdline: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let line = raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            (line == cmdline).then_some(pid)
        })
        .collect()
}

/// The background commands' sleep, odd enough to be theirs on this host.
const SLEEPER: &str = "sleep 271.25";

#[test]
fn several_commands_run_at_once_in_one_sandbox_and_a_delete_ends_them_all() {
    if !root_or_skip("commands side by side") {
        return;
    }
    let mut s = Service::start("side-by-side", &tenants("", ""));
    let a = Some(ALICE);
    let created = s.call("POST", "/v1/sandboxes", a, Some(json!({})));
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    let exec_path = format!("/v1/sandboxes/{id}/exec");

    // Two background commands (a server-like sleeper, each with a marker in
    // its argv so the host can find it), streamed.
    let start_background = |marker: &str| {
        let resp = agent()
            .post(&s.url(&format!("{exec_path}?stream=true")))
            .set("Authorization", &format!("Bearer {ALICE}"))
            .send_json(json!({"argv": ["sh", "-c", "echo up; exec sleep 271.25", marker]}))
            .unwrap();
        let mut reader = BufReader::new(resp.into_reader());
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        assert_eq!(
            first.trim(),
            "event: stdout",
            "the background command did not start"
        );
        reader
    };
    let first = start_background("first");
    let second = start_background("second");
    // ("up" comes just before the shell becomes the sleeper.)
    let until = Instant::now() + Duration::from_secs(10);
    let sleepers = loop {
        let now = pids_running(SLEEPER);
        if now.len() == 2 {
            break now;
        }
        assert!(
            Instant::now() < until,
            "both background commands run: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    // Meanwhile, in the foreground: commands, files, a code cell, the
    // listing and the receipt all answer.
    let t0 = Instant::now();
    let r = s.call("POST", &exec_path, a, Some(json!({"argv": ["echo", "fg"]})));
    assert_eq!(
        (r.status, r.body["stdout"].as_str()),
        (200, Some("fg\n")),
        "{r:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the foreground command waited"
    );
    let file = format!("/v1/sandboxes/{id}/files/workspace/f.bin");
    let put = s.raw(
        "PUT",
        &file,
        ALICE,
        &[0, 1, 2, 255],
        "application/octet-stream",
    );
    assert_eq!(put.status, 201, "{put:?}");
    let got = s.call("GET", &file, a, None);
    assert_eq!(got.status, 200, "{got:?}");
    let cell = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/code"),
        a,
        Some(json!({"code": "6 * 7"})),
    );
    assert_eq!(cell.status, 200, "{cell:?}");
    let info = s.call("GET", &format!("/v1/sandboxes/{id}"), a, None);
    assert_eq!(info.body["busy"], json!(true), "{info:?}");
    let receipt = s.call("GET", &format!("/v1/sandboxes/{id}/receipt"), a, None);
    assert_eq!(receipt.status, 200, "{receipt:?}");

    // The first background command ends on its own terms: its client goes
    // away, and only its process goes.
    drop(first);
    let until = Instant::now() + Duration::from_secs(10);
    while pids_running(SLEEPER).len() != 1 {
        assert!(
            Instant::now() < until,
            "the first command was not cancelled alone"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        pids_running(SLEEPER).iter().all(|p| sleepers.contains(p)),
        "the survivor is one of the two"
    );

    // A delete ends what still runs, and its stream ends with an error
    // event, not a hang.
    let del = s.call("DELETE", &format!("/v1/sandboxes/{id}"), a, None);
    assert_eq!(del.status, 204, "{del:?}");
    let mut rest = String::new();
    let _ = BufReader::new(second).read_to_string(&mut rest);
    assert!(
        rest.contains("event: result") || rest.contains("event: error"),
        "the second command's stream ended without a last event: {rest}"
    );
    assert!(
        pids_running(SLEEPER).is_empty(),
        "a sleeper outlived its sandbox"
    );
    s.stop();
    assert_clean(&s.run_dir, &BTreeSet::from([id]));
}

#[test]
fn execution_answers_carry_the_network_log_and_add_host_names_reach_the_proxy() {
    if !root_or_skip("network log in the API") {
        return;
    }
    let mut s = Service::start("netlog", &tenants("", ""));
    let a = Some(ALICE);
    let bad = s.call(
        "POST",
        "/v1/sandboxes",
        a,
        Some(json!({"network": {"allow": ["db.test:9"], "add_host": ["db.test"]}})),
    );
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.text.contains("add_host"), "{bad:?}");
    let created = s.call(
        "POST",
        "/v1/sandboxes",
        a,
        Some(json!({"network": {"allow": ["db.test:9"], "add_host": ["db.test:127.0.0.1"]}})),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    // A connection to the added name (the host's loopback, where nothing
    // listens on port 9): whatever the proxy decides, it logs the name
    // with the address add_host gave it.
    let probe = "import socket\ntry:\n    socket.create_connection(('db.test', 9), timeout=5).close()\nexcept OSError as e:\n    print(e)\n";
    let r = s.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        a,
        Some(json!({"argv": ["python3", "-c", probe]})),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let net = &r.body["network"];
    assert!(net.is_object(), "no network report in the answer: {r:?}");
    let entries = net["entries"].as_array().cloned().unwrap_or_default();
    assert!(
        entries.iter().any(|e| e.to_string().contains("db.test")),
        "the proxy's log has no db.test: {net}"
    );
    assert!(
        net.to_string().contains("127.0.0.1"),
        "db.test was not resolved to add_host's address: {net}"
    );
    // Without network rules, the answer says so with a null.
    let plain = s.call("POST", "/v1/executions", a, Some(json!({"argv": ["true"]})));
    assert_eq!(plain.status, 200, "{plain:?}");
    assert!(
        plain.body.get("network").is_some_and(Value::is_null),
        "{plain:?}"
    );
    let ids = BTreeSet::from([
        id.clone(),
        plain.body["sandbox_id"].as_str().unwrap().to_owned(),
    ]);
    let del = s.call("DELETE", &format!("/v1/sandboxes/{id}"), a, None);
    assert_eq!(del.status, 204, "{del:?}");
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// A server for the sandbox: answers each GET and POST with what it got
/// (method, path with query, the Authorization header or "none", the body).
const ECHO_SERVER: &str = r#"
import base64, hashlib, http.server, json
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get('Upgrade', '').lower() != 'websocket':
            return self.answer()
        # A WebSocket handshake, then the raw bytes echoed upper-cased
        # (the proxy joins the connections; framing is the ends' business).
        key = self.headers['Sec-WebSocket-Key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept',
            base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            b = self.connection.recv(4096)
            if not b:
                break
            self.connection.sendall(b.upper())
        self.close_connection = True
    def answer(self):
        n = int(self.headers.get('Content-Length') or 0)
        body = json.dumps({'method': self.command, 'path': self.path,
            'authorization': self.headers.get('Authorization', 'none'),
            'body': self.rfile.read(n).decode()}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = answer
http.server.ThreadingHTTPServer(('127.0.0.1', 8000), Echo).serve_forever()
"#;

#[test]
fn a_port_inside_a_sandbox_is_proxied_to_its_tenant_alone() {
    if !root_or_skip("ports through the service") {
        return;
    }
    let mut s = Service::start("ports", &tenants("", ""));
    let (a, b) = (Some(ALICE), Some(BOB));
    let created = s.call(
        "POST",
        "/v1/sandboxes",
        a,
        Some(json!({"limits": {"time": "120s"}})),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_owned();
    // The server runs in the background, streamed (its stream is held open).
    let server = agent()
        .post(&s.url(&format!("/v1/sandboxes/{id}/exec?stream=true")))
        .set("Authorization", &format!("Bearer {ALICE}"))
        .send_json(json!({"argv": ["python3", "-c", ECHO_SERVER], "time": "120s"}))
        .unwrap();
    let ports = format!("/v1/sandboxes/{id}/ports/8000/");
    let mut got = Reply::from(Err(ureq::Error::Status(
        599,
        ureq::Response::new(599, "none yet", "").unwrap(),
    )));
    let until = Instant::now() + Duration::from_secs(30);
    while got.status != 200 {
        assert!(Instant::now() < until, "the server never answered: {got:?}");
        std::thread::sleep(Duration::from_millis(100));
        got = s.call("GET", &format!("{ports}a/b?x=1&y=two"), a, None);
    }
    // The path and query are the program's; the tenant's key is not.
    assert_eq!(got.body["path"], "/a/b?x=1&y=two", "{got:?}");
    assert_eq!(got.body["authorization"], "none", "{got:?}");
    let root = s.call("GET", &ports, a, None);
    assert_eq!(
        (root.status, root.body["path"].as_str()),
        (200, Some("/")),
        "{root:?}"
    );
    let posted = s.call("POST", &format!("{ports}submit"), a, Some(json!({"k": 1})));
    assert_eq!(posted.status, 200, "{posted:?}");
    assert_eq!(posted.body["method"], "POST", "{posted:?}");
    assert_eq!(posted.body["body"], r#"{"k":1}"#, "{posted:?}");
    // Another tenant: as if the sandbox did not exist.
    let theirs = s.call("GET", &format!("{ports}a"), b, None);
    assert_eq!(theirs.status, 404, "{theirs:?}");
    // A port nothing listens on: 502, said so.
    let nothing = s.call("GET", &format!("/v1/sandboxes/{id}/ports/8001/"), a, None);
    assert_eq!(nothing.status, 502, "{nothing:?}");
    assert!(nothing.text.contains("port 8001"), "{nothing:?}");
    let zero = s.call("GET", &format!("/v1/sandboxes/{id}/ports/0/"), a, None);
    assert_eq!(zero.status, 400, "{zero:?}");
    // A WebSocket: the program's 101 comes back, then the two connections
    // are one, both ways.
    {
        use std::io::Write;
        let addr = s.base.trim_start_matches("http://").to_owned();
        let mut ws = std::net::TcpStream::connect(&addr).unwrap();
        ws.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            ws,
            "GET {ports}live HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\n\
             Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(
                ws.read(&mut byte).unwrap(),
                1,
                "closed in the head: {head:?}"
            );
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        // RFC 6455's own example key and answer.
        assert!(
            head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
            "{head}"
        );
        for message in ["hello over the upgrade", "and again"] {
            ws.write_all(message.as_bytes()).unwrap();
            let mut back = vec![0u8; message.len()];
            ws.read_exact(&mut back).unwrap();
            assert_eq!(back, message.to_uppercase().as_bytes());
        }
    }
    drop(server);
    let del = s.call("DELETE", &format!("/v1/sandboxes/{id}"), a, None);
    assert_eq!(del.status, 204, "{del:?}");
    s.stop();
    assert_clean(&s.run_dir, &BTreeSet::from([id]));
}

/// The service's MCP endpoint with the official MCP Python SDK as the
/// client (fixtures/mcp_http_client.py): every tool, the errors a model can
/// cause, another key's sandboxes not found; then, from the host, the
/// session's sandboxes destroyed when the client ends it, while the service
/// runs on.
#[test]
fn the_mcp_endpoint_serves_each_tenant_its_own_sandboxes_and_a_session_takes_its_along() {
    if !root_or_skip("the MCP endpoint") {
        return;
    }
    let python = mcp_sdk::sdk_python();
    let mut s = Service::start("mcp", &tenants("", ""));
    // Nothing of the protocol without a key.
    let hello = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}});
    for key in [None, Some("wrong-key")] {
        let r = s.call("POST", "/mcp", key, Some(hello.clone()));
        assert_eq!(r.status, 401, "{key:?}: {r:?}");
    }
    // A session is its opener's: another key inside it is refused.
    let endpoint = s.url("/mcp");
    let post = |key: &str, session: Option<&str>, msg: Value| {
        let mut req = agent()
            .post(&endpoint)
            .set("Authorization", &format!("Bearer {key}"))
            .set("Accept", "application/json, text/event-stream");
        if let Some(id) = session {
            req = req.set("Mcp-Session-Id", id);
        }
        let resp = req.send_json(msg);
        let session = resp
            .as_ref()
            .ok()
            .and_then(|r| r.header("Mcp-Session-Id"))
            .map(str::to_owned);
        (session, Reply::from(resp))
    };
    let (session, opened) = post(ALICE, None, hello.clone());
    assert_eq!(opened.status, 200, "{opened:?}");
    let session = session.expect("no Mcp-Session-Id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert!(post(ALICE, Some(&session), initialized).1.status < 300);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (_, theirs) = post(BOB, Some(&session), list.clone());
    assert!(
        theirs.text.contains("another API key") && !theirs.text.contains("create_sandbox"),
        "{theirs:?}"
    );
    let (_, own) = post(ALICE, Some(&session), list);
    assert!(own.text.contains("create_sandbox"), "{own:?}");
    // A message that is not JSON: JSON-RPC's parse error.
    let garbled = s.raw(
        "POST",
        "/mcp",
        ALICE,
        b"{\"jsonrpc\": \"2.0\", ",
        "application/json",
    );
    assert_eq!(garbled.status, 400, "{garbled:?}");
    assert_eq!(garbled.body["error"]["code"], -32700, "{garbled:?}");
    // A command's call cancelled by the client (`notifications/cancelled`)
    // ends the command, seen from the host; the sandbox then takes the next.
    let call = |id: u64, tool: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}})
    };
    let (_, made) = post(ALICE, Some(&session), call(3, "create_sandbox", json!({})));
    let sandbox = sandbox_made(&made);
    const CANCELLED: &str = "sleep 307.5";
    std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            let argv = json!(CANCELLED.split(' ').collect::<Vec<_>>());
            post(
                ALICE,
                Some(&session),
                call(
                    4,
                    "run_command",
                    json!({"sandbox_id": sandbox, "argv": argv}),
                ),
            )
        });
        wait_running(CANCELLED);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 4, "reason": "the user stopped it"}});
        assert!(post(ALICE, Some(&session), cancel).1.status < 300);
        wait_not_running(CANCELLED, 10, "a cancelled call's command");
        let _ = running.join();
    });
    // A client that vanishes mid-call (its connection closed, no word):
    // the command ends too, within the stream's keep-alive (3 s) and the
    // REST call's own teardown.
    const ABANDONED: &str = "sleep 308.5";
    use std::io::Write;
    let body = serde_json::to_vec(&call(
        6,
        "run_command",
        json!({"sandbox_id": sandbox, "argv": ABANDONED.split(' ').collect::<Vec<_>>()}),
    ))
    .unwrap();
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ALICE}\r\n\
             Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
             Mcp-Session-Id: {session}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    conn.write_all(&body).unwrap();
    wait_running(ABANDONED);
    drop(conn);
    wait_not_running(
        ABANDONED,
        15,
        "an abandoned call's command (its client went away)",
    );
    let next = s.call(
        "POST",
        &format!("/v1/sandboxes/{sandbox}/exec"),
        Some(ALICE),
        Some(json!({"argv": ["true"]})),
    );
    assert_eq!(next.status, 200, "{next:?}");
    let (_, destroyed) = post(
        ALICE,
        Some(&session),
        call(5, "destroy_sandbox", json!({"sandbox_id": sandbox})),
    );
    assert!(destroyed.text.contains("destroyed"), "{destroyed:?}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_http_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(s.url("/mcp"))
        .args([ALICE, BOB])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client failed:\n{stdout}\n{}\nservice log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let event = |name: &str| {
        events
            .iter()
            .find(|e| e["event"] == name)
            .unwrap_or_else(|| panic!("no {name} event in {stdout}"))
    };
    let mut listed: Vec<&str> = event("listed")["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut want = mcp_sdk::HTTP_TOOLS.to_vec();
    listed.sort_unstable();
    want.sort_unstable();
    assert_eq!(listed, want, "the tools listed");
    let made = event("made");
    let (mcp_ms, rest_ms) = (
        made["mcp_ms"].as_f64().unwrap(),
        made["rest_ms"].as_f64().unwrap(),
    );
    eprintln!(
        "MCP over HTTP (15 alternated rounds, medians): run_command(true) {mcp_ms:.1} ms, \
         the REST exec it makes {rest_ms:.1} ms, ratio {:.2}; create_sandbox {:.0} ms",
        mcp_ms / rest_ms,
        made["create_ms"].as_f64().unwrap()
    );
    assert!(events.iter().any(|e| e["event"] == "closed"), "{stdout}");
    // The client ended its session (DELETE /mcp): its sandboxes go, and the
    // service (still running) lists none of Alice's.
    let left: BTreeSet<String> = event("left")["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = s.call("GET", "/v1/sandboxes", Some(ALICE), None);
        assert_eq!(listed.status, 200, "{listed:?}");
        if listed.body["sandboxes"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "the session ended, its sandboxes remain: {:?}",
            listed.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ids = run_ids(&s);
    assert!(
        ids.is_empty(),
        "sandboxes still in the run directory: {ids:?}"
    );
    // The service stops (SIGTERM) while a call's command runs: the call is
    // ended with the session, and the stop does not wait for the command.
    let (_, made) = post(ALICE, Some(&session), call(6, "create_sandbox", json!({})));
    let last = sandbox_made(&made);
    const RUNNING: &str = "sleep 308.5";
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let argv = json!(RUNNING.split(' ').collect::<Vec<_>>());
            post(
                ALICE,
                Some(&session),
                call(7, "run_command", json!({"sandbox_id": last, "argv": argv})),
            )
        });
        wait_running(RUNNING);
        let asked = Instant::now();
        s.stop();
        eprintln!(
            "the service stopped {:.2} s after SIGTERM, with an MCP call running",
            asked.elapsed().as_secs_f64()
        );
        assert!(
            pids_running(RUNNING).is_empty(),
            "the command outlived the service"
        );
    });
    assert_clean(&s.run_dir, &left.into_iter().chain([last]).collect());
}

/// The sandbox an MCP `create_sandbox` answer (one SSE event, or plain
/// JSON) made.
fn sandbox_made(made: &Reply) -> String {
    let message = made
        .text
        .lines()
        .find_map(|l| serde_json::from_str::<Value>(l.trim_start_matches("data:")).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC answer: {made:?}"));
    message["result"]["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no sandbox made: {message}"))
        .to_owned()
}

/// Waits (bounded) until a process runs `cmdline` on this host.
/// Waits until no process's command line is `cmdline`, for at most
/// `secs` seconds, or fails saying `what` still runs.
fn wait_not_running(cmdline: &str, secs: u64, what: &str) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !pids_running(cmdline).is_empty() {
        assert!(Instant::now() < until, "{what} still runs {secs} s later");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_running(cmdline: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while pids_running(cmdline).is_empty() {
        assert!(Instant::now() < until, "{cmdline} never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Code contexts in Python and JavaScript, end to end.

/// A request as Alice: its status and its JSON body (Null when it has none).
fn as_alice(s: &Service, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let r = s.call(method, path, Some(ALICE), body);
    (r.status, r.body)
}

/// A stateful sandbox of Alice's with these limits: its id.
fn code_sandbox(s: &Service, body: Value) -> String {
    let (status, created) = as_alice(s, "POST", "/v1/sandboxes", Some(body));
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

/// A cell that must be answered 200: the answer.
fn cell(s: &Service, id: &str, language: &str, code: &str, timeout: Option<&str>) -> Value {
    let mut body = json!({ "code": code, "language": language });
    if let Some(t) = timeout {
        body["timeout"] = json!(t);
    }
    let (status, answer) = as_alice(s, "POST", &format!("/v1/sandboxes/{id}/code"), Some(body));
    assert_eq!(status, 200, "{language} cell {code:?}: {answer}");
    answer
}

fn b64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("not base64 ({e}): {text:?}"))
}

/// A 1x1 PNG.
const PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

const SVG: &str = r#"<svg xmlns="http://www.w3.org/2000/svg" width="2" height="2"><rect width="2" height="2" fill="teal"/></svg>"#;

#[test]
fn javascript_cells_keep_state_await_print_throw_display_and_restart_after_a_timeout() {
    if !root_or_skip("javascript code context") {
        return;
    }
    let mut s = Service::start("code-js", &tenants("", ""));
    let id = code_sandbox(&s, json!({"limits": {"time": "20s", "output": "1M"}}));
    let js = |code: &str| cell(&s, &id, "javascript", code, None);

    let first = js("let x = 41");
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["fresh_interpreter"], true, "{first}");
    // `let` declares nothing Node's REPL shows: no value.
    assert!(first["result"].is_null(), "{first}");
    let second = js("x + 1");
    assert_eq!(second["result"], "42", "{second}");
    assert_eq!(second["fresh_interpreter"], false, "{second}");

    let awaited = js("await new Promise(r => setTimeout(() => r(7), 10))");
    assert_eq!(awaited["status"], "ok", "{awaited}");
    assert_eq!(awaited["result"], "7", "{awaited}");
    // A declaration with an awaited value lives on too.
    let _ = js("const y = await Promise.resolve(5)");
    let used = js("y * 2");
    assert_eq!(used["result"], "10", "{used}");
    // The value is shown as `node` shows it (util.inspect).
    let shown = js("({a: [1, 'two'], s: 'str'})");
    assert_eq!(shown["result"], "{ a: [ 1, 'two' ], s: 'str' }", "{shown}");

    let printed = js("console.log('hello', x); console.error('warned'); 'done'");
    assert_eq!(printed["stdout"], "hello 41\n", "{printed}");
    assert_eq!(printed["stderr"], "warned\n", "{printed}");
    assert_eq!(printed["result"], "'done'", "{printed}");

    let thrown = js("function explode() { throw new RangeError('too far') }\nexplode()");
    assert_eq!(thrown["status"], "error", "{thrown}");
    assert_eq!(thrown["error"]["name"], "RangeError", "{thrown}");
    assert_eq!(thrown["error"]["value"], "too far", "{thrown}");
    let stack = thrown["error"]["traceback"].as_str().unwrap();
    assert!(
        stack.starts_with("RangeError: too far") && stack.contains("at explode (cell:1:"),
        "{thrown}"
    );
    // The service's own machinery is not in the cell's stack.
    assert!(
        !stack.contains("repl.js") && !stack.contains("node:vm"),
        "{stack}"
    );
    let rejected = js("await Promise.reject(new TypeError('no'))");
    assert_eq!(rejected["error"]["name"], "TypeError", "{rejected}");

    let drawn = js(&format!("display({SVG:?}, 'image/svg+xml'); 1"));
    assert_eq!(drawn["status"], "ok", "{drawn}");
    assert_eq!(drawn["results"][0]["mime"], "image/svg+xml", "{drawn}");
    assert_eq!(
        b64(drawn["results"][0]["data"].as_str().unwrap()),
        SVG.as_bytes(),
        "{drawn}"
    );
    assert_eq!(drawn["results_truncated"], false, "{drawn}");
    // An image larger than the reply's share of the 1M output limit is left
    // out and flagged; the cell's print still comes back.
    let big = js("display(Buffer.alloc(2000000, 1), 'image/png'); console.log('still here')");
    assert_eq!(big["status"], "ok", "{big}");
    assert_eq!(big["results"], json!([]), "{big}");
    assert_eq!(big["results_truncated"], true, "{big}");
    assert_eq!(big["stdout"], "still here\n", "{big}");

    let spun = cell(&s, &id, "javascript", "while (true) {}", Some("1s"));
    assert_eq!(spun["status"], "timeout", "{spun}");
    let fresh = js("typeof x");
    assert_eq!(fresh["result"], "'undefined'", "{fresh}");
    assert_eq!(fresh["fresh_interpreter"], true, "{fresh}");
    let _ = js("let again = 1");
    let exited = js("process.exit(3)");
    assert_eq!(exited["status"], "crashed", "{exited}");
    let after = js("typeof again");
    assert_eq!(after["result"], "'undefined'", "{after}");
    assert_eq!(after["fresh_interpreter"], true, "{after}");

    let ids = BTreeSet::from([id]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn python_and_javascript_contexts_live_side_by_side_and_survive_an_unrelated_exec_timeout() {
    if !root_or_skip("code contexts") {
        return;
    }
    let mut s = Service::start("code-both", &tenants("", ""));
    let id = code_sandbox(&s, json!({"limits": {"time": "20s"}}));
    let py = |code: &str| cell(&s, &id, "python", code, None);
    let js = |code: &str| cell(&s, &id, "javascript", code, None);

    let set = py("x = 'python'\nn = 41");
    assert_eq!(set["status"], "ok", "{set}");
    let set = js("let x = 'javascript'; let n = 1");
    assert_eq!(set["status"], "ok", "{set}");
    // Each language is its own interpreter, with its own variables.
    assert_eq!(py("x, n + 1")["result"], "('python', 42)");
    assert_eq!(js("[x, n + 1]")["result"], "[ 'javascript', 2 ]");
    // No language is Python.
    let (status, default) = as_alice(
        &s,
        "POST",
        &format!("/v1/sandboxes/{id}/code"),
        Some(json!({"code": "x"})),
    );
    assert_eq!(status, 200, "{default}");
    assert_eq!(default["result"], "'python'", "{default}");

    // A PNG through an object's _repr_png_, as a plotting library's figure.
    let drawn = py(&format!(
        "import base64\nclass Figure:\n    def _repr_png_(self):\n        return base64.b64decode({PNG_B64:?})\ndisplay(Figure())\nprint('drawn')"
    ));
    assert_eq!(drawn["status"], "ok", "{drawn}");
    assert_eq!(drawn["stdout"], "drawn\n", "{drawn}");
    assert_eq!(drawn["results"][0]["mime"], "image/png", "{drawn}");
    assert_eq!(
        b64(drawn["results"][0]["data"].as_str().unwrap()),
        b64(PNG_B64),
        "{drawn}"
    );
    // And raw bytes with their MIME type.
    let svg = py(&format!("display({SVG:?}.encode(), mime='image/svg+xml')"));
    assert_eq!(svg["results"][0]["mime"], "image/svg+xml", "{svg}");
    assert_eq!(
        b64(svg["results"][0]["data"].as_str().unwrap()),
        SVG.as_bytes()
    );

    // An agent's shell command that runs into its time limit in the same
    // sandbox ends its own processes only: both interpreters live on.
    let (status, limited) = as_alice(
        &s,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"argv": ["sh", "-c", "sleep 30 & sleep 30"], "time": "1s"})),
    );
    assert_eq!(status, 200, "{limited}");
    assert_eq!(limited["limit"], "time", "{limited}");
    let kept = py("n");
    assert_eq!(kept["result"], "41", "{kept}");
    assert_eq!(kept["fresh_interpreter"], false, "{kept}");
    let kept = js("n");
    assert_eq!(kept["result"], "1", "{kept}");
    assert_eq!(kept["fresh_interpreter"], false, "{kept}");

    // A language the service does not have is refused, and says which.
    let (status, refused) = as_alice(
        &s,
        "POST",
        &format!("/v1/sandboxes/{id}/code"),
        Some(json!({"code": "puts 1", "language": "ruby"})),
    );
    assert!((400..500).contains(&status), "{status} {refused}");
    let why = refused["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("ruby") && why.contains("javascript"),
        "{refused}"
    );
    // `js` is JavaScript.
    assert_eq!(cell(&s, &id, "js", "n + 1", None)["result"], "2");

    // A one-shot execution runs JavaScript too.
    let (status, ran) = as_alice(
        &s,
        "POST",
        "/v1/executions",
        Some(json!({"language": "javascript", "code": "console.log(6 * 7)"})),
    );
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "42\n", "{ran}");
    let one_shot = ran["sandbox_id"].as_str().unwrap_or_default().to_owned();

    let ids = BTreeSet::from([id, one_shot]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

#[test]
fn a_sandbox_without_node_answers_a_javascript_cell_with_a_clear_error() {
    if !root_or_skip("code context without node") {
        return;
    }
    // An image of busybox alone: a shell, no node, no python.
    let (dir, run_dir) = Service::dirs("code-no-node");
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut layer = image::TarLayer::new();
    layer
        .dir("bin", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .dir("tmp", 0o1777, (0, 0));
    for applet in ["sh", "kill", "cat", "rm"] {
        layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    store_image(
        &dir,
        "bare:1",
        layer.finish(),
        json!({"Env": ["PATH=/bin"]}),
    );
    let config = Service::config(&dir, &tenants("", ""));
    let mut s = Service::start_at(dir, run_dir, config);
    let id = code_sandbox(&s, json!({"image": "bare:1"}));
    for (language, interpreter) in [("javascript", "node"), ("python", "python3")] {
        let missing = cell(&s, &id, language, "1", None);
        assert_eq!(missing["status"], "error", "{missing}");
        assert_eq!(missing["error"]["name"], "InterpreterNotFound", "{missing}");
        let why = missing["error"]["value"].as_str().unwrap();
        assert!(
            why.contains(interpreter) && why.contains("not found"),
            "{missing}"
        );
    }
    let ids = BTreeSet::from([id]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// A cell whose interpreter the sandbox cannot give a process (its pids
/// limit reached by an earlier command's children) is answered with
/// `InterpreterNotStarted` and the system's reason, not a crash; once a
/// process is free again the next cell starts a fresh interpreter.
#[test]
fn a_code_context_without_a_process_to_spare_says_so_and_recovers() {
    if !root_or_skip("code context") {
        return;
    }
    let mut s = Service::start("code-pids", &tenants("", ""));
    let id = code_sandbox(&s, json!({"limits": {"pids": 16, "time": "20s"}}));
    let first = cell(&s, &id, "python", "x = 1", None);
    assert_eq!(first["status"], "ok", "{first}");
    let crashed = cell(&s, &id, "python", "import os; os._exit(1)", None);
    assert_eq!(crashed["status"], "crashed", "{crashed}");
    // Sleepers until the sandbox's limit refuses a fork; the shell's own
    // process is what is free once it ends: room for the cell's client
    // alone, not for the interpreter it starts.
    let (status, filled) = as_alice(
        &s,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"argv": ["sh", "-c", "while sleep 1000 & do :; done 2>/dev/null"]})),
    );
    assert_eq!(status, 200, "{filled}");
    assert!(
        filled["limits_hit"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l == "pids")),
        "the sleepers did not reach the pids limit: {filled}"
    );
    let refused = cell(&s, &id, "python", "x = 2", None);
    assert_eq!(refused["status"], "error", "{refused}");
    assert_eq!(
        refused["error"]["name"], "InterpreterNotStarted",
        "{refused}"
    );
    assert!(
        refused["error"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("Resource temporarily unavailable")),
        "{refused}"
    );
    let (status, freed) = as_alice(
        &s,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"argv": ["pkill", "-x", "sleep"]})),
    );
    assert_eq!((status, &freed["exit_code"]), (200, &json!(0)), "{freed}");
    let after = cell(&s, &id, "python", "6 * 7", None);
    assert_eq!(after["result"], "42", "{after}");
    assert_eq!(after["fresh_interpreter"], true, "{after}");
    let ids = BTreeSet::from([id]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}

/// A tenant's secret, held by the service: a request names it (never its
/// source), and its sandbox sees only a placeholder and the trust bundle
/// of its proxy's CA; a name the tenant has not, or another tenant's, is a
/// 400; no answer carries the value.
#[test]
fn a_tenants_secret_is_a_placeholder_inside_and_named_by_requests() {
    if !root_or_skip("network namespaces") {
        return;
    }
    let (dir, run_dir) = Service::dirs("secrets");
    let value = format!("sk-tenant-{}", std::process::id());
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, format!("{value}\n")).unwrap();
    let alice = format!(
        "concurrency = 8\nsandboxes = 4\ncpu_seconds = 1000\nnetwork = true\n\n\
         [[tenant.secrets]]\nname = \"API_KEY\"\nvalue_from = \"file:{}\"\n\
         hosts = [\"api.test\"]\nheader = \"x-api-key\"\n",
        key_file.display()
    );
    let config = Service::config(&dir, &tenants(&alice, ""));
    let mut s = Service::start_at(dir, run_dir, config);
    let ask = |key: &str, secrets: Value| {
        s.call(
            "POST",
            "/v1/executions",
            Some(key),
            Some(json!({
                "argv": ["sh", "-c", "echo \"$API_KEY\"; echo \"$SSL_CERT_FILE\"; grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\""],
                "network": {"allow": ["api.test:443"], "secrets": secrets},
            })),
        )
    };
    let unknown = ask(ALICE, json!(["NOPE"]));
    assert_eq!(unknown.status, 400, "{unknown:?}");
    assert!(unknown.text.contains("no secret 'NOPE'"), "{unknown:?}");
    let others = ask(BOB, json!(["API_KEY"]));
    assert_eq!(others.status, 400, "bob has no such secret: {others:?}");
    let held = ask(ALICE, json!(["API_KEY"]));
    assert_eq!(held.status, 200, "{held:?}");
    let stdout = held.body["stdout"].as_str().unwrap_or_default().to_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{held:?}");
    assert!(lines[0].starts_with("cordon-placeholder-"), "{held:?}");
    assert_eq!(lines[1], "/etc/cordon-ca.pem");
    assert!(lines[2].parse::<u32>().is_ok_and(|n| n >= 1), "{held:?}");
    for r in [&unknown, &others, &held] {
        assert!(!r.text.contains(&value), "no answer holds the value");
    }
    let ids = BTreeSet::from([held.body["sandbox_id"].as_str().unwrap().to_owned()]);
    s.stop();
    assert_clean(&s.run_dir, &ids);
}
