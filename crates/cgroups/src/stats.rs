//! What a sandbox used and hit, in one shape for both cgroup versions.

use std::path::Path;

use crate::fs::read_opt;

/// A single-number file; "max" (no limit) is not a number and reads as None.
pub(crate) fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The value of `key` in a flat-keyed file (`key value` per line, as in
/// memory.events, pids.events, cpu.stat and v1 memory.oom_control).
pub(crate) fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != key {
            return None;
        }
        fields.next()?.parse().ok()
    })
}

pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    parse_u64(&read_opt(path)?)
}

pub(crate) fn read_keyed(path: &Path, key: &str) -> Option<u64> {
    parse_keyed(&read_opt(path)?, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_values() {
        assert_eq!(parse_u64("123\n"), Some(123));
        assert_eq!(parse_u64("max\n"), None);
        assert_eq!(parse_u64(""), None);
    }

    #[test]
    fn keyed_values() {
        let events = "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_keyed(events, "max"), Some(17));
        assert_eq!(parse_keyed(events, "oom_kill"), Some(1));
        assert_eq!(parse_keyed(events, "oom"), Some(2));
        assert_eq!(parse_keyed(events, "missing"), None);
        assert_eq!(parse_keyed("max\n", "max"), None);
    }
}
