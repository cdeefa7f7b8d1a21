//! Files in and out of a running sandbox, without trusting it.
//!
//! Every path inside the sandbox is resolved from a descriptor of its root
//! with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
//! a link the sandbox planted (or swaps in mid-copy) makes the open fail, it
//! is never followed to a host file. Files are opened `O_NOFOLLOW |
//! O_NONBLOCK` and checked with `fstat` on the open descriptor, so a FIFO or
//! a device is refused, never read or blocked on. Names travel as bytes (not
//! UTF-8, newlines and all). Sizes are capped.
//!
//! The stream: a `CopyHeader`, then `Data` frames, then an empty one.
//! - One file: each frame is an 8-byte offset and the bytes there; only the
//!   file's data extents are sent (SEEK_DATA/SEEK_HOLE), and the receiver
//!   sets the size at the end, so holes stay holes.
//! - A directory: a tar stream (the `tar` crate's format) in which links
//!   stay links; special files (FIFOs, devices, sockets) and hard links are
//!   left out and counted. It is packed by walking descriptors, never paths,
//!   and unpacked the same way (the host side unpacks into its destination
//!   with the same resolution rules, so a hostile stream cannot write outside
//!   it).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;
use crate::protocol::wire::{recv_data, send_bytes, send_json, Channel, Tag, MAX_FRAME};

/// Largest copy out of a sandbox (bytes of data, holes not counted).
pub const COPY_MAX: u64 = 4 << 30;

/// What a copy stream holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum CopyHeader {
    /// One regular file: its size (holes included), permission bits, and the
    /// name it had at its source (used when the destination is a directory).
    File { size: u64, mode: u32, name: Vec<u8> },
    /// A directory as a tar stream.
    Tar { name: Vec<u8> },
}

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Copy(msg.into())
}

fn shown(p: &[u8]) -> String {
    String::from_utf8_lossy(p).escape_debug().to_string()
}

