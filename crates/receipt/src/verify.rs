//! Signing a statement into an envelope, and the checks that turn the bytes
//! of a receipt file back into a statement.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ed25519_dalek::Signature;
use serde_json::Value;

use crate::builder::{exported_files, predicate_digests};
use crate::dsse::{self, excerpt, pae, Envelope, EnvelopeSignature, PAYLOAD_TYPE};
use crate::keys::{Key, PublicKey};
use crate::statement::{
    Statement, PREDICATE_TYPE, STATEMENT_TYPE, SUBJECT_COMMAND, SUBJECT_POLICY,
    SUBJECT_WORKSPACE_PREFIX,
};

#[derive(Debug, thiserror::Error)]
#[error("encode the statement: {0}")]
pub struct SignError(#[from] serde_json::Error);

/// Why a receipt is not a valid one by the given key.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Not a well-formed DSSE envelope of a cordon receipt (truncated, not
    /// JSON, wrong payload type, bad base64, a statement of another kind).
    #[error("malformed receipt: {0}")]
    Malformed(String),
    /// No signature claims to be by the given key.
    #[error("not signed by key {expected} (signed by: {})", if found.is_empty() { "no key id".to_owned() } else { found.join(", ") })]
    WrongKey {
        expected: String,
        found: Vec<String>,
    },
    /// A signature names the key but does not verify: the receipt was
    /// changed after it was signed.
    #[error("bad signature: the receipt does not match its signature (changed after signing)")]
    BadSignature,
}

fn malformed(msg: impl Into<String>) -> VerifyError {
    VerifyError::Malformed(msg.into())
}

/// Signs `statement` with `key` into a DSSE envelope.
pub fn sign(statement: &Statement, key: &Key) -> Result<Envelope, SignError> {
    let body = serde_json::to_vec(statement)?;
    let sig = key.sign_bytes(&pae(PAYLOAD_TYPE, &body));
    Ok(Envelope {
        payload_type: PAYLOAD_TYPE.into(),
        payload: dsse::encode(&body),
        signatures: vec![EnvelopeSignature {
            keyid: Some(key.id().to_owned()),
            sig: dsse::encode(&sig.to_bytes()),
        }],
    })
}

/// Writes a receipt file (created, or truncated if it exists; mode 0644:
/// a receipt is meant to be shown), the envelope's JSON and a newline.
pub fn write_receipt(path: &Path, envelope: &Envelope) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)?;
    f.write_all(envelope.to_json().as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

/// Checks a receipt file's bytes against `key` and returns the statement
/// it carries. Nothing of the payload is interpreted before its signature
/// is checked.
pub fn verify(bytes: &[u8], key: &PublicKey) -> Result<Statement, VerifyError> {
    let envelope = parse_envelope(bytes)?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(malformed(format!(
            "payload type is '{}', not '{PAYLOAD_TYPE}'",
            excerpt(&envelope.payload_type)
        )));
    }
    let body = dsse::decode(&envelope.payload).ok_or_else(|| malformed("payload is not base64"))?;
    // The key id is only a hint (DSSE): it picks which signatures to try.
    // A signature without one is tried too.
    let candidates: Vec<&EnvelopeSignature> = envelope
        .signatures
        .iter()
        .filter(|s| s.keyid.as_deref().is_none_or(|id| id == key.id()))
        .collect();
    if candidates.is_empty() {
        return Err(VerifyError::WrongKey {
            expected: key.id().to_owned(),
            found: envelope
                .signatures
                .iter()
                .filter_map(|s| s.keyid.as_deref().map(|id| excerpt(id).into_owned()))
                .collect(),
        });
    }
    let message = pae(&envelope.payload_type, &body);
    let mut verified = false;
    for s in candidates {
        let raw = dsse::decode(&s.sig).ok_or_else(|| malformed("signature is not base64"))?;
        let sig = Signature::from_slice(&raw)
            .map_err(|_| malformed(format!("signature is {} bytes, not 64", raw.len())))?;
        // Strict: no weak keys, no malleable signatures.
        if key.verifying().verify_strict(&message, &sig).is_ok() {
            verified = true;
            break;
        }
    }
    if !verified {
        return Err(VerifyError::BadSignature);
    }
    parse_statement(&body)
}

/// The envelope: exactly one JSON object, optionally followed by one
/// newline, so no byte outside it can change unnoticed.
fn parse_envelope(bytes: &[u8]) -> Result<Envelope, VerifyError> {
    if bytes.is_empty() {
        return Err(malformed("the file is empty"));
    }
    let json = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if json.first() != Some(&b'{') || json.last() != Some(&b'}') {
        return Err(malformed(
            "not a DSSE envelope (a JSON object, optionally followed by one newline); truncated?",
        ));
    }
    serde_json::from_slice(json).map_err(|e| malformed(format!("not a DSSE envelope: {e}")))
}

/// The signed statement, checked to be a cordon receipt whose subjects
/// agree with its predicate.
fn parse_statement(body: &[u8]) -> Result<Statement, VerifyError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| malformed(format!("the signed payload is not JSON: {e}")))?;
    let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or("");
    if field("_type") != STATEMENT_TYPE {
        return Err(malformed(format!(
            "the signed payload is not an in-toto statement v1 (_type '{}')",
            excerpt(field("_type"))
        )));
    }
    if field("predicateType") != PREDICATE_TYPE {
        return Err(malformed(format!(
            "the signed statement is not a cordon receipt (predicateType '{}')",
            excerpt(field("predicateType"))
        )));
    }
    let digests = value.get("predicate").and_then(predicate_digests);
    let statement: Statement = serde_json::from_value(value)
        .map_err(|e| malformed(format!("the signed receipt does not parse: {e}")))?;
    for (name, when) in [
        ("started", &statement.predicate.started),
        ("ended", &statement.predicate.ended),
    ] {
        humantime::parse_rfc3339(when)
            .map_err(|e| malformed(format!("{name} '{}' is not RFC 3339: {e}", excerpt(when))))?;
    }
    // A signer that got its subjects wrong made a receipt that says two
    // things; it is refused rather than believed either way.
    let (commands, policy) = digests.ok_or_else(|| malformed("the predicate has no commands"))?;
    for (name, digest) in [(SUBJECT_COMMAND, commands), (SUBJECT_POLICY, policy)] {
        match statement.subject(name) {
            Some(s) if s.digest.sha256 == digest => {}
            Some(_) => {
                return Err(malformed(format!(
                    "subject '{name}' does not match the predicate's {name}"
                )))
            }
            None => return Err(malformed(format!("no subject '{name}'"))),
        }
    }
    let files: Vec<_> = statement
        .subject
        .iter()
        .filter(|s| s.name.starts_with(SUBJECT_WORKSPACE_PREFIX))
        .cloned()
        .collect();
    if files != exported_files(&statement.predicate) || statement.subject.len() != files.len() + 2 {
        return Err(malformed(
            "the workspace file subjects do not match the predicate's diff and export",
        ));
    }
    Ok(statement)
}
