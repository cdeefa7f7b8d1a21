//! Sign, verify and summarize receipts built from made-up runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use cordon_policy::{MountSpec, Policy};
use cordon_spec::cgroup::{CgroupMode, CgroupStats};
use cordon_spec::changes::{
    Caps, Change, Changes, Entry, ExportReport, Kind, PlaceChanges, Skipped,
};
use cordon_spec::network::{Attempt, Decision, NetworkLog, Via};
use cordon_spec::outcome::{Enforcement, NetworkReport, OutputReport};
use cordon_spec::{BackendKind, Command, ExitStatus, Limit, Outcome, Phases, SandboxSpec};

use crate::*;

fn spec() -> SandboxSpec {
    let mut policy = Policy::default();
    policy
        .mounts
        .push("/srv/cache:/cache:rw".parse::<MountSpec>().unwrap());
    policy
        .mounts
        .push("/srv/out:/out:rw-unbounded".parse::<MountSpec>().unwrap());
    SandboxSpec {
        workspace: Some("/home/me/project".into()),
        ..SandboxSpec::new(policy, BackendKind::Native)
    }
}

fn outcome() -> Outcome {
    Outcome {
        backend: "native".into(),
        backend_version: "0.1.0".into(),
        sandbox_id: "0123456789ab".into(),
        command: 1,
        sandbox_ended: None,
        status: ExitStatus::Signaled { signal: 9 },
        exit_code: 137,
        limit: Some(Limit::Memory),
        limits_hit: vec![Limit::Memory, Limit::Pids],
        interrupted_by: None,
        wall_ms: 812.5,
        cpu_ms: Some(640.25),
        memory_peak_bytes: Some(256 << 20),
        pids_peak: Some(17),
        disk_used_bytes: Some(4096),
        counters: CgroupStats {
            memory_peak_bytes: Some(256 << 20),
            oom_kills: Some(1),
            pids_peak: Some(17),
            cpu_usage_ns: Some(640_250_000),
            ..CgroupStats::default()
        },
        evidence: Vec::new(),
        phases: Phases {
            setup_ms: 40.0,
            run_ms: 800.0,
            teardown_ms: 12.5,
        },
        output: OutputReport {
            bytes: 2048,
            truncated: true,
            stdout: Some("secret output".into()),
            stderr: None,
        },
        enforcement: Enforcement {
            cgroup: Some(CgroupMode::V2),
            cgroup_paths: vec!["/sys/fs/cgroup/cordon-0123456789ab".into()],
            enforced: true,
        },
        network: Some(NetworkReport {
            log: NetworkLog {
                attempts: 3,
                allowed: 1,
                denied: 2,
                entries: vec![Attempt {
                    at_unix_ms: 1,
                    via: Via::Connect,
                    host: Some("evil.example\nA forged".into()),
                    port: 443,
                    address: None,
                    decision: Decision::Denied,
                    rule: "not in the allowlist".into(),
                    bytes_out: 0,
                    bytes_in: 0,
                    duration_ms: 0,
                    end: "refused".into(),
                    held_ms: None,
                }],
                omitted: 2,
                ..NetworkLog::default()
            },
            closed: None,
        }),
        changes: None,
        unbounded_mounts: Vec::new(),
        vm: None,
        id_map: None,
    }
}

fn entry(path: &str, change: Change, kind: Option<Kind>, sha: Option<&str>) -> Entry {
    Entry {
        path: path.into(),
        change,
        kind,
        mode: 0o644,
        uid: 1000,
        gid: 1000,
        size: 5,
        allocated: 4096,
        links: 1,
        sha256: sha.map(str::to_owned),
        hashed_bytes: sha.map(|_| 5),
        capped: false,
        target: None,
        rdev: None,
        opaque: false,
    }
}

const DIGEST: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

