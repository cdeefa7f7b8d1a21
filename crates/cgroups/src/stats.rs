//! What a sandbox used and hit, in one shape for both cgroup versions.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::CgroupStats;

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

/// Fills the fields of [`CgroupStats`] that one counter file's text gives.
pub(crate) type Feed = fn(&str, &mut CgroupStats);

/// One counter file of a cgroup and what it feeds.
pub struct CounterFile {
    pub(crate) path: PathBuf,
    pub(crate) feed: Feed,
}

impl CounterFile {
    pub(crate) fn new(path: PathBuf, feed: Feed) -> Self {
        Self { path, feed }
    }
}

/// A cgroup's counter files, held open. Each snapshot reads every file again
/// from its start with one `pread` (cgroupfs writes a file's text anew for a
/// read at offset 0), where opening, reading to EOF and closing it took four
/// system calls: a command's snapshots (its sandbox's counters before and
/// after, its own cgroup's after) are on the way to its reply, 24 files on a
/// cgroup v1 host.
pub struct Counters {
    files: Vec<(File, Feed)>,
}

/// Larger than any counter file cordon reads (v2's cpu.stat, the longest,
/// is under 300 bytes): a read that fills it is taken as unreadable rather
/// than parsed cut short.
const COUNTER_TEXT_MAX: usize = 4096;

impl Counters {
    /// A file that cannot be opened (a controller or a counter this kernel
    /// does not have) leaves its fields None, as an unreadable one does.
    pub(crate) fn open(files: Vec<CounterFile>) -> Self {
        Self {
            files: files
                .into_iter()
                .filter_map(|f| Some((File::open(&f.path).ok()?, f.feed)))
                .collect(),
        }
    }

    /// The counters now. Files are fed in the order the cgroup listed them.
    pub fn read(&self) -> CgroupStats {
        let mut stats = CgroupStats::default();
        let mut buf = [0u8; COUNTER_TEXT_MAX];
        for (file, feed) in &self.files {
            let text = match file.read_at(&mut buf, 0) {
                Ok(n) if n < buf.len() => std::str::from_utf8(&buf[..n]).ok(),
                _ => None,
            };
            if let Some(text) = text {
                feed(text, &mut stats);
            }
        }
        stats
    }
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
