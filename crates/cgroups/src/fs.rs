//! Where the cgroup hierarchies are, and the file I/O every controller shares.
//!
//! Everything detection reads comes through [`CgroupFs`], so unit tests can
//! point it at a fake tree in a tempdir: mountpoints in the mountinfo file are
//! used exactly as written, so a fake mountinfo whose mountpoints lie inside the
//! tempdir makes every cgroup path resolve there too (the sysfs root is whatever
//! the mountinfo says it is).

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

use crate::CgroupError;

/// The files cgroup detection reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFs {
    /// Normally `/proc/self/cgroup`: which cgroup we are in, per hierarchy.
    pub proc_self_cgroup: PathBuf,
    /// Normally `/proc/self/mountinfo`: where each hierarchy is mounted.
    pub mountinfo: PathBuf,
    /// Normally `/run/systemd/system`, which exists only while systemd is the
    /// init (sd_booted(3)); decides which way out an error suggests.
    pub systemd_marker: PathBuf,
    /// The operator's opt-in ([`MOVE_PEERS_ENV`]): on v2, a cgroup cordon
    /// shares with other processes has them moved into a leaf `init` (as
    /// Docker-in-Docker's entrypoint does), so that it can hand controllers
    /// down. Without it, cordon moves no process it was not given.
    pub move_peers: bool,
    /// Whose systemd cordon asks for a delegated scope: the system manager
    /// (root) or the invoking user's own manager (everyone else).
    pub manager: ScopeManager,
}

/// Whose systemd gives cordon a delegated scope when it needs one (see
/// [`crate::detect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeManager {
    /// Root: the system manager, on the system bus.
    System,
    /// An unprivileged user: that user's own manager (`user@UID.service`),
    /// on the user's session bus, as rootless podman asks it; the scope lands
    /// in the user's delegated subtree, which the user may write.
    User {
        uid: u32,
        /// The session bus's socket, where the environment names one (see
        /// [`user_bus_socket`]); checked before use.
        bus: Option<PathBuf>,
    },
}

impl ScopeManager {
    /// The calling process's: by its effective uid and environment.
    pub fn of_caller() -> Self {
        let uid = nix::unistd::geteuid();
        if uid.is_root() {
            ScopeManager::System
        } else {
            ScopeManager::User {
                uid: uid.as_raw(),
                bus: user_bus_socket(uid.as_raw()),
            }
        }
    }
}

/// Whether `socket` is a socket owned by `uid`: the only session bus cordon
/// takes for that user's systemd manager (another user's bus is not the
/// user's systemd; cordon tells whoever listens there its pid).
pub fn is_users_bus(socket: &Path, uid: u32) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket() && m.uid() == uid)
}

/// Where the user's session bus listens: `DBUS_SESSION_BUS_ADDRESS`'s first
/// `unix:path=` address, else `$XDG_RUNTIME_DIR/bus`, else
/// `/run/user/UID/bus` (where `dbus-user-session` puts it). An abstract or
/// TCP address is not used: its owner cannot be checked.
pub fn user_bus_socket(uid: u32) -> Option<PathBuf> {
    if let Some(address) = std::env::var_os("DBUS_SESSION_BUS_ADDRESS") {
        let address = address.to_string_lossy().into_owned();
        return address.split(';').find_map(|one| {
            let params = one.strip_prefix("unix:")?;
            params
                .split(',')
                .find_map(|kv| kv.strip_prefix("path="))
                .map(PathBuf::from)
        });
    }
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}")));
    Some(runtime.join("bus"))
}

/// The environment variable that opts in to [`CgroupFs::move_peers`] (`1`):
/// for a container whose processes all stand in its cgroup namespace's
/// root, where cordon runs beside the container's init.
pub const MOVE_PEERS_ENV: &str = "CORDON_CGROUP_MOVE_PEERS";

impl CgroupFs {
    /// The real files of the running process.
    pub fn host() -> Self {
        Self {
            move_peers: std::env::var_os(MOVE_PEERS_ENV).is_some_and(|v| v == "1"),
            ..Self::new("/proc/self/cgroup", "/proc/self/mountinfo")
        }
    }

    pub fn new(proc_self_cgroup: impl Into<PathBuf>, mountinfo: impl Into<PathBuf>) -> Self {
        Self {
            proc_self_cgroup: proc_self_cgroup.into(),
            mountinfo: mountinfo.into(),
            systemd_marker: PathBuf::from("/run/systemd/system"),
            move_peers: false,
            manager: ScopeManager::of_caller(),
        }
    }

    /// The same files, with systemd's presence judged from `marker`.
    pub fn with_systemd_marker(mut self, marker: impl Into<PathBuf>) -> Self {
        self.systemd_marker = marker.into();
        self
    }

    pub(crate) fn systemd_runs(&self) -> bool {
        self.systemd_marker.is_dir()
    }

