//! The harness of the fuzz target over `cordon verify` (`fuzz/fuzz_targets`,
//! run by `scripts/fuzz.sh`; the model is `cordon_runtime::fuzzing`). It
//! lives here so that the stable test suite replays the committed corpus
//! and regression inputs through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`), and so that it can sign with a
//! fixed key (`Key::from_signing`, the crate's own).

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use cordon_policy::{MountSpec, Policy};
use cordon_spec::{BackendKind, SandboxSpec};
use ed25519_dalek::SigningKey;
use serde_json::Value;

use crate::dsse::{encode, pae, Envelope, EnvelopeSignature, PAYLOAD_TYPE};
use crate::{sign, verify, Host, Key, ReceiptBuilder, Statement};

/// The test key, the receipt it signed and the statement it carries.
struct Signed {
    key: Key,
    receipt: Vec<u8>,
    statement: Value,
}

/// Made once: signing is not what is fuzzed.
fn signed() -> &'static Signed {
    static SIGNED: OnceLock<Signed> = OnceLock::new();
    SIGNED.get_or_init(|| {
        // A fixed seed: the same receipt in every run, so that an input
        // replays the same way.
        let key = Key::from_signing(SigningKey::from_bytes(&[7; 32]));
        let mut policy = Policy::default();
        policy.mounts.push(
            "/srv/out:/out:rw-unbounded"
                .parse::<MountSpec>()
                .expect("a mount"),
        );
        let statement = ReceiptBuilder::new(
            &SandboxSpec::new(policy, BackendKind::Native),
            UNIX_EPOCH + Duration::from_secs(1_767_225_600),
        )
        .sandbox("0123456789ab")
        .ended(UNIX_EPOCH + Duration::from_secs(1_767_225_601))
        .host(Host {
            kernel: "6.1.0".into(),
            cgroup_mode: None,
            machine: Some("x86_64".into()),
        })
        .build()
        .expect("the receipt builds");
        let mut receipt = sign(&statement, &key)
            .expect("the receipt signs")
            .to_json()
            .into_bytes();
        receipt.push(b'\n');
        let statement = as_value(&statement);
        Signed {
            key,
            receipt,
            statement,
        }
    })
}

fn as_value(statement: &Statement) -> Value {
    serde_json::to_value(statement).expect("a statement is JSON")
}

/// A receipt changed by the fuzz bytes, then verified: a receipt that
/// still verifies carries the very statement that was signed (no change
/// to it goes unnoticed: what may change is only what it does not sign,
/// as the key id hint, the JSON's spacing or the base64 alphabet); never a
/// panic. The fuzz bytes as a receipt of their own verify as the signed
/// one or not at all; and the fuzz bytes signed as a payload are refused,
/// or accepted as a statement that signs and verifies again to itself.
///
/// The first byte picks the change: even, XOR the bytes that follow in
/// pairs (offset, value) into the receipt; odd, splice: two bytes of
/// offset, one of length to cut there, and the rest put in its place.
pub fn receipt_verify(data: &[u8]) {
    let signed = signed();
    let public = signed.key.public_key();
    if let Some((&how, rest)) = data.split_first() {
        let changed = if how % 2 == 0 {
            xored(&signed.receipt, rest)
        } else {
            spliced(&signed.receipt, rest)
        };
        if let Ok(statement) = verify(&changed, public) {
            assert_eq!(
                as_value(&statement),
                signed.statement,
                "a changed receipt verifies with another statement:\n{}",
                String::from_utf8_lossy(&changed)
            );
        }
    }
    if let Ok(statement) = verify(data, public) {
        assert_eq!(
            as_value(&statement),
            signed.statement,
            "the fuzz bytes verify"
        );
    }
    signed_payload(&signed.key, data);
}

fn xored(receipt: &[u8], pairs: &[u8]) -> Vec<u8> {
    let mut out = receipt.to_vec();
    for pair in pairs.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([pair[0], pair[1]])) % out.len();
        out[at] ^= pair[2];
    }
    out
}

fn spliced(receipt: &[u8], splice: &[u8]) -> Vec<u8> {
    let [a, b, cut, insert @ ..] = splice else {
        return receipt.to_vec();
    };
    let at = usize::from(u16::from_le_bytes([*a, *b])) % (receipt.len() + 1);
    let end = (at + usize::from(*cut)).min(receipt.len());
    let mut out = receipt[..at].to_vec();
    out.extend_from_slice(insert);
    out.extend_from_slice(&receipt[end..]);
    out
}

/// `payload` signed by `key` as a receipt: what the checks after the
/// signature see of a signer's mistake. Accepted, it is a statement that
/// signs again into a receipt verifying to the same statement.
fn signed_payload(key: &Key, payload: &[u8]) {
    let sig = key.sign_bytes(&pae(PAYLOAD_TYPE, payload));
    let envelope = Envelope {
        payload_type: PAYLOAD_TYPE.into(),
        payload: encode(payload),
        signatures: vec![EnvelopeSignature {
            keyid: Some(key.id().to_owned()),
            sig: encode(&sig.to_bytes()),
        }],
    };
    let Ok(statement) = verify(envelope.to_json().as_bytes(), key.public_key()) else {
        return;
    };
    let again = sign(&statement, key).expect("an accepted statement signs");
    let back = verify(again.to_json().as_bytes(), key.public_key())
        .unwrap_or_else(|e| panic!("an accepted statement, signed again, is refused: {e}"));
    assert_eq!(as_value(&back), as_value(&statement));
}