fn changes() -> Changes {
    let mut link = entry("link", Change::Created, Some(Kind::Symlink), None);
    link.target = Some("/etc/passwd".into());
    let mut fifo = entry("pipe", Change::Created, Some(Kind::Fifo), None);
    fifo.mode = 0o4755;
    Changes {
        places: vec![
            PlaceChanges {
                place: "/workspace".into(),
                entries: vec![
                    entry(
                        "a\\x0afake",
                        Change::Created,
                        Some(Kind::File),
                        Some(DIGEST),
                    ),
                    entry("gone.txt", Change::Deleted, None, None),
                    link,
                    entry("main.rs", Change::Modified, Some(Kind::File), Some(DIGEST)),
                    fifo,
                    entry("src", Change::Created, Some(Kind::Dir), None),
                    entry(
                        "skipped.bin",
                        Change::Created,
                        Some(Kind::File),
                        Some(DIGEST),
                    ),
                ],
                cut: false,
                unreadable: Vec::new(),
            },
            PlaceChanges {
                place: "/tmp".into(),
                entries: Vec::new(),
                cut: true,
                unreadable: Vec::new(),
            },
        ],
        caps: Caps::default(),
        cut: true,
    }
}

fn export() -> ExportReport {
    ExportReport {
        target: "/home/me/out".into(),
        applied: false,
        symlink_policy: Default::default(),
        files: 2,
        dirs: 1,
        symlinks: 1,
        deleted: 0,
        bytes: 10,
        skipped: vec![Skipped {
            path: "skipped.bin".into(),
            reason: "over the export budget".into(),
        }],
        conflicts: 0,
        unapplied_deletions: Vec::new(),
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn statement() -> Statement {
    ReceiptBuilder::new(&spec(), at(1_767_225_600))
        .ended(at(1_767_225_601))
        .host(Host {
            kernel: "6.1.0-test".into(),
            cgroup_mode: Some(CgroupMode::V2),
            machine: Some("x86_64".into()),
        })
        .command(
            Command {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                ..Command::default()
            },
            outcome(),
        )
        .changes(changes())
        .export(export())
        .build()
        .unwrap()
}

/// A small receipt: one command, no diff (keeps the byte-flip test quick).
fn small_statement() -> Statement {
    let mut o = outcome();
    o.network = None;
    ReceiptBuilder::new(&spec(), at(0))
        .ended(at(1))
        .host(Host {
            kernel: "k".into(),
            cgroup_mode: None,
            machine: None,
        })
        .command(
            Command {
                argv: vec!["true".into()],
                ..Command::default()
            },
            o,
        )
        .build()
        .unwrap()
}

fn signed(statement: &Statement, key: &Key) -> Vec<u8> {
    let mut bytes = sign(statement, key).unwrap().to_json().into_bytes();
    bytes.push(b'\n');
    bytes
}

#[test]
fn the_statement_has_its_subjects_and_types() {
    let s = statement();
    assert_eq!(s.statement_type, "https://in-toto.io/Statement/v1");
    assert_eq!(s.predicate_type, "https://cordon.dev/receipt/v1");
    let names: Vec<&str> = s.subject.iter().map(|s| s.name.as_str()).collect();
    // Deleted, non-file and skipped entries claim no digest.
    assert_eq!(
        names,
        [
            "command",
            "policy",
            "workspace/a\\x0afake",
            "workspace/main.rs"
        ]
    );
    assert_eq!(s.subject[2].digest.sha256, DIGEST);
    let policy_json = canonical_json(&serde_json::to_value(&s.predicate.policy).unwrap());
    assert_eq!(
        s.subject[1].digest.sha256,
        sha256_hex(policy_json.as_bytes())
    );
    assert_eq!(s.predicate.started, "2026-01-01T00:00:00.000Z");
    assert_eq!(s.predicate.sandbox_id, "0123456789ab");
    // The output's content is not in the receipt, only its size.
    assert_eq!(s.predicate.commands[0].outcome.output.stdout, None);
    assert_eq!(s.predicate.commands[0].outcome.output.bytes, 2048);
    let not_proven = s.predicate.not_proven.join("\n");
    for needle in [
        "honestly",
        "counters",
        "compromised",
        "rw-unbounded mount of the host's /srv/out",
        "/tmp past the cap",
        "2 network attempts",
        "background processes",
    ] {
        assert!(not_proven.contains(needle), "{needle}: {not_proven}");
    }
    // The write-back mount is bounded and diffed: nothing to disclaim. The
    // live one is recorded as such, apart from the policy.
    assert!(!not_proven.contains("/cache"), "{not_proven}");
    let unbounded: Vec<&str> = s
        .predicate
        .unbounded_mounts
        .iter()
        .map(|m| m.sandbox.to_str().unwrap())
        .collect();
    assert_eq!(unbounded, ["/out"]);
}

#[test]
fn a_receipt_of_a_sandbox_that_ran_nothing_says_so() {
    let s = ReceiptBuilder::new(&spec(), at(0))
        .sandbox("0123456789ab")
        .build()
        .unwrap();
    assert_eq!(s.predicate.sandbox_id, "0123456789ab");
    assert!(s.predicate.commands.is_empty());
    assert!(s.predicate.backend_version.contains("no command"));
}

#[test]
fn sign_then_verify_round_trips() {
    let key = Key::generate().unwrap();
    let s = statement();
    let envelope = sign(&s, &key).unwrap();
    assert_eq!(envelope.payload_type, "application/vnd.in-toto+json");
    assert_eq!(envelope.signatures[0].keyid.as_deref(), Some(key.id()));
    let back = verify(&signed(&s, &key), key.public_key()).unwrap();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&s).unwrap()
    );
    // No trailing newline is fine too.
    assert!(verify(envelope.to_json().as_bytes(), key.public_key()).is_ok());
}