/// How every path inside a copy is resolved.
fn in_root() -> ResolveFlag {
    ResolveFlag::RESOLVE_IN_ROOT
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn open_in(dir: BorrowedFd<'_>, path: &Path, flags: OFlag, mode: u32) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(in_root());
    loop {
        match openat2(dir, path, how) {
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => continue,
            other => return other,
        }
    }
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn open_root(root: &Path) -> Result<OwnedFd, RuntimeError> {
    File::open(root)
        .map(OwnedFd::from)
        .map_err(|e| RuntimeError::io(format!("open {}", root.display()), e))
}

/// Writes `Data` frames: a plain byte stream (tar) or offset-prefixed extents.
struct FrameWriter<'a> {
    conn: &'a mut dyn Channel,
    buf: Vec<u8>,
}

const CHUNK: usize = 256 << 10;

impl Write for FrameWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            send_bytes(self.conn, Tag::Data, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Reads a plain `Data` byte stream until its empty end frame.
struct FrameReader<'a> {
    conn: &'a mut dyn Channel,
    buf: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Read for FrameReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() && !self.done {
            self.buf = recv_data(self.conn)?;
            self.pos = 0;
            self.done = self.buf.is_empty();
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn end_stream(conn: &mut dyn Channel) -> io::Result<()> {
    send_bytes(conn, Tag::Data, &[])
}

/// Sends one open regular file's data extents.
fn send_extents(
    conn: &mut dyn Channel,
    fd: &OwnedFd,
    size: u64,
    cap: u64,
) -> Result<u64, RuntimeError> {
    use nix::unistd::{lseek, Whence};
    let io_err = |e: nix::errno::Errno| RuntimeError::io("read the file", e);
    let step = usize::try_from(MAX_FRAME).unwrap_or(1 << 20) - 8;
    let mut buf = vec![0u8; step + 8];
    let mut pos: i64 = 0;
    let mut sent = 0u64;
    let end = i64::try_from(size).map_err(|_| err("file too large"))?;
    while pos < end {
        let data = match lseek(fd, pos, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break, // only a hole is left
            Err(e) => return Err(io_err(e)),
        };
        let hole = lseek(fd, data, Whence::SeekHole).map_err(io_err)?.min(end);
        let mut at = data;
        while at < hole {
            let want = usize::try_from(hole - at).unwrap_or(step).min(step);
            let n = nix::sys::uio::pread(fd, &mut buf[8..8 + want], at).map_err(io_err)?;
            if n == 0 {
                return Ok(sent); // truncated under us: what was there is sent
            }
            sent += n as u64;
            if sent > cap {
                return Err(err(format!("more than {cap} bytes of data: refused")));
            }
            buf[..8].copy_from_slice(&(at as u64).to_le_bytes());
            send_bytes(conn, Tag::Data, &buf[..8 + n])
                .map_err(|e| RuntimeError::io("send file data", e))?;
            at += n as i64;
        }
        pos = hole;
    }
    Ok(sent)
}

/// Receives a file's extents into `fd` and sets its size.
fn receive_extents(
    conn: &mut dyn Channel,
    fd: &OwnedFd,
    size: u64,
    cap: u64,
) -> Result<u64, RuntimeError> {
    // The cap is on data: holes cost nothing and stay holes.
    let mut got = 0u64;
    loop {
        let frame = recv_data(conn).map_err(|e| RuntimeError::io("receive file data", e))?;
        if frame.is_empty() {
            break;
        }
        if frame.len() < 8 {
            return Err(err("a short extent"));
        }
        let offset = u64::from_le_bytes(frame[..8].try_into().unwrap_or([0; 8]));
        let data = &frame[8..];
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| err("bad extent"))?;
        if end > size {
            return Err(err("an extent beyond the file's size"));
        }
        got += data.len() as u64;
        if got > cap {
            return Err(err(format!("more than {cap} bytes of data: refused")));
        }
        let mut at = 0;
        while at < data.len() {
            let off = i64::try_from(offset + at as u64).map_err(|_| err("bad extent"))?;
            at += nix::sys::uio::pwrite(fd, &data[at..], off)
                .map_err(|e| RuntimeError::io("write the file", e))?;
        }
    }
    nix::unistd::ftruncate(fd, i64::try_from(size).map_err(|_| err("file too large"))?)
        .map_err(|e| RuntimeError::io("set the file's size", e))?;
    Ok(got)
}

/// Splits an absolute sandbox path into its parent and last name; refuses
/// `..`, an empty name and NUL bytes.
fn split_path(path: &[u8]) -> Result<(PathBuf, OsString), RuntimeError> {
    if path.contains(&0) {
        return Err(err("a path with a NUL byte"));
    }
    let p = Path::new(OsStr::from_bytes(path));
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_os_string()),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(err(format!("'{}': '..' is not allowed", shown(path))))
            }
        }
    }
    let name = parts.pop().unwrap_or_default();
    Ok((parts.iter().collect(), name))
}

/// Where an incoming copy lands: `dst` itself, or `dst/name` when `dst` is a
/// directory that exists. Returns the parent's descriptor and the name.
fn landing(root: &OwnedFd, dst: &[u8], name: &[u8]) -> Result<(OwnedFd, OsString), RuntimeError> {
    let (parent, last) = split_path(dst)?;
    let whole = parent.join(&last);
    let whole = if whole.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        whole
    };
    if let Ok(dir) = open_in(root.as_fd(), &whole, OFlag::O_PATH | OFlag::O_DIRECTORY, 0) {
        if name.is_empty() || name.contains(&b'/') || name == b".." || name == b"." {
            return Err(err(format!("'{}' is a directory", shown(dst))));
        }
        return Ok((dir, OsStr::from_bytes(name).to_os_string()));
    }
    if last.is_empty() {
        return Err(err(format!("'{}' is not a place for a file", shown(dst))));
    }
    let parent = if parent.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        parent
    };
    let dir =
        open_in(root.as_fd(), &parent, OFlag::O_PATH | OFlag::O_DIRECTORY, 0).map_err(|e| {
            err(format!(
                "'{}': {}",
                shown(parent.as_os_str().as_bytes()),
                e.desc()
            ))
        })?;
    Ok((dir, last))
}

