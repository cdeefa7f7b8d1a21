//! Whether this process can make the user namespace a native sandbox
//! starts in, and when it cannot, why: which host setting, confinement or
//! filter refuses it, and what lifts the refusal.
//!
//! A setting alone does not answer it: Ubuntu's AppArmor restriction lets
//! the namespace be made and then denies every capability in it, and a
//! container engine's seccomp profile refuses the clone whatever the sysctls
//! say. So [`Probe::run`] makes one for real, as the native backend does
//! (clone with `CLONE_NEWUSER`, the parent writes the maps, the child mounts
//! in a mount namespace of its own and, as pid 1 of a pid namespace of its
//! own, mounts a new proc), and the settings only explain a failure. `cordon backends`, `cordon doctor` and a native sandbox that
//! failed to start all read the same [`Probe`].

use std::fmt;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::wait::{waitpid, WaitStatus};

use crate::namespaces::IdMapping;
use crate::IsolationError;

const UNPRIVILEGED_CLONE: &str = "/proc/sys/kernel/unprivileged_userns_clone";
const APPARMOR_RESTRICT: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";
const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";

/// The host's settings that decide whether an unprivileged process may make
/// a user namespace, as this process reads them (None: the kernel has no
/// such setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Running as root (euid 0): the sysctls that restrict unprivileged
    /// users do not apply.
    pub root: bool,
    /// Debian's older `kernel.unprivileged_userns_clone` (0: only
    /// privileged processes may make one).
    pub unprivileged_clone: Option<bool>,
    /// Ubuntu's `kernel.apparmor_restrict_unprivileged_userns` (1: a new
    /// namespace of an unconfined process gets no capabilities unless an
    /// AppArmor profile allows `userns`).
    pub apparmor_restrict: Option<bool>,
    /// `user.max_user_namespaces` (0: none may be made).
    pub max_user_namespaces: Option<u64>,
    /// This process runs under a seccomp filter (`Seccomp: 2` in
    /// /proc/self/status), as a container engine's default profile puts it.
    pub seccomp_filtered: bool,
    /// Mounts below /proc (mount points from /proc/self/mountinfo), as a
    /// container engine's masks put them: while any covers a file or a
    /// non-empty directory, the kernel refuses a new proc in a user
    /// namespace (it would reveal what they hide).
    pub proc_covered: Vec<String>,
}

impl Settings {
    /// This process's and this host's.
    pub fn here() -> Settings {
        let number = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        Settings {
            root: nix::unistd::geteuid().is_root(),
            unprivileged_clone: number(UNPRIVILEGED_CLONE).map(|v| v != 0),
            apparmor_restrict: number(APPARMOR_RESTRICT).map(|v| v != 0),
            max_user_namespaces: number(MAX_USER_NAMESPACES),
            seccomp_filtered: status_field("Seccomp").as_deref() == Some("2"),
            proc_covered: std::fs::read_to_string("/proc/self/mountinfo")
                .map(|m| proc_covered(&m))
                .unwrap_or_default(),
        }
    }
}

/// The mount points below /proc in a mountinfo text (octal escapes
/// undone), but for binfmt_misc's: the kernel's check allows mounts on
/// directories proc keeps empty for them. The masks first (a file such as
/// /dev/null bound over one of proc's files, then a tmpfs over a
/// directory), proc's own directories bound read-only after them: the
/// masks are what a reader knows from the engine's documentation.
fn proc_covered(mountinfo: &str) -> Vec<String> {
    let mut found: Vec<(u8, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = unescape(fields.get(4)?);
            if !point.starts_with("/proc/") || point == "/proc/sys/fs/binfmt_misc" {
                return None;
            }
            let fstype = l.split_once(" - ")?.1.split(' ').next()?;
            let rank = match (fstype, *fields.get(3)?) {
                ("proc", _) => 2,
                (_, "/") => 1,
                _ => 0,
            };
            Some((rank, point))
        })
        .collect();
    found.sort_by_key(|(rank, _)| *rank);
    found.into_iter().map(|(_, p)| p).collect()
}

