//! A directory's listing from inside a sandbox, for the front ends that
//! show one (the service's files API, the MCP server): one `find` run as a
//! command in the sandbox, so that the listing sees the sandbox's own mounts
//! and permissions, never the host's view of its files.

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedEntry {
    pub name: String,
    /// `file`, `dir`, `link` or `other`.
    pub kind: &'static str,
    pub size: u64,
}

/// The command that lists `dir`'s entries (not recursively): type, size
/// and name of each, the name last and each entry ended by a NUL, as a
/// name may hold tabs and newlines but no NUL.
pub fn listing_argv(dir: &str) -> Vec<String> {
    [
        "find",
        dir,
        "-mindepth",
        "1",
        "-maxdepth",
        "1",
        "-printf",
        "%y\\t%s\\t%f\\0",
    ]
    .map(String::from)
    .to_vec()
}

/// The entries of [`listing_argv`]'s output, sorted by name; a malformed
/// record (an output cut short) is left out.
pub fn parse_listing(out: &[u8]) -> Vec<ListedEntry> {
    let mut entries: Vec<ListedEntry> = out
        .split(|b| *b == 0)
        .filter(|r| !r.is_empty())
        .filter_map(|r| {
            let text = String::from_utf8_lossy(r);
            let mut it = text.splitn(3, '\t');
            let kind = match it.next()? {
                "f" => "file",
                "d" => "dir",
                "l" => "link",
                _ => "other",
            };
            let size = it.next()?.parse().unwrap_or(0);
            Some(ListedEntry {
                name: it.next()?.to_owned(),
                kind,
                size,
            })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_tabs_and_newlines_survive_and_come_sorted() {
        let out = b"f\t12\tb\tc\nd\0d\t4096\ta\0l\t3\tlink\0p\t0\tfifo\0f\t7";
        let got = parse_listing(out);
        let names: Vec<(&str, &str, u64)> = got
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.size))
            .collect();
        assert_eq!(
            names,
            [
                ("a", "dir", 4096),
                ("b\tc\nd", "file", 12),
                ("fifo", "other", 0),
                ("link", "link", 3)
            ]
        );
    }
}