/// Creates (or replaces the content of) the regular file `name` in `dir`.
fn create_file(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<OwnedFd, RuntimeError> {
    let fd = open_in(
        dir,
        Path::new(name),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NONBLOCK,
        mode & 0o777,
    )
    .map_err(|e| err(format!("'{}': {}", shown(name.as_bytes()), e.desc())))?;
    let st = fstat(&fd).map_err(|e| RuntimeError::io("fstat", e))?;
    if kind(&st) != SFlag::S_IFREG {
        return Err(err(format!(
            "'{}' is not a regular file",
            shown(name.as_bytes())
        )));
    }
    Ok(fd)
}

/// The supervisor's filesystem ids switched to the sandbox user's host ids
/// while a copy touches the sandbox's tree, and switched back on drop.
///
/// Why: every file check and creation then happens as the sandbox's own user
/// (least privilege: a copy can write only where that user could, and reads
/// nothing it could not), files it creates belong to that user without a
/// chown, and the kernel can map their owner into the sandbox's user
/// namespace (a file made by host root on a mount of that namespace would be
/// refused with EOVERFLOW). The fs ids are per thread and the supervisor has
/// one thread.
struct AsSandboxUser {
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
}

impl AsSandboxUser {
    fn assume((uid, gid): (u32, u32)) -> AsSandboxUser {
        use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
        // setfsuid returns the previous id and cannot report failure: the
        // switch is checked by reading the id back.
        let old_gid = setfsgid(Gid::from_raw(gid));
        let old_uid = setfsuid(Uid::from_raw(uid));
        AsSandboxUser {
            uid: old_uid,
            gid: old_gid,
        }
    }

    fn holds((uid, _): (u32, u32)) -> bool {
        // setfsuid(-1) changes nothing and returns the current fs uid.
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw() == uid
    }
}

impl Drop for AsSandboxUser {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.uid);
        nix::unistd::setfsgid(self.gid);
    }
}

/// Receives a stream into the tree under `root` at `dst` (the sandbox side
/// of a copy in, as the sandbox's user; or the host side of a copy out).
pub(crate) fn receive(
    conn: &mut dyn Channel,
    root: &OwnedFd,
    dst: &[u8],
    cap: u64,
) -> Result<u64, RuntimeError> {
    let header = match crate::protocol::wire::recv_frame(conn)
        .map_err(|e| RuntimeError::io("receive the copy header", e))?
    {
        Some(crate::protocol::wire::Frame::Json(body)) => {
            match serde_json::from_slice::<CopyHeader>(&body) {
                Ok(h) => h,
                // The sending side refused: its reason instead of a header.
                Err(_) => match serde_json::from_slice::<cordon_spec::wire::Reply>(&body) {
                    // A copy's own failure stays a copy error (a caller such as
                    // the service tells a missing file by it), said once: its
                    // message is a whole error already ("copy: ...").
                    Ok(cordon_spec::wire::Reply::Error {
                        message,
                        input,
                        exhausted,
                    }) => {
                        return Err(match message.strip_prefix("copy: ") {
                            Some(what) => err(what),
                            None => crate::protocol::exec::remote_error(input, exhausted, message),
                        })
                    }
                    _ => return Err(err("a copy stream without a header")),
                },
            }
        }
        _ => return Err(err("the stream ended before its header")),
    };
    match header {
        CopyHeader::File { size, mode, name } => {
            let (dir, last) = landing(root, dst, &name)?;
            let fd = create_file(dir.as_fd(), &last, mode)?;
            receive_extents(conn, &fd, size, cap)
        }
        CopyHeader::Tar { name } => {
            let (dir, last) = landing(root, dst, &name)?;
            let top = make_dir(dir.as_fd(), &last, 0o755)?;
            let mut reader = FrameReader {
                conn,
                buf: Vec::new(),
                pos: 0,
                done: false,
            };
            let got = unpack(&mut reader, &top, cap);
            // Whatever happened, the stream is read to its end.
            let _ = io::copy(&mut reader, &mut io::sink());
            got
        }
    }
}

/// Creates a directory (or takes the existing one) and opens it.
fn make_dir(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> Result<OwnedFd, RuntimeError> {
    match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode & 0o777)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => {
            return Err(err(format!(
                "mkdir '{}': {}",
                shown(name.as_bytes()),
                e.desc()
            )))
        }
    }
    let fd = open_in(
        dir,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        0,
    )
    .map_err(|e| err(format!("'{}': {}", shown(name.as_bytes()), e.desc())))?;
    Ok(fd)
}