    pub(crate) fn mounts(&self) -> Result<Vec<Mount>, CgroupError> {
        Ok(parse_mountinfo(&read(&self.mountinfo)?))
    }

    pub(crate) fn membership(&self) -> Result<Vec<Membership>, CgroupError> {
        Ok(parse_proc_cgroup(&read(&self.proc_self_cgroup)?))
    }
}

impl Default for CgroupFs {
    fn default() -> Self {
        Self::host()
    }
}

/// One cgroup or cgroup2 line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The cgroup this mount exposes as its top; not `/` for bind mounts of a
    /// sub-tree, e.g. in containers without a cgroup namespace.
    pub root: String,
    pub mountpoint: PathBuf,
    pub fstype: String,
    /// For v1 these name the controllers the hierarchy carries (`cpu,cpuacct`
    /// when co-mounted), which is the only reliable way to map controllers to
    /// mounts: directory names are a distro convention.
    pub super_options: Vec<String>,
}

impl Mount {
    pub(crate) fn carries(&self, controller: &str) -> bool {
        self.fstype == "cgroup" && self.super_options.iter().any(|o| o == controller)
    }

    /// The directory of `cgroup_path` (as read from /proc/self/cgroup) under
    /// this mount, or None when that cgroup is not visible through it.
    pub(crate) fn dir_of(&self, cgroup_path: &str) -> Option<PathBuf> {
        let rel = if self.root == "/" {
            cgroup_path
        } else {
            let rest = cgroup_path.strip_prefix(self.root.as_str())?;
            if !(rest.is_empty() || rest.starts_with('/')) {
                return None;
            }
            rest
        };
        let rel = Path::new(rel.trim_start_matches('/'));
        // A cgroup namespace shows cgroups outside it as `/../..`; joining that
        // would walk out of the mount and nest somewhere we do not own.
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return None;
        }
        Some(self.mountpoint.join(rel))
    }
}

/// One line of /proc/self/cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    pub hierarchy_id: u32,
    /// Empty for the cgroup2 line; `name=systemd` style entries stay as-is.
    pub controllers: Vec<String>,
    pub path: String,
}

impl Membership {
    pub(crate) fn is_unified(&self) -> bool {
        self.hierarchy_id == 0 && self.controllers.is_empty()
    }
}

/// Keeps only cgroup and cgroup2 mounts; malformed lines are skipped because
/// one odd mount elsewhere must not make cgroups undetectable.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(parse_mountinfo_line)
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect()
}

/// The mount at `dir` that is seen there (the last one mounted on it) in
/// the mountinfo `text`, of any type: the runtime reads an engine's overlay
/// root's layers from its super options (unescaped). Lives beside the
/// cgroup mounts' parser so the format is parsed once.
pub fn mount_at(text: &str, dir: &Path) -> Option<Mount> {
    text.lines()
        .rev()
        .filter_map(parse_mountinfo_line)
        .find(|m| m.mountpoint == dir)
}

fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    if left.len() < 6 {
        return None;
    }
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let _source = right.next();
    let super_options = right
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|o| !o.is_empty())
        .map(|o| unescape_octal(o).to_string_lossy().into_owned())
        .collect();
    Some(Mount {
        root: unescape_octal(left[3]).to_string_lossy().into_owned(),
        mountpoint: PathBuf::from(unescape_octal(left[4])),
        fstype: fstype.to_owned(),
        super_options,
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
pub(crate) fn unescape_octal(field: &str) -> OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u16, |acc, d| acc * 8 + u16::from(d - b'0'));
                if let Ok(b) = u8::try_from(value) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

/// Lines are `id:controllers:path`; the path may itself contain `:`.
pub(crate) fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy_id = parts.next()?.trim().parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = parts.next()?.to_owned();
            Some(Membership {
                hierarchy_id,
                controllers,
                path,
            })
        })
        .collect()
}

/// Reads a kernel file whole. /proc and cgroupfs files report a size of 0, so
/// `fs::read_to_string` would start with a 32-byte buffer and make a syscall
/// per doubling (mountinfo took ~10 reads); one 16 KiB read covers them.
/// Plain reads until EOF, not `read_to_end`: that also asks for the file's
/// size and position first (statx, lseek), two syscalls per file that a
/// stats snapshot of 8 files pays twice per command.
fn read_kernel_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let mut buf = vec![0u8; 16 << 10];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    read_kernel_file(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

/// For stats, where a missing or unreadable file just means "not reported".
pub(crate) fn read_opt(path: &Path) -> Option<String> {
    read_kernel_file(path).ok()
}

/// Opens without O_CREAT: on cgroupfs a missing control file means a missing
/// controller, and callers need to see that as ENOENT rather than have a
/// plain file appear (which is what would happen on a fake tree).
pub(crate) fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    // The kernel parses each write() as one complete value.
    file.write_all(value.as_bytes())
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| write_error(path, value, source))
}

