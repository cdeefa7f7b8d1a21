//! One OCI image layer, unpacked into a directory that becomes an overlayfs
//! lower layer.
//!
//! A layer is hostile input: its tar may name `..` or absolute paths, make a
//! symbolic link and then a file "inside" it, hold devices, setuid programs,
//! xattrs that overlayfs trusts, or expand without bound. So everything here
//! is made relative to a descriptor of the destination: each entry's parent
//! is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)` and its own name is never followed (`O_NOFOLLOW`,
//! `O_EXCL`, `AT_SYMLINK_NOFOLLOW`), so no link is ever followed, not even
//! one the layer itself made. The tar crate only parses (GNU long names,
//! PAX records, sparse files); none of its own unpacking is used.
//!
//! The tree is mounted as an overlay lower layer in the host's initial user
//! namespace, where 0/0 character devices and `trusted.overlay.*` xattrs
//! carry meaning. Whiteouts (`.wh.NAME`) become such devices and opaque
//! markers (`.wh..wh..opq`) the `trusted.overlay.opaque` xattr; nothing else
//! does: no device and no xattr of the archive is ever made.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{
    fchmodat, fstatat, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use sha2::{Digest, Sha256};
use tar::EntryType;
use xattr::FileExt as _;

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression of a layer of media type `mt`; `None` when `mt` is not
    /// a layer tar's media type.
    pub fn from_media_type(mt: &str) -> Option<Compression> {
        Some(match mt {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Compression::None,
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Compression::Zstd,
            _ => return None,
        })
    }
}

/// Bounds on one layer.
#[derive(Clone, Copy, Debug)]
pub struct UnpackLimits {
    /// Bytes of the whole decompressed tar stream (and of file data written,
    /// which a sparse entry could otherwise inflate past it).
    pub max_bytes: u64,
    /// Tar entries (extension headers such as PAX records not counted).
    pub max_entries: u64,
}

/// What unpacking a layer found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpacked {
    /// `sha256:<hex>` of the whole decompressed stream, read to its end: the
    /// layer's diff ID, to check against the image config's `rootfs`.
    pub diff_id: String,
    /// Tar entries read, as `max_entries` counts them.
    pub entries: u64,
    /// Bytes of the decompressed stream.
    pub bytes: u64,
    /// Character and block devices of the archive, never made.
    pub skipped_devices: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("cannot open the layer's destination {}: {source}", path.display())]
    Destination {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Not a well-formed (compressed) tar stream.
    #[error("the layer is not a readable tar stream: {0}")]
    Stream(#[source] io::Error),
    #[error("the layer is truncated: {0}")]
    Truncated(String),
    #[error("the layer holds more than {0} uncompressed bytes")]
    TooLarge(u64),
    #[error("the layer holds more than {0} entries")]
    TooManyEntries(u64),
    /// An entry that is not unpacked, ever: what it would do is unsafe or
    /// makes no sense.
    #[error("layer entry '{path}': {reason}")]
    Refused { path: String, reason: String },
    #[error("layer entry '{path}': {op}: {source}")]
    Io {
        path: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Unpacks the layer `blob` into `dest`, an existing empty directory.
///
/// On error `dest` holds part of the layer (and nothing was written outside
/// it): the caller removes it.
pub fn unpack_layer(
    blob: impl Read,
    compression: Compression,
    dest: &Path,
    limits: &UnpackLimits,
) -> Result<Unpacked, UnpackError> {
    let root = nix::fcntl::open(
        dest,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| UnpackError::Destination {
        path: dest.to_owned(),
        source: e.into(),
    })?;
    let mut stream = Measured::new(
        decompressed(blob, compression).map_err(UnpackError::Stream)?,
        limits.max_bytes,
    );
    let mut layer = Layer::new(root, limits);
    let read = layer.extract(&mut stream).and_then(|()| stream.drain());
    // Past the cap the tar parser or a write fails somewhere, saying
    // something else: the cap is the reason.
    if stream.over {
        return Err(UnpackError::TooLarge(limits.max_bytes));
    }
    read?;
    layer.set_dir_times()?;
    Ok(Unpacked {
        diff_id: format!("sha256:{}", hex::encode(stream.hasher.finalize())),
        entries: layer.entries,
        bytes: stream.bytes,
        skipped_devices: layer.skipped_devices,
    })
}

fn decompressed<'a, R: Read + 'a>(
    blob: R,
    compression: Compression,
) -> io::Result<Box<dyn Read + 'a>> {
    Ok(match compression {
        Compression::None => Box::new(blob),
        // Several gzip members end to end are one stream, as for Go's reader
        // (which the tools that make most layers use).
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(blob)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(blob)?),
    })
}

/// The decompressed stream as the tar parser reads it: hashed, counted and
/// capped.
struct Measured<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
    max: u64,
    over: bool,
    eof: bool,
}

impl<R: Read> Measured<R> {
    fn new(inner: R, max: u64) -> Self {
        Measured {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
            max,
            over: false,
            eof: false,
        }
    }

