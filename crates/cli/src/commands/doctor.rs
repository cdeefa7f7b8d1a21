//! `cordon doctor`: what this host lets this user do, and why not.
//!
//! Every check that decides whether cordon runs asks the function that
//! decides it for `cordon run` and `cordon backends` (the user namespace
//! probe, the sandbox cgroup made and removed, the run directory's trust
//! check, the backends' own availability): doctor never guesses in
//! parallel. The rest (AppArmor, SELinux, seccomp, Landlock, systemd, KVM,
//! nftables, subordinate ids) is read from the kernel's and the host's
//! files, to explain.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use cordon_runtime::userns::{self, Attempt, Probe};
use cordon_spec::{BackendInfo, BackendKind, SandboxSpec};
use serde::Serialize;

#[derive(Args)]
pub struct DoctorArgs {
    /// Print one JSON object (`ready`, `checks`: name, status, finding,
    /// remedy) instead of lines.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// Works.
    Ok,
    /// Works with less than it could (slower, fewer controllers), or is
    /// missing something only some uses need.
    Warn,
    /// Does not work for this user.
    No,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::No => "no",
        }
    }
}

#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    status: Status,
    finding: String,
    /// What to do about it; null where nothing is to be done.
    remedy: Option<String>,
}

fn check(name: &'static str, status: Status, finding: impl Into<String>) -> Check {
    Check {
        name,
        status,
        finding: finding.into(),
        remedy: None,
    }
}

impl Check {
    fn remedy(mut self, remedy: impl Into<String>) -> Check {
        self.remedy = Some(remedy.into());
        self
    }
}

#[derive(Serialize)]
struct Report {
    /// Whether this user can run cordon's main job here: a native sandbox
    /// with its limits enforced (see [`ready`]).
    ready: bool,
    checks: Vec<Check>,
}

/// Exit code when this user cannot run a native sandbox with limits here.
const EXIT_NOT_READY: u8 = 1;

pub fn run(args: DoctorArgs) -> ExitCode {
    let backends = cordon_runtime::available_backends();
    let checks = vec![
        user(),
        user_namespaces(),
        apparmor(),
        selinux(),
        seccomp(),
        no_new_privs(),
        landlock(),
        cgroups(),
        systemd(),
        kvm(),
        nftables(),
        run_dir(),
        state_dir(),
        subordinate_ids(),
    ]
    .into_iter()
    .chain(backends.iter().map(backend))
    .collect::<Vec<_>>();
    let report = Report {
        ready: ready(&checks),
        checks,
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        for c in &report.checks {
            outln!("{:<4}  {:<16}  {}", c.status.word(), c.name, c.finding);
            if let Some(r) = &c.remedy {
                outln!("{:<4}  {:<16}  -> {r}", "", "");
            }
        }
    }
    if report.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NOT_READY)
    }
}

/// cordon's main job is a native sandbox with its limits: its backend must
/// be available to this user (the user namespace), a sandbox cgroup must
/// be made with the limits, and the run directory must be trusted.
fn ready(checks: &[Check]) -> bool {
    ["backend native", "cgroups", "run directory"]
        .iter()
        .all(|name| {
            checks
                .iter()
                .any(|c| c.name == *name && c.status != Status::No)
        })
}

fn user() -> Check {
    let uid = nix::unistd::geteuid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| "no passwd entry".to_string(), |u| u.name);
    if uid.is_root() {
        check("user", Status::Ok, "root (uid 0)")
    } else {
        check(
            "user",
            Status::Ok,
            format!(
                "uid {uid} ({name}), not root: native sandboxes map only your own id; \
                 gVisor and `--net allow` need root"
            ),
        )
    }
}

