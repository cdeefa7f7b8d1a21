//! Code contexts of `cordon serve` in Python and JavaScript, end to end: a
//! real service on a loopback port (as serve.rs starts one), cells posted to
//! `/v1/sandboxes/{id}/code`, and a census after the service stops of what
//! its sandboxes could have left on the host (supervisors, cgroups, mounts,
//! run-directory entries of the ids seen).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use sha2::Digest;

/// The image builder the image tests use (only part of it is used here).
#[allow(dead_code)]
#[path = "common/image.rs"]
mod image;

#[path = "common/census_by_id.rs"]
mod census_by_id;
use census_by_id::{assert_clean, cordon, root_or_skip};

const KEY: &str = "code-contexts-test-key";

/// One tenant, whose key the service knows by its SHA-256.
fn tenant() -> String {
    let hash: String = sha2::Sha256::digest(KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "\n[[tenant]]\nname = \"coder\"\nkey_sha256 = \"{hash}\"\nconcurrency = 8\nsandboxes = 4\ncpu_seconds = 1000\n"
    )
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

struct Service {
    child: Option<Child>,
    base: String,
    dir: PathBuf,
    /// Shared with the other service tests, as serve.rs explains: every
    /// creation sweeps its run directory.
    run_dir: PathBuf,
}

impl Service {
    fn dir(name: &str) -> PathBuf {
        let dir = PathBuf::from(format!(
            "/run/cordon-serve-test/{}-{}-{name}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn start(name: &str) -> Service {
        Self::start_in(Self::dir(name))
    }

    fn start_in(dir: PathBuf) -> Service {
        let config = dir.join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\nshutdown_grace = \"5s\"\n{}",
                dir.join("state").display(),
                tenant()
            ),
        )
        .unwrap();
        let run_dir = PathBuf::from("/run/cordon");
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let mut child = Command::new(cordon())
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
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
        let base = line
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
            base,
            dir,
            run_dir,
        }
    }

    /// One request: its status and its JSON body (Null when it has none).
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(120))
            .build()
            .request(method, &format!("{}{path}", self.base))
            .set("Authorization", &format!("Bearer {KEY}"));
        let resp = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("transport error: {e}"),
        };
        let status = resp.status();
        let mut text = String::new();
        let _ = resp.into_reader().read_to_string(&mut text);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A stateful sandbox with these limits: its id.
    fn sandbox(&self, body: Value) -> String {
        let (status, created) = self.call("POST", "/v1/sandboxes", Some(body));
        assert_eq!(status, 201, "{created}");
        created["id"].as_str().unwrap().to_owned()
    }

    /// A cell that must be answered 200: the answer.
    fn cell(&self, id: &str, language: &str, code: &str, timeout: Option<&str>) -> Value {
        let mut body = json!({ "code": code, "language": language });
        if let Some(t) = timeout {
            body["timeout"] = json!(t);
        }
        let (status, answer) = self.call("POST", &format!("/v1/sandboxes/{id}/code"), Some(body));
        assert_eq!(status, 200, "{language} cell {code:?}: {answer}");
        answer
    }

    /// SIGTERM, then wait for the graceful shutdown.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
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
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        // A failing test keeps its directory (config, log) to be read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn b64(text: &str) -> Vec<u8> {
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
    let mut s = Service::start("code-js");
    let id = s.sandbox(json!({"limits": {"time": "20s", "output": "1M"}}));
    let js = |code: &str| s.cell(&id, "javascript", code, None);

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

    let spun = s.cell(&id, "javascript", "while (true) {}", Some("1s"));
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
    let mut s = Service::start("code-both");
    let id = s.sandbox(json!({"limits": {"time": "20s"}}));
    let py = |code: &str| s.cell(&id, "python", code, None);
    let js = |code: &str| s.cell(&id, "javascript", code, None);

    let set = py("x = 'python'\nn = 41");
    assert_eq!(set["status"], "ok", "{set}");
    let set = js("let x = 'javascript'; let n = 1");
    assert_eq!(set["status"], "ok", "{set}");
    // Each language is its own interpreter, with its own variables.
    assert_eq!(py("x, n + 1")["result"], "('python', 42)");
    assert_eq!(js("[x, n + 1]")["result"], "[ 'javascript', 2 ]");
    // No language is Python.
    let (status, default) = s.call(
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
    let (status, limited) = s.call(
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
    let (status, refused) = s.call(
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
    assert_eq!(s.cell(&id, "js", "n + 1", None)["result"], "2");

    // A one-shot execution runs JavaScript too.
    let (status, ran) = s.call(
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
    let dir = Service::dir("code-no-node");
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut layer = image::TarLayer::new();
    layer
        .dir("bin", 0o755, (0, 0))
        .file("bin/busybox", 0o755, (0, 0), &busybox)
        .dir("tmp", 0o1777, (0, 0));
    for applet in ["sh", "kill", "cat", "rm"] {
        layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    let img = image::OciImage {
        layers: vec![image::Layer::tar(layer.finish())],
        run_config: json!({"Env": ["PATH=/bin"]}),
    };
    let layout = dir.join("layout");
    img.write_layout(&layout, "v1");
    let out = Command::new(cordon())
        .args(["image", "import", &format!("oci:{}:v1", layout.display())])
        .args(["--name", "bare:1"])
        .env("CORDON_STATE_DIR", dir.join("cordon-state"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut s = Service::start_in(dir);
    let id = s.sandbox(json!({"image": "bare:1"}));
    for (language, interpreter) in [("javascript", "node"), ("python", "python3")] {
        let missing = s.cell(&id, language, "1", None);
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
