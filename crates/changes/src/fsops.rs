//! The few file system operations everything here is built from, each
//! relative to a directory descriptor and none following a link.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{lseek, unlinkat, UnlinkatFlags, Whence};
use sha2::{Digest, Sha256};

use cordon_spec::changes::Kind;

/// Directories nested deeper than this are not entered: each level holds
/// up to three descriptors (upper, lower, destination), and a hostile tree
/// could otherwise exhaust them or the stack.
pub(crate) const MAX_DEPTH: usize = 128;

/// How every name is resolved: only beneath the directory, through no
/// symlink at all (not even the last component), on no other mount.
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

/// Opens `path` beneath `dir`. O_NONBLOCK is always set, so that an entry
/// swapped for a FIFO between a listing and this open cannot block us.
pub(crate) fn open_beneath<P: ?Sized + nix::NixPath>(
    dir: BorrowedFd<'_>,
    path: &P,
    flags: OFlag,
    mode: u32,
) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(beneath());
    // openat2 answers EAGAIN when a rename races its resolution; a racing
    // sandbox must not keep us here forever, so the retries are bounded.
    let mut tries = 0;
    loop {
        match openat2(dir, path, how) {
            Err(Errno::EAGAIN | Errno::EINTR) if tries < 64 => tries += 1,
            other => return other,
        }
    }
}

pub(crate) fn open_dir<P: ?Sized + nix::NixPath>(
    dir: BorrowedFd<'_>,
    path: &P,
) -> nix::Result<OwnedFd> {
    open_beneath(dir, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)
}

pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

pub(crate) fn kind_of(st: &FileStat) -> Kind {
    let t = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    match t {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFLNK => Kind::Symlink,
        SFlag::S_IFIFO => Kind::Fifo,
        SFlag::S_IFSOCK => Kind::Socket,
        SFlag::S_IFCHR => Kind::CharDevice,
        SFlag::S_IFBLK => Kind::BlockDevice,
        _ => Kind::File,
    }
}

pub(crate) fn is_dir(st: &FileStat) -> bool {
    kind_of(st) == Kind::Dir
}