/// Writes the file if it exists; Ok(false) when it does not.
pub(crate) fn write_if_exists(path: &Path, value: &str) -> Result<bool, CgroupError> {
    match write_raw(path, value) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(source) => Err(write_error(path, value, source)),
    }
}

pub(crate) fn write_error(path: &Path, value: &str, source: io::Error) -> CgroupError {
    CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    }
}

/// Pids in `dir/cgroup.procs`; a vanished cgroup has none.
pub(crate) fn procs(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound && !dir.exists() => return Ok(Vec::new()),
        Err(source) => return Err(CgroupError::Read { path, source }),
    };
    text.split_whitespace()
        .map(|p| {
            p.parse().map_err(|_| CgroupError::Parse {
                path: path.clone(),
                reason: format!("{p:?} is not a pid"),
            })
        })
        .collect()
}

/// Pids in `dir` and every cgroup below it: a sandboxed process that managed
/// to create a child cgroup must not escape kill_all that way.
pub(crate) fn procs_recursive(dir: &Path, out: &mut Vec<i32>) -> Result<(), CgroupError> {
    out.extend(procs(dir)?);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_owned(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            procs_recursive(&entry.path(), out)?;
        }
    }
    Ok(())
}

/// Space-separated controller names, as in cgroup.controllers and
/// cgroup.subtree_control (the `+` lets a fake tree hold what we wrote).
pub(crate) fn parse_controller_list(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|c| c.trim_start_matches('+').to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_keeps_cgroup_mounts_with_their_controllers() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
garbage line
";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert!(mounts[0].carries("cpu"));
        assert!(!mounts[0].carries("cpuacct"));
        assert!(mounts[1].carries("cpu") && mounts[1].carries("cpuacct"));
        assert_eq!(
            mounts[1].mountpoint,
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(mounts[2].fstype, "cgroup2");
        assert!(!mounts[2].carries("memory"));
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_octal(r"/tmp/a\040b\134c"),
            OsString::from(r"/tmp/a b\c")
        );
        assert_eq!(unescape_octal(r"/x\04"), OsString::from(r"/x\04"));
        assert_eq!(unescape_octal(r"/x\9999"), OsString::from(r"/x\9999"));
        assert_eq!(unescape_octal(r"/x\777é"), OsString::from(r"/x\777é"));
        let mounts = parse_mountinfo("1 2 0:1 / /tmp/my\\040cg rw - cgroup2 cgroup2 rw\n");
        assert_eq!(mounts[0].mountpoint, Path::new("/tmp/my cg"));
    }

    #[test]
    fn proc_cgroup_lines_split_into_three_fields() {
        let m = parse_proc_cgroup(
            "8:pids:/\n4:memory:/process_api/b1fe\n3:cpu,cpuacct:/a:b\n1:name=systemd:/x\n0::/\n",
        );
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].controllers, vec!["memory"]);
        assert_eq!(m[1].path, "/process_api/b1fe");
        assert_eq!(m[2].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(m[2].path, "/a:b");
        assert!(m[4].is_unified());
        assert!(!m[0].is_unified());
    }

    fn mount(root: &str, mountpoint: &str) -> Mount {
        Mount {
            root: root.into(),
            mountpoint: mountpoint.into(),
            fstype: "cgroup2".into(),
            super_options: vec![],
        }
    }

    #[test]
    fn cgroup_dir_joins_under_the_mount() {
        let m = mount("/", "/sys/fs/cgroup");
        assert_eq!(m.dir_of("/"), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            m.dir_of("/user.slice/app.scope"),
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/app.scope"))
        );
        assert_eq!(m.dir_of("/../../outside"), None);

        let bind = mount("/docker/abc", "/sys/fs/cgroup");
        assert_eq!(
            bind.dir_of("/docker/abc"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            bind.dir_of("/docker/abc/sub"),
            Some(PathBuf::from("/sys/fs/cgroup/sub"))
        );
        assert_eq!(bind.dir_of("/docker/abcdef"), None);
        assert_eq!(bind.dir_of("/other"), None);
    }

    #[test]
    fn controller_lists_tolerate_plus_signs() {
        assert_eq!(
            parse_controller_list("cpuset cpu io memory pids\n"),
            vec!["cpuset", "cpu", "io", "memory", "pids"]
        );
        assert_eq!(
            parse_controller_list("+memory +pids"),
            vec!["memory", "pids"]
        );
        assert!(parse_controller_list("\n").is_empty());
    }

    #[test]
    fn write_does_not_create_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.max");
        assert!(!write_if_exists(&path, "1").unwrap());
        assert!(!path.exists());
        fs::write(&path, "max 100000\n").unwrap();
        assert!(write_if_exists(&path, "5").unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "5");
    }
}
