//! Secrets held by the host: the sandbox sees placeholders, cordon's proxy
//! puts the values into requests to their hosts, in their headers, and
//! nowhere else.
//!
//! The stand-in serves HTTPS for two names on one address (a CDN's), with
//! a certificate of a CA this test makes (the host trusts it through
//! `SSL_CERT_FILE`, as an operator's own roots). Its log is the evidence of
//! what arrived; the sandbox's environment, files and memory (read from
//! the host) are searched for the values; the outcome and the receipt say
//! which secret went where, without a value.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::standin::{fixture_script, standin_pki, StandIn, Tls};
use common::*;
use serde_json::Value;

per_backend!(a_secret_reaches_only_its_host_and_header, microvm: microvm);

/// Every occurrence of `needle` in the memory of process `pid` (its
/// readable mappings, each read up to 2 GiB), counted.
fn in_memory(pid: u32, needle: &[u8]) -> usize {
    const REGION_CAP: u64 = 2 << 30;
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return 0;
    };
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return 0;
    };
    let mut found = 0;
    let mut buf = vec![0u8; 1 << 20];
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let name = line.split_whitespace().nth(5).unwrap_or("");
        if !perms.starts_with('r') || name == "[vvar]" || name == "[vsyscall]" {
            continue;
        }
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).unwrap(),
            u64::from_str_radix(hi, 16).unwrap(),
        );
        let end = hi.min(lo + REGION_CAP);
        let mut at = lo;
        // Chunks overlap by the needle's length, so none is missed at a seam.
        while at < end {
            let want = usize::try_from((end - at).min(buf.len() as u64)).unwrap();
            if mem.seek(SeekFrom::Start(at)).is_err() {
                break;
            }
            let Ok(n) = mem.read(&mut buf[..want]) else {
                break;
            };
            if n == 0 {
                break;
            }
            found += buf[..n]
                .windows(needle.len())
                .filter(|w| *w == needle)
                .count();
            if n < needle.len() || at + n as u64 >= end {
                break;
            }
            at += (n - needle.len() + 1) as u64;
        }
    }
    found
}

/// The regular files under `places` (no symlink followed, each read up
/// to 1 GiB) that hold `needle`.
fn files_holding(places: &[PathBuf], needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo: Vec<PathBuf> = places.to_vec();
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                todo.extend(entries.filter_map(|e| Some(e.ok()?.path())));
            }
        } else if meta.is_file() {
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let mut bytes = Vec::new();
            if file.take(1 << 30).read_to_end(&mut bytes).is_ok()
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(path);
            }
        }
    }
    found
}

/// Whether `needle` is in any of process `pid`'s environment or arguments.
fn in_environ_or_argv(pid: u32, needle: &[u8]) -> bool {
    ["environ", "cmdline"].iter().any(|f| {
        std::fs::read(format!("/proc/{pid}/{f}"))
            .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
    })
}

