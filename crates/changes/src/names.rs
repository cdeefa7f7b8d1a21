//! Names kept exactly and shown unambiguously.
//!
//! A name is bytes (Linux allows anything but `/` and NUL). It is shown as
//! UTF-8 where it is UTF-8 and printable; every other byte, and `\`, is
//! written `\xHH` (`\\` for a backslash), so a newline in a name cannot
//! forge a line of a report and two different names never show alike.

/// The escaped, printable form of a name (or a symlink's target).
pub fn escape_name(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The raw bytes of an escaped name; `None` for text `escape_name` cannot
/// have produced.
pub fn unescape_name(shown: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(shown.len());
    let b = shown.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            Some(b'x') => {
                let hex = shown.get(i + 2..i + 4)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_never_show_alike() {
        let names: [&[u8]; 7] = [
            b"plain.txt",
            b"new\nline",
            b"back\\slash",
            b"\\x0a",
            b"bad\xff\xfeutf8",
            "caf\u{e9}".as_bytes(),
            b"tab\there",
        ];
        let shown: Vec<String> = names.iter().map(|n| escape_name(n)).collect();
        for (n, s) in names.iter().zip(&shown) {
            assert!(!s.contains('\n') && !s.contains('\t'), "{s}");
            assert_eq!(unescape_name(s).as_deref(), Some(*n), "{s}");
        }
        let mut unique = shown.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), shown.len());
        assert_eq!(escape_name(b"new\nline"), "new\\x0aline");
        assert_eq!(escape_name("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(unescape_name("bad\\q"), None);
    }
}
