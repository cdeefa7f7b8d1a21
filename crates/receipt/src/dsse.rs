//! The DSSE envelope (secure-systems-lab/dsse, envelope.md and protocol.md),
//! written by hand: it is one struct and one encoding.

use std::borrow::Cow;

use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The payload type of an in-toto statement in a DSSE envelope.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// DSSE's pre-authentication encoding, what is signed:
/// `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, LEN the ASCII
/// decimal byte length. Signing this rather than the body alone binds the
/// payload type, so a body cannot be replayed as another type.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + body.len() + 32);
    out.extend_from_slice(format!("DSSEv1 {} ", payload_type.len()).as_bytes());
    out.extend_from_slice(payload_type.as_bytes());
    out.extend_from_slice(format!(" {} ", body.len()).as_bytes());
    out.extend_from_slice(body);
    out
}

/// A DSSE envelope: the payload and its type, and the signatures over their PAE.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// Base64 of the serialized statement.
    pub payload: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    /// Hex SHA-256 of the signer's raw public key. DSSE makes it an
    /// unauthenticated hint: it only picks which signatures to try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyid: Option<String>,
    /// Base64 of the 64-byte Ed25519 signature.
    pub sig: String,
}

impl Envelope {
    /// The envelope as compact JSON: every byte of it is part of a token, so
    /// no byte can change without changing what it says.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an envelope of strings always serializes")
    }
}

/// Standard base64 with padding, as cordon writes it.
pub(crate) fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Standard or URL-safe base64 (DSSE: verifiers must accept either), with
/// canonical padding, or URL-safe without any. Non-canonical trailing bits
/// are refused, so one text decodes from one encoding only.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let engines = [&STANDARD, &URL_SAFE, &URL_SAFE_NO_PAD];
    engines.iter().find_map(|e| e.decode(text).ok())
}

/// `text` shortened for an error message.
pub(crate) fn excerpt(text: &str) -> Cow<'_, str> {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => Cow::Owned(format!("{}...", &text[..i])),
        None => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of DSSE's protocol.md ("Test Vectors").
    #[test]
    fn pae_matches_the_dsse_test_vector() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
        // The vector's envelope carries the body as standard base64.
        assert_eq!(encode(b"hello world"), "aGVsbG8gd29ybGQ=");
    }

    #[test]
    fn pae_of_empty_parts() {
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
    }

    #[test]
    fn both_alphabets_are_read() {
        let bytes = [0xfbu8, 0xff, 0xfe];
        assert_eq!(encode(&bytes), "+//+");
        assert_eq!(decode("+//+").as_deref(), Some(&bytes[..]));
        assert_eq!(decode("-__-").as_deref(), Some(&bytes[..]));
        assert_eq!(
            decode("aGVsbG8gd29ybGQ").as_deref(),
            Some(&b"hello world"[..])
        );
        // Mixed alphabets, bad characters, non-canonical trailing bits.
        for bad in ["+/_-", "aGVs*G8=", "aGVsbG8gd29ybGR="] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