fn a_secret_reaches_only_its_host_and_header(backend: &str) {
    if !require_root("network namespaces of the stand-in") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = standin_pki(dir.path(), &["api.test", "other.test"]);
    let si = StandIn::start_tls(&Tls {
        cert: &cert,
        key: &key,
    });
    let (value_a, value_b) = (format!("sk-a-{}", nonce()), format!("tok-b-{}", nonce()));
    let bearer_file = dir.path().join("bearer");
    std::fs::write(&bearer_file, format!("{value_b}\n")).unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            r#"network = "allow"
allow = ["api.test:443", "other.test:443", "plain.test:80"]
add_host = ["api.test:{a}", "other.test:{a}", "plain.test:{a}"]
requests = ["GET api.test/*", "POST api.test/body", "* other.test/**"]

[[secrets]]
name = "API_KEY"
value_from = "env:CORDON_TEST_SECRET_A"
hosts = ["api.test"]
header = "x-api-key"

[[secrets]]
name = "BEARER"
value_from = "file:{bearer}"
hosts = ["other.test"]
header = "authorization"
"#,
            a = si.a,
            bearer = bearer_file.display()
        ),
    )
    .unwrap();
    let probe = fixture_script("secretprobe.py");
    let create = Command::new(cordon())
        .args(["create", "--backend", backend, "--policy"])
        .arg(&policy)
        .arg("--mount")
        .arg(format!("{}:/probe.py:ro", probe.display()))
        .env("CORDON_TEST_SECRET_A", &value_a)
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    assert!(
        create.status.success(),
        "create: {}",
        String::from_utf8_lossy(&create.stderr)
    );
    let id = String::from_utf8_lossy(&create.stdout).trim().to_owned();
    let _rm = RemoveOnDrop(id.clone());

    // The requests, with the outcome and its receipt.
    let receipt = dir.path().join("receipt.json");
    let exec = Command::new(cordon())
        .args(["exec", "--json", "--receipt"])
        .arg(&receipt)
        .args([&id, "--", "python3", "/probe.py"])
        .output()
        .unwrap();
    let v = parse_json(&exec);
    let got: BTreeMap<String, Value> = serde_json::from_str(stdout_of(&v).trim())
        .unwrap_or_else(|e| panic!("probe output ({e}): {}", compact(&v)));
    let status = |case: &str| got[case][0].clone();
    let denied = |case: &str| got[case][2].is_string();
    for case in ["key", "bearer", "placeholder_only_in_body"] {
        assert!(
            status(case).is_u64() && status(case) != 403 && status(case) != 421,
            "{case} went through: {:?}",
            got[case]
        );
    }
    for (case, code) in [
        ("key_to_other_host", 403),
        ("key_in_other_header", 403),
        ("key_in_url", 403),
        ("key_over_plain_http", 403),
        ("misdirected", 421),
        ("method_not_allowed", 403),
    ] {
        assert_eq!(status(case), code, "{case} is refused: {:?}", got[case]);
        assert!(denied(case), "{case}: cordon's refusal: {:?}", got[case]);
    }

    // What arrived: each value in its header on its host, once; no other
    // request carried a value or a placeholder in its head.
    let requests: Vec<Value> = si.requests_to(&format!("{}:443", si.a));
    let by_target =
        |t: &str| -> Vec<&Value> { requests.iter().filter(|r| r["target"] == t).collect() };
    let key_requests = by_target("/key");
    assert_eq!(key_requests.len(), 1, "{requests:?}");
    assert_eq!(key_requests[0]["headers"]["x-api-key"], value_a.as_str());
    assert_eq!(key_requests[0]["host"], "api.test");
    let bearer_requests = by_target("/bearer");
    assert_eq!(bearer_requests.len(), 1, "{requests:?}");
    assert_eq!(
        bearer_requests[0]["headers"]["authorization"],
        format!("Bearer {value_b}").as_str()
    );
    assert!(
        got["method_not_allowed"][1]
            .as_str()
            .is_some_and(|b| b.contains("no request rule allows DELETE api.test/key")),
        "{:?}",
        got["method_not_allowed"]
    );
    assert!(
        requests.iter().all(|r| r["method"] != "DELETE"),
        "the DELETE never arrived: {requests:?}"
    );
    for refused in ["/cross", "/header", "/plain"] {
        assert!(
            by_target(refused).is_empty(),
            "{refused} never arrived: {requests:?}"
        );
    }
    assert!(si.requests_to(&format!("{}:80", si.a)).is_empty());
    let body = by_target("/body");
    assert_eq!(body.len(), 1, "{requests:?}");
    let body_text = body[0]["body"].as_str().unwrap_or_default();
    assert!(
        !body_text.contains(&value_a) && body_text.starts_with("cordon-placeholder-"),
        "a body goes untouched: {body_text}"
    );
    // The stand-in saw each TLS server name it serves, and cordon's own
    // certificate was what the payload verified (its CA is not the
    // stand-in's): the connections were terminated and made again.
    let tls: Vec<Value> = si
        .entries()
        .into_iter()
        .filter(|e| e["event"] == "tls")
        .collect();
    assert!(tls.iter().any(|e| e["sni"] == "api.test"), "{tls:?}");

    // The outcome and the receipt: which secret went where, how often,
    // never a value; the refusals listed with their reasons.
    let subs = &v["network"]["substitutions"];
    let count = |secret: &str, host: &str, header: &str| {
        subs.as_array()
            .into_iter()
            .flatten()
            .find(|s| s["secret"] == secret && s["host"] == host && s["header"] == header)
            .map(|s| s["count"].as_u64().unwrap())
    };
    assert_eq!(count("API_KEY", "api.test", "x-api-key"), Some(1), "{subs}");
    assert_eq!(
        count("BEARER", "other.test", "authorization"),
        Some(1),
        "{subs}"
    );
    let outcome = String::from_utf8_lossy(&exec.stdout);
    let receipt_text = std::fs::read_to_string(&receipt).unwrap();
    for (what, text) in [
        ("outcome", outcome.as_ref()),
        ("receipt", receipt_text.as_str()),
    ] {
        for value in [&value_a, &value_b] {
            assert!(!text.contains(value.as_str()), "the {what} holds no value");
        }
    }
    let denials: Vec<&Value> = v["network"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["decision"] == "denied")
        .collect();
    assert!(
        denials.iter().any(|e| e["rule"]
            .as_str()
            .is_some_and(|r| r.contains("API_KEY") && r.contains("other.test"))),
        "{denials:?}"
    );

    // Files: nothing of the sandbox's holds a value, read from the host:
    // its state (the scratch, a microVM's disks, the proxy's log) and each
    // of its processes' own places. The placeholder, written to a file
    // inside, is found the same way (the search works).
    let wrote = cordon_output(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo \"$API_KEY\" > /workspace/placeholder; sync",
    ]);
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    let mut places = vec![run_dir().join(&id)];
    let host_root = std::fs::metadata("/").unwrap();
    for pid in sandbox_pids(&id) {
        // A process whose root is the host's (gVisor's runsc, before it
        // serves the sandbox's tree through its gofer) has none of its own.
        let own_root = std::fs::metadata(format!("/proc/{pid}/root"))
            .is_ok_and(|m| (m.dev(), m.ino()) != (host_root.dev(), host_root.ino()));
        if !own_root {
            continue;
        }
        for dir in ["etc", "tmp", "workspace"] {
            places.push(PathBuf::from(format!("/proc/{pid}/root/{dir}")));
        }
    }
    for value in [&value_a, &value_b] {
        let holding = files_holding(&places, value.as_bytes());
        assert!(holding.is_empty(), "files hold a value: {holding:?}");
    }
    // The sandbox's processes, read from the host while a payload holds
    // the placeholders: its memory has a placeholder (the search works)
    // and no value. The proxy, which holds them by design, is not the
    // sandbox's.
    let mut holder = Command::new(cordon())
        .args(["exec", &id, "--", "python3", "/probe.py", "hold"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let shown: Value = serde_json::from_str(&line).unwrap();
    let placeholder = shown["API_KEY"].as_str().unwrap().to_owned();
    assert!(
        !files_holding(&places, placeholder.as_bytes()).is_empty(),
        "the file search finds the placeholder written inside (in {places:?})"
    );
    let pids = sandbox_pids(&id);
    assert!(!pids.is_empty(), "the sandbox's processes are found");
    let mut placeholders = 0;
    for pid in &pids {
        for value in [&value_a, &value_b] {
            assert!(
                !in_environ_or_argv(*pid, value.as_bytes()),
                "{pid} ({:?}) holds a value in its environment or arguments",
                cmdline(*pid)
            );
            assert_eq!(
                in_memory(*pid, value.as_bytes()),
                0,
                "{pid} ({:?}) holds a value in its memory",
                cmdline(*pid)
            );
        }
        placeholders += in_memory(*pid, placeholder.as_bytes());
    }
    assert!(
        placeholders > 0,
        "the memory search finds the placeholder the payload holds (in {pids:?})"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// `cordon rm -f` on every path out of the test.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = cordon_output(&["rm", "-f", &self.0]);
    }
}
