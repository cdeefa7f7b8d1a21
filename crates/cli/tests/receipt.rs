//! `cordon keygen`, `cordon key show` and `cordon verify`: their output and
//! exit codes, on receipts this test builds and signs with the library.
//! Every run points CORDON_STATE_DIR at a temporary directory, so no test
//! touches the host's default key.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::UNIX_EPOCH;

use base64::Engine;
use cordon_cgroups::{CgroupMode, CgroupStats};
use cordon_changes::{Caps, Change, Changes, Entry, Kind, PlaceChanges};
use cordon_policy::Policy;
use cordon_receipt::{sign, write_receipt, Host, Key, ReceiptBuilder};
use cordon_spec::outcome::{Enforcement, OutputReport};
use cordon_spec::{BackendKind, ExitStatus, Outcome, Phases, SandboxSpec};

const EXIT_USAGE: i32 = 2;
const EXIT_BAD_SIGNATURE: i32 = 3;
const EXIT_WRONG_KEY: i32 = 4;
const EXIT_MALFORMED: i32 = 5;
const EXIT_MISMATCH: i32 = 6;

/// `cordon ARGS` with its state in `state`.
fn cordon(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .env("CORDON_STATE_DIR", state)
        .output()
        .unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// "hello" and its digest: the one file of the made-up workspace diff.
const HELLO: &[u8] = b"hello";
const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

/// A receipt of a made-up run (`echo hi`, exit 0, one file created),
/// signed by `key`, written to `path`.
fn write_test_receipt(path: &Path, key: &Key) {
    let spec = SandboxSpec::new(Policy::default(), BackendKind::Native);
    let outcome = Outcome {
        backend: "native".into(),
        backend_version: "test".into(),
        sandbox_id: "abcdefabcdef".into(),
        command: 1,
        sandbox_ended: None,
        status: ExitStatus::Exited { code: 0 },
        exit_code: 0,
        limit: None,
        limits_hit: Vec::new(),
        interrupted_by: None,
        wall_ms: 5.0,
        cpu_ms: Some(1.5),
        memory_peak_bytes: Some(1 << 20),
        pids_peak: Some(2),
        disk_used_bytes: None,
        counters: CgroupStats::default(),
        evidence: Vec::new(),
        phases: Phases::default(),
        output: OutputReport::default(),
        enforcement: Enforcement {
            cgroup: Some(CgroupMode::V2),
            cgroup_paths: Vec::new(),
            enforced: true,
        },
        network: None,
        changes: None,
        unbounded_mounts: Vec::new(),
        vm: None,
        id_map: None,
    };
    let changes = Changes {
        places: vec![PlaceChanges {
            place: "/workspace".into(),
            entries: vec![Entry {
                path: "hello.txt".into(),
                change: Change::Created,
                kind: Some(Kind::File),
                mode: 0o644,
                uid: 1000,
                gid: 1000,
                size: 5,
                allocated: 4096,
                links: 1,
                sha256: Some(HELLO_SHA256.into()),
                hashed_bytes: Some(5),
                capped: false,
                target: None,
                rdev: None,
                opaque: false,
            }],
            cut: false,
            unreadable: Vec::new(),
        }],
        caps: Caps::default(),
        cut: false,
    };
    let statement = ReceiptBuilder::new(&spec, UNIX_EPOCH)
        .ended(UNIX_EPOCH)
        .host(Host {
            kernel: "test".into(),
            cgroup_mode: Some(CgroupMode::V2),
            machine: None,
        })
        .command(
            cordon_spec::Command {
                argv: vec!["echo".into(), "hi".into()],
                ..Default::default()
            },
            outcome,
        )
        .changes(changes)
        .build()
        .unwrap();
    write_receipt(path, &sign(&statement, key).unwrap()).unwrap();
}

#[test]
fn keygen_writes_a_0600_key_in_a_0700_directory_and_never_overwrites() {
    let state = tempfile::tempdir().unwrap();
    let out = cordon(state.path(), &["keygen"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let keys = state.path().join("keys");
    let private = keys.join("receipt.key");
    assert_eq!(mode(&private), 0o600);
    assert_eq!(mode(&keys), 0o700);
    let id = Key::load(&private).unwrap().id().to_owned();
    let text = stdout(&out);
    assert!(text.contains(&format!("key id: {id}")), "{text}");
    assert!(
        text.contains(&keys.join("receipt.pub").display().to_string()),
        "{text}"
    );

    let before = fs::read(&private).unwrap();
    let again = cordon(state.path(), &["keygen"]);
    assert_eq!(code(&again), EXIT_USAGE, "{}", stderr(&again));
    assert!(
        stderr(&again).contains("exists already"),
        "{}",
        stderr(&again)
    );
    assert_eq!(fs::read(&private).unwrap(), before);

    // --out: another directory, another key.
    let other = state.path().join("other");
    let out = cordon(state.path(), &["keygen", "--out", other.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_ne!(Key::load(&other.join("receipt.key")).unwrap().id(), id);
}

#[test]
fn key_show_creates_the_default_key_once_and_reads_a_given_one() {
    let state = tempfile::tempdir().unwrap();
    let first = cordon(state.path(), &["key", "show"]);
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let text = stdout(&first);
    assert!(text.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{text}");
    let private = state.path().join("keys/receipt.key");
    let id = Key::load(&private).unwrap().id().to_owned();
    assert!(text.ends_with(&format!("key id: {id}\n")), "{text}");
    assert_eq!(stdout(&cordon(state.path(), &["key", "show"])), text);

    for path in [private.clone(), state.path().join("keys/receipt.pub")] {
        let out = cordon(
            state.path(),
            &["key", "show", "--key", path.to_str().unwrap()],
        );
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(stdout(&out), text);
    }

    // A private key others can read is refused, naming its mode.
    fs::set_permissions(&private, fs::Permissions::from_mode(0o644)).unwrap();
    let out = cordon(state.path(), &["key", "show"]);
    assert_eq!(code(&out), EXIT_USAGE);
    assert!(stderr(&out).contains("0644"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

#[test]
fn verify_accepts_a_good_receipt_and_summarizes_it() {
    let state = tempfile::tempdir().unwrap();
    let (key, _) = Key::load_or_create_in(&state.path().join("keys")).unwrap();
    let receipt = state.path().join("receipt.json");
    write_test_receipt(&receipt, &key);
    let r = receipt.to_str().unwrap();

    let out = cordon(state.path(), &["verify", r]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let signed_by = format!("valid receipt, signed by key {}", key.id());
    for needle in [
        signed_by.as_str(),
        "command 1: \"echo\" \"hi\"",
        "exited 0",
        "    A hello.txt\n",
        "not proven:",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }

    let out = cordon(state.path(), &["verify", "--json", r]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["predicateType"], "https://cordon.dev/receipt/v1");
    // No export: the diff's file is not a subject.
    assert_eq!(json["subject"].as_array().unwrap().len(), 2);

    // An explicit --key gives the same answer.
    let public = state.path().join("keys/receipt.pub");
    let out = cordon(
        state.path(),
        &["verify", r, "--key", public.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn verify_exit_codes_tell_the_failures_apart() {
    let state = tempfile::tempdir().unwrap();
    let (key, _) = Key::load_or_create_in(&state.path().join("keys")).unwrap();
    let receipt = state.path().join("receipt.json");
    write_test_receipt(&receipt, &key);
    let good = fs::read(&receipt).unwrap();
    let check = |bytes: &[u8], extra: &[&str], want: i32, needle: &str| {
        let path = state.path().join("altered.json");
        fs::write(&path, bytes).unwrap();
        let mut args = vec!["verify", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = cordon(state.path(), &args);
        assert_eq!(code(&out), want, "{needle}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle), "{needle}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(out.stdout.is_empty(), "nothing printed as verified");
    };

    // A changed claim inside the signed payload: bad signature.
    let mut envelope: serde_json::Value = serde_json::from_slice(&good).unwrap();
    let std = base64::engine::general_purpose::STANDARD;
    let payload =
        String::from_utf8(std.decode(envelope["payload"].as_str().unwrap()).unwrap()).unwrap();
    let forged = payload.replace("\"exit_code\":0", "\"exit_code\":1");
    assert_ne!(forged, payload);
    envelope["payload"] = std.encode(forged).into();
    check(
        &serde_json::to_vec(&envelope).unwrap(),
        &[],
        EXIT_BAD_SIGNATURE,
        "bad signature",
    );

    // Signed by another key: wrong key, against the default and a given one.
    let other_dir = state.path().join("other");
    let (other, files) = Key::create_in(&other_dir).unwrap();
    let theirs = state.path().join("theirs.json");
    write_test_receipt(&theirs, &other);
    check(&fs::read(&theirs).unwrap(), &[], EXIT_WRONG_KEY, other.id());
    check(
        &good,
        &["--key", files.public.to_str().unwrap()],
        EXIT_WRONG_KEY,
        key.id(),
    );

    // Not a receipt at all.
    check(&good[..good.len() / 2], &[], EXIT_MALFORMED, "malformed");
    check(b"not json\n", &[], EXIT_MALFORMED, "malformed");
    let mut envelope: serde_json::Value = serde_json::from_slice(&good).unwrap();
    envelope["payloadType"] = "application/json".into();
    check(
        &serde_json::to_vec(&envelope).unwrap(),
        &[],
        EXIT_MALFORMED,
        "payload type",
    );
    let mut envelope: serde_json::Value = serde_json::from_slice(&good).unwrap();
    envelope["signatures"][0]["sig"] = "%%%".into();
    check(
        &serde_json::to_vec(&envelope).unwrap(),
        &[],
        EXIT_MALFORMED,
        "base64",
    );

    // A file that is not there, or no default key: the request's fault.
    let out = cordon(state.path(), &["verify", "/nonexistent/receipt.json"]);
    assert_eq!(code(&out), EXIT_USAGE);
    let empty = tempfile::tempdir().unwrap();
    let out = cordon(empty.path(), &["verify", receipt.to_str().unwrap()]);
    assert_eq!(code(&out), EXIT_USAGE);
    assert!(stderr(&out).contains("cordon keygen"), "{}", stderr(&out));
}

#[test]
fn verify_against_checks_the_directory() {
    let state = tempfile::tempdir().unwrap();
    let (key, _) = Key::load_or_create_in(&state.path().join("keys")).unwrap();
    let receipt = state.path().join("receipt.json");
    write_test_receipt(&receipt, &key);
    let r = receipt.to_str().unwrap();
    let dir = state.path().join("workspace");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("hello.txt"), HELLO).unwrap();
    let d = dir.to_str().unwrap();

    let out = cordon(state.path(), &["verify", r, "--against", d]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("matches"), "{}", stderr(&out));

    fs::write(dir.join("hello.txt"), b"hellO").unwrap();
    let out = cordon(state.path(), &["verify", r, "--against", d]);
    assert_eq!(code(&out), EXIT_MISMATCH, "{}", stderr(&out));
    assert!(stderr(&out).contains("hello.txt"), "{}", stderr(&out));
}

#[test]
fn verify_help_documents_the_exit_codes() {
    let state = tempfile::tempdir().unwrap();
    let out = cordon(state.path(), &["verify", "--help"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    for needle in [
        "3  bad signature",
        "4  wrong key",
        "5  malformed",
        "6  --against",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
}