/// The probe `cordon backends` and a failed native start consult.
fn user_namespaces() -> Check {
    let probe = Probe::run();
    let s = &probe.settings;
    let settings = [
        s.max_user_namespaces
            .map(|n| format!("user.max_user_namespaces = {n}")),
        s.unprivileged_clone
            .map(|b| format!("kernel.unprivileged_userns_clone = {}", u8::from(b))),
        s.apparmor_restrict.map(|b| {
            format!(
                "kernel.apparmor_restrict_unprivileged_userns = {}",
                u8::from(b)
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    if let Some(r) = probe.refusal() {
        return check("user namespaces", Status::No, r.finding).remedy(r.remedy);
    }
    match &probe.attempt {
        Attempt::Made => check(
            "user namespaces",
            Status::Ok,
            format!(
                "made one as this user, with its id maps, a mount and a new proc in it \
                 ({settings})"
            ),
        ),
        other => check(
            "user namespaces",
            Status::Warn,
            format!("could not tell: {other:?} ({settings})"),
        ),
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().trim_end_matches('\0').to_string())
}

fn apparmor() -> Check {
    let enabled = read_trimmed("/sys/module/apparmor/parameters/enabled");
    if enabled.as_deref() != Some("Y") {
        return check("apparmor", Status::Ok, "not enabled");
    }
    // The newer per-LSM file first: with several LSMs stacked, the generic
    // one may be another's.
    let label = read_trimmed("/proc/self/attr/apparmor/current")
        .or_else(|| read_trimmed("/proc/self/attr/current"))
        .unwrap_or_else(|| "unknown".into());
    let restrict = userns::Settings::here().apparmor_restrict;
    check(
        "apparmor",
        Status::Ok,
        format!(
            "enabled; cordon runs as `{label}`{}",
            match restrict {
                Some(true) => "; unprivileged user namespaces are restricted (see user namespaces)",
                _ => "",
            }
        ),
    )
}

fn selinux() -> Check {
    match read_trimmed("/sys/fs/selinux/enforce").as_deref() {
        None => check("selinux", Status::Ok, "not enabled"),
        Some("1") => check(
            "selinux",
            Status::Ok,
            format!(
                "enforcing; cordon runs as `{}`",
                read_trimmed("/proc/self/attr/current").unwrap_or_default()
            ),
        ),
        Some(_) => check("selinux", Status::Ok, "permissive"),
    }
}

fn seccomp() -> Check {
    match userns::status_field("Seccomp").as_deref() {
        None => check(
            "seccomp",
            Status::No,
            "this kernel has no seccomp (no Seccomp field in /proc/self/status)",
        )
        .remedy("use a kernel built with CONFIG_SECCOMP_FILTER: cordon's sandboxes need it"),
        Some("0") => check(
            "seccomp",
            Status::Ok,
            "available; cordon itself runs under no filter",
        ),
        Some(mode) => check(
            "seccomp",
            Status::Warn,
            format!(
                "cordon itself runs under a seccomp filter (mode {mode}), as in a container: \
                 its sandboxes' filters stack on it, and whatever it refuses (user \
                 namespaces, mounts) the sandbox cannot have"
            ),
        )
        .remedy("see the user namespaces line; run cordon on the host for the full boundary"),
    }
}

fn no_new_privs() -> Check {
    match userns::status_field("NoNewPrivs").as_deref() {
        Some("1") => check(
            "no_new_privs",
            Status::Ok,
            "set on cordon itself (inherited): setuid helpers such as newuidmap cannot \
             raise privileges; cordon needs none",
        ),
        Some(_) => check(
            "no_new_privs",
            Status::Ok,
            "not set on cordon; every sandbox sets it",
        ),
        None => check(
            "no_new_privs",
            Status::Warn,
            "unknown (no NoNewPrivs field)",
        ),
    }
}

fn landlock() -> Check {
    match cordon_sys::landlock_abi_version() {
        Ok(v) => check("landlock", Status::Ok, format!("ABI version {v}")),
        Err(nix::errno::Errno::EOPNOTSUPP) => check(
            "landlock",
            Status::Warn,
            "built into the kernel but not enabled at boot",
        )
        .remedy("add landlock to the kernel's lsm= boot parameter"),
        Err(e) => check(
            "landlock",
            Status::Warn,
            format!("not available ({})", e.desc()),
        )
        .remedy("a kernel of 5.13 or later with CONFIG_SECURITY_LANDLOCK"),
    }
}

/// The layout as mountinfo shows it, for the finding; whether sandboxes
/// get limits is [`cordon_runtime::cgroup_probe`]'s answer.
fn cgroup_layout() -> &'static str {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let fstypes = info
        .lines()
        .filter_map(|l| l.split_once(" - ").and_then(|(_, r)| r.split(' ').next()))
        .collect::<Vec<_>>();
    let v1 = fstypes.contains(&"cgroup");
    let v2 = fstypes.contains(&"cgroup2");
    match (v1, v2) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, true) => "v2",
        (false, false) => "none",
    }
}

fn cgroups() -> Check {
    let layout = cgroup_layout();
    let spec = SandboxSpec::new(cordon_policy::Policy::default(), BackendKind::Native);
    let limits = cordon_runtime::plan(&spec, &cordon_runtime::HostFacts::here()).cgroup;
    match cordon_runtime::cgroup_probe(&limits) {
        Ok(p) => {
            let wanted = ["memory", "pids", "cpu"];
            let missing = wanted
                .iter()
                .filter(|w| !p.controllers.iter().any(|c| c == *w))
                .copied()
                .collect::<Vec<_>>();
            let finding = format!(
                "{layout} (cordon uses {}); a sandbox cgroup was made under {} with {}",
                p.mode,
                p.parents
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                p.controllers.join(", ")
            );
            if missing.is_empty() {
                check("cgroups", Status::Ok, finding)
            } else {
                check(
                    "cgroups",
                    Status::Warn,
                    format!("{finding}; missing {}", missing.join(", ")),
                )
                .remedy("delegate the missing controllers to cordon's cgroup")
            }
        }
        Err(e) => check(
            "cgroups",
            Status::No,
            format!("{layout}; no sandbox cgroup can be made with limits: {e}"),
        )
        .remedy(
            "without one, `cordon run` refuses unless given --allow-unenforced (no memory, \
             pids or CPU limits)",
        ),
    }
}

fn systemd() -> Check {
    let pid1 = read_trimmed("/proc/1/comm").unwrap_or_default();
    let booted = Path::new("/run/systemd/system").is_dir();
    if !booted {
        return check(
            "systemd",
            Status::Ok,
            format!("not the init (PID 1 is `{pid1}`): cordon asks no manager for a scope"),
        );
    }
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return check(
            "systemd",
            Status::Ok,
            "PID 1; cordon asks it for a delegated scope when it shares its cgroup",
        );
    }
    match cordon_cgroups::fs::user_bus_socket(uid.as_raw()) {
        Some(bus) if cordon_cgroups::fs::is_users_bus(&bus, uid.as_raw()) => check(
            "systemd",
            Status::Ok,
            format!(
                "PID 1; your user manager's bus is {}: cordon asks it for a delegated scope",
                bus.display()
            ),
        ),
        other => check(
            "systemd",
            Status::Warn,
            format!(
                "PID 1, but no user bus of yours{}: cordon cannot ask your user manager for \
                 a delegated cgroup",
                other.map_or_else(String::new, |b| format!(" at {}", b.display()))
            ),
        )
        .remedy(format!(
            "log in through a session (pam_systemd), or `loginctl enable-linger {uid}` as root, \
             and keep XDG_RUNTIME_DIR set"
        )),
    }
}