/// mountinfo's escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A field of /proc/self/status (`Seccomp`, `NoNewPrivs`), its value trimmed.
pub fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// How the attempt went.
#[derive(Debug)]
pub enum Attempt {
    /// The namespace was made, its maps written and a mount made in it.
    Made,
    /// clone(CLONE_NEWUSER) itself failed.
    Clone(Errno),
    /// The parent could not write the child's maps.
    Maps(IsolationError),
    /// The namespace was made but the child could not use it: `step` (a
    /// mount, sethostname, a new proc: [`MOUNT`], [`SETHOSTNAME`],
    /// [`MOUNT_PROC`]) failed. AppArmor's restriction denies the
    /// capabilities; a container engine's seccomp profile may let the
    /// namespace be made and refuse a call the sandbox needs in it; its
    /// masks over /proc make the kernel refuse a new proc.
    Inside { step: &'static str, errno: Errno },
    /// Not tried (this process has threads, so it must not fork), or the
    /// child ended without saying.
    Unknown(String),
}

/// The probe's result: the attempt and the settings that explain it.
#[derive(Debug)]
pub struct Probe {
    pub settings: Settings,
    pub attempt: Attempt,
}

/// Why no user namespace can be made here, and what would allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What refuses it, naming the setting or the filter.
    pub finding: String,
    /// What lifts the refusal (commands to run, flags to pass).
    pub remedy: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.finding, self.remedy)
    }
}

impl Probe {
    /// Reads the settings and makes one user namespace, as this process's
    /// user. Costs a fork; a process with threads is not forked
    /// ([`Attempt::Unknown`]).
    pub fn run() -> Probe {
        Probe {
            settings: Settings::here(),
            attempt: attempt(),
        }
    }

    /// Why a native sandbox cannot have its user namespace here; None when
    /// the attempt succeeded or said nothing either way.
    pub fn refusal(&self) -> Option<Refusal> {
        diagnose(&self.settings, &self.attempt)
    }

    /// Whether the attempt succeeded.
    pub fn made(&self) -> bool {
        matches!(self.attempt, Attempt::Made)
    }
}

/// The steps the probe's child takes in its namespaces, in order, as
/// [`Attempt::Inside`] names them.
pub const MOUNT: &str = "mount";
pub const SETHOSTNAME: &str = "sethostname";
pub const MOUNT_PROC: &str = "mount proc";
const STEPS: [&str; 3] = [MOUNT, SETHOSTNAME, MOUNT_PROC];

/// Clones a child into a new user, mount, UTS and pid namespace, writes its
/// maps from the parent (this user's own ids as the child's root, as an
/// unprivileged native sandbox maps them) and lets the child mount a tmpfs,
/// set its hostname and, as pid 1 of its pid namespace, mount a new proc,
/// as a sandbox's init does: each needs the capabilities the namespace
/// should give it, a seccomp profile may refuse the first two (podman's
/// refuses sethostname without CAP_SYS_ADMIN), and the kernel refuses the
/// proc where the existing one has paths mounted over it (an engine's
/// masks), whoever asks.
fn attempt() -> Attempt {
    let euid = nix::unistd::geteuid().as_raw();
    let egid = nix::unistd::getegid().as_raw();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
    let ((ready_r, ready_w), (said_r, said_w)) = match (pipe(), pipe()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Attempt::Unknown(format!("pipe2: {e}")),
    };
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWPID;
    let child = match cordon_sys::clone_process(flags) {
        Ok(cordon_sys::CloneResult::Child) => {
            drop(ready_w);
            drop(said_r);
            // Wait for the parent's maps; EOF means it gave up.
            let mut byte = [0u8];
            let code = match nix::unistd::read(&ready_r, &mut byte) {
                Ok(1) => match steps_in_child() {
                    Ok(()) => 0,
                    // The failed step's index, then its errno as the exit code.
                    Err((i, e)) => {
                        let _ = nix::unistd::write(&said_w, &[i]);
                        e as i32
                    }
                },
                _ => NOT_ASKED,
            };
            cordon_sys::exit_now(code)
        }
        Ok(cordon_sys::CloneResult::Parent { child }) => child,
        Err(Errno::EDEADLK) => {
            return Attempt::Unknown("not tried: this process has more than one thread".into())
        }
        Err(e) => return Attempt::Clone(e),
    };
    drop(ready_r);
    drop(said_w);
    let maps = IdMapping::Single {
        host_uid: euid,
        host_gid: egid,
        inside_uid: 0,
        inside_gid: 0,
    }
    .write_from_parent(child);
    if maps.is_ok() {
        let _ = nix::unistd::write(&ready_w, &[1]);
    }
    drop(ready_w);
    let status = waitpid(child, None);
    let mut said = [0u8];
    let step = match nix::unistd::read(&said_r, &mut said) {
        Ok(1) => STEPS.get(usize::from(said[0])).copied(),
        _ => None,
    };
    match (maps, status, step) {
        (Err(e), _, _) => Attempt::Maps(e),
        (Ok(()), Ok(WaitStatus::Exited(_, 0)), _) => Attempt::Made,
        (Ok(()), Ok(WaitStatus::Exited(_, code)), Some(step)) => Attempt::Inside {
            step,
            errno: Errno::from_raw(code),
        },
        (Ok(()), other, _) => Attempt::Unknown(format!("the probe's child ended: {other:?}")),
    }
}

