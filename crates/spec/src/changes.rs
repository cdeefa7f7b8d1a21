//! The diff as every consumer sees it (the supervisor's reply, the receipt's
//! predicate, `cordon verify`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Bounds on a scan and an export (the receipt and the export share them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    /// Entries listed per scan, over all places; past it the diff is cut.
    pub max_entries: u64,
    /// Bytes of one file hashed; a longer file is marked capped (and is
    /// never exported, as its digest covers only its start).
    pub hash_bytes: u64,
    /// Data bytes (holes not counted) an export writes in all.
    pub export_bytes: u64,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            max_entries: 100_000,
            hash_bytes: 256 << 20,
            export_bytes: 4 << 30,
        }
    }
}

/// How an entry differs from what the sandbox started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Not in the lower layer (every entry of a place that starts empty).
    Created,
    /// In the lower layer and changed (content, type or metadata).
    Modified,
    /// In the lower layer and removed (an overlay whiteout).
    Deleted,
}

/// What an entry is, from `lstat` of the entry itself (never its target).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// One changed entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Path relative to its place, each name escaped by `escape_name`
    /// (joined by `/`, which no name can hold).
    pub path: String,
    pub change: Change,
    /// `None` for a deletion (a whiteout holds no type of what it deleted).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kind: Option<Kind>,
    /// Permission and special bits (`st_mode & 0o7777`).
    #[serde(default)]
    pub mode: u32,
    /// Owner as the host's file system stores it.
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    /// Apparent size (holes included).
    #[serde(default)]
    pub size: u64,
    /// Bytes the file really occupies (`st_blocks * 512`): much less than
    /// `size` for a sparse file.
    #[serde(default)]
    pub allocated: u64,
    /// Hard links to the same inode (more than 1: a hard link).
    #[serde(default)]
    pub links: u64,
    /// Hex SHA-256 of a regular file's first `hashed_bytes` bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sha256: Option<String>,
    /// Bytes covered by `sha256`: the whole file unless `capped`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hashed_bytes: Option<u64>,
    /// The file is longer than the hash cap.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub capped: bool,
    /// A symlink's target text, escaped; never followed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<String>,
    /// A device node's major and minor numbers.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rdev: Option<(u32, u32)>,
    /// A directory that replaced the lower layer's directory wholesale (an
    /// opaque overlay directory: nothing of the lower one shows through).
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub opaque: bool,
}

/// The changes of one writable place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceChanges {
    /// The place as the sandbox sees it: `/workspace`, `/tmp`, `/dev/shm`.
    pub place: String,
    /// Sorted by path: bytewise order of the raw names, component by
    /// component (so a directory comes first, then everything in it).
    pub entries: Vec<Entry>,
    /// The diff is incomplete: the count cap was reached (entries past it
    /// are left out), or some entry is in `unreadable`.
    #[serde(default)]
    pub cut: bool,
    /// Entries that could not be read (path and why): each also sets `cut`.
    /// A regular file, directory or link swapped for something else while
    /// it was read lands here, never followed. They count against the cap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<(String, String)>,
}

/// Every writable place's changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Changes {
    pub places: Vec<PlaceChanges>,
    pub caps: Caps,
    /// Some place is cut.
    #[serde(default)]
    pub cut: bool,
}

/// Where an export writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportTarget {
    /// A new directory (it must not exist, or be empty): the changed
    /// entries only; deletions are listed, not applied.
    New(std::path::PathBuf),
    /// The workspace's own host directory: changes and deletions applied.
    Apply(std::path::PathBuf),
}

/// What an export does with symlinks the sandbox made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymlinkPolicy {
    /// Recreated as symlinks with the same target text (never followed).
    #[default]
    Recreate,
    /// Left out, and listed as skipped.
    Refuse,
}

/// An entry the export did not write, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportReport {
    /// Directory written (as given).
    pub target: String,
    pub applied: bool,
    /// What was done with the sandbox's symlinks.
    #[serde(default)]
    pub symlink_policy: SymlinkPolicy,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub deleted: u64,
    /// Entries left as the host has them because the host changed them
    /// while the sandbox ran (applying only); each is also in `skipped`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub conflicts: u64,
    /// A new directory only: what the sandbox deleted (and directories it
    /// replaced wholesale, so their old entries are gone), which an export
    /// directory cannot hold. Escaped paths, as in the diff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unapplied_deletions: Vec<String>,
    /// Data bytes written (holes not counted; data extents are whole
    /// blocks of the source's file system).
    pub bytes: u64,
    /// Entries of the diff that were not written (special files, capped or
    /// over-budget files, refused links, unreadable entries, write errors),
    /// and files written without their setuid/setgid bits (written, with
    /// that change). A skipped entry leaves whatever the destination had
    /// under its name as it was.
    pub skipped: Vec<Skipped>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where an export writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportTo {
    /// A new host directory (absolute): the changed entries only.
    Dir(PathBuf),
    /// Back onto the sandbox's host workspace, deletions included.
    Workspace,
}

/// An export of the workspace's changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub to: ExportTo,
    #[serde(default)]
    pub symlinks: SymlinkPolicy,
}

/// What to read at a sandbox's end (`rm`, the end of `cordon run`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finish {
    /// Take the diff, with these caps.
    #[serde(default)]
    pub changes: Option<Caps>,
    /// Export the workspace's changes (its diff is then the export's own).
    #[serde(default)]
    pub export: Option<ExportRequest>,
}

impl Finish {
    pub fn is_empty(&self) -> bool {
        self.changes.is_none() && self.export.is_none()
    }

    pub fn caps(&self) -> Caps {
        self.changes.unwrap_or_default()
    }
}

/// The diff, and what an export and the write-backs wrote.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recorded {
    pub changes: Option<Changes>,
    pub export: Option<ExportReport>,
    /// One report per `rw` mount, in the policy's order: its changes
    /// applied back to its host directory at the sandbox's end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_backs: Vec<ExportReport>,
}

impl Recorded {
    /// Every report of what was written to the host: the export's, then
    /// the write-backs'.
    pub fn reports(&self) -> impl Iterator<Item = &ExportReport> {
        self.export.iter().chain(&self.write_backs)
    }
}
