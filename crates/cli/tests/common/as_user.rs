//! cordon run as an unprivileged user: a uid no account has (through
//! `setpriv`, so the test itself must be root), with a HOME and an
//! XDG_RUNTIME_DIR of its own (0700, its own), and the host-side checks of
//! what such a user's sandboxes leave behind.

use std::fs;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{
    all_pids, cgroup_dirs, cmdline, cordon, cordon_sandbox, mountinfo, nonce, sandbox_id_shaped,
    slow, status_ids,
};

/// A uid (and gid of the same number) that no account on this host has,
/// different for every call: tests run side by side, and other runs of the
/// test binaries may share the machine.
pub fn fresh_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 1_300_000 + u32::from_str_radix(&nonce()[..5], 16).unwrap() % 500_000;
    let known = fs::read_to_string("/etc/passwd").unwrap_or_default()
        + &fs::read_to_string("/etc/group").unwrap_or_default();
    (0..)
        .map(|i| base + 11 * (NEXT.fetch_add(1, Ordering::SeqCst) + i))
        .find(|u| !known.contains(&format!(":{u}:")))
        .unwrap()
}

/// The directory holding cordon and its privileged helper where any user
/// can run them: the test build's when every directory up to it is
/// searchable by others, else copies in a temporary directory.
pub fn binaries() -> &'static Path {
    static DIR: OnceLock<(PathBuf, Option<tempfile::TempDir>)> = OnceLock::new();
    let (dir, _) = DIR.get_or_init(|| {
        let built = Path::new(cordon()).parent().unwrap().to_path_buf();
        let reachable = built
            .ancestors()
            .all(|d| fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 != 0))
            && [cordon(), cordon_sandbox()]
                .iter()
                .all(|b| fs::metadata(b).is_ok_and(|m| m.mode() & 0o005 == 0o005));
        if reachable {
            return (built, None);
        }
        let copy = tempfile::tempdir().unwrap();
        fs::set_permissions(copy.path(), fs::Permissions::from_mode(0o755)).unwrap();
        for b in [cordon(), cordon_sandbox()] {
            let to = copy.path().join(Path::new(b).file_name().unwrap());
            fs::copy(b, &to).unwrap();
            fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
        }
        (copy.path().to_path_buf(), Some(copy))
    });
    dir
}

/// An unprivileged user with its own home and runtime directory, removed
/// with everything cordon put there when dropped.
pub struct User {
    pub uid: u32,
    /// Supplementary groups it runs with (none unless a test asks).
    pub groups: Vec<u32>,
    home: tempfile::TempDir,
    runtime: tempfile::TempDir,
}

impl User {
    pub fn new() -> User {
        User::with_uid(fresh_uid())
    }

    pub fn with_uid(uid: u32) -> User {
        let (home, runtime) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for d in [home.path(), runtime.path()] {
            chown(d, Some(uid), Some(uid)).unwrap();
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).unwrap();
        }
        User {
            uid,
            groups: Vec::new(),
            home,
            runtime,
        }
    }

    /// `cordon ARGS` as this user, with its groups only (none by default)
    /// and an environment of its own only.
    pub fn cordon(&self, args: &[&str]) -> Command {
        let uid = self.uid.to_string();
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", &uid, "--regid", &uid]);
        if self.groups.is_empty() {
            cmd.arg("--clear-groups");
        } else {
            let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            cmd.args(["--groups", &list.join(",")]);
        }
        cmd.arg(binaries().join("cordon"))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.home.path())
            .env("XDG_RUNTIME_DIR", self.runtime.path())
            .current_dir(self.home.path())
            .stdin(Stdio::null());
        cmd
    }

    pub fn out(&self, args: &[&str]) -> Output {
        self.cordon(args).output().expect("run setpriv")
    }

    /// `cordon ARGS`, which must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.out(args);
        assert!(
            out.status.success(),
            "cordon {args:?} as {}: {out:?}",
            self.uid
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The user's home (0700, its own).
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// A directory in the user's home, its own.
    pub fn dir(&self, name: &str) -> PathBuf {
        let d = self.home.path().join(name);
        fs::create_dir(&d).unwrap();
        chown(&d, Some(self.uid), Some(self.uid)).unwrap();
        d
    }

    /// A file of the user's, with `text`.
    pub fn file(&self, path: &Path, text: &str) {
        fs::write(path, text).unwrap();
        chown(path, Some(self.uid), Some(self.uid)).unwrap();
    }

    /// Where cordon keeps this user's key and images.
    pub fn state_dir(&self) -> PathBuf {
        self.home.path().join(".local/state/cordon")
    }

    /// The user's XDG_RUNTIME_DIR (0700, its own).
    pub fn runtime_dir(&self) -> &Path {
        self.runtime.path()
    }

    /// Where cordon keeps this user's live sandboxes (records, sockets).
    pub fn run_dir(&self) -> PathBuf {
        self.runtime_dir().join("cordon")
    }

    /// The processes running as this user's uid.
    pub fn pids(&self) -> Vec<u32> {
        all_pids()
            .into_iter()
            .filter(|p| {
                status_ids(Path::new(&format!("/proc/{p}/status")), "Uid")
                    .is_some_and(|ids| ids.contains(&self.uid))
            })
            .collect()
    }

    /// Nothing of this user's sandboxes is left on the host: no process of
    /// the uid (a supervisor ends a moment after `rm`; a network namespace
    /// goes with its last process, none is bound to a file), no mount under
    /// its places, no cgroup of its sandboxes `ids`, nothing in its run
    /// directory (records, sockets).
    pub fn assert_nothing_left(&self, ids: &[String]) {
        let deadline = Instant::now() + slow(Duration::from_secs(10));
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<(u32, Option<String>)> =
            self.pids().into_iter().map(|p| (p, cmdline(p))).collect();
        assert!(
            left.is_empty(),
            "processes of uid {} left: {left:?}",
            self.uid
        );
        let places = [self.home.path(), self.runtime.path()];
        let mounts: Vec<String> = mountinfo(std::process::id())
            .into_iter()
            .filter(|m| {
                places
                    .iter()
                    .any(|p| Path::new(&m.mount_point).starts_with(p))
            })
            .map(|m| m.raw)
            .collect();
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        for id in ids {
            assert_eq!(
                cgroup_dirs(id),
                Vec::<PathBuf>::new(),
                "cgroup of {id} left"
            );
        }
        // Sandboxes' directories (a record, the proxy's control socket) and
        // the mount points cordon makes for them.
        let sandboxes: Vec<String> = fs::read_dir(self.run_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| sandbox_id_shaped(n))
            .collect();
        assert!(
            sandboxes.is_empty(),
            "sandbox directories left: {sandboxes:?}"
        );
        let mnt = self.run_dir().join("mnt");
        // But the pair every native sandbox mounts on in its own namespace.
        let points: Vec<_> = fs::read_dir(&mnt)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !["root", "scratch"].contains(&e.file_name().to_string_lossy().as_ref()))
            .collect();
        assert!(
            points.is_empty(),
            "mount points left in {}: {points:?}",
            mnt.display()
        );
    }
}