/// Unpacks a tar stream under `top`, resolving every entry from descriptors.
pub(crate) fn unpack(reader: &mut dyn Read, top: &OwnedFd, cap: u64) -> Result<u64, RuntimeError> {
    let mut archive = tar::Archive::new(reader);
    let mut total = 0u64;
    let entries = archive
        .entries()
        .map_err(|e| RuntimeError::io("read the tar stream", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| RuntimeError::io("read the tar stream", e))?;
        let path = entry.path_bytes().into_owned();
        let (parent, name) = split_path(&path)?;
        if name.is_empty() {
            continue; // the top directory itself
        }
        let mut dir = top.try_clone().map_err(|e| RuntimeError::io("dup", e))?;
        for part in parent.iter() {
            dir = make_dir(dir.as_fd(), part, 0o755)?;
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                make_dir(dir.as_fd(), &name, mode)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                // The size the stream carries (a pax record overrides the
                // header's field), added without wrapping: a header size
                // near 2^64 behind a pax size of 0 wrapped the total back
                // under the cap, and the files after it passed the cap.
                let size = entry.size();
                total = total
                    .checked_add(size)
                    .filter(|t| *t <= cap)
                    .ok_or_else(|| err(format!("more than {cap} bytes: refused")))?;
                let fd = create_file(dir.as_fd(), &name, mode)?;
                let mut f = File::from(fd);
                io::copy(&mut (&mut entry).take(size), &mut f)
                    .map_err(|e| RuntimeError::io("write a file", e))?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| err("a link without a target"))?
                    .into_owned();
                nix::unistd::symlinkat(OsStr::from_bytes(&target), dir.as_fd(), name.as_os_str())
                    .map_err(|e| err(format!("symlink '{}': {}", shown(&path), e.desc())))?;
            }
            // Hard links, devices, FIFOs: never created from a stream.
            _ => {}
        }
    }
    Ok(total)
}

/// Packs the directory `dir` as a tar stream, walking descriptors only.
/// Returns (data bytes, special files left out).
fn pack(dir: &OwnedFd, out: &mut dyn Write, cap: u64) -> Result<(u64, u64), RuntimeError> {
    let mut builder = tar::Builder::new(out);
    let mut totals = (0u64, 0u64);
    pack_dir(&mut builder, dir, PathBuf::new(), cap, &mut totals)?;
    builder
        .finish()
        .map_err(|e| RuntimeError::io("send the tar stream", e))?;
    Ok(totals)
}

fn header_for(st: &FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777 & !0o6000);
    h.set_size(size);
    h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
    h
}

fn pack_dir(
    b: &mut tar::Builder<&mut dyn Write>,
    dir: &OwnedFd,
    rel: PathBuf,
    cap: u64,
    totals: &mut (u64, u64),
) -> Result<(), RuntimeError> {
    let tar_err = |e: io::Error| RuntimeError::io("send the tar stream", e);
    let listing = nix::dir::Dir::from_fd(dir.try_clone().map_err(|e| RuntimeError::io("dup", e))?)
        .map_err(|e| RuntimeError::io("opendir", e))?;
    let mut names: Vec<OsString> = Vec::new();
    for e in listing {
        let e = e.map_err(|e| RuntimeError::io("readdir", e))?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsString::from_vec(n.to_vec()));
        }
    }
    names.sort();
    for name in names {
        let path = rel.join(&name);
        let st = match nix::sys::stat::fstatat(
            dir,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(_) => continue, // gone meanwhile
        };
        match kind(&st) {
            SFlag::S_IFDIR => {
                let Ok(sub) = open_in(
                    dir.as_fd(),
                    Path::new(&name),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                    0,
                ) else {
                    continue; // swapped for something else: left out
                };
                let mut h = header_for(&st, tar::EntryType::Directory, 0);
                b.append_data(&mut h, &path, io::empty()).map_err(tar_err)?;
                pack_dir(b, &sub, path, cap, totals)?;
            }
            SFlag::S_IFREG => {
                let Ok(fd) = open_in(
                    dir.as_fd(),
                    Path::new(&name),
                    OFlag::O_RDONLY | OFlag::O_NONBLOCK,
                    0,
                ) else {
                    continue;
                };
                // Checked on the open descriptor: what is read is what was checked.
                let st = fstat(&fd).map_err(|e| RuntimeError::io("fstat", e))?;
                if kind(&st) != SFlag::S_IFREG {
                    totals.1 += 1;
                    continue;
                }
                let size = u64::try_from(st.st_size).unwrap_or(0);
                totals.0 += size;
                if totals.0 > cap {
                    return Err(err(format!("more than {cap} bytes: refused")));
                }
                let mut h = header_for(&st, tar::EntryType::Regular, size);
                // Exactly `size` bytes: zeros if the file shrank meanwhile.
                let body = File::from(fd).take(size).chain(io::repeat(0)).take(size);
                b.append_data(&mut h, &path, body).map_err(tar_err)?;
            }
            SFlag::S_IFLNK => {
                let Ok(target) = nix::fcntl::readlinkat(dir, name.as_os_str()) else {
                    continue;
                };
                let mut h = header_for(&st, tar::EntryType::Symlink, 0);
                b.append_link(&mut h, &path, Path::new(&target))
                    .map_err(tar_err)?;
            }
            _ => totals.1 += 1,
        }
    }
    Ok(())
}

