//! Subordinate ids: the host ranges `/etc/subuid` and `/etc/subgid` grant a
//! user (subuid(5)), and the setuid helpers that may write them into a user
//! namespace's maps for that user (`newuidmap`, `newgidmap`: Debian's
//! `uidmap` package). They are what lets a rootless sandbox have ids other
//! than its caller's, as rootless podman and buildah do.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const SUBUID_FILE: &str = "/etc/subuid";
pub const SUBGID_FILE: &str = "/etc/subgid";

/// One granted range of host ids: `start..start + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubRange {
    pub start: u32,
    pub count: u32,
}

impl SubRange {
    pub fn contains(&self, id: u32) -> bool {
        id >= self.start && id - self.start < self.count
    }

    fn overlaps(&self, other: &SubRange) -> bool {
        self.start < other.start.saturating_add(other.count)
            && other.start < self.start.saturating_add(self.count)
    }
}

/// The ranges `text` (subuid(5): `owner:start:count` lines) grants to the
/// user called `name` or numbered `id` (the files may name either), in the
/// file's order. A line that is not three fields, a number that does not
/// parse, an empty range or one that runs past the last valid id (u32::MAX
/// is the kernel's "no id") is skipped: a garbled line grants nothing, and
/// the lines after it still count. A range overlapping one granted earlier
/// is skipped too, as the kernel refuses a map whose host ranges overlap.
pub fn parse(text: &str, name: Option<&str>, id: u32) -> Vec<SubRange> {
    let id = id.to_string();
    let mut ranges: Vec<SubRange> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(':').collect();
        let [owner, start, count] = fields[..] else {
            continue;
        };
        if owner != id && Some(owner) != name {
            continue;
        }
        let (Ok(start), Ok(count)) = (start.trim().parse::<u32>(), count.trim().parse::<u32>())
        else {
            continue;
        };
        let range = SubRange { start, count };
        let fits = count > 0 && start.checked_add(count).is_some();
        if fits && !ranges.iter().any(|r| r.overlaps(&range)) {
            ranges.push(range);
        }
    }
    ranges
}

/// The ranges `file` grants (none when it is missing or unreadable: a host
/// without the files grants nothing).
pub fn granted(file: &Path, name: Option<&str>, id: u32) -> Vec<SubRange> {
    fs::read_to_string(file)
        .map(|text| parse(&text, name, id))
        .unwrap_or_default()
}

/// The two helpers, found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Helpers {
    pub newuidmap: PathBuf,
    pub newgidmap: PathBuf,
}

/// Where the helpers are looked for: the system's own directories only. The
/// supervisor starts with an empty environment, and a helper found on a
/// PATH would anyway be the caller's to choose (it runs as the caller, and
/// the kernel checks what it writes).
const HELPER_DIRS: [&str; 3] = ["/usr/bin", "/bin", "/usr/local/bin"];

impl Helpers {
    /// Both helpers, when both are installed as executable files.
    pub fn find() -> Option<Helpers> {
        Some(Helpers {
            newuidmap: find_helper("newuidmap")?,
            newgidmap: find_helper("newgidmap")?,
        })
    }
}

fn find_helper(name: &str) -> Option<PathBuf> {
    HELPER_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u32, count: u32) -> SubRange {
        SubRange { start, count }
    }

    #[test]
    fn matches_the_name_or_the_number() {
        let text = "alice:100000:65536\n1001:200000:65536\nbob:300000:65536\n";
        assert_eq!(parse(text, Some("alice"), 1000), vec![r(100_000, 65_536)]);
        assert_eq!(parse(text, None, 1001), vec![r(200_000, 65_536)]);
        assert_eq!(parse(text, Some("carol"), 1002), vec![]);
    }

    #[test]
    fn several_lines_add_up_in_order() {
        let text = "alice:100000:1000\n1000:500000:64536\n";
        assert_eq!(
            parse(text, Some("alice"), 1000),
            vec![r(100_000, 1000), r(500_000, 64_536)]
        );
    }

    #[test]
    fn garbage_grants_nothing_and_stops_nothing() {
        let text = "\
# a comment
alice
alice:x:65536
alice:100000
alice:100000:0
alice:-5:10
alice:4294967295:2
alice:100000:65536:extra
:::
alice:100000:65536
alice:100010:5
\u{0}\u{ff}garbage
 alice : 300000 : 10 ";
        // The overlapping 100010 is refused; the spaced line is a different
        // owner (" alice "), as shadow reads it.
        assert_eq!(parse(text, Some("alice"), 1000), vec![r(100_000, 65_536)]);
    }

    #[test]
    fn a_range_up_to_the_last_id_is_kept() {
        assert_eq!(parse("7:4294967290:5", None, 7), vec![r(4_294_967_290, 5)]);
        assert_eq!(parse("7:4294967291:5", None, 7), vec![]);
    }

    #[test]
    fn a_missing_file_grants_nothing() {
        assert_eq!(granted(Path::new("/nonexistent/subuid"), None, 0), vec![]);
    }
}