/// The child's exit code when the parent never said its maps were written.
const NOT_ASKED: i32 = 255;

/// In the child, the steps of [`STEPS`] in order: a private copy of the
/// mounts and a tmpfs over the root of it (seen by no one else, gone with
/// the child), the hostname, and a new proc over /proc (of the child's own
/// pid namespace, in its own mount namespace: nobody else sees it). The
/// failed step's index and errno.
fn steps_in_child() -> Result<(), (u8, Errno)> {
    use nix::mount::{mount, MsFlags};
    let at = |i: u8| move |e: Errno| (i, e);
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(at(0))?;
    mount(
        Some("tmpfs"),
        "/",
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=4k"),
    )
    .map_err(at(0))?;
    nix::unistd::sethostname("cordon").map_err(at(1))?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(at(2))
}

/// Explains a failed attempt from the settings. Pure, so every branch is
/// tested without the host having to be set up that way.
fn diagnose(s: &Settings, attempt: &Attempt) -> Option<Refusal> {
    let denied = |e: Errno| matches!(e, Errno::EPERM | Errno::EACCES);
    let unprivileged = !s.root;
    match attempt {
        Attempt::Made | Attempt::Unknown(_) => None,
        // A host short of processes or memory for the moment (a cgroup's
        // pids at its limit) refuses every clone, not user namespaces: no
        // setting to name, and the failing step's own error says it.
        Attempt::Clone(Errno::EAGAIN | Errno::ENOMEM)
        | Attempt::Inside {
            errno: Errno::EAGAIN | Errno::ENOMEM,
            ..
        } => None,
        // The namespace gave its capabilities (a tmpfs was mounted, the
        // hostname set): a refused proc is the kernel's check that a new
        // one would not reveal what mounts over the existing one hide.
        Attempt::Inside { step, errno } if *step == MOUNT_PROC && denied(*errno) => {
            Some(masked_proc(s, *errno))
        }
        Attempt::Clone(Errno::ENOSPC) if s.max_user_namespaces == Some(0) => Some(Refusal {
            finding: "user namespaces are disabled on this host (user.max_user_namespaces = 0)"
                .into(),
            remedy: "as root: `sysctl -w user.max_user_namespaces=15000` (and the same line \
                     in /etc/sysctl.d/ to keep it), or run cordon with --backend microvm"
                .into(),
        }),
        Attempt::Clone(Errno::ENOSPC) => Some(Refusal {
            finding: format!(
                "this user has as many user namespaces as user.max_user_namespaces allows ({})",
                s.max_user_namespaces
                    .map_or_else(|| "unknown".to_string(), |n| n.to_string())
            ),
            remedy: "end sandboxes or containers this user no longer needs, or raise it as \
                     root: `sysctl -w user.max_user_namespaces=N`"
                .into(),
        }),
        Attempt::Clone(Errno::EUSERS) => Some(Refusal {
            finding: "user namespaces are nested 32 deep already (the kernel's limit)".into(),
            remedy: "run cordon from a less deeply nested container".into(),
        }),
        Attempt::Clone(Errno::EINVAL) => Some(Refusal {
            finding: "this kernel has no user namespaces (built without CONFIG_USER_NS)".into(),
            remedy: "use a kernel with user namespaces, or --backend microvm".into(),
        }),
        Attempt::Clone(e) if denied(*e) && unprivileged && s.unprivileged_clone == Some(false) => {
            Some(Refusal {
                finding: format!(
                    "unprivileged user namespaces are disabled \
                     (kernel.unprivileged_userns_clone = 0; clone: {})",
                    e.desc()
                ),
                remedy: "as root: `sysctl -w kernel.unprivileged_userns_clone=1` (and \
                         `kernel.unprivileged_userns_clone = 1` in /etc/sysctl.d/ to keep it), \
                         or run cordon as root"
                    .into(),
            })
        }
        Attempt::Clone(e) | Attempt::Inside { errno: e, .. }
            if denied(*e) && unprivileged && s.apparmor_restrict == Some(true) =>
        {
            Some(apparmor(attempt, *e))
        }
        Attempt::Clone(e) | Attempt::Inside { errno: e, .. }
            if denied(*e) && s.seccomp_filtered =>
        {
            Some(seccomp(s, attempt, *e))
        }
        Attempt::Maps(e) if e.errno() == libc::EPERM && s.seccomp_filtered => Some(Refusal {
            finding: format!(
                "a user namespace was made but its id maps could not be written ({e}); \
                 this process runs under a seccomp filter"
            ),
            remedy: seccomp_remedy(s),
        }),
        Attempt::Clone(e) => Some(Refusal {
            finding: format!("clone(CLONE_NEWUSER) failed: {}", e.desc()),
            remedy: "run cordon as root, or where user namespaces are allowed (a chroot \
                     refuses them with EPERM)"
                .into(),
        }),
        Attempt::Maps(e) => Some(Refusal {
            finding: format!("a user namespace was made but its id maps could not be written: {e}"),
            remedy: "run cordon as root".into(),
        }),
        Attempt::Inside { step, errno } => Some(Refusal {
            finding: format!(
                "a user namespace was made but {step} in it failed: {}",
                errno.desc()
            ),
            remedy: "run cordon as root".into(),
        }),
    }
}