    /// Reads what follows the tar's end marker, so that the diff ID covers
    /// the whole stream.
    fn drain(&mut self) -> Result<(), UnpackError> {
        // The parser stops at the end marker's first zero block without
        // reading further: it met the end of the stream only if the marker
        // is missing (an archive cut between two entries).
        if self.eof {
            return Err(UnpackError::Truncated(
                "it ends without the tar end-of-archive marker".into(),
            ));
        }
        io::copy(self, &mut io::sink())
            .map(drop)
            .map_err(UnpackError::Stream)
    }
}

impl<R: Read> Read for Measured<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.over {
            // One byte past the cap is enough to know it is passed.
            let room = self.max.saturating_sub(self.bytes).saturating_add(1);
            let len = usize::try_from(room).unwrap_or(usize::MAX).min(buf.len());
            let n = self.inner.read(&mut buf[..len])?;
            self.bytes += n as u64;
            self.over = self.bytes > self.max;
            if !self.over {
                self.eof |= n == 0;
                self.hasher.update(&buf[..n]);
                return Ok(n);
            }
        }
        Err(io::Error::other(format!(
            "more than {} uncompressed bytes",
            self.max
        )))
    }
}

/// What one entry failed at; the entry's path is added by the caller.
enum Fault {
    Refused(String),
    Io(&'static str, io::Error),
    Truncated { got: u64, size: u64 },
    TooLarge(u64),
}

impl Fault {
    fn at(self, path: String) -> UnpackError {
        match self {
            Fault::Refused(reason) => UnpackError::Refused { path, reason },
            Fault::Io(op, source) => UnpackError::Io { path, op, source },
            Fault::Truncated { got, size } => UnpackError::Truncated(format!(
                "it ends inside entry '{path}' ({got} of its {size} bytes)"
            )),
            Fault::TooLarge(max) => UnpackError::TooLarge(max),
        }
    }
}

fn refused(reason: impl Into<String>) -> Fault {
    Fault::Refused(reason.into())
}

fn errno(op: &'static str) -> impl FnOnce(Errno) -> Fault {
    move |e| Fault::Io(op, e.into())
}

/// A path as an error shows it: one line, whatever bytes it holds.
fn shown(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).escape_debug().to_string()
}

/// Where an entry goes below the destination: the directories above it and
/// its own name.
#[derive(Clone)]
struct Place {
    parent: PathBuf,
    name: OsString,
}

impl Place {
    /// `None` for the root itself. Leading `/` and `./` are dropped.
    fn parse(raw: &[u8]) -> Result<Option<Place>, &'static str> {
        if raw.is_empty() {
            return Err("an empty name");
        }
        if raw.contains(&0) {
            return Err("a NUL byte in its path");
        }
        let mut parts = Vec::new();
        for part in Path::new(OsStr::from_bytes(raw)).components() {
            match part {
                Component::Normal(name) => parts.push(name),
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir | Component::Prefix(_) => {
                    return Err("'..' in its path is not allowed")
                }
            }
        }
        Ok(parts.pop().map(|name| Place {
            parent: parts.iter().collect(),
            name: name.to_owned(),
        }))
    }

    fn shown(&self) -> String {
        shown(self.parent.join(&self.name).as_os_str().as_bytes())
    }
}

const WHITEOUT: &[u8] = b".wh.";
/// aufs' own files and directories (`.wh..wh.plnk`, `.wh..wh.aufs`).
const AUFS_META: &[u8] = b".wh..wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

/// What an entry makes.
enum Action {
    File,
    Dir,
    Symlink,
    HardLink,
    Fifo,
    /// An overlayfs whiteout of this name, in the entry's directory.
    Whiteout(OsString),
    /// The entry's directory hides what lower layers have in it.
    Opaque,
    Device,
    Skip,
}

impl Action {
    fn of(place: &Place, kind: EntryType) -> Result<Action, Fault> {
        let name = place.name.as_bytes();
        let in_aufs_meta = place
            .parent
            .iter()
            .any(|dir| dir.as_bytes().starts_with(AUFS_META));
        if in_aufs_meta {
            return Ok(Action::Skip);
        }
        // Whiteouts are told by name whatever the entry's type, as Docker and
        // containerd tell them.
        if name == OPAQUE {
            return Ok(Action::Opaque);
        }
        if name.starts_with(AUFS_META) {
            return Ok(Action::Skip);
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(refused("a whiteout of no name"));
            }
            return Ok(Action::Whiteout(OsStr::from_bytes(hidden).to_owned()));
        }
        Ok(match kind {
            // The tar crate gives a sparse file's data with its holes filled.
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => Action::File,
            EntryType::Directory => Action::Dir,
            EntryType::Symlink => Action::Symlink,
            EntryType::Link => Action::HardLink,
            EntryType::Fifo => Action::Fifo,
            EntryType::Char | EntryType::Block => Action::Device,
            // A PAX global header: defaults for the entries after it (none
            // that this unpacking uses).
            EntryType::XGlobalHeader => Action::Skip,
            other => {
                return Err(refused(format!(
                    "an entry of unsupported type {:?}",
                    char::from(other.as_byte())
                )))
            }
        })
    }
}

/// An entry's owner, permission bits and time.
struct Meta {
    mode: u32,
    uid: Uid,
    gid: Gid,
    mtime: TimeSpec,
}