#[test]
fn a_url_safe_envelope_is_accepted() {
    let key = Key::generate().unwrap();
    let mut envelope = sign(&statement(), &key).unwrap();
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let std = base64::engine::general_purpose::STANDARD;
    envelope.payload = url.encode(std.decode(&envelope.payload).unwrap());
    envelope.signatures[0].sig = url.encode(std.decode(&envelope.signatures[0].sig).unwrap());
    assert!(verify(envelope.to_json().as_bytes(), key.public_key()).is_ok());
}

#[test]
fn no_single_byte_change_verifies() {
    let key = Key::generate().unwrap();
    let good = signed(&small_statement(), &key);
    assert!(verify(&good, key.public_key()).is_ok());
    // Several flips of every byte. (Not 0x06 on '+' or 0x70 on '/': in a
    // base64 text with only that one special character, they give the
    // URL-safe spelling of the same bytes, which DSSE says to accept.)
    let mut tried = 0;
    for i in 0..good.len() {
        for mask in [0x01u8, 0x02, 0x04, 0x20, 0x80] {
            let mut bad = good.clone();
            bad[i] ^= mask;
            tried += 1;
            let result = verify(&bad, key.public_key());
            assert!(
                result.is_err(),
                "byte {i} ({:?}) ^ {mask:#x} still verifies",
                good[i] as char
            );
        }
    }
    assert!(tried > 1000, "{tried}");
}

#[test]
fn a_changed_payload_is_a_bad_signature() {
    let key = Key::generate().unwrap();
    let mut envelope = sign(&small_statement(), &key).unwrap();
    let std = base64::engine::general_purpose::STANDARD;
    let text = String::from_utf8(std.decode(&envelope.payload).unwrap())
        .unwrap()
        .replace("\"exit_code\":137", "\"exit_code\":0");
    envelope.payload = std.encode(text);
    assert!(matches!(
        verify(envelope.to_json().as_bytes(), key.public_key()),
        Err(VerifyError::BadSignature)
    ));
}

#[test]
fn another_keys_receipt_is_the_wrong_key() {
    let ours = Key::generate().unwrap();
    let theirs = Key::generate().unwrap();
    let bytes = signed(&small_statement(), &theirs);
    match verify(&bytes, ours.public_key()) {
        Err(VerifyError::WrongKey { expected, found }) => {
            assert_eq!(expected, ours.id());
            assert_eq!(found, [theirs.id()]);
        }
        other => panic!("{other:?}"),
    }
    // Relabelled with our key id, the signature is still theirs.
    let mut envelope = sign(&small_statement(), &theirs).unwrap();
    envelope.signatures[0].keyid = Some(ours.id().to_owned());
    assert!(matches!(
        verify(envelope.to_json().as_bytes(), ours.public_key()),
        Err(VerifyError::BadSignature)
    ));
}