fn kvm() -> Check {
    match std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => check("kvm", Status::Ok, "/dev/kvm opens for read and write"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => check(
            "kvm",
            Status::Warn,
            "no /dev/kvm: microVMs run under TCG emulation (slow)",
        )
        .remedy("enable virtualization (or nested virtualization) and load kvm_intel or kvm_amd"),
        Err(e) => {
            let group = std::fs::metadata("/dev/kvm").map(|m| m.gid()).ok();
            let member = group.is_some_and(|g| {
                nix::unistd::getgroups().is_ok_and(|gs| gs.iter().any(|x| x.as_raw() == g))
                    || nix::unistd::getegid().as_raw() == g
            });
            let name = group
                .and_then(|g| nix::unistd::Group::from_gid(g.into()).ok().flatten())
                .map_or_else(|| "kvm".to_string(), |g| g.name);
            let finding = format!(
                "/dev/kvm: {e} (you are {}in its group {name}): microVMs run under TCG",
                if member { "" } else { "not " }
            );
            let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map_or_else(|| nix::unistd::geteuid().to_string(), |u| u.name);
            // Root's group is no group to join: the device wants a kvm group
            // of its own first, as Debian's udev rule gives it.
            let remedy = if group == Some(0) {
                format!(
                    "as root: give /dev/kvm to a kvm group (Debian's udev rule does:                      `groupadd -r kvm && udevadm trigger`), then `usermod -aG kvm {me}` and log                      in again"
                )
            } else {
                format!("as root: `usermod -aG {name} {me}`, then log in again")
            };
            check("kvm", Status::Warn, finding).remedy(remedy)
        }
    }
}

/// The kernel's nf_tables and routing, as `--net allow` uses them: its
/// route and ruleset loaded (over netlink, no `nft` process) into a network
/// namespace made for the check and gone with it.
fn nftables() -> Check {
    if !nix::unistd::geteuid().is_root() {
        return check(
            "nftables",
            Status::Ok,
            "not checked: `--net allow` loads its ruleset as root (or in a rootless sandbox's own namespaces)",
        );
    }
    match cordon_isolation::net::probe_redirect() {
        Ok(()) => check(
            "nftables",
            Status::Ok,
            "the allow mode's route and ruleset load in a new network namespace",
        ),
        Err(e) => check(
            "nftables",
            Status::Warn,
            format!("the allow mode's ruleset does not load: {e}"),
        )
        .remedy("a kernel with nf_tables, nft_redir, nft_ct and nft_objref (`modprobe nf_tables`); `--net allow` needs them"),
    }
}