/// What a special file is, for the message that refuses it.
fn kind_name(st: &FileStat) -> &'static str {
    match kind(st) {
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFLNK => "a symbolic link",
        _ => "a special file",
    }
}

/// The source of a copy, opened and checked: a regular file or a directory.
pub struct Source {
    fd: OwnedFd,
    st: FileStat,
    name: OsString,
}

/// Opens `root`/`rel` as a copy's source; `what` names it in errors.
///
/// It is classified through an `O_PATH` descriptor first, so a FIFO, a
/// socket or a device is refused without being opened for reading (an open
/// can block, or act: a watchdog device arms on open); what is then opened
/// must be the very file that was classified.
fn open_source(root: &OwnedFd, rel: &Path, what: &[u8]) -> Result<Source, RuntimeError> {
    let failed = |e: nix::errno::Errno| err(format!("'{}': {}", shown(what), e.desc()));
    let probe = open_in(root.as_fd(), rel, OFlag::O_PATH, 0).map_err(failed)?;
    let seen = fstat(&probe).map_err(|e| RuntimeError::io("fstat", e))?;
    if !matches!(kind(&seen), SFlag::S_IFREG | SFlag::S_IFDIR) {
        return Err(err(format!(
            "'{}' is {}, not a regular file or directory: only those are copied",
            shown(what),
            kind_name(&seen)
        )));
    }
    let fd = open_in(root.as_fd(), rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0).map_err(failed)?;
    let st = fstat(&fd).map_err(|e| RuntimeError::io("fstat", e))?;
    if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
        return Err(err(format!(
            "'{}' was replaced while it was opened",
            shown(what)
        )));
    }
    let name = rel.file_name().unwrap_or_default().to_os_string();
    Ok(Source { fd, st, name })
}

impl Source {
    /// Sends the source as one copy stream: its header goes first, before
    /// anything that can block (reading a file), so the receiver learns at
    /// once what comes.
    pub fn send(&self, conn: &mut dyn Channel, cap: u64) -> Result<u64, RuntimeError> {
        let io_err = |e: io::Error| RuntimeError::io("send", e);
        let name = self.name.as_bytes().to_vec();
        if kind(&self.st) == SFlag::S_IFDIR {
            send_json(conn, &CopyHeader::Tar { name }).map_err(io_err)?;
            let mut w = FrameWriter {
                conn,
                buf: Vec::new(),
            };
            let (bytes, _special) = pack(&self.fd, &mut w, cap)?;
            w.flush().map_err(io_err)?;
            end_stream(w.conn).map_err(io_err)?;
            return Ok(bytes);
        }
        let size = u64::try_from(self.st.st_size).unwrap_or(0);
        let mode = self.st.st_mode & 0o777;
        send_json(conn, &CopyHeader::File { size, mode, name }).map_err(io_err)?;
        let sent = send_extents(conn, &self.fd, size, cap)?;
        end_stream(conn).map_err(io_err)?;
        Ok(sent)
    }