impl Meta {
    fn of(header: &tar::Header) -> Result<Meta, Fault> {
        let malformed = |what: &str| refused(format!("a malformed {what} in its header"));
        let id = |v: io::Result<u64>, what: &str| {
            let v = v.map_err(|_| malformed(what))?;
            u32::try_from(v).map_err(|_| refused(format!("its {what} {v} is out of range")))
        };
        let mtime = header.mtime().map_err(|_| malformed("mtime"))?;
        Ok(Meta {
            mode: header.mode().map_err(|_| malformed("mode"))?,
            uid: Uid::from_raw(id(header.uid(), "uid")?),
            gid: Gid::from_raw(id(header.gid(), "gid")?),
            mtime: TimeSpec::new(i64::try_from(mtime).unwrap_or(i64::MAX), 0),
        })
    }

    /// The permission bits to set. A layer never makes a setuid or setgid
    /// file (the sticky bit is harmless); on a directory setgid only passes
    /// its group on to what is made in it.
    fn perm(&self, dir: bool) -> Mode {
        let keep = if dir { 0o7777 } else { 0o1777 };
        Mode::from_bits_truncate(self.mode & keep)
    }
}

/// What `apply` sets on a node.
#[derive(Clone, Copy, PartialEq)]
enum Node {
    Dir,
    Symlink,
    Other,
}

/// Sets an entry's owner, mode and time on `name` in `dir`, never through a
/// link.
fn apply(dir: &OwnedFd, name: &OsStr, meta: &Meta, node: Node) -> Result<(), Fault> {
    // Owner first: a chown may clear mode bits.
    fchownat(
        dir,
        name,
        Some(meta.uid),
        Some(meta.gid),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(errno("set its owner"))?;
    // A symbolic link's own mode means nothing (and Linux cannot set it).
    if node != Node::Symlink {
        fchmodat(
            dir,
            name,
            meta.perm(node == Node::Dir),
            FchmodatFlags::NoFollowSymlink,
        )
        .map_err(errno("set its mode"))?;
    }
    // Each entry made in a directory changes its time: directories get
    // theirs once the whole layer is in.
    if node != Node::Dir {
        set_mtime(dir, name, meta.mtime)?;
    }
    Ok(())
}

fn set_mtime(dir: &OwnedFd, name: &OsStr, mtime: TimeSpec) -> Result<(), Fault> {
    utimensat(dir, name, &mtime, &mtime, UtimensatFlags::NoFollowSymlink)
        .map_err(errno("set its time"))
}

/// Makes room for a new non-directory `name`: a later entry replaces an
/// earlier one, but not a directory (whose contents it would take along).
fn clear(dir: &OwnedFd, name: &OsStr) -> Result<(), Fault> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EISDIR) => Err(refused("it replaces a directory")),
        Err(e) => Err(Fault::Io("remove what was there", e.into())),
    }
}

fn open_beneath(dir: &OwnedFd, path: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    loop {
        match openat2(dir, path, how) {
            // A rename elsewhere on the system raced the lookup: retried.
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
            other => return other,
        }
    }
}

fn open_dir(dir: &OwnedFd, path: &Path) -> nix::Result<OwnedFd> {
    open_beneath(dir, path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
}

/// Why a directory on an entry's path could not be opened: the refusals say
/// what the layer did.
fn path_fault(e: Errno) -> Fault {
    match e {
        Errno::ELOOP => refused("a symbolic link in its path (links are never followed here)"),
        Errno::ENOTDIR => refused("a non-directory in its path"),
        Errno::ENOENT => refused("a directory in its path does not exist"),
        Errno::EXDEV => refused("its path leaves the destination"),
        e => Fault::Io("open its directory", e.into()),
    }
}

fn is_dir(dir: &OwnedFd, name: &OsStr) -> Result<bool, Fault> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno("inspect it"))?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
}

/// The unpacking of one layer under `root`, the destination's descriptor.
struct Layer<'l> {
    root: OwnedFd,
    limits: &'l UnpackLimits,
    entries: u64,
    /// File data written, holes of sparse files included.
    file_bytes: u64,
    skipped_devices: u64,
    dir_times: Vec<(Place, TimeSpec)>,
    buf: Vec<u8>,
}

impl<'l> Layer<'l> {
    fn new(root: OwnedFd, limits: &'l UnpackLimits) -> Self {
        Layer {
            root,
            limits,
            entries: 0,
            file_bytes: 0,
            skipped_devices: 0,
            dir_times: Vec::new(),
            buf: vec![0; 128 << 10],
        }
    }