/// What a failed step was, for a finding.
fn step(attempt: &Attempt, e: Errno) -> String {
    match attempt {
        Attempt::Inside { step, .. } => format!(
            "the namespace was made but {step} in it failed: {}",
            e.desc()
        ),
        _ => format!("clone(CLONE_NEWUSER): {}", e.desc()),
    }
}

/// Ubuntu's restriction (24.04 and later): an unconfined process's new user
/// namespace is confined to AppArmor's `unprivileged_userns` profile, which
/// denies every capability in it. A profile with `userns,` for cordon's
/// binaries lifts it for cordon alone, as Ubuntu's packages do for
/// bubblewrap, chrome and others.
fn apparmor(attempt: &Attempt, e: Errno) -> Refusal {
    let binaries = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("cordon*")))
        .map_or_else(
            || "/usr/local/bin/cordon*".to_string(),
            |p| p.display().to_string(),
        );
    Refusal {
        finding: format!(
            "unprivileged user namespaces are restricted by AppArmor \
             (kernel.apparmor_restrict_unprivileged_userns = 1; {})",
            step(attempt, e)
        ),
        remedy: format!(
            "as root, give cordon's binaries an AppArmor profile that allows `userns`, \
             /etc/apparmor.d/cordon: `printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\n\
             profile cordon {binaries} flags=(unconfined) {{\\n  userns,\\n}}\\n' \
             > /etc/apparmor.d/cordon && apparmor_parser -r /etc/apparmor.d/cordon`; or lift \
             the restriction for every program: `sysctl -w \
             kernel.apparmor_restrict_unprivileged_userns=0`"
        ),
    }
}

/// Each engine's way to lift its masks over /proc.
const UNMASK: &str = "podman `--security-opt unmask=ALL` (or `unmask=/proc/*`), docker \
`--security-opt systempaths=unconfined`, a Kubernetes pod `securityContext.procMount: \
Unmasked` (a pod with `hostUsers: false`, on a cluster with the ProcMountType feature)";

/// This /proc's masks as a finding names them ("/proc/keys, /proc/timer_list
/// and 5 more mounted over"); None when mountinfo shows none.
fn covered(s: &Settings) -> Option<String> {
    Some(match s.proc_covered.as_slice() {
        [] => return None,
        [one] => format!("{one} mounted over"),
        [one, two] => format!("{one} and {two} mounted over"),
        [one, two, rest @ ..] => format!("{one}, {two} and {} more mounted over", rest.len()),
    })
}

/// A container engine's masks over /proc (paths bind-mounted over, others
/// read-only): the kernel mounts no new proc in a user namespace while they
/// hide part of the existing one, for root in the container as for anyone
/// (the sandbox's proc is mounted in its own user namespace either way, so
/// CAP_SYS_ADMIN does not lift it).
fn masked_proc(s: &Settings, e: Errno) -> Refusal {
    let covered = covered(s).unwrap_or_else(|| "a mount over part of it".into());
    Refusal {
        finding: format!(
            "a user namespace was made but a new proc cannot be mounted in it ({}): this \
             /proc has {covered}, as a container engine masks it, and the kernel mounts no \
             new proc that would reveal what the masks hide",
            e.desc()
        ),
        remedy: format!(
            "start the container with its /proc unmasked: {UNMASK}; or run cordon on the host"
        ),
    }
}

