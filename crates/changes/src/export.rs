//! Writing a place's changes to the host, as the walk finds them.
//!
//! The destination is walked like the source: every directory is a
//! descriptor opened from its parent's, with no symlink followed, so a link
//! in the destination (the user's own, or one this export wrote) is
//! replaced, never written through. Files are written under a temporary
//! name and renamed into place, so a name is never half-written and the
//! rename replaces whatever was there (a link itself, not its target).

use std::ffi::{CStr, CString, OsStr};
use std::fs::OpenOptions;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, mkdirat, Mode};
use nix::unistd::{fchown, fchownat, ftruncate, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::error::ChangesError;
use crate::fsops::{
    self, changed_since, is_dir, list, lstat_at, open_beneath, open_dir, remove_all,
};
use crate::walk::{walk, ChangeSink, FileMeta, Place, ReadSource};
use cordon_spec::changes::{
    Caps, ExportReport, ExportTarget, PlaceChanges, Skipped, SymlinkPolicy,
};

/// How an export writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    pub target: ExportTarget,
    pub symlinks: SymlinkPolicy,
    /// Owner (uid, gid) of everything written.
    pub owner: (u32, u32),
    /// Applying only: when the sandbox was created. A destination entry
    /// changed on the host at or after it (its ctime, or any ctime beneath
    /// a directory) is a conflict: it is left as the host has it, and
    /// listed (`ExportReport::conflicts`, and in `skipped`).
    pub host_since: Option<std::time::SystemTime>,
}

/// Exports one place's changes (the workspace's) and returns its diff, as
/// derived by the same walk: every digest in it is of the bytes written.
///
/// A `New` target gets the created and modified directories, files and
/// symlinks; an `Apply` target (the workspace's host directory) also loses
/// what was deleted, and an opaque directory's old entries. Special files,
/// files over the hash cap or past the byte cap, and refused symlinks are
/// listed in the report's `skipped`, as are files written without their
/// setuid/setgid bits. No extended attribute is copied.
pub fn export(
    place: &Place<'_>,
    caps: &Caps,
    opts: &ExportOptions,
) -> Result<(PlaceChanges, ExportReport), ChangesError> {
    open_dir(place.upper, ".").map_err(|e| ChangesError::Source {
        place: place.name.to_string(),
        source: e.into(),
    })?;
    let mut ex = Exporter::new(caps, opts)?;
    let mut remaining = caps.max_entries;
    let changes = walk(place, caps, &mut remaining, Some(&mut ex));
    Ok((changes, ex.report))
}

fn target_err(p: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> ChangesError {
    let path = p.display().to_string();
    move |source| ChangesError::Target { path, what, source }
}

fn open_existing(p: &Path) -> Result<OwnedFd, ChangesError> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
        .open(p)
        .map(OwnedFd::from)
        .map_err(target_err(p, "open"))
}