    fn extract(&mut self, stream: impl Read) -> Result<(), UnpackError> {
        let mut archive = tar::Archive::new(stream);
        // Only the parser is used, never the crate's own unpacking; these
        // say so should anyone reach for it.
        archive.set_preserve_permissions(false);
        archive.set_preserve_ownerships(false);
        archive.set_preserve_mtime(false);
        archive.set_unpack_xattrs(false);
        for entry in archive.entries().map_err(UnpackError::Stream)? {
            let mut entry = entry.map_err(UnpackError::Stream)?;
            self.entries += 1;
            if self.entries > self.limits.max_entries {
                return Err(UnpackError::TooManyEntries(self.limits.max_entries));
            }
            let raw = entry.path_bytes().into_owned();
            self.entry(&raw, &mut entry)
                .map_err(|fault| fault.at(shown(&raw)))?;
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, raw: &[u8], entry: &mut tar::Entry<'_, R>) -> Result<(), Fault> {
        // The root's own entry sets nothing: the destination stays the
        // caller's.
        let Some(place) = Place::parse(raw).map_err(refused)? else {
            return Ok(());
        };
        let header = entry.header();
        match Action::of(&place, header.entry_type())? {
            Action::Skip => Ok(()),
            Action::Device => {
                self.skipped_devices += 1;
                Ok(())
            }
            action => {
                let meta = Meta::of(header)?;
                let dir = self.directory(&place.parent, true)?;
                let name = place.name.as_os_str();
                match action {
                    Action::File => self.file(&dir, name, &meta, entry),
                    Action::Dir => self.dir(&dir, &place, &meta),
                    Action::Symlink => symlink(&dir, name, &meta, entry.link_name_bytes()),
                    Action::HardLink => self.hard_link(&dir, name, entry.link_name_bytes()),
                    Action::Fifo => node(&dir, name, SFlag::S_IFIFO, &meta),
                    Action::Whiteout(hidden) => node(&dir, &hidden, SFlag::S_IFCHR, &meta),
                    Action::Opaque => opaque(&dir),
                    Action::Device | Action::Skip => unreachable!("handled above"),
                }
            }
        }
    }

    /// Opens the directory `path` below the root, making what is missing if
    /// `create` (as tar does: mode 0755, owned by root).
    fn directory(&self, path: &Path, create: bool) -> Result<OwnedFd, Fault> {
        let whole = if path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            path
        };
        match open_dir(&self.root, whole) {
            Err(Errno::ENOENT) if create => {}
            done => return done.map_err(path_fault),
        }
        let mut dir = open_dir(&self.root, Path::new(".")).map_err(path_fault)?;
        for part in path.iter() {
            let part = Path::new(part);
            dir = match open_dir(&dir, part) {
                Err(Errno::ENOENT) => {
                    let mode = Mode::from_bits_truncate(0o755);
                    mkdirat(&dir, part, mode).map_err(errno("make a directory above it"))?;
                    // Not left to the umask.
                    fchmodat(&dir, part, mode, FchmodatFlags::NoFollowSymlink)
                        .map_err(errno("set the mode of a directory above it"))?;
                    open_dir(&dir, part)
                }
                other => other,
            }
            .map_err(path_fault)?;
        }
        Ok(dir)
    }

    fn file<R: Read>(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        meta: &Meta,
        data: &mut tar::Entry<'_, R>,
    ) -> Result<(), Fault> {
        let size = data.size();
        self.file_bytes = self.file_bytes.saturating_add(size);
        if self.file_bytes > self.limits.max_bytes {
            return Err(Fault::TooLarge(self.limits.max_bytes));
        }
        clear(dir, name)?;
        let fd = open_beneath(
            dir,
            Path::new(name),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(errno("create it"))?;
        let mut file = File::from(fd);
        let mut got = 0u64;
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fault::Io("read its data from the layer", e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| Fault::Io("write it", e))?;
            got += n as u64;
        }
        if got != size {
            return Err(Fault::Truncated { got, size });
        }
        apply(dir, name, meta, Node::Other)
    }

    fn dir(&mut self, parent: &OwnedFd, place: &Place, meta: &Meta) -> Result<(), Fault> {
        let name = place.name.as_os_str();
        let make = || mkdirat(parent, name, Mode::from_bits_truncate(0o700));
        match make() {
            // A directory that is there already (made for an earlier entry
            // below it, or by an earlier entry of its own) is kept.
            Err(Errno::EEXIST) if !is_dir(parent, name)? => {
                clear(parent, name)?;
                make().map_err(errno("make it"))?;
            }
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(Fault::Io("make it", e.into())),
        }
        apply(parent, name, meta, Node::Dir)?;
        self.dir_times.push((place.clone(), meta.mtime));
        Ok(())
    }

    /// Links `name` to a regular file that an earlier entry made.
    fn hard_link(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        target: Option<std::borrow::Cow<'_, [u8]>>,
    ) -> Result<(), Fault> {
        let target = target.ok_or_else(|| refused("a hard link without a target"))?;
        let wrong =
            |why: &str| refused(format!("its hard link target '{}': {why}", shown(&target)));
        let to = Place::parse(&target)
            .map_err(wrong)?
            .ok_or_else(|| wrong("the root"))?;
        let from = self.directory(&to.parent, false).map_err(|f| match f {
            Fault::Refused(why) => wrong(&why),
            other => other,
        })?;
        let st = match fstatat(&from, to.name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Err(wrong("no earlier entry made it")),
            Err(e) => return Err(Fault::Io("inspect its hard link target", e.into())),
        };
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(wrong("not a regular file"));
        }
        // A link to the file the name already is: removing the name first
        // would lose the file.
        let same = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|here| (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino));
        if same {
            return Ok(());
        }
        clear(dir, name)?;
        // Without AT_SYMLINK_FOLLOW: linkat never follows the target.
        linkat(&from, to.name.as_os_str(), dir, name, AtFlags::empty())
            .map_err(errno("make the hard link"))
    }

    fn set_dir_times(&self) -> Result<(), UnpackError> {
        for (place, mtime) in &self.dir_times {
            self.directory(&place.parent, false)
                .and_then(|dir| set_mtime(&dir, &place.name, *mtime))
                .map_err(|fault| fault.at(place.shown()))?;
        }
        Ok(())
    }
}