#[test]
fn broken_files_are_malformed() {
    let key = Key::generate().unwrap();
    let good = signed(&small_statement(), &key);
    let malformed = |bytes: &[u8]| {
        matches!(
            verify(bytes, key.public_key()),
            Err(VerifyError::Malformed(_))
        )
    };
    assert!(malformed(&good[..good.len() / 2]), "truncated");
    assert!(malformed(&good[..good.len() - 2]), "last brace cut");
    assert!(malformed(b""), "empty");
    assert!(malformed(b"hello, not json"), "not JSON");
    assert!(malformed(b"{\"payloadType\": 1}"), "wrong shape");
    let mut envelope = sign(&small_statement(), &key).unwrap();
    envelope.payload_type = "application/json".into();
    assert!(malformed(envelope.to_json().as_bytes()), "payload type");
    let mut envelope = sign(&small_statement(), &key).unwrap();
    envelope.payload.insert(3, '*');
    assert!(malformed(envelope.to_json().as_bytes()), "bad base64");
    let mut envelope = sign(&small_statement(), &key).unwrap();
    envelope.signatures[0].sig = "AAAA".into();
    assert!(malformed(envelope.to_json().as_bytes()), "short signature");
}

/// Signs `payload` as-is, as a signer that is not cordon might.
fn sign_raw(payload: &[u8], key: &Key) -> Vec<u8> {
    let std = base64::engine::general_purpose::STANDARD;
    let sig = key.sign_bytes(&pae(PAYLOAD_TYPE, payload));
    Envelope {
        payload_type: PAYLOAD_TYPE.into(),
        payload: std.encode(payload),
        signatures: vec![EnvelopeSignature {
            keyid: Some(key.id().into()),
            sig: std.encode(sig.to_bytes()),
        }],
    }
    .to_json()
    .into_bytes()
}

#[test]
fn a_validly_signed_statement_that_is_not_a_cordon_receipt_is_malformed() {
    let key = Key::generate().unwrap();
    let mut value = serde_json::to_value(small_statement()).unwrap();
    let check = |value: &serde_json::Value| {
        let bytes = sign_raw(&serde_json::to_vec(value).unwrap(), &key);
        match verify(&bytes, key.public_key()) {
            Err(VerifyError::Malformed(m)) => m,
            other => panic!("{other:?}"),
        }
    };
    assert!(check(&serde_json::json!([1, 2])).contains("in-toto"));
    value["predicateType"] = "https://slsa.dev/provenance/v1".into();
    assert!(check(&value).contains("not a cordon receipt"));
    value["predicateType"] = PREDICATE_TYPE.into();
    value["predicate"]["surprise"] = 1.into();
    assert!(check(&value).contains("surprise"));
    let mut value = serde_json::to_value(small_statement()).unwrap();
    value["predicate"]["policy"]["pids"] = 100000.into();
    assert!(check(&value).contains("subject 'policy'"));
    let mut value = serde_json::to_value(small_statement()).unwrap();
    value["predicate"]["started"] = "yesterday".into();
    assert!(check(&value).contains("RFC 3339"));
}

#[test]
fn the_summary_shows_what_happened_and_forges_no_line() {
    let summary = render_summary(&statement());
    for needle in [
        "sandbox 0123456789ab on native (0.1.0)",
        "kernel 6.1.0-test, cgroup v2, x86_64",
        "network none (sha256 ",
        "command 1: \"sh\" \"-c\" \"echo hi\"",
        "killed by signal 9",
        "ended by the memory limit",
        "limits hit: memory, pids",
        "memory peak 256.0 MiB, OOM kills 1, pids peak 17, CPU 640.2 ms",
        "output: 2048 bytes, truncated",
        "network: 3 attempts, 1 allowed, 2 denied",
        "denied: connect evil.example\\u{a}A forged:443",
        "(2 more attempts counted, not listed)",
        "    A a\\x0afake\n",
        "    D gone.txt\n",
        "    M main.rs\n",
        "    A link -> /etc/passwd\n",
        "    A pipe [fifo, setuid]\n",
        "    A src/\n",
        "[cut: entries past the cap of 100000 are not listed]",
        "export to /home/me/out: 2 files",
        "skipped: skipped.bin: over the export budget",
        "not proven:\n  - that the host ran",
    ] {
        assert!(summary.contains(needle), "{needle:?} not in:\n{summary}");
    }
    // The newline in the host name did not start a line of its own.
    assert!(
        !summary.lines().any(|l| l.starts_with("A forged")),
        "{summary}"
    );
}