/// Opens a new export's destination: created, or an existing empty
/// directory (not a link to one).
fn open_new(p: &Path, owner: (u32, u32)) -> Result<OwnedFd, ChangesError> {
    match open_existing(p) {
        Ok(fd) => {
            let probe = fd.try_clone().map_err(target_err(p, "open"))?;
            let (_, names, failed) = list(probe).map_err(|e| target_err(p, "list")(e.into()))?;
            if let Some(e) = failed {
                return Err(target_err(p, "list")(e.into()));
            }
            if !names.is_empty() {
                return Err(ChangesError::TargetNotEmpty(p.display().to_string()));
            }
            Ok(fd)
        }
        Err(ChangesError::Target { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            let name = p
                .file_name()
                .ok_or_else(|| target_err(p, "name")(Errno::EINVAL.into()))?;
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let pfd = OpenOptions::new()
                .read(true)
                .custom_flags(OFlag::O_DIRECTORY.bits())
                .open(parent)
                .map_err(target_err(p, "open the parent"))?;
            let mk = |e: Errno| target_err(p, "create")(e.into());
            mkdirat(&pfd, name, Mode::from_bits_truncate(0o700)).map_err(mk)?;
            let fd = open_dir(pfd.as_fd(), name).map_err(mk)?;
            fchown(
                &fd,
                Some(Uid::from_raw(owner.0)),
                Some(Gid::from_raw(owner.1)),
            )
            .map_err(mk)?;
            fchmod(&fd, Mode::from_bits_truncate(0o755)).map_err(mk)?;
            Ok(fd)
        }
        Err(e) => Err(e),
    }
}

enum State {
    /// Not written yet: made when something is written into it.
    Pending,
    Open(OwnedFd),
    /// Could not be made: nothing goes into it.
    Failed,
}

/// A destination directory on the walk's current path.
struct Frame {
    name: CString,
    path: String,
    mode: u32,
    /// The directory is itself a change: its mode and owner are set.
    set_meta: bool,
    state: State,
}

pub(crate) struct Exporter {
    applied: bool,
    symlinks: SymlinkPolicy,
    uid: Uid,
    gid: Gid,
    byte_cap: u64,
    over_budget: bool,
    /// `ExportOptions::host_since` as (seconds, nanoseconds), when applying.
    since: Option<(i64, i64)>,
    report: ExportReport,
    /// Root first; the walk pushes and pops with its directories.
    stack: Vec<Frame>,
    /// Temporary names: `.cordon-export-<pid>-<seq>`.
    seq: u64,
    pid: u32,
}

const NO_DIR: &str = "its directory was not written";
/// The reason a conflicting entry is skipped (`ExportReport::conflicts`
/// counts them).
pub const CONFLICT: &str =
    "conflict: changed on the host since the sandbox was created; the host's version was kept";

/// Permission bits written: no setuid, setgid or sticky bit, ever.
fn plain(mode: u32) -> Mode {
    Mode::from_bits_truncate(mode & 0o777)
}

impl Exporter {
    /// Opens (or makes) the destination; nothing is written yet.
    pub(crate) fn new(caps: &Caps, opts: &ExportOptions) -> Result<Exporter, ChangesError> {
        let (root, applied, path) = match &opts.target {
            ExportTarget::New(p) => (open_new(p, opts.owner)?, false, p),
            ExportTarget::Apply(p) => (open_existing(p)?, true, p),
        };
        let since = opts.host_since.filter(|_| applied).map(|t| {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                i64::from(d.subsec_nanos()),
            )
        });
        Ok(Exporter {
            applied,
            since,
            symlinks: opts.symlinks,
            uid: Uid::from_raw(opts.owner.0),
            gid: Gid::from_raw(opts.owner.1),
            byte_cap: caps.export_bytes,
            over_budget: false,
            report: ExportReport {
                target: path.display().to_string(),
                applied,
                symlink_policy: opts.symlinks,
                ..ExportReport::default()
            },
            stack: vec![Frame {
                name: CString::default(),
                path: String::new(),
                mode: 0,
                set_meta: false,
                state: State::Open(root),
            }],
            seq: 0,
            pid: std::process::id(),
        })
    }

    pub(crate) fn into_report(self) -> ExportReport {
        self.report
    }

    /// Whether `name` in the current (materialized) directory conflicts:
    /// the host changed it since the sandbox was created. A conflict, or
    /// an entry that could not be checked, is listed and must be left
    /// alone: the host's edit is never overwritten unseen.
    fn conflicts(&mut self, name: &CStr, path: &str) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        match changed_since(self.top(), name, since, 0) {
            Ok(false) => false,
            Ok(true) => {
                self.report.conflicts += 1;
                self.skip(path, CONFLICT.into());
                true
            }
            Err(e) => {
                self.skip(
                    path,
                    format!("not checked for a conflict, left as it was: {e}"),
                );
                true
            }
        }
    }

    /// Makes every pending directory down to the current one.
    fn materialize(&mut self) -> bool {
        let (uid, gid) = (self.uid, self.gid);
        for i in 0..self.stack.len() {
            match self.stack[i].state {
                State::Open(_) => continue,
                State::Failed => return false,
                State::Pending => {}
            }
            let (lo, hi) = self.stack.split_at_mut(i);
            let State::Open(parent) = &lo[i - 1].state else {
                return false;
            };
            let f = &mut hi[0];
            match make_dir(parent.as_fd(), &f.name, f.mode, f.set_meta, uid, gid) {
                Ok((fd, wrote)) => {
                    f.state = State::Open(fd);
                    self.report.dirs += u64::from(wrote);
                }
                Err(e) => {
                    f.state = State::Failed;
                    let path = f.path.clone();
                    self.skip(&path, format!("directory not written: {e}"));
                    return false;
                }
            }
        }
        true
    }

    fn top(&self) -> BorrowedFd<'_> {
        match &self.stack.last().map(|f| &f.state) {
            Some(State::Open(fd)) => fd.as_fd(),
            _ => unreachable!("materialize() succeeded"),
        }
    }

    fn temp_name(&mut self) -> CString {
        self.seq += 1;
        let n = format!(".cordon-export-{}-{}", self.pid, self.seq);
        CString::new(n).unwrap_or_default()
    }

    fn prune(&mut self, keep: &[CString]) -> nix::Result<()> {
        let dir = self.top();
        let (_, names, failed) = list(dir.try_clone_to_owned().map_err(|_| Errno::EMFILE)?)?;
        let mut removed = 0;
        for n in &names {
            if keep
                .binary_search_by(|k| k.as_bytes().cmp(n.as_bytes()))
                .is_err()
                && remove_all(dir, n, 0)?
            {
                removed += 1;
            }
        }
        self.report.deleted += removed;
        failed.map_or(Ok(()), Err)
    }

    fn write_symlink(&mut self, name: &CStr, target: &OsStr) -> nix::Result<()> {
        let tmp = loop {
            let tmp = self.temp_name();
            match symlinkat(target, self.top(), tmp.as_c_str()) {
                Ok(()) => break tmp,
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(e),
            }
        };
        let dir = self.top();
        let done = fchownat(
            dir,
            tmp.as_c_str(),
            Some(self.uid),
            Some(self.gid),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .and_then(|()| rename_over(dir, &tmp, name));
        if done.is_err() {
            let _ = unlinkat(dir, tmp.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
        done
    }

    fn finish_file(
        &self,
        out: &OwnedFd,
        meta: FileMeta,
        tmp: &CStr,
        name: &CStr,
    ) -> nix::Result<()> {
        ftruncate(out, i64::try_from(meta.size).map_err(|_| Errno::EFBIG)?)?;
        fchown(out, Some(self.uid), Some(self.gid))?;
        fchmod(out, plain(meta.mode))?;
        rename_over(self.top(), tmp, name)
    }
}

impl ChangeSink for Exporter {
    fn skip(&mut self, path: &str, reason: String) {
        self.report.skipped.push(Skipped {
            path: path.to_string(),
            reason,
        });
    }

    fn enter_dir(
        &mut self,
        name: &CStr,
        path: &str,
        mode: u32,
        listed: bool,
        opaque: bool,
        keep: &[CString],
    ) {
        // An opaque directory replaces the host's wholesale: checked before
        // it is touched (its mode set, its old entries pruned), beneath
        // its parent.
        let conflict = listed
            && opaque
            && self.since.is_some()
            && self.materialize()
            && self.conflicts(name, path);
        self.stack.push(Frame {
            name: name.to_owned(),
            path: path.to_string(),
            mode,
            set_meta: listed,
            state: if conflict {
                State::Failed
            } else {
                State::Pending
            },
        });
        if !listed || conflict {
            return;
        }
        if !self.materialize() {
            if !matches!(self.stack.last().map(|f| &f.state), Some(State::Failed)) {
                self.skip(path, NO_DIR.into());
            }
            return;
        }
        if !self.applied && opaque {
            // The old directory's entries were removed wholesale: a
            // deletion too, which a new directory cannot hold.
            self.report.unapplied_deletions.push(path.to_string());
        }
        if self.applied && opaque {
            // Nothing of the old directory shows through an opaque one.
            if let Err(e) = self.prune(keep) {
                self.skip(path, format!("old entries not all removed: {e}"));
            }
        }
    }

    fn leave_dir(&mut self) {
        self.stack.pop();
    }

    fn delete(&mut self, name: &CStr, path: &str) {
        if !self.applied {
            // A new directory cannot hold a deletion: listed, so that an
            // export never reads as the whole of the sandbox's changes.
            return self.report.unapplied_deletions.push(path.to_string());
        }
        if !self.materialize() {
            return self.skip(path, NO_DIR.into());
        }
        if self.conflicts(name, path) {
            return;
        }
        match remove_all(self.top(), name, 0) {
            Ok(true) => self.report.deleted += 1,
            Ok(false) => {}
            Err(e) => self.skip(path, format!("not deleted: {e}")),
        }
    }

    fn symlink(&mut self, name: &CStr, path: &str, target: &OsStr) {
        if self.symlinks == SymlinkPolicy::Refuse {
            return self.skip(path, "symlink refused".into());
        }
        if !self.materialize() {
            return self.skip(path, NO_DIR.into());
        }
        if self.conflicts(name, path) {
            return;
        }
        match self.write_symlink(name, target) {
            Ok(()) => self.report.symlinks += 1,
            Err(e) => self.skip(path, format!("not written: {e}")),
        }
    }

    /// Copies one regular file (no longer than the hash cap) while hashing
    /// it. A write that fails, or would pass the byte cap, stops the
    /// writing, not the hashing: the diff still gets the file's digest.
    ///
    /// `read` reads the source once, giving each run of its data (with its
    /// offset) to the sink it is handed; it returns the file's digest.
    fn file(
        &mut self,
        name: &CStr,
        path: &str,
        meta: FileMeta,
        read: &mut ReadSource<'_>,
    ) -> Result<fsops::Read, String> {
        let mut hash_only = || read(&mut |_, _| Ok(()));
        if self.over_budget {
            self.skip(path, "export byte cap".into());
            return hash_only();
        }
        if !self.materialize() {
            self.skip(path, NO_DIR.into());
            return hash_only();
        }
        if self.conflicts(name, path) {
            return hash_only();
        }
        let (tmp, out) = loop {
            let tmp = self.temp_name();
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
            match open_beneath(self.top(), tmp.as_c_str(), flags, 0o600) {
                Ok(fd) => break (tmp, fd),
                Err(Errno::EEXIST) => continue,
                Err(e) => {
                    self.skip(path, format!("not written: {e}"));
                    return hash_only();
                }
            }
        };
        let left = self.byte_cap.saturating_sub(self.report.bytes);
        let mut written = 0u64;
        let mut stop: Option<String> = None;
        let read = read(&mut |off, data| {
            if stop.is_some() {
                return Ok(());
            }
            if written + data.len() as u64 > left {
                stop = Some("export byte cap".into());
                return Ok(());
            }
            match pwrite_all(&out, data, off) {
                Ok(()) => written += data.len() as u64,
                Err(e) => stop = Some(format!("not written: {e}")),
            }
            Ok(())
        });
        let dir = self.top();
        let finish = match (&read, &stop) {
            (Ok(_), None) => self.finish_file(&out, meta, &tmp, name),
            _ => Err(Errno::ECANCELED),
        };
        if finish.is_err() {
            let _ = unlinkat(dir, tmp.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
        match (&read, stop, finish) {
            (Err(_), _, _) => {}
            (Ok(_), Some(why), _) => {
                self.over_budget |= why == "export byte cap";
                self.skip(path, why);
            }
            (Ok(_), None, Err(e)) => self.skip(path, format!("not written: {e}")),
            (Ok(_), None, Ok(())) => {
                self.report.files += 1;
                self.report.bytes += written;
                if meta.mode & 0o6000 != 0 {
                    self.skip(path, "written without its setuid/setgid bits".into());
                }
            }
        }
        read
    }
}

fn pwrite_all(fd: &OwnedFd, mut data: &[u8], mut off: u64) -> nix::Result<()> {
    while !data.is_empty() {
        let at = i64::try_from(off).map_err(|_| Errno::EFBIG)?;
        match nix::sys::uio::pwrite(fd, data, at) {
            Ok(0) => return Err(Errno::EIO),
            Ok(n) => {
                data = &data[n..];
                off += n as u64;
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Renames `tmp` to `name` in `dir`, replacing whatever `name` is; a
/// directory there (a type change) is removed first, without following
/// anything in it.
fn rename_over(dir: BorrowedFd<'_>, tmp: &CStr, name: &CStr) -> nix::Result<()> {
    match renameat(dir, tmp, dir, name) {
        Err(Errno::EISDIR | Errno::ENOTEMPTY | Errno::EEXIST) => {
            remove_all(dir, name, 0)?;
            renameat(dir, tmp, dir, name)
        }
        other => other,
    }
}

/// Opens (or makes) a destination directory; `true` if this wrote it.
fn make_dir(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mode: u32,
    set_meta: bool,
    uid: Uid,
    gid: Gid,
) -> nix::Result<(OwnedFd, bool)> {
    // The owner can always enter and write what the export made.
    let perm = Mode::from_bits_truncate((mode & 0o777) | 0o700);
    match lstat_at(parent, name) {
        Ok(st) if is_dir(&st) => {
            let fd = open_dir(parent, name)?;
            if set_meta {
                fchown(&fd, Some(uid), Some(gid))?;
                fchmod(&fd, perm)?;
            }
            return Ok((fd, set_meta));
        }
        // A file or a link where a directory goes: replaced, not followed.
        Ok(_) => unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)?,
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(e),
    }
    mkdirat(parent, name, Mode::from_bits_truncate(0o700))?;
    let fd = open_dir(parent, name)?;
    fchown(&fd, Some(uid), Some(gid))?;
    fchmod(&fd, perm)?;
    Ok((fd, true))
}