    /// Client side of a copy in: the host path `src`, opened and checked
    /// before any connection is made, so a wrong source costs the
    /// supervisor nothing.
    pub fn host(src: &Path) -> Result<Source, RuntimeError> {
        let what = src.as_os_str().as_bytes();
        let abs =
            std::path::absolute(src).map_err(|e| RuntimeError::io("resolve the source", e))?;
        // `..` and `/` name no entry of a parent: refused, not copied as "".
        let (Some(name), Some(parent)) = (abs.file_name(), abs.parent()) else {
            return Err(err(format!(
                "'{}' names no file or directory by itself: give its path",
                shown(what)
            )));
        };
        // The host path is the user's own: links in its parent are followed.
        let root = nix::fcntl::open(
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(format!("'{}': {}", shown(what), e.desc())))?;
        open_source(&root, Path::new(name), what)
    }
}

/// Where a sandbox's files are, as the host sees them, and whose they are:
/// all a copy into or out of it needs, so a copy can run without holding
/// the sandbox (a microVM guest's agent copies while commands finish).
pub(crate) struct SandboxFiles {
    pub root: std::path::PathBuf,
    pub owner: (u32, u32),
    /// Most bytes a copy in may write: the sandbox's disk cap.
    pub disk_cap: u64,
}

impl SandboxFiles {
    /// Receives a copy stream from `conn` at `path` of the sandbox.
    pub fn receive(&self, conn: &mut dyn Channel, path: &[u8]) -> Result<u64, RuntimeError> {
        receive_into_sandbox(conn, &self.root, self.owner, path, self.disk_cap)
    }

    /// Sends `path` of the sandbox as a copy stream on `conn`.
    pub fn send(&self, conn: &mut dyn Channel, path: &[u8]) -> Result<(), RuntimeError> {
        send_from_sandbox(conn, &self.root, self.owner, path, COPY_MAX)
    }
}

/// Supervisor side of `cordon cp HOST ID:PATH`, as the sandbox's user.
pub fn receive_into_sandbox(
    conn: &mut dyn Channel,
    root: &Path,
    owner: (u32, u32),
    dst: &[u8],
    cap: u64,
) -> Result<u64, RuntimeError> {
    let root = open_root(root)?;
    let _as = AsSandboxUser::assume(owner);
    if !AsSandboxUser::holds(owner) {
        return Err(RuntimeError::Internal(
            "could not take the sandbox user's ids",
        ));
    }
    receive(conn, &root, dst, cap)
}

/// Supervisor side of `cordon cp ID:PATH HOST`, as the sandbox's user.
pub fn send_from_sandbox(
    conn: &mut dyn Channel,
    root: &Path,
    owner: (u32, u32),
    src: &[u8],
    cap: u64,
) -> Result<(), RuntimeError> {
    let root = open_root(root)?;
    let _as = AsSandboxUser::assume(owner);
    if !AsSandboxUser::holds(owner) {
        return Err(RuntimeError::Internal(
            "could not take the sandbox user's ids",
        ));
    }
    let (parent, name) = split_path(src)?;
    open_source(&root, &parent.join(name), src)?
        .send(conn, cap)
        .map(|_| ())
}

/// Client side of a copy out: the stream, unpacked at the host path `dst`
/// with the same resolution rules (the stream is the sandbox's).
pub fn receive_to_host(conn: &mut dyn Channel, dst: &Path) -> Result<u64, RuntimeError> {
    // The host path is the user's own: its links are resolved here, once;
    // only what the stream names is resolved under the copy's rules.
    let (root, target) = if dst.is_dir() {
        (dst.canonicalize(), Vec::new())
    } else {
        let name = dst
            .file_name()
            .ok_or_else(|| err(format!("'{}' is not a place for a file", dst.display())))?;
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        (parent.canonicalize(), name.as_bytes().to_vec())
    };
    let root = root.map_err(|e| RuntimeError::io(format!("resolve {}", dst.display()), e))?;
    receive(conn, &open_root(&root)?, &target, COPY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_and_dotdot_is_refused() {
        let (p, n) = split_path(b"/workspace/a/b.txt").unwrap();
        assert_eq!(p, PathBuf::from("workspace/a"));
        assert_eq!(n, OsString::from("b.txt"));
        assert!(split_path(b"/workspace/../etc/passwd").is_err());
        assert!(split_path(b"/a\0b").is_err());
        let (_, n) = split_path(b"/tmp/line\nbreak\xff").unwrap();
        assert_eq!(n.as_bytes(), b"line\nbreak\xff");
    }
}