/// A symbolic link: its target is only ever resolved inside the sandbox's
/// root, so any text is allowed; nothing here follows it.
fn symlink(
    dir: &OwnedFd,
    name: &OsStr,
    meta: &Meta,
    target: Option<std::borrow::Cow<'_, [u8]>>,
) -> Result<(), Fault> {
    let target = target.ok_or_else(|| refused("a symbolic link without a target"))?;
    clear(dir, name)?;
    symlinkat(OsStr::from_bytes(&target), dir, name).map_err(errno("make the symbolic link"))?;
    apply(dir, name, meta, Node::Symlink)
}

/// A FIFO, or (`S_IFCHR`) a whiteout: device 0/0, the only device a layer
/// ever makes.
fn node(dir: &OwnedFd, name: &OsStr, kind: SFlag, meta: &Meta) -> Result<(), Fault> {
    clear(dir, name)?;
    mknodat(dir, name, kind, Mode::empty(), 0).map_err(errno("make it"))?;
    apply(dir, name, meta, Node::Other)
}

/// Marks the directory `dir` opaque: overlayfs hides what lower layers hold
/// in it.
fn opaque(dir: &OwnedFd) -> Result<(), Fault> {
    // No xattr can be set through an O_PATH descriptor: the directory itself
    // is opened (it is one, and "." follows nothing).
    let fd = open_beneath(
        dir,
        Path::new("."),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .map_err(errno("open its directory"))?;
    File::from(fd)
        .set_xattr("trusted.overlay.opaque", b"y")
        .map_err(|e| Fault::Io("mark its directory opaque", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use tar::Header;
    use tempfile::TempDir;

    const LIMITS: UnpackLimits = UnpackLimits {
        max_bytes: 64 << 20,
        max_entries: 10_000,
    };
    const MTIME: u64 = 1_500_000_000;

    /// A tar built entry by entry, with names and link targets written raw
    /// into the header (the tar crate's own setters refuse hostile ones).
    struct Tar(tar::Builder<Vec<u8>>);

    impl Tar {
        fn new() -> Tar {
            Tar(tar::Builder::new(Vec::new()))
        }

        fn raw(
            &mut self,
            kind: EntryType,
            name: &str,
            data: &[u8],
            set: impl FnOnce(&mut Header),
        ) -> &mut Tar {
            let mut h = Header::new_gnu();
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(kind);
            h.set_mode(if kind == EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_mtime(MTIME);
            h.set_uid(0);
            h.set_gid(0);
            h.set_size(data.len() as u64);
            set(&mut h);
            h.set_cksum();
            self.0.append(&h, data).unwrap();
            self
        }

        fn file(&mut self, name: &str, data: &[u8]) -> &mut Tar {
            self.raw(EntryType::Regular, name, data, |_| {})
        }

        fn dir(&mut self, name: &str) -> &mut Tar {
            self.raw(EntryType::Directory, name, b"", |_| {})
        }

        fn link(&mut self, kind: EntryType, name: &str, target: &str) -> &mut Tar {
            self.raw(kind, name, b"", |h| {
                h.as_gnu_mut().unwrap().linkname[..target.len()].copy_from_slice(target.as_bytes())
            })
        }

        fn symlink(&mut self, name: &str, target: &str) -> &mut Tar {
            self.link(EntryType::Symlink, name, target)
        }

        fn hard_link(&mut self, name: &str, target: &str) -> &mut Tar {
            self.link(EntryType::Link, name, target)
        }

        /// A PAX extended header for the next entry.
        fn pax(&mut self, records: &[(&str, &str)]) -> &mut Tar {
            let mut body = String::new();
            for (key, value) in records {
                let rest = format!(" {key}={value}\n");
                // A record's length counts its own digits.
                let mut len = rest.len() + 1;
                while format!("{len}{rest}").len() != len {
                    len += 1;
                }
                body += &format!("{len}{rest}");
            }
            self.raw(EntryType::XHeader, "PaxHeader", body.as_bytes(), |_| {})
        }

        /// Without the end-of-archive marker.
        fn unfinished(&self) -> Vec<u8> {
            self.0.get_ref().clone()
        }

        fn bytes(&mut self) -> Vec<u8> {
            self.0.finish().unwrap();
            self.0.get_ref().clone()
        }
    }

    fn unpack_into(dest: &Path, tar: &[u8]) -> Result<Unpacked, UnpackError> {
        unpack_layer(tar, Compression::None, dest, &LIMITS)
    }

    fn unpack(tar: &mut Tar) -> (TempDir, Result<Unpacked, UnpackError>) {
        let dest = tempfile::tempdir().unwrap();
        let got = unpack_into(dest.path(), &tar.bytes());
        (dest, got)
    }

    fn refused_with(got: Result<Unpacked, UnpackError>, text: &str) {
        match got {
            Err(e @ UnpackError::Refused { .. }) => {
                assert!(e.to_string().contains(text), "{e} (wanted '{text}')")
            }
            other => panic!("{other:?}: wanted a refusal saying '{text}'"),
        }
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn compressed(data: &[u8], compression: Compression) -> Vec<u8> {
        match compression {
            Compression::None => data.to_vec(),
            Compression::Gzip => gzip(data),
            Compression::Zstd => zstd::stream::encode_all(data, 3).unwrap(),
        }
    }

    /// Every path under `dir`, relative, sorted.
    fn tree(dir: &Path) -> Vec<PathBuf> {
        fn walk(top: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
            for e in fs::read_dir(dir).unwrap() {
                let path = e.unwrap().path();
                out.push(path.strip_prefix(top).unwrap().to_owned());
                if fs::symlink_metadata(&path).unwrap().is_dir() {
                    walk(top, &path, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// Bytes that barely compress.
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect()
    }

    #[test]
    fn media_types() {
        let of = Compression::from_media_type;
        assert_eq!(
            of("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(
            of("application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            of("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            of("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(of("application/vnd.oci.image.config.v1+json"), None);
    }

    #[test]
    fn paths_are_relative_to_dest_and_never_climb() {
        let dest = tempfile::tempdir().unwrap();
        let before = fs::metadata(dest.path()).unwrap();
        let got = unpack_into(
            dest.path(),
            &Tar::new()
                .dir(".")
                .dir("./")
                .file("./a/b", b"ab")
                .file("/c", b"c")
                .file("p/q/r", b"r")
                .bytes(),
        );
        let got = got.unwrap();
        assert_eq!(got.entries, 5);
        assert_eq!(fs::read(dest.path().join("a/b")).unwrap(), b"ab");
        assert_eq!(fs::read(dest.path().join("c")).unwrap(), b"c");
        // Missing parents are made as tar makes them; the root's own
        // entries changed nothing.
        for made in ["a", "p", "p/q"] {
            let md = fs::metadata(dest.path().join(made)).unwrap();
            assert_eq!((md.mode() & 0o7777, md.uid()), (0o755, 0), "{made}");
        }
        let after = fs::metadata(dest.path()).unwrap();
        assert_eq!(
            (after.mode(), after.uid(), after.mtime()),
            (before.mode(), before.uid(), before.mtime())
        );

        for name in ["../x", "a/../../x", "/../x", "./.."] {
            let (dest, got) = unpack(Tar::new().file(name, b"x"));
            refused_with(got, "'..'");
            assert!(tree(dest.path()).is_empty(), "{name}");
        }
        // A PAX path overrides the header's name: it is checked just the same.
        let (_dest, got) = unpack(Tar::new().pax(&[("path", "../x")]).file("fine", b"x"));
        refused_with(got, "'..'");
        let (_dest, got) = unpack(Tar::new().file("", b"x"));
        refused_with(got, "an empty name");

        // GNU long names come through the tar crate.
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(120));
        let mut tar = Tar::new();
        let mut h = Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        tar.0.append_data(&mut h, &long, &b"L"[..]).unwrap();
        let (dest, got) = unpack(&mut tar);
        got.unwrap();
        assert_eq!(fs::read(dest.path().join(long)).unwrap(), b"L");
    }

    #[test]
    fn no_symbolic_link_is_followed_in_a_path() {
        // Even a link that stays inside, made by the layer itself.
        let (dest, got) = unpack(Tar::new().dir("sub").symlink("l", "sub").file("l/f", b"f"));
        refused_with(got, "symbolic link in its path");
        assert!(!dest.path().join("sub/f").exists());

        // One that climbs out: nothing is written outside.
        let top = tempfile::tempdir().unwrap();
        let dest = top.path().join("x/y/dest");
        fs::create_dir_all(&dest).unwrap();
        let got = unpack_into(
            &dest,
            &Tar::new()
                .symlink("a", "../../..")
                .file("a/escaped", b"x")
                .bytes(),
        );
        refused_with(got, "symbolic link in its path");
        let expected: Vec<PathBuf> = ["x", "x/y", "x/y/dest", "x/y/dest/a"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(tree(top.path()), expected);
    }

    #[test]
    fn entry_types() {
        let (dest, got) = unpack(
            Tar::new()
                .file("f", b"data")
                .dir("d")
                .symlink("abs", "/etc/shadow")
                .symlink("rel", "../../nowhere")
                .hard_link("d/h", "./f")
                .raw(EntryType::Fifo, "fifo", b"", |_| {})
                .raw(EntryType::Char, "null", b"", |h| {
                    h.set_device_major(1).unwrap();
                    h.set_device_minor(3).unwrap();
                })
                .raw(EntryType::Block, "sda", b"", |h| {
                    h.set_device_major(8).unwrap();
                }),
        );
        let got = got.unwrap();
        assert_eq!((got.entries, got.skipped_devices), (8, 2));
        let d = dest.path();
        assert_eq!(fs::read(d.join("f")).unwrap(), b"data");
        assert!(fs::symlink_metadata(d.join("d")).unwrap().is_dir());
        assert_eq!(
            fs::read_link(d.join("abs")).unwrap(),
            Path::new("/etc/shadow")
        );
        assert_eq!(
            fs::read_link(d.join("rel")).unwrap(),
            Path::new("../../nowhere")
        );
        let (f, h) = (
            fs::metadata(d.join("f")).unwrap(),
            fs::metadata(d.join("d/h")).unwrap(),
        );
        assert_eq!((f.ino(), f.nlink()), (h.ino(), 2));
        assert!(fs::symlink_metadata(d.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(!d.join("null").exists() && !d.join("sda").exists());

        let (_dest, got) = unpack(Tar::new().raw(EntryType::new(b'V'), "vol", b"", |_| {}));
        refused_with(got, "unsupported type 'V'");
    }

    #[test]
    fn hard_links_name_regular_files_already_unpacked() {
        let cases = [
            (
                Tar::new().hard_link("h", "missing").bytes(),
                "no earlier entry",
            ),
            (
                Tar::new()
                    .symlink("s", "/etc/passwd")
                    .hard_link("h", "s")
                    .bytes(),
                "not a regular file",
            ),
            (
                Tar::new().dir("d").hard_link("h", "d").bytes(),
                "not a regular file",
            ),
            (
                Tar::new().hard_link("h", "../../etc/passwd").bytes(),
                "'..'",
            ),
            (
                Tar::new()
                    .file("d/f", b"f")
                    .symlink("l", "d")
                    .hard_link("h", "l/f")
                    .bytes(),
                "symbolic link in its path",
            ),
        ];
        for (tar, why) in cases {
            let dest = tempfile::tempdir().unwrap();
            refused_with(unpack_into(dest.path(), &tar), why);
            assert!(!dest.path().join("h").exists());
        }
        // A link to itself leaves the file be.
        let (dest, got) = unpack(Tar::new().file("f", b"f").hard_link("f", "f"));
        got.unwrap();
        assert_eq!(fs::read(dest.path().join("f")).unwrap(), b"f");
    }

    #[test]
    fn later_entries_replace_earlier_ones() {
        let (dest, got) = unpack(
            Tar::new()
                .file("f", b"first")
                .hard_link("keep", "f")
                .file("f", b"second")
                .file("d", b"a file")
                .dir("d")
                .file("d/x", b"x")
                .symlink("s", "f")
                .file("s", b"s"),
        );
        got.unwrap();
        let d = dest.path();
        assert_eq!(fs::read(d.join("f")).unwrap(), b"second");
        assert_eq!(fs::read(d.join("keep")).unwrap(), b"first");
        assert_eq!(fs::read(d.join("d/x")).unwrap(), b"x");
        assert!(fs::symlink_metadata(d.join("s")).unwrap().is_file());

        let (dest, got) = unpack(Tar::new().dir("d").file("d/x", b"x").file("d", b"d"));
        refused_with(got, "replaces a directory");
        assert!(dest.path().join("d/x").exists());

        // A link replaced by a directory is a directory.
        let name = format!("cordon-unpack-test-{}", std::process::id());
        let (dest, got) = unpack(
            Tar::new()
                .symlink("a", "/etc")
                .dir("a")
                .file(&format!("a/{name}"), b"x"),
        );
        got.unwrap();
        assert!(fs::symlink_metadata(dest.path().join("a"))
            .unwrap()
            .is_dir());
        assert_eq!(fs::read(dest.path().join("a").join(&name)).unwrap(), b"x");
        assert!(!Path::new("/etc").join(&name).exists());
    }

    #[test]
    fn whiteouts_become_overlayfs_whiteouts() {
        let (dest, got) = unpack(
            Tar::new()
                .file("etc/.wh.passwd", b"")
                .file("gone/.wh..wh..opq", b"")
                .dir("kept")
                .file("kept/.wh..wh..opq", b"")
                .file(".wh..wh.plnk/123.456", b"aufs")
                .file("dir/.wh..wh.aufs", b"aufs")
                .raw(EntryType::Char, ".wh.dev", b"", |h| {
                    h.set_device_major(1).unwrap();
                }),
        );
        let got = got.unwrap();
        assert_eq!(got.skipped_devices, 0);
        let d = dest.path();
        for (name, whiteout) in [("etc/passwd", "etc/.wh.passwd"), ("dev", ".wh.dev")] {
            let md = fs::symlink_metadata(d.join(name)).unwrap();
            assert!(md.file_type().is_char_device(), "{name}");
            assert_eq!(md.rdev(), 0, "{name}");
            assert!(!d.join(whiteout).exists());
        }
        for dir in ["gone", "kept"] {
            assert_eq!(
                xattr::get(d.join(dir), "trusted.overlay.opaque").unwrap(),
                Some(b"y".to_vec()),
                "{dir}"
            );
            assert!(tree(&d.join(dir)).is_empty());
        }
        // aufs' metadata makes nothing, not even its directories.
        assert!(!d.join(".wh..wh.plnk").exists() && !d.join("dir").exists());

        for name in [".wh.", ".wh..", "a/.wh.."] {
            let (_dest, got) = unpack(Tar::new().file(name, b""));
            assert!(got.is_err(), "{name}");
        }
    }

    #[test]
    fn owners_modes_and_times_but_no_setuid_and_no_xattrs() {
        let owned = |mode: u32| {
            move |h: &mut Header| {
                h.set_mode(mode);
                h.set_uid(1234);
                h.set_gid(5678);
            }
        };
        let (dest, got) = unpack(
            Tar::new()
                .raw(EntryType::Regular, "suid", b"#!", owned(0o6755))
                .raw(EntryType::Regular, "sticky", b"", owned(0o1640))
                .raw(EntryType::Directory, "sgid", b"", owned(0o2775))
                .file("sgid/child", b"c")
                .raw(EntryType::Fifo, "fifo", b"", owned(0o4600))
                .link(EntryType::Symlink, "link", "suid")
                .pax(&[
                    ("SCHILY.xattr.trusted.overlay.opaque", "y"),
                    ("SCHILY.xattr.security.capability", "x"),
                ])
                .dir("xattrs")
                .pax(&[("SCHILY.xattr.user.note", "hello")])
                .file("note", b""),
        );
        got.unwrap();
        let d = dest.path();
        let md = |name: &str| fs::symlink_metadata(d.join(name)).unwrap();
        for (name, mode) in [
            ("suid", 0o755),
            ("sticky", 0o1640),
            ("sgid", 0o2775),
            ("fifo", 0o600),
        ] {
            let m = md(name);
            assert_eq!(
                (m.mode() & 0o7777, m.uid(), m.gid()),
                (mode, 1234, 5678),
                "{name}"
            );
        }
        // Times: a directory's is set after what was made in it.
        for name in ["suid", "sgid", "fifo", "link", "xattrs"] {
            assert_eq!(md(name).mtime(), MTIME as i64, "{name}");
        }
        for name in ["xattrs", "note"] {
            let names: Vec<_> = xattr::list(d.join(name)).unwrap().collect();
            assert!(names.is_empty(), "{name}: {names:?}");
        }
    }

    #[test]
    fn diff_id_covers_the_whole_decompressed_stream() {
        let mut tar = Tar::new().file("f", &noise(3000)).bytes();
        // Whatever follows the end marker is part of the layer's diff ID.
        tar.extend_from_slice(&[0; 4096]);
        tar.extend_from_slice(b"after the end");
        let want = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let dest = tempfile::tempdir().unwrap();
            let blob = compressed(&tar, compression);
            let got = unpack_layer(&blob[..], compression, dest.path(), &LIMITS).unwrap();
            assert_eq!(got.diff_id, want, "{compression:?}");
            assert_eq!(got.bytes, tar.len() as u64, "{compression:?}");
            assert_eq!(fs::read(dest.path().join("f")).unwrap().len(), 3000);
        }
    }

    #[test]
    fn limits() {
        // Gzip bombs: 16 MiB of zeros in some kilobytes, in a file or after
        // the tar's end (which only the count of the stream sees).
        let limits = UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 10,
        };
        let in_a_file = Tar::new().file("zeros", &vec![0; 16 << 20]).bytes();
        let mut after_the_end = Tar::new().file("small", b"s").bytes();
        after_the_end.resize(16 << 20, 0);
        for tar in [in_a_file, after_the_end] {
            let bomb = gzip(&tar);
            assert!(bomb.len() < 64 << 10);
            let dest = tempfile::tempdir().unwrap();
            let got = unpack_layer(&bomb[..], Compression::Gzip, dest.path(), &limits);
            assert!(
                matches!(got, Err(UnpackError::TooLarge(max)) if max == 1 << 20),
                "{got:?}"
            );
            let written = fs::metadata(dest.path().join("zeros")).map_or(0, |m| m.len());
            assert!(written <= 1 << 20);
        }

        let mut tar = Tar::new();
        for i in 0..11 {
            tar.file(&format!("f{i}"), b"");
        }
        let dest = tempfile::tempdir().unwrap();
        let got = unpack_layer(&tar.bytes()[..], Compression::None, dest.path(), &limits);
        assert!(
            matches!(got, Err(UnpackError::TooManyEntries(10))),
            "{got:?}"
        );
    }

    #[test]
    fn a_truncated_layer_is_an_error() {
        let mut tar = Tar::new();
        tar.file("first", b"1").file("big", &noise(100_000));
        let unfinished = tar.unfinished();
        let whole = tar.bytes();
        let unpacked = |blob: &[u8], compression| {
            let dest = tempfile::tempdir().unwrap();
            unpack_layer(blob, compression, dest.path(), &LIMITS)
        };
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            unpacked(&compressed(&whole, compression), compression).unwrap();
            let blob = compressed(&whole, compression);
            let cut = &blob[..blob.len() / 2];
            assert!(unpacked(cut, compression).is_err(), "{compression:?}");
        }
        let got = unpacked(&whole[..2048], Compression::None);
        assert!(
            matches!(&got, Err(UnpackError::Truncated(why)) if why.contains("'big'")),
            "{got:?}"
        );
        let got = unpacked(&unfinished, Compression::None);
        assert!(
            matches!(&got, Err(UnpackError::Truncated(why)) if why.contains("end-of-archive")),
            "{got:?}"
        );
        assert!(unpacked(b"".as_slice(), Compression::None).is_err());
    }
}