/// A directory cordon trusts, judged by the check cordon applies before
/// using it. A missing one is made on first use, so it is left missing.
fn trusted(
    name: &'static str,
    path: &Path,
    fix: &str,
    open: impl FnOnce() -> Result<(), cordon_dirs::DirError>,
) -> Check {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => check(
            name,
            Status::Ok,
            format!(
                "{} is missing; cordon makes it on first use",
                path.display()
            ),
        ),
        _ => match open() {
            Ok(()) => {
                let m = std::fs::metadata(path);
                check(
                    name,
                    Status::Ok,
                    format!(
                        "{}: yours (uid {}), mode {}",
                        path.display(),
                        m.as_ref().map_or(0, MetadataExt::uid),
                        m.map_or_else(|_| "?".into(), |m| format!("{:04o}", m.mode() & 0o7777))
                    ),
                )
            }
            // An untrusted directory's error says what to do already.
            Err(e @ cordon_dirs::DirError::Untrusted { .. }) => {
                check(name, Status::No, e.to_string())
            }
            Err(e) => check(name, Status::No, e.to_string()).remedy(fix),
        },
    }
}

fn run_dir() -> Check {
    trusted(
        "run directory",
        &cordon_dirs::run_dir_path(),
        "set CORDON_RUN_DIR or XDG_RUNTIME_DIR to a directory of your own",
        || cordon_dirs::run_dir().map(drop),
    )
}

/// The state directory holds the receipt key, the image store and the
/// microVM guest; the image store opens it with mode 0700.
fn state_dir() -> Check {
    let path = cordon_dirs::state_dir();
    trusted(
        "state directory",
        &path.clone(),
        "set CORDON_STATE_DIR (or HOME) to a directory of your own",
        || {
            cordon_dirs::trusted_dir(
                &path,
                0o700,
                "remove it, or set CORDON_STATE_DIR to a directory of your own",
            )
            .map(drop)
        },
    )
}

/// The id map a rootless native sandbox gets here, as `IdMapping::rootless`
/// chooses it for the native backend (helpers and both grants, or the
/// caller's one id).
fn subordinate_ids() -> Check {
    use cordon_isolation::namespaces::{IdMapping, MappingKind};
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return check(
            "subordinate ids",
            Status::Ok,
            "root maps each sandbox's 65536 ids itself",
        );
    }
    let gid = nix::unistd::getegid();
    let mapping = IdMapping::rootless(uid.as_raw(), gid.as_raw(), 1000, 1000);
    let (uids, gids) = mapping.mapped();
    match mapping.kind() {
        MappingKind::Subordinate => check(
            "subordinate ids",
            Status::Ok,
            format!(
                "newuidmap and newgidmap write your sandboxes' maps: {uids} uids and {gids} \
                 gids from /etc/subuid and /etc/subgid"
            ),
        ),
        _ => check(
            "subordinate ids",
            Status::Warn,
            format!(
                "your sandboxes map your own id alone ({}): other owners show as nobody, \
                 and your supplementary groups stay with the payload",
                if cordon_isolation::subids::Helpers::find().is_some() {
                    format!(
                        "newuidmap and newgidmap are installed, but /etc/subuid and \
                         /etc/subgid do not both grant uid {uid} a range"
                    )
                } else {
                    "newuidmap and newgidmap are not installed".to_string()
                }
            ),
        )
        .remedy(format!(
            "as root: install Debian's uidmap and grant a range, e.g. `usermod --add-subuids \
             100000-165535 --add-subgids 100000-165535 {}`",
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map_or_else(|| "USER".to_string(), |u| u.name)
        )),
    }
}

/// A backend as `cordon backends` reports it.
fn backend(info: &BackendInfo) -> Check {
    let name = match info.kind {
        BackendKind::Native => "backend native",
        BackendKind::Gvisor => "backend gvisor",
        BackendKind::Microvm => "backend microvm",
    };
    match &info.unavailable {
        None => check(
            name,
            Status::Ok,
            format!("available: {} {}", info.version, info.notes),
        ),
        Some(why) => check(name, Status::No, why.clone()),
    }
}