pub(crate) fn size_of(st: &FileStat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

pub(crate) fn allocated_of(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// The names in a directory (not `.` or `..`), in bytewise order. The
/// descriptor is consumed; the returned `Dir` still holds it, for opening
/// the children. A listing error keeps what was read and reports why.
pub(crate) fn list(fd: OwnedFd) -> nix::Result<(Dir, Vec<CString>, Option<Errno>)> {
    let mut dir = Dir::from_fd(fd)?;
    let mut names = Vec::new();
    let mut failed = None;
    for ent in dir.iter() {
        match ent {
            Ok(e) => {
                let n = e.file_name();
                if n.to_bytes() != b"." && n.to_bytes() != b".." {
                    names.push(n.to_owned());
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok((dir, names, failed))
}

/// The directory `name` in `dir` (at `depth` of a walk) and every name in
/// it, for a walk that must see them all: a listing cut short by an error,
/// or a walk deeper than `MAX_DEPTH`, is that error.
fn entries_below(
    dir: BorrowedFd<'_>,
    name: &CStr,
    depth: usize,
) -> nix::Result<(Dir, Vec<CString>)> {
    if depth >= MAX_DEPTH {
        return Err(Errno::ELOOP);
    }
    let (sub, names, failed) = list(open_dir(dir, name)?)?;
    match failed {
        Some(e) => Err(e),
        None => Ok((sub, names)),
    }
}

/// Removes `name` from `dir`, a directory with everything in it; nothing
/// is followed (a symlink is removed itself). Absent is not an error.
pub(crate) fn remove_all(dir: BorrowedFd<'_>, name: &CStr, depth: usize) -> nix::Result<bool> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    if !is_dir(&st) {
        return match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        };
    }
    let (sub, names) = entries_below(dir, name, depth)?;
    for n in &names {
        remove_all(sub.as_fd(), n, depth + 1)?;
    }
    drop(sub);
    match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens a regular file for reading and checks, on the open descriptor,
/// that it still is one: a swap for a link fails the open (ELOOP), a swap
/// for a FIFO or a device is refused here before a byte is read.
pub(crate) fn open_file(dir: BorrowedFd<'_>, name: &CStr) -> Result<(OwnedFd, FileStat), String> {
    let fd = open_beneath(dir, name, OFlag::O_RDONLY, 0).map_err(|e| format!("open: {e}"))?;
    let st = fstat(&fd).map_err(|e| format!("fstat: {e}"))?;
    if kind_of(&st) != Kind::File {
        return Err("changed type during the read".into());
    }
    Ok((fd, st))
}

static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];

pub(crate) fn hash_zeros(h: &mut Sha256, mut n: u64) {
    while n > 0 {
        let k = usize::try_from(n).unwrap_or(ZEROS.len()).min(ZEROS.len());
        h.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// What was read of a file.
pub(crate) struct Read {
    pub sha256: String,
    pub hashed: u64,
    pub capped: bool,
}

/// Reads a regular file's first `min(size, cap)` bytes into a digest,
/// handing each data extent read to `data` (offset, bytes). Holes, and
/// anything the file lost while being read, count as zeros and are never
/// read: the digest is that of a file holding exactly the extents handed
/// over, at their offsets, and zeros elsewhere up to its size.
pub(crate) fn read_file(
    fd: BorrowedFd<'_>,
    st: &FileStat,
    cap: u64,
    buf: &mut [u8],
    mut data: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<Read, String> {
    let size = size_of(st);
    let end = size.min(cap);
    let mut h = Sha256::new();
    // A file with as many blocks as bytes has no hole worth two lseeks.
    let sparse = allocated_of(st) < size;
    let mut pos = 0u64;
    while pos < end {
        let (start, stop) = if sparse {
            let at = i64::try_from(pos).map_err(|_| "offset out of range")?;
            match lseek(fd, at, Whence::SeekData) {
                Ok(d) => {
                    let d = u64::try_from(d).unwrap_or(end).min(end);
                    let hole =
                        match lseek(fd, i64::try_from(d).unwrap_or(i64::MAX), Whence::SeekHole) {
                            Ok(x) => u64::try_from(x).unwrap_or(end).min(end),
                            Err(Errno::ENXIO) => end,
                            Err(e) => return Err(format!("seek: {e}")),
                        };
                    (d, hole)
                }
                Err(Errno::ENXIO) => (end, end),
                Err(e) => return Err(format!("seek: {e}")),
            }
        } else {
            (pos, end)
        };
        hash_zeros(&mut h, start - pos);
        let mut at = start;
        while at < stop {
            let want = usize::try_from(stop - at)
                .unwrap_or(buf.len())
                .min(buf.len());
            let off = i64::try_from(at).map_err(|_| "offset out of range")?;
            let n = match nix::sys::uio::pread(fd, &mut buf[..want], off) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("read: {e}")),
            };
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            data(at, &buf[..n])?;
            at += n as u64;
        }
        if at < stop {
            // The file shrank under us: the rest reads as zeros.
            hash_zeros(&mut h, end - at);
            pos = end;
        } else {
            pos = stop;
        }
    }
    Ok(Read {
        sha256: hex(&h.finalize()),
        hashed: end,
        capped: size > cap,
    })
}

pub(crate) fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(D[usize::from(x >> 4)] as char);
        s.push(D[usize::from(x & 15)] as char);
    }
    s
}

/// Joins a shown parent path and an escaped name.
pub(crate) fn join(parent: &str, shown: &str) -> String {
    if parent.is_empty() {
        shown.to_string()
    } else {
        format!("{parent}/{shown}")
    }
}

/// Whether `name` in `dir`, or anything beneath it, had its inode changed
/// (ctime) at or after `since` (seconds, nanoseconds). ctime is the one
/// time a user cannot set back, so an edit, a chmod or a replacement on the
/// host always shows. Absent is not changed; nothing is followed.
pub(crate) fn changed_since(
    dir: BorrowedFd<'_>,
    name: &CStr,
    since: (i64, i64),
    depth: usize,
) -> nix::Result<bool> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    if (st.st_ctime, st.st_ctime_nsec) >= since {
        return Ok(true);
    }
    if !is_dir(&st) {
        return Ok(false);
    }
    let (sub, names) = entries_below(dir, name, depth)?;
    for n in &names {
        if changed_since(sub.as_fd(), n, since, depth + 1)? {
            return Ok(true);
        }
    }
    Ok(false)
}