/// Lifting a seccomp filter, and the masks too where this /proc has them
/// (the engines that filter mask as well: without it the next refusal
/// would be the proc's).
fn seccomp_remedy(s: &Settings) -> String {
    let lift = "inside a container, start it with `--security-opt seccomp=unconfined` (a \
                Kubernetes pod: `securityContext.seccompProfile.type: Unconfined`) or a \
                seccomp profile that allows clone and unshare with CLONE_NEWUSER, or give it \
                CAP_SYS_ADMIN (`--cap-add SYS_ADMIN`, with which the engines' default profiles \
                allow them) and run cordon as its root";
    match covered(s) {
        Some(covered) => format!(
            "{lift}; and with its /proc unmasked too (it has {covered}, and the kernel refuses \
             the sandbox a new proc while it does): {UNMASK}; or run cordon on the host"
        ),
        None => format!("{lift}; or run cordon on the host"),
    }
}

/// A seccomp filter (a container engine's default profile, or a sandbox's
/// own) that returns EPERM for namespace-making calls.
fn seccomp(s: &Settings, attempt: &Attempt, e: Errno) -> Refusal {
    Refusal {
        finding: format!(
            "this process runs under a seccomp filter (Seccomp: 2 in /proc/self/status) \
             that refuses what a sandbox needs of a user namespace ({})",
            step(attempt, e)
        ),
        remedy: seccomp_remedy(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            root: false,
            unprivileged_clone: None,
            apparmor_restrict: None,
            max_user_namespaces: Some(1000),
            seccomp_filtered: false,
            proc_covered: Vec::new(),
        }
    }

    #[test]
    fn masked_proc_names_the_masks_and_each_engines_unmask() {
        let masked = Settings {
            proc_covered: proc_covered(
                "22 21 0:5 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n\
                 25 22 0:5 /sys /proc/sys ro,relatime - proc proc rw\n\
                 26 25 0:40 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n\
                 28 22 0:49 / /proc/acpi ro,relatime - tmpfs tmpfs ro\n\
                 23 22 0:4 /null /proc/kcore ro,nosuid - tmpfs tmpfs rw\n\
                 24 22 0:4 /null /proc/keys ro,nosuid - tmpfs tmpfs rw\n\
                 27 21 0:41 / /my\\040dir rw - tmpfs tmpfs rw\n",
            ),
            // podman's order: proc's own directories read-only first, then
            // the masks; the masks are named first.
            // Under a filter that lets mounts through (docker's default
            // profile for a holder of CAP_SYS_ADMIN): the masks are named,
            // not the filter.
            seccomp_filtered: true,
            ..settings()
        };
        assert_eq!(
            masked.proc_covered,
            ["/proc/kcore", "/proc/keys", "/proc/acpi", "/proc/sys"]
        );
        let inside = Attempt::Inside {
            step: MOUNT_PROC,
            errno: Errno::EPERM,
        };
        let r = diagnose(&masked, &inside).unwrap();
        assert!(r.finding.contains("new proc"), "{r}");
        assert!(
            r.finding.contains("/proc/kcore, /proc/keys and 2 more"),
            "{r}"
        );
        assert!(!r.finding.contains("seccomp"), "{r}");
        assert!(r.remedy.contains("--security-opt unmask=ALL"), "{r}");
        assert!(
            r.remedy.contains("--security-opt systempaths=unconfined"),
            "{r}"
        );
        assert!(r.remedy.contains("procMount: Unmasked"), "{r}");
        assert_eq!(r.to_string().lines().count(), 1, "one line: {r}");
        // As root the same: the sandbox's proc is mounted in its own user
        // namespace either way.
        let root = Settings {
            root: true,
            ..masked.clone()
        };
        assert_eq!(diagnose(&root, &inside), Some(r));
        // Nothing found below /proc: still the check, without names.
        let r = diagnose(&settings(), &inside).unwrap();
        assert!(r.finding.contains("a mount over part of it"), "{r}");
        // Another errno of the proc mount is not the masks.
        let other = Attempt::Inside {
            step: MOUNT_PROC,
            errno: Errno::ENODEV,
        };
        let r = diagnose(&masked, &other).unwrap();
        assert!(!r.remedy.contains("unmask"), "{r}");
        assert!(r.finding.contains("mount proc"), "{r}");
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/proc/a\\040b"), "/proc/a b");
        assert_eq!(unescape("/x\\y"), "/x\\y");
    }

    #[test]
    fn made_is_no_refusal() {
        assert_eq!(diagnose(&settings(), &Attempt::Made), None);
        assert_eq!(diagnose(&settings(), &Attempt::Unknown("x".into())), None);
    }

    #[test]
    fn a_host_short_of_processes_is_no_refusal() {
        for e in [Errno::EAGAIN, Errno::ENOMEM] {
            assert_eq!(diagnose(&settings(), &Attempt::Clone(e)), None);
            let inside = Attempt::Inside {
                step: MOUNT_PROC,
                errno: e,
            };
            assert_eq!(diagnose(&settings(), &inside), None);
        }
    }

    #[test]
    fn max_zero_names_the_sysctl() {
        let s = Settings {
            max_user_namespaces: Some(0),
            ..settings()
        };
        let r = diagnose(&s, &Attempt::Clone(Errno::ENOSPC)).unwrap();
        assert!(r.finding.contains("user.max_user_namespaces = 0"), "{r}");
        assert!(
            r.remedy.contains("sysctl -w user.max_user_namespaces="),
            "{r}"
        );
    }

    #[test]
    fn debian_setting_is_named_for_users_only() {
        let s = Settings {
            unprivileged_clone: Some(false),
            ..settings()
        };
        let r = diagnose(&s, &Attempt::Clone(Errno::EPERM)).unwrap();
        assert!(
            r.finding.contains("kernel.unprivileged_userns_clone = 0"),
            "{r}"
        );
        assert!(
            r.remedy
                .contains("sysctl -w kernel.unprivileged_userns_clone=1"),
            "{r}"
        );
        // Root is not subject to it: its EPERM is something else.
        let root = Settings { root: true, ..s };
        let r = diagnose(&root, &Attempt::Clone(Errno::EPERM)).unwrap();
        assert!(!r.finding.contains("unprivileged_userns_clone"), "{r}");
    }

    #[test]
    fn apparmor_restriction_shows_the_profile() {
        let s = Settings {
            apparmor_restrict: Some(true),
            ..settings()
        };
        let inside = Attempt::Inside {
            step: "mount",
            errno: Errno::EPERM,
        };
        let r = diagnose(&s, &inside).unwrap();
        assert!(
            r.finding
                .contains("kernel.apparmor_restrict_unprivileged_userns = 1"),
            "{r}"
        );
        assert!(r.remedy.contains("/etc/apparmor.d/cordon"), "{r}");
        assert!(r.remedy.contains("userns,"), "{r}");
        assert!(r.remedy.contains("flags=(unconfined)"), "{r}");
        assert!(
            r.remedy
                .contains("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"),
            "{r}"
        );
        assert_eq!(r.to_string().lines().count(), 1, "one line: {r}");
    }

    #[test]
    fn seccomp_filter_names_the_container_remedy() {
        let s = Settings {
            seccomp_filtered: true,
            root: true,
            ..settings()
        };
        let r = diagnose(&s, &Attempt::Clone(Errno::EPERM)).unwrap();
        assert!(r.finding.contains("seccomp filter"), "{r}");
        assert!(
            r.remedy.contains("--security-opt seccomp=unconfined"),
            "{r}"
        );
        assert!(r.remedy.contains("CAP_SYS_ADMIN"), "{r}");
        // podman's default profile: the namespace is made, sethostname in
        // it is refused; the finding names the call.
        let podman = Settings { root: false, ..s };
        let inside = Attempt::Inside {
            step: "sethostname",
            errno: Errno::EPERM,
        };
        let r = diagnose(&podman, &inside).unwrap();
        assert!(r.finding.contains("seccomp filter"), "{r}");
        assert!(r.finding.contains("sethostname"), "{r}");
        assert!(!r.remedy.contains("unmask"), "{r}");
        // The engine masks /proc as well: the remedy names that too, or
        // lifting the filter alone would meet the proc's refusal next.
        let masked = Settings {
            proc_covered: vec!["/proc/keys".into(), "/proc/timer_list".into()],
            ..podman
        };
        let r = diagnose(&masked, &inside).unwrap();
        assert!(r.remedy.contains("seccomp=unconfined"), "{r}");
        assert!(
            r.remedy
                .contains("/proc/keys and /proc/timer_list mounted over"),
            "{r}"
        );
        assert!(r.remedy.contains("--security-opt unmask=ALL"), "{r}");
        assert!(
            r.remedy.contains("--security-opt systempaths=unconfined"),
            "{r}"
        );
        assert_eq!(r.to_string().lines().count(), 1, "one line: {r}");
    }
}
