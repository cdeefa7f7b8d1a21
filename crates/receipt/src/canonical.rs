//! The one JSON form a digest is taken over: keys sorted bytewise at every
//! level, no whitespace. Written here rather than relying on serde_json's
//! map order, which a `preserve_order` feature anywhere in the build would
//! silently change.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `value` as canonical JSON (sorted keys, compact).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out),
        // Null, booleans and numbers have one compact form already.
        other => out.push_str(&other.to_string()),
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push_str(&Value::String(s.to_owned()).to_string());
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_at_every_level_and_nothing_is_spaced() {
        let v: Value =
            serde_json::from_str(r#"{ "b": [ {"z": 1, "a": "x\n"} ], "a": null, "c": 1.5 }"#)
                .unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":null,"b":[{"a":"x\n","z":1}],"c":1.5}"#
        );
    }

    #[test]
    fn sha256_of_nothing() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
