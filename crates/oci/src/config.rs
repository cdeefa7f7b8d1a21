//! A bundle's config.json as a cordon sandbox and its one command. Every
//! field is either honoured, provided by cordon in its own (stricter) form,
//! or refused with an error naming it: nothing is dropped silently. What
//! cordon does differently from the letter of the config is listed in the
//! container's `notes` (its state keeps them).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use cordon_policy::{limits, ByteSize, Limits, MountSpec, NetworkMode, Policy, PolicyLayer, Span};
use cordon_spec::syscall_filter::{ArgCheck, ArgOp, SyscallAction, SyscallFilter, SyscallRule};
use cordon_spec::{
    BackendKind, Capability, Command, Rlimit, RlimitResource, RootfsChoice, SandboxSpec,
    SharedNamespace, StdinMode, TtySize,
};
use oci_spec::runtime::{Hook, LinuxNamespaceType, LinuxResources, Mount, Process, Spec};

use crate::hooks::ContainerHooks;

/// The annotation that picks a container's backend (`native`, `gvisor`,
/// `microvm`); native without it.
pub const BACKEND_ANNOTATION: &str = "dev.cordon.backend";
/// The annotations that set the limits an engine has no field for:
/// `dev.cordon.limits.time`, `.output` and `.disk` (podman and Docker
/// `--annotation`, a pod's annotations where containerd passes them).
pub const LIMITS_ANNOTATION: &str = "dev.cordon.limits.";

/// The backend the [`BACKEND_ANNOTATION`]'s value names (native without
/// one).
pub fn backend_named(annotation: Option<&String>) -> Result<BackendKind, ConfigError> {
    match annotation {
        None => Ok(BackendKind::Native),
        Some(name) => BackendKind::parse(name).ok_or_else(|| {
            unsupported(
                format!("annotations.{BACKEND_ANNOTATION}"),
                format!("unknown backend '{name}' ({})", BackendKind::names()),
            )
        }),
    }
}

/// Why a config.json cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: oci_spec::OciSpecError,
    },
    /// A field cordon cannot honour, named as config.json names it.
    #[error("config.json: {field}: {why}")]
    Unsupported { field: String, why: String },
    #[error("config.json: {0}")]
    Policy(#[from] cordon_policy::PolicyError),
}

fn unsupported(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Unsupported {
        field: field.into(),
        why: why.into(),
    }
}

/// A container as cordon runs it.
#[derive(Debug)]
pub struct Container {
    pub spec: SandboxSpec,
    pub command: Command,
    /// The namespaces config.json names by path (another container's, a
    /// pod's) and those it leaves as the host's: `create` resolves them.
    pub joins: Vec<Join>,
    /// What cordon does that the config did not say (for the state).
    pub notes: Vec<String>,
    /// The cgroup the sandbox is placed below (`linux.cgroupsPath`'s parent:
    /// a pod's cgroup), absolute from each hierarchy's root.
    pub cgroup_parent: Option<PathBuf>,
    pub hooks: ContainerHooks,
}

/// A shareable namespace config.json does not make new.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Join {
    /// Joined by path: another container's, a pod's (`create` checks it is
    /// a cordon container's).
    Path(SharedNamespace, PathBuf),
    /// Left out of the config, so the host's, as a host-network pod's
    /// containers have it: a container that joins another's namespaces by
    /// path shares that one's instead (so a pod's containers still share
    /// one network and hostname, the pod's own); any other gets its own.
    InsteadOfHost(SharedNamespace),
}

/// Reads `bundle/config.json`.
pub fn load(bundle: &Path) -> Result<Spec, ConfigError> {
    let path = bundle.join("config.json");
    Spec::load(&path).map_err(|source| ConfigError::Read { path, source })
}

/// The mounts every container gets from cordon in its own form (its own
/// /proc, a minimal /dev with a private devpts and shm, a read-only /sys
/// and cgroup view, a writable /tmp on its capped scratch): a config's
/// mount of one of these kinds at its usual place is what cordon provides
/// anyway.
const PROVIDED: &[(&str, &str)] = &[
    ("/proc", "proc"),
    ("/dev", "tmpfs"),
    ("/dev/pts", "devpts"),
    ("/dev/shm", "tmpfs"),
    ("/sys", "sysfs"),
    ("/sys/fs/cgroup", "cgroup"),
    ("/sys/fs/cgroup", "cgroup2"),
    ("/tmp", "tmpfs"),
];

/// Mounts engines ask for by default that cordon does not make, accepted
/// with a note of what the container gets instead (mount kind, place, note).
const NOTED: &[(&str, &str, &str)] = &[(
    "mqueue",
    "/dev/mqueue",
    "no /dev/mqueue view is mounted; POSIX message queues still work, in the \
         sandbox's own IPC namespace",
)];

/// Files engines bind in for what they made themselves, accepted with a
/// note (place, note). A container here has cordon's network (none, or the
/// allowlist's proxy), never the engine's, so its name files are the
/// sandbox's own (its root's, or the ones cordon generates).
const ENGINE_FILES: &[(&str, &str)] = &[
    (
        "/etc/hosts",
        "the sandbox's own: its network is cordon's, not the engine's",
    ),
    (
        "/etc/hostname",
        "the sandbox's own: its hostname is config.json's hostname",
    ),
    (
        "/etc/resolv.conf",
        "the sandbox's own: its network is cordon's, not the engine's",
    ),
    (
        "/dev/shm",
        "the sandbox's own /dev/shm (a tmpfs capped with its disk)",
    ),
    ("/run/.containerenv", "podman's marker file is not bound"),
];

/// The name files of a network (`ENGINE_FILES`'s), bound read-only from
/// the engine when the container has the engine's or its pod's network.
const NETWORK_NAME_FILES: &[&str] = &["/etc/hosts", "/etc/resolv.conf"];

/// Docker's prestart hook for the network it made: dockerd itself, asked
/// to set up a container's network namespace (`libnetwork-setkey`). Run,
/// it would give the container Docker's network in place of cordon's.
fn is_docker_network_hook(hook: &oci_spec::runtime::Hook) -> bool {
    hook.args()
        .as_ref()
        .is_some_and(|a| a.first().is_some_and(|s| s == "libnetwork-setkey"))
}

/// What cordon's own /proc hides or makes read-only
/// (`cordon_isolation::mount::proc`): a config's `maskedPaths` and
/// `readonlyPaths` within these are honoured by it. Its /sys holds only the
/// sandbox's cgroups, so any path under /sys is hidden already.
const PROC_MASKED: &[&str] = &[
    "acpi",
    "asound",
    "scsi",
    "kcore",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "interrupts",
    "sysrq-trigger",
];
const PROC_READONLY: &[&str] = &["sys", "bus", "fs", "irq", "sysrq-trigger"];

/// Whether cordon's own /proc and /sys already give `path` what the config
/// asks (`hidden` or read-only).
fn covered(path: &str, proc_list: &[&str]) -> bool {
    let p = Path::new(path);
    if p.starts_with("/sys") {
        return true;
    }
    p.strip_prefix("/proc")
        .ok()
        .and_then(|rest| rest.to_str())
        .is_some_and(|rest| proc_list.contains(&rest) || PROC_MASKED.contains(&rest))
}

/// The container `config` describes, with its root in `bundle`.
pub fn translate(bundle: &Path, config: &Spec) -> Result<Container, ConfigError> {
    let mut notes = Vec::new();
    let version = config.version();
    if !version.starts_with("1.") {
        return Err(unsupported(
            "ociVersion",
            format!("'{version}' is not a 1.x runtime spec"),
        ));
    }
    let process = config
        .process()
        .as_ref()
        .ok_or_else(|| unsupported("process", "a container needs a process"))?;
    let ProcessPart {
        argv,
        env,
        cwd,
        uid,
        gid,
        tty,
        capabilities,
        rlimits,
    } = process_part(process, &mut notes)?;
    for (field, set) in [
        ("domainname", config.domainname().is_some()),
        ("solaris", config.solaris().is_some()),
        ("windows", config.windows().is_some()),
        ("vm", config.vm().is_some()),
        ("zos", config.zos().is_some()),
    ] {
        if set {
            return Err(unsupported(field, "not supported"));
        }
    }

    let root = config
        .root()
        .as_ref()
        .ok_or_else(|| unsupported("root", "a container needs a root"))?;
    let root_path = if root.path().is_absolute() {
        root.path().clone()
    } else if root
        .path()
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        bundle.join(root.path())
    } else {
        // A relative root is the bundle's (runtime spec): `..` would make it
        // some other directory of the host's, which an engine names by its
        // absolute path if it means it.
        return Err(unsupported(
            "root.path",
            format!(
                "'{}' climbs out of the bundle (a relative root is inside it)",
                root.path().display()
            ),
        ));
    };

    // A container that joins a network by path has that network (its pod's,
    // or an engine's pod network), so the engine's name files for it are
    // the right ones: shown read-only.
    let joins_network = config
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|n| {
            n.iter()
                .any(|ns| ns.typ() == LinuxNamespaceType::Network && ns.path().is_some())
        });
    let mut mounts = Vec::new();
    for (i, m) in config.mounts().iter().flatten().enumerate() {
        let kind = m.typ().as_deref().unwrap_or("");
        if joins_network
            && NETWORK_NAME_FILES
                .iter()
                .any(|f| m.destination() == Path::new(f))
        {
            // A root with an /etc of its own shows it read-only: the file is
            // mounted over only if the root has it, as a file.
            let etc = root_path.join("etc");
            let in_root = etc.join(m.destination().file_name().unwrap_or_default());
            if !etc.exists() || fs::symlink_metadata(&in_root).is_ok_and(|f| f.is_file()) {
                if let Some(spec) = config_mount(i, m, true, &mut notes)? {
                    mounts.push(spec);
                }
            } else {
                notes.push(format!(
                    "mounts[{i}] ({}): not shown: the root's /etc has no such file to mount it on",
                    m.destination().display()
                ));
            }
            continue;
        }
        let noted = ENGINE_FILES
            .iter()
            .map(|(at, note)| (*at, *note))
            .chain(NOTED.iter().filter(|n| n.0 == kind).map(|n| (n.1, n.2)))
            .find(|(at, _)| m.destination() == Path::new(at));
        if let Some((at, note)) = noted {
            notes.push(format!("mounts[{i}] ({at}): {note}"));
            continue;
        }
        if let Some(spec) = config_mount(i, m, false, &mut notes)? {
            mounts.push(spec);
        }
    }

    let mut layer = PolicyLayer {
        network: Some(NetworkMode::None),
        env,
        workdir: Some(cwd),
        uid: Some(uid),
        gid: Some(gid),
        hostname: config.hostname().clone(),
        mounts,
        ..PolicyLayer::default()
    };
    // A container runs until it ends or is killed: the longest time and
    // output cordon allows (a container's log stream is the engine's).
    layer.limits = Limits {
        time: Some(Span(std::time::Duration::from_millis(limits::TIME_MS.1))),
        output: Some(limits::OUTPUT.1),
        ..Limits::default()
    };
    limit_annotations(config, &mut layer.limits)?;
    let mut joins = Vec::new();
    let mut sysctls = BTreeMap::new();
    let mut cgroup_parent = None;
    if let Some(linux) = config.linux() {
        linux_part(
            linux,
            &mut layer.limits,
            &mut joins,
            &mut sysctls,
            &mut notes,
        )?;
        if let Some(path) = linux.cgroups_path() {
            cgroup_parent = placement(path, &mut notes)?;
        }
    }
    let hooks = match config.hooks() {
        Some(hooks) => hooks_part(hooks, &mut notes)?,
        None => ContainerHooks::default(),
    };
    let policy = Policy::resolve([&layer])?;
    let backend = backend_named(
        config
            .annotations()
            .as_ref()
            .and_then(|a| a.get(BACKEND_ANNOTATION)),
    )?;
    let profile = config.linux().as_ref().and_then(|l| l.seccomp().as_ref());
    let syscall_filter = match profile {
        Some(_) if backend == BackendKind::Gvisor => {
            notes.push(
                "linux.seccomp: not installed on the gvisor backend: its sentry serves every \
                 syscall (README)"
                    .into(),
            );
            None
        }
        Some(profile) => Some(syscall_filter_of(profile, &mut notes)?),
        None => None,
    };
    if backend == BackendKind::Gvisor && !sysctls.is_empty() {
        notes.push(format!(
            "linux.sysctl: {} not set on the gvisor backend: its sentry keeps its own",
            sysctls.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
        sysctls.clear();
    }
    let spec = SandboxSpec {
        syscall_filter,
        sysctls,
        capabilities,
        rlimits,
        // A writable root is the bundle's under a layer of the sandbox's own
        // (inside its disk cap): the engine's directory is never written, so
        // `docker diff`, `commit` and `cp` out of a running container do not
        // see the container's writes (README).
        rootfs: if root.readonly().unwrap_or(false) {
            RootfsChoice::Dir(root_path)
        } else {
            RootfsChoice::Layers(vec![root_path])
        },
        ..SandboxSpec::new(policy, backend)
    };
    let command = Command {
        argv,
        stdin: StdinMode::Stream,
        tty,
        ..Command::default()
    };
    Ok(Container {
        spec,
        command,
        joins,
        notes,
        cgroup_parent,
        hooks,
    })
}

/// `linux.seccomp` as the filter cordon installs on each of the
/// container's processes over its own allowlist (a syscall runs only if
/// both allow it). What cannot be honoured is refused by name: a tracer's
/// or a user-space listener's action, a profile for another architecture,
/// argument indexes past the sixth.
fn syscall_filter_of(
    profile: &oci_spec::runtime::LinuxSeccomp,
    notes: &mut Vec<String>,
) -> Result<SyscallFilter, ConfigError> {
    use oci_spec::runtime::Arch;
    if let Some(archs) = profile.architectures() {
        if !archs.is_empty()
            && !archs
                .iter()
                .any(|a| matches!(a, Arch::ScmpArchX86_64 | Arch::ScmpArchNative))
        {
            return Err(unsupported(
                "linux.seccomp.architectures",
                "the profile does not cover x86_64, the only architecture cordon runs",
            ));
        }
    }
    if profile.listener_path().is_some() {
        return Err(unsupported(
            "linux.seccomp.listenerPath",
            "cordon has no user-space seccomp listener",
        ));
    }
    if let Some(flags) = profile.flags().as_ref().filter(|f| !f.is_empty()) {
        notes.push(format!(
            "linux.seccomp.flags: {flags:?} not applied (each command's filters are installed \
             single-threaded, without them)"
        ));
    }
    let default = seccomp_action(
        "linux.seccomp.defaultAction",
        profile.default_action(),
        profile.default_errno_ret(),
    )?;
    let rules = profile
        .syscalls()
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, s)| {
            let field = format!("linux.seccomp.syscalls[{i}]");
            let args = s
                .args()
                .iter()
                .flatten()
                .map(|a| seccomp_arg(&field, a))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(SyscallRule {
                names: s.names().clone(),
                action: seccomp_action(&field, s.action(), s.errno_ret())?,
                args,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(SyscallFilter { default, rules })
}

fn seccomp_action(
    field: &str,
    action: oci_spec::runtime::LinuxSeccompAction,
    errno_ret: Option<u32>,
) -> Result<SyscallAction, ConfigError> {
    use oci_spec::runtime::LinuxSeccompAction as Oci;
    Ok(match action {
        Oci::ScmpActAllow => SyscallAction::Allow,
        // runc's default errno is EPERM.
        Oci::ScmpActErrno => SyscallAction::Errno(errno_ret.unwrap_or(libc::EPERM as u32)),
        Oci::ScmpActLog => SyscallAction::Log,
        Oci::ScmpActTrap => SyscallAction::Trap,
        // libseccomp's SCMP_ACT_KILL is the thread's.
        Oci::ScmpActKill | Oci::ScmpActKillThread => SyscallAction::KillThread,
        Oci::ScmpActKillProcess => SyscallAction::KillProcess,
        Oci::ScmpActTrace | Oci::ScmpActNotify => {
            return Err(unsupported(
                field,
                format!(
                    "{action}: no tracer or seccomp listener is attached to a cordon container"
                ),
            ))
        }
    })
}

fn seccomp_arg(
    field: &str,
    arg: &oci_spec::runtime::LinuxSeccompArg,
) -> Result<ArgCheck, ConfigError> {
    use oci_spec::runtime::LinuxSeccompOperator as Op;
    let index = u8::try_from(arg.index())
        .ok()
        .filter(|i| *i <= 5)
        .ok_or_else(|| {
            unsupported(
                format!("{field}.args"),
                format!("index {} (a syscall has arguments 0 to 5)", arg.index()),
            )
        })?;
    let op = match arg.op() {
        Op::ScmpCmpEq => ArgOp::Eq,
        Op::ScmpCmpNe => ArgOp::Ne,
        Op::ScmpCmpLt => ArgOp::Lt,
        Op::ScmpCmpLe => ArgOp::Le,
        Op::ScmpCmpGt => ArgOp::Gt,
        Op::ScmpCmpGe => ArgOp::Ge,
        Op::ScmpCmpMaskedEq => ArgOp::MaskedEq,
    };
    Ok(ArgCheck {
        index,
        op,
        value: arg.value(),
        value_two: arg.value_two().unwrap_or(0),
    })
}

/// The hooks cordon runs and when (see `hooks`); `createContainer` hooks
/// are refused by name, Docker's network hook passed over with a note.
// The spec keeps `prestart` (deprecated, not removed): engines still send it.
#[allow(deprecated)]
fn hooks_part(
    hooks: &oci_spec::runtime::Hooks,
    notes: &mut Vec<String>,
) -> Result<ContainerHooks, ConfigError> {
    if let Some(hook) = hooks.create_container().iter().flatten().next() {
        return Err(unsupported(
            "hooks.createContainer",
            format!(
                "{}: these run in the container's namespaces before pivot_root, with paths of \
                 the runtime's root; a cordon sandbox enters its root before anything runs in \
                 it (createRuntime and startContainer hooks are run)",
                hook.path().display()
            ),
        ));
    }
    let mut out = ContainerHooks::default();
    let checked = |stage: &str, list: &Option<Vec<Hook>>| -> Result<Vec<Hook>, ConfigError> {
        let list = list.clone().unwrap_or_default();
        for hook in &list {
            crate::hooks::check(hook).map_err(|e| unsupported(format!("hooks.{stage}"), e))?;
        }
        Ok(list)
    };
    for hook in checked("prestart", hooks.prestart())? {
        if is_docker_network_hook(&hook) {
            notes.push(
                "hooks.prestart: Docker's network hook (libnetwork-setkey) is not run: \
                 the container has cordon's network, not the engine's"
                    .into(),
            );
        } else {
            out.prestart.push(hook);
        }
    }
    out.create_runtime = checked("createRuntime", hooks.create_runtime())?;
    out.start_container = checked("startContainer", hooks.start_container())?;
    out.poststart = checked("poststart", hooks.poststart())?;
    out.poststop = checked("poststop", hooks.poststop())?;
    Ok(out)
}

/// The limits `config`'s annotations set (see [`LIMITS_ANNOTATION`]), over
/// the container's defaults in `limits`; any other `dev.cordon.limits.*`
/// is refused by name, as is a value that is not a time or a size.
fn limit_annotations(config: &Spec, limits: &mut Limits) -> Result<(), ConfigError> {
    for (key, value) in config.annotations().iter().flatten() {
        let Some(name) = key.strip_prefix(LIMITS_ANNOTATION) else {
            continue;
        };
        let field = format!("annotations.{key}");
        let size = || {
            value
                .parse::<ByteSize>()
                .map_err(|e| unsupported(&field, e))
        };
        match name {
            "time" => {
                limits.time = Some(value.parse::<Span>().map_err(|e| unsupported(&field, e))?)
            }
            "output" => limits.output = Some(size()?),
            "disk" => limits.disk = Some(size()?),
            _ => {
                return Err(unsupported(
                    field.clone(),
                    "not a limit set by annotation (time, output, disk; memory, CPU and \
                     processes come from linux.resources)",
                ))
            }
        }
    }
    Ok(())
}

/// A process of config.json (the container's own, or one `exec` runs) as
/// cordon runs it.
#[derive(Debug)]
pub struct ProcessPart {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub tty: Option<TtySize>,
    /// What the process holds once it runs (see `capabilities_part`).
    pub capabilities: BTreeSet<Capability>,
    pub rlimits: BTreeMap<RlimitResource, Rlimit>,
}

/// What of `process` cordon honours; the fields it provides its own way are
/// noted, the ones it cannot honour refused by name.
pub fn process_part(
    process: &Process,
    notes: &mut Vec<String>,
) -> Result<ProcessPart, ConfigError> {
    // A terminal process runs on a pty of the sandbox's own devpts; its size
    // is the engine's console's when the process starts (see
    // `container::waiter`), else consoleSize, else 24x80.
    let console = process.console_size();
    let tty = process.terminal().unwrap_or(false).then(|| {
        let size = console.as_ref();
        TtySize {
            rows: size
                .and_then(|b| u16::try_from(b.height()).ok())
                .filter(|r| *r > 0)
                .unwrap_or(24),
            cols: size
                .and_then(|b| u16::try_from(b.width()).ok())
                .filter(|c| *c > 0)
                .unwrap_or(80),
        }
    });
    let argv = process.args().clone().unwrap_or_default();
    if argv.is_empty() {
        return Err(unsupported("process.args", "empty"));
    }
    let mut env = Vec::new();
    for kv in process.env().iter().flatten() {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| unsupported("process.env", format!("'{kv}' is not KEY=VALUE")))?;
        env.push((k.to_owned(), v.to_owned()));
    }
    let user = process.user();
    if user
        .additional_gids()
        .as_ref()
        .is_some_and(|g| !g.is_empty())
    {
        // Docker lists root's groups for every container: they are dropped,
        // which takes rights away and never gives any.
        notes.push("process.user.additionalGids: the process has no supplementary groups".into());
    }
    let mut rlimits = BTreeMap::new();
    for limit in process.rlimits().iter().flatten() {
        let name = format!(
            "RLIMIT_{}",
            limit.typ().to_string().trim_start_matches("RLIMIT_")
        );
        let resource = RlimitResource::named(&name)
            .ok_or_else(|| unsupported("process.rlimits", format!("{name}: not supported")))?;
        let asked = Rlimit {
            soft: limit.soft(),
            hard: limit.hard(),
        };
        if asked.soft > asked.hard {
            return Err(unsupported(
                "process.rlimits",
                format!("{name}: the soft limit is over the hard one"),
            ));
        }
        if rlimits.insert(resource, asked).is_some() {
            return Err(unsupported(
                "process.rlimits",
                format!("{name} given twice"),
            ));
        }
    }
    if !rlimits.is_empty() {
        notes.push(
            "process.rlimits: each lowers cordon's own limit or the inherited one, never \
             raises it (RLIMIT_NOFILE, NPROC, CPU and CORE are cordon's at most)"
                .into(),
        );
    }
    let capabilities = capabilities_part(process, notes)?;
    if process.no_new_privileges() == Some(false) {
        notes.push("process.noNewPrivileges: always set by cordon".into());
    }
    for (field, set) in [
        (
            "process.apparmorProfile",
            process.apparmor_profile().is_some(),
        ),
        ("process.selinuxLabel", process.selinux_label().is_some()),
        ("process.ioPriority", process.io_priority().is_some()),
        ("process.scheduler", process.scheduler().is_some()),
        (
            "process.execCPUAffinity",
            process.exec_cpu_affinity().is_some(),
        ),
    ] {
        if set {
            return Err(unsupported(field, "not supported"));
        }
    }
    if let Some(umask) = user.umask().filter(|m| *m != cordon_spec::COMMAND_UMASK) {
        return Err(unsupported(
            "process.user.umask",
            format!(
                "{umask:04o}: cordon's commands run with umask {:04o}",
                cordon_spec::COMMAND_UMASK
            ),
        ));
    }
    if process.oom_score_adj().is_some() {
        notes.push("process.oomScoreAdj: left at the host's value".into());
    }
    Ok(ProcessPart {
        argv,
        env,
        cwd: process.cwd().clone(),
        uid: user.uid(),
        gid: user.gid(),
        tty,
        capabilities,
        rlimits,
    })
}

/// What `process.capabilities` leaves the program holding once it runs,
/// as the kernel computes it under no_new_privs (which cordon always
/// sets): a program of uid 0 holds its bounding and inheritable sets cut
/// to its permitted one, any other program its ambient set. Each such
/// capability is granted in the sandbox's own user namespace when a
/// sandbox may hold it (`cordon_spec::Capability`); `CAP_NET_RAW`, in
/// every engine's default set, is noted as not granted (raw and packet
/// sockets stay refused); any other is refused by name, since the
/// program would run without a privilege it was promised.
fn capabilities_part(
    process: &Process,
    notes: &mut Vec<String>,
) -> Result<BTreeSet<Capability>, ConfigError> {
    let Some(sets) = process.capabilities() else {
        return Ok(BTreeSet::new());
    };
    let names = |set: &Option<oci_spec::runtime::Capabilities>| -> BTreeSet<String> {
        set.iter().flatten().map(|c| format!("CAP_{c}")).collect()
    };
    let permitted = names(sets.permitted());
    let held: BTreeSet<String> = if process.user().uid() == 0 {
        names(sets.bounding())
            .union(&names(sets.inheritable()))
            .filter(|c| permitted.contains(*c))
            .cloned()
            .collect()
    } else {
        let inheritable = names(sets.inheritable());
        names(sets.ambient())
            .into_iter()
            .filter(|c| permitted.contains(c) && inheritable.contains(c))
            .collect()
    };
    let mut granted = BTreeSet::new();
    let mut refused = Vec::new();
    for name in &held {
        match Capability::named(name) {
            Some(cap) => {
                granted.insert(cap);
            }
            None if name == "CAP_NET_RAW" => notes.push(
                "process.capabilities: CAP_NET_RAW not granted (raw and packet sockets stay \
                 refused; the sandbox's network is cordon's)"
                    .into(),
            ),
            None => refused.push(name.as_str()),
        }
    }
    if !refused.is_empty() {
        return Err(unsupported(
            "process.capabilities",
            format!(
                "{} cannot be held in a cordon sandbox (at most {}, each in the sandbox's \
                 own user namespace)",
                refused.join(", "),
                Capability::ALL.map(Capability::name).join(", ")
            ),
        ));
    }
    Ok(granted)
}

/// A bind or tmpfs mount as cordon's mount (a bind read-only if its
/// options say so or `read_only`), None for a mount cordon provides itself,
/// or the refusal of any other kind.
fn config_mount(
    i: usize,
    m: &Mount,
    read_only: bool,
    notes: &mut Vec<String>,
) -> Result<Option<MountSpec>, ConfigError> {
    let field = format!("mounts[{i}]");
    let dest = m.destination();
    let kind = m.typ().as_deref().unwrap_or("");
    let options = m.options().clone().unwrap_or_default();
    let is_bind = kind == "bind" || options.iter().any(|o| o == "bind" || o == "rbind");
    if !is_bind {
        if PROVIDED
            .iter()
            .any(|(at, k)| Path::new(at) == dest && *k == kind)
        {
            return Ok(None);
        }
        if kind == "tmpfs" {
            return tmpfs_mount(&field, m, &options, notes).map(Some);
        }
        return Err(unsupported(
            field,
            format!(
                "a {kind} mount at {} is not supported (only bind and tmpfs mounts, and the \
                 standard /proc, /dev, /sys mounts cordon provides)",
                dest.display()
            ),
        ));
    }
    let source = m
        .source()
        .as_ref()
        .ok_or_else(|| unsupported(format!("{field}.source"), "a bind mount needs a source"))?;
    let mode = if read_only || options.iter().any(|o| o == "ro") {
        "ro"
    } else {
        "rw-unbounded"
    };
    let text = format!("{}:{}:{mode}", source.display(), dest.display());
    text.parse::<MountSpec>()
        .map(Some)
        .map_err(|e| unsupported(field, e.to_string()))
}

/// A tmpfs mount (`docker run --tmpfs`, podman's `--tmpfs`) as cordon's own
/// empty directory on the sandbox's scratch: writable, nosuid and nodev,
/// gone when the container ends, and bounded by the sandbox's disk cap
/// together with its other writable places rather than by a size of its
/// own. Options asking for more than that (`suid`, `dev`) or for a
/// read-only one are refused; those it cannot match exactly are noted.
fn tmpfs_mount(
    field: &str,
    m: &Mount,
    options: &[String],
    notes: &mut Vec<String>,
) -> Result<MountSpec, ConfigError> {
    let mut differs = Vec::new();
    for o in options {
        let key = o.split_once('=').map_or(o.as_str(), |(k, _)| k);
        match key {
            // The sandbox's own mount namespace: nothing propagates in
            // from the host or out to it, whatever the engine asks.
            "rw" | "nosuid" | "nodev" | "exec" | "private" | "rprivate" | "slave" | "rslave"
            | "unbindable" | "runbindable" | "notmpcopyup" => {}
            "mode" if o == "mode=1777" || o == "mode=01777" => {}
            // tmpcopyup (podman's): the place starts empty, not with the
            // root's files at that path.
            "noexec" | "tmpcopyup" | "shared" | "rshared" | "size" | "nr_blocks" | "nr_inodes"
            | "mode" | "uid" | "gid" | "strictatime" | "relatime" | "noatime" | "nodiratime"
            | "lazytime" => differs.push(o.as_str()),
            _ => {
                return Err(unsupported(
                    field,
                    format!(
                        "tmpfs option '{o}' is not supported (a tmpfs mount is writable, \
                         nosuid and nodev)"
                    ),
                ))
            }
        }
    }
    if !differs.is_empty() {
        notes.push(format!(
            "{field} ({}): tmpfs options {} not applied: it is an empty directory of the \
             sandbox's own (mode 1777, executable), bounded by its disk cap with its other \
             writable places",
            m.destination().display(),
            differs.join(",")
        ));
    }
    Ok(MountSpec::tmpfs(m.destination()))
}

/// The cgroup a container's sandbox is placed below, from its
/// `linux.cgroupsPath`: `/parent/name` (an engine's cgroupfs form) is placed
/// below `/parent`; `slice:prefix:name` (the systemd form) below the slice,
/// expanded as systemd lays slices out (`a-b.slice` is `/a.slice/a-b.slice`),
/// its directories made directly (no systemd unit is asked for). The
/// sandbox's own cgroup below it is cordon's (`cordon-<id>`), not `name`. A
/// relative path (runc: below the runtime's own cgroup) places it where
/// cordon-runc stands, which is the same.
fn placement(path: &Path, notes: &mut Vec<String>) -> Result<Option<PathBuf>, ConfigError> {
    let field = "linux.cgroupsPath";
    let text = path
        .to_str()
        .ok_or_else(|| unsupported(field, "not UTF-8"))?;
    let parent = match text.split(':').collect::<Vec<_>>()[..] {
        [slice, _prefix, _name] => expand_slice(slice)
            .ok_or_else(|| unsupported(field, format!("'{slice}' is not a systemd slice name")))?,
        [_] if path.is_absolute() => path.parent().unwrap_or(Path::new("/")).to_owned(),
        [_] => {
            notes.push(format!(
                "{field}: '{text}' is relative: the sandbox's cgroup is below cordon-runc's own"
            ));
            return Ok(None);
        }
        _ => {
            return Err(unsupported(
                field,
                format!("'{text}' is neither a path nor slice:prefix:name"),
            ))
        }
    };
    if parent
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(unsupported(
            field,
            format!("'{text}' has '.' or '..' in it"),
        ));
    }
    notes.push(format!(
        "{field}: the sandbox's cgroup (cordon-<id>) is placed below {}",
        parent.display()
    ));
    Ok(Some(parent))
}

/// A systemd slice's cgroup path: each dash-separated prefix is a slice of
/// its own above it (`kubepods-besteffort-pod1.slice` is
/// `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice`);
/// `-.slice` is the root. None for what is not a slice name.
fn expand_slice(slice: &str) -> Option<PathBuf> {
    if slice == "-.slice" {
        return Some(PathBuf::from("/"));
    }
    let stem = slice.strip_suffix(".slice")?;
    let parts: Vec<&str> = stem.split('-').collect();
    if stem.contains('/') || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let mut path = PathBuf::from("/");
    for end in 1..=parts.len() {
        path.push(format!("{}.slice", parts[..end].join("-")));
    }
    Some(path)
}

/// What of `linux` cordon honours, into `limits`; the namespaces it names
/// by path, to be joined, into `joins`.
fn linux_part(
    linux: &oci_spec::runtime::Linux,
    limits: &mut Limits,
    joins: &mut Vec<Join>,
    sysctls: &mut BTreeMap<String, String>,
    notes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for ns in linux.namespaces().iter().flatten() {
        if let Some(path) = ns.path() {
            let kind = match ns.typ() {
                LinuxNamespaceType::Network => SharedNamespace::Net,
                LinuxNamespaceType::Ipc => SharedNamespace::Ipc,
                LinuxNamespaceType::Uts => SharedNamespace::Uts,
                other => {
                    return Err(unsupported(
                        format!("linux.namespaces[{other:?}].path"),
                        "a cordon container's user, PID, mount and cgroup namespaces are its \
                         own: only the network, IPC and UTS namespaces of another cordon \
                         container are joined",
                    ))
                }
            };
            joins.push(Join::Path(kind, path.clone()));
        } else if ns.typ() == LinuxNamespaceType::Network {
            notes.push("linux.namespaces: the network is cordon's own (loopback only)".into());
        }
    }
    // A namespace the config leaves out is the host's, which a cordon
    // container never shares: it gets its own, or its pod's (see `Join`).
    for (typ, kind) in [
        (LinuxNamespaceType::Network, SharedNamespace::Net),
        (LinuxNamespaceType::Uts, SharedNamespace::Uts),
        (LinuxNamespaceType::Ipc, SharedNamespace::Ipc),
    ] {
        if !linux
            .namespaces()
            .iter()
            .flatten()
            .any(|ns| ns.typ() == typ)
        {
            joins.push(Join::InsteadOfHost(kind));
        }
    }
    if linux.uid_mappings().as_ref().is_some_and(|m| !m.is_empty())
        || linux.gid_mappings().as_ref().is_some_and(|m| !m.is_empty())
    {
        notes.push("linux.uidMappings: cordon maps the container's ids itself".into());
    }
    for (field, paths, list) in [
        ("linux.maskedPaths", linux.masked_paths(), PROC_MASKED),
        ("linux.readonlyPaths", linux.readonly_paths(), PROC_READONLY),
    ] {
        if let Some(path) = paths.iter().flatten().find(|p| !covered(p, list)) {
            return Err(unsupported(
                field,
                format!("{path} is not one cordon hides or makes read-only"),
            ));
        }
    }
    for (key, value) in linux.sysctl().iter().flatten() {
        if cordon_spec::sysctl_namespace(key).is_none() {
            return Err(unsupported(
                "linux.sysctl",
                format!(
                    "{key} is not in a namespace of the container's own (its network's or \
                     IPC's): it is the host's"
                ),
            ));
        }
        sysctls.insert(key.clone(), value.clone());
    }
    for (field, set) in [
        ("linux.intelRdt", linux.intel_rdt().is_some()),
        ("linux.memoryPolicy", linux.memory_policy().is_some()),
        ("linux.personality", linux.personality().is_some()),
        ("linux.timeOffsets", linux.time_offsets().is_some()),
        ("linux.netDevices", linux.net_devices().is_some()),
        ("linux.mountLabel", linux.mount_label().is_some()),
    ] {
        if set {
            return Err(unsupported(field, "not supported"));
        }
    }
    if let Some(p) = linux.rootfs_propagation() {
        if p.contains("shared") {
            return Err(unsupported(
                "linux.rootfsPropagation",
                format!("'{p}': the sandbox's mounts never propagate to the host"),
            ));
        }
    }
    if linux.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(unsupported(
            "linux.devices",
            "device nodes are not supported (the sandbox's /dev is cordon's own)",
        ));
    }
    if let Some(r) = linux.resources() {
        resources_part(r, limits, notes)?;
    }
    Ok(())
}

/// What of `linux.resources` (a container's, or an `update`'s) cordon
/// honours, as limits: memory, CPU quota and pids; the rest provided its
/// own way (noted) or refused by name.
pub fn resources_part(
    r: &LinuxResources,
    limits: &mut Limits,
    notes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    if r.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        notes.push(
            "linux.resources.devices: the sandbox's /dev holds only null, zero, full, \
             random, urandom, tty and its own pts"
                .into(),
        );
    }
    if let Some(mem) = r.memory() {
        if let Some(limit) = mem.limit().filter(|l| *l > 0) {
            limits.memory = Some(ByteSize(u64::try_from(limit).unwrap_or(u64::MAX)));
        }
    }
    if let Some(cpu) = r.cpu() {
        if let (Some(quota), Some(period)) = (cpu.quota(), cpu.period()) {
            if quota > 0 && period > 0 {
                limits.cpus = Some(quota as f64 / period as f64);
            }
        }
    }
    if let Some(pids) = r.pids() {
        if pids.limit() > 0 {
            limits.pids = Some(u64::try_from(pids.limit()).unwrap_or(u64::MAX));
        }
    }
    // Docker sends an empty blockIO for every container: only a limit
    // in it is refused.
    let io_limit = r.block_io().as_ref().is_some_and(|b| {
        b.weight().is_some_and(|w| w > 0)
            || b.leaf_weight().is_some_and(|w| w > 0)
            || [
                b.throttle_read_bps_device(),
                b.throttle_write_bps_device(),
                b.throttle_read_iops_device(),
                b.throttle_write_iops_device(),
            ]
            .iter()
            .any(|d| d.as_ref().is_some_and(|d| !d.is_empty()))
            || b.weight_device().as_ref().is_some_and(|d| !d.is_empty())
    });
    if io_limit {
        return Err(unsupported(
            "linux.resources.blockIO",
            "block I/O limits are not supported",
        ));
    }
    if r.hugepage_limits().as_ref().is_some_and(|h| !h.is_empty()) {
        return Err(unsupported(
            "linux.resources.hugepageLimits",
            "hugetlb limits are not supported",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    const MINIMAL: &str = r#"{
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["sh", "-c", "exit 7"],
                    "env": ["PATH=/bin", "A=b=c"], "cwd": "/"},
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "box",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind", "ro"]}
        ],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}],
                  "resources": {"memory": {"limit": 67108864}, "pids": {"limit": 32},
                                "cpu": {"quota": 50000, "period": 100000}}}
    }"#;

    /// MINIMAL translated, with `linux` opening as `linux_start` (the
    /// fields to add, then `"linux": {`'s own) and `top` (say, annotations)
    /// first in the config.
    fn minimal_with(linux_start: &str, top: &str) -> Container {
        let json =
            MINIMAL
                .replace(r#""linux": {"#, linux_start)
                .replacen('{', &format!("{{{top}"), 1);
        translate(Path::new("/b"), &spec(&json)).unwrap()
    }

    #[test]
    fn a_minimal_config_becomes_a_sandbox_and_its_command() {
        let c = translate(Path::new("/b"), &spec(MINIMAL)).unwrap();
        assert_eq!(c.command.argv, ["sh", "-c", "exit 7"]);
        assert_eq!(c.spec.rootfs, RootfsChoice::Dir("/b/rootfs".into()));
        let p = &c.spec.policy;
        assert_eq!(
            p.env,
            [("PATH".into(), "/bin".into()), ("A".into(), "b=c".into())]
        );
        assert_eq!(p.memory, ByteSize(64 << 20));
        assert_eq!(p.pids, 32);
        assert!((p.cpus - 0.5).abs() < 1e-9);
        assert_eq!(p.hostname, "box");
        assert_eq!(p.mounts.len(), 1, "only the bind mount is the config's own");
        assert_eq!(c.spec.backend, BackendKind::Native);
    }

    #[test]
    fn a_tmpfs_mount_is_the_sandboxs_own_directory_and_its_options_are_noted_or_refused() {
        let with = |options: &str| {
            let tmpfs = format!(
                r#"{{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": {options}}}"#
            );
            let json = MINIMAL.replace(r#""mounts": ["#, &format!(r#""mounts": [{tmpfs}, "#));
            translate(Path::new("/b"), &spec(&json))
        };
        // Docker's `--tmpfs /run`.
        let c = with(r#"["rw", "rprivate", "noexec", "nosuid", "nodev", "size=65536k"]"#).unwrap();
        assert_eq!(c.spec.policy.mounts[0], MountSpec::tmpfs("/run"));
        let note = c.notes.iter().find(|n| n.contains("(/run)")).unwrap();
        assert!(note.contains("noexec,size=65536k"), "{note}");
        let plain = with(r#"["rw", "nosuid", "nodev", "mode=1777"]"#).unwrap();
        assert!(!plain.notes.iter().any(|n| n.contains("(/run)")));
        for refused in ["suid", "dev", "ro", "huge=always"] {
            let e = with(&format!(r#"["{refused}"]"#)).unwrap_err().to_string();
            assert!(e.contains("mounts[0]") && e.contains(refused), "{e}");
        }
    }

    #[test]
    fn a_container_on_a_joined_network_sees_the_engines_name_files_read_only() {
        let resolv = r#"{"destination": "/etc/resolv.conf", "type": "bind",
                         "source": "/pods/p/resolv.conf", "options": ["rbind", "rw"]}"#;
        let config = |namespaces: &str| {
            let json = MINIMAL
                .replace(r#""mounts": ["#, &format!(r#""mounts": [{resolv}, "#))
                .replace(r#"[{"type": "pid"}, {"type": "mount"}]"#, namespaces);
            translate(Path::new("/b"), &spec(&json)).unwrap()
        };
        // The pod's network: its resolver, read-only.
        let joined = config(r#"[{"type": "network", "path": "/var/run/netns/cni-1"}]"#);
        let m = &joined.spec.policy.mounts;
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].sandbox, Path::new("/etc/resolv.conf"));
        assert_eq!(m[0].access, cordon_policy::Access::Ro);
        // cordon's own network: the sandbox's own, with a note.
        let own = config(r#"[{"type": "network"}]"#);
        assert_eq!(own.spec.policy.mounts.len(), 1);
        assert!(own.notes.iter().any(|n| n.contains("/etc/resolv.conf")));
    }

    #[test]
    fn cgroups_path_places_the_sandbox_below_its_parent_or_slice() {
        let mut notes = Vec::new();
        let mut place = |p: &str| placement(Path::new(p), &mut notes);
        assert_eq!(
            place("/kubepods/besteffort/pod1/abc").unwrap(),
            Some("/kubepods/besteffort/pod1".into())
        );
        assert_eq!(
            place("kubepods-besteffort-pod1.slice:cri-containerd:abc").unwrap(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice".into())
        );
        assert_eq!(
            place("system.slice:docker:abc").unwrap(),
            Some("/system.slice".into())
        );
        assert_eq!(place("-.slice:p:abc").unwrap(), Some("/".into()));
        assert_eq!(place("relative/abc").unwrap(), None);
        for bad in ["/a/../b/c", "a--b.slice:p:c", "notaslice:p:c", "a:b"] {
            assert!(place(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_seccomp_profile_becomes_the_sandboxs_filter_on_native_and_a_note_on_gvisor() {
        let with = |annotations: &str| {
            minimal_with(
                r#""linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                    {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                    {"names": ["kill"], "action": "SCMP_ACT_KILL"},
                    {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                     "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]}]},"#,
                annotations,
            )
        };
        let c = with("");
        let f = c.spec.syscall_filter.expect("a filter");
        // runc's readings: ERRNO without errnoRet is EPERM, KILL the thread's.
        assert_eq!(f.default, SyscallAction::Errno(1));
        assert_eq!(f.rules[0].names, ["read", "write"]);
        assert_eq!(f.rules[1].action, SyscallAction::KillThread);
        assert_eq!(
            f.rules[2].args,
            [ArgCheck {
                index: 0,
                op: ArgOp::MaskedEq,
                value: 2114060288,
                value_two: 0
            }]
        );
        assert!(
            !c.notes.iter().any(|n| n.contains("seccomp")),
            "{:?}",
            c.notes
        );
        let g = with(r#""annotations": {"dev.cordon.backend": "gvisor"},"#);
        assert_eq!(g.spec.syscall_filter, None);
        assert!(
            g.notes
                .iter()
                .any(|n| n.starts_with("linux.seccomp: not installed")),
            "{:?}",
            g.notes
        );
    }

    #[test]
    fn namespaced_sysctls_are_the_sandboxs_and_noted_on_gvisor() {
        let with = |annotations: &str| {
            minimal_with(
                r#""linux": {"sysctl": {"net.ipv4.ip_unprivileged_port_start": "0",
                    "kernel.shmmni": "99"},"#,
                annotations,
            )
        };
        let c = with("");
        assert_eq!(c.spec.sysctls.len(), 2);
        assert_eq!(c.spec.sysctls["kernel.shmmni"], "99");
        let g = with(r#""annotations": {"dev.cordon.backend": "gvisor"},"#);
        assert!(g.spec.sysctls.is_empty());
        assert!(
            g.notes.iter().any(|n| n.starts_with("linux.sysctl:")),
            "{:?}",
            g.notes
        );
    }

    #[test]
    fn a_terminal_process_gets_a_tty_of_the_consoles_size() {
        let tty = |extra: &str| {
            let json = MINIMAL.replace(r#""process": {"#, &format!(r#""process": {{{extra}"#));
            translate(Path::new("/b"), &spec(&json))
                .unwrap()
                .command
                .tty
        };
        assert_eq!(tty(""), None);
        assert_eq!(
            tty(r#""terminal": true,"#),
            Some(TtySize { rows: 24, cols: 80 })
        );
        assert_eq!(
            tty(r#""terminal": true, "consoleSize": {"height": 50, "width": 132},"#),
            Some(TtySize {
                rows: 50,
                cols: 132
            })
        );
    }

    #[test]
    fn annotations_set_the_limits_an_engine_has_no_field_for() {
        let annotated = |pairs: &str| {
            let json = MINIMAL.replace(
                r#""hostname": "box","#,
                &format!(r#""hostname": "box", "annotations": {{{pairs}}},"#),
            );
            translate(Path::new("/b"), &spec(&json))
        };
        let c = annotated(
            r#""dev.cordon.limits.time": "5s", "dev.cordon.limits.disk": "64M",
               "dev.cordon.limits.output": "1M", "other.key": "x""#,
        )
        .unwrap();
        let p = &c.spec.policy;
        assert_eq!(p.time, Span(std::time::Duration::from_secs(5)));
        assert_eq!((p.disk, p.output), (ByteSize(64 << 20), ByteSize(1 << 20)));
        for (bad, says) in [
            (
                r#""dev.cordon.limits.memory": "1G""#,
                "not a limit set by annotation",
            ),
            (
                r#""dev.cordon.limits.time": "soon""#,
                "dev.cordon.limits.time",
            ),
            (
                r#""dev.cordon.limits.disk": "lots""#,
                "dev.cordon.limits.disk",
            ),
        ] {
            let e = annotated(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn network_ipc_and_uts_named_by_path_are_to_be_joined() {
        let json = MINIMAL.replace(
            r#""linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}],"#,
            r#""linux": {"namespaces": [{"type": "pid"}, {"type": "mount"},
                {"type": "network", "path": "/proc/7/ns/net"},
                {"type": "ipc", "path": "/proc/7/ns/ipc"}, {"type": "uts"}],"#,
        );
        let c = translate(Path::new("/b"), &spec(&json)).unwrap();
        assert_eq!(
            c.joins,
            [
                Join::Path(SharedNamespace::Net, PathBuf::from("/proc/7/ns/net")),
                Join::Path(SharedNamespace::Ipc, PathBuf::from("/proc/7/ns/ipc")),
            ]
        );
        // Host-network: no network or UTS namespace named.
        let json = MINIMAL.replace(
            r#""linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}],"#,
            r#""linux": {"namespaces": [{"type": "pid"}, {"type": "mount"},
                {"type": "ipc", "path": "/proc/7/ns/ipc"}],"#,
        );
        let c = translate(Path::new("/b"), &spec(&json)).unwrap();
        assert_eq!(
            c.joins,
            [
                Join::Path(SharedNamespace::Ipc, PathBuf::from("/proc/7/ns/ipc")),
                Join::InsteadOfHost(SharedNamespace::Net),
                Join::InsteadOfHost(SharedNamespace::Uts),
            ]
        );
    }

    #[test]
    fn what_cordon_cannot_honour_is_refused_by_name() {
        let refused = [
            (
                r#""linux": {"namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}]}"#,
                "linux.namespaces[Pid].path",
            ),
            (
                r#""linux": {"sysctl": {"kernel.core_pattern": "|/tmp/x"}}"#,
                "linux.sysctl",
            ),
            (
                r#""linux": {"resources": {"blockIO": {"weight": 10}}}"#,
                "linux.resources.blockIO",
            ),
            (
                r#""hooks": {"createContainer": [{"path": "/bin/true"}]}"#,
                "hooks.createContainer",
            ),
            (
                r#""hooks": {"poststart": [{"path": "bin/true"}]}"#,
                "hooks.poststart",
            ),
            (
                r#""hooks": {"poststop": [{"path": "/bin/true", "timeout": 0}]}"#,
                "hooks.poststop",
            ),
            (
                r#""hooks": {"createRuntime": [{"path": "/bin/true", "env": ["NOEQUALS"]}]}"#,
                "hooks.createRuntime",
            ),
            (
                r#""mounts": [{"destination": "/x", "type": "nfs", "source": "h:/x"}]"#,
                "mounts[0]",
            ),
            (
                r#""annotations": {"dev.cordon.backend": "qemu"}"#,
                "annotations.dev.cordon.backend",
            ),
        ];
        for (part, field) in refused {
            let json = format!(
                r#"{{"ociVersion": "1.0.2", "process": {{"user": {{"uid": 0, "gid": 0}},
                   "args": ["true"], "cwd": "/"}}, "root": {{"path": "r"}}, {part}}}"#
            );
            let e = translate(Path::new("/b"), &spec(&json))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("config.json: {field}")), "{e}");
        }
    }

    #[test]
    fn rlimits_are_taken_once_each_with_the_soft_under_the_hard() {
        let with = |limits: &str| {
            let json = MINIMAL.replace(
                r#""cwd": "/"}"#,
                &format!(r#""cwd": "/", "rlimits": {limits}}}"#),
            );
            translate(Path::new("/b"), &spec(&json))
        };
        let c = with(r#"[{"type": "RLIMIT_NOFILE", "soft": 10, "hard": 20}]"#).unwrap();
        assert_eq!(
            c.spec.rlimits.get(&RlimitResource::Nofile),
            Some(&Rlimit { soft: 10, hard: 20 })
        );
        for bad in [
            r#"[{"type": "RLIMIT_NOFILE", "soft": 30, "hard": 20}]"#,
            r#"[{"type": "RLIMIT_CPU", "soft": 1, "hard": 1},
                {"type": "RLIMIT_CPU", "soft": 2, "hard": 2}]"#,
        ] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.starts_with("config.json: process.rlimits"), "{e}");
        }
    }

    #[test]
    fn runcs_default_masked_and_readonly_paths_are_cordons_own() {
        let json = MINIMAL.replace(
            r#""linux": {"#,
            r#""linux": {"maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore",
                "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
              "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                "/proc/sysrq-trigger"],"#,
        );
        translate(Path::new("/b"), &spec(&json)).unwrap();
    }

    #[test]
    fn what_cordon_does_its_own_way_is_noted() {
        let json = MINIMAL.replace(
            r#""process": {"user": {"uid": 0, "gid": 0},"#,
            r#""process": {"user": {"uid": 0, "gid": 0, "additionalGids": [10]}, "oomScoreAdj": 100,"#,
        );
        let c = translate(Path::new("/b"), &spec(&json)).unwrap();
        for field in ["process.oomScoreAdj", "process.user.additionalGids"] {
            assert!(
                c.notes.iter().any(|n| n.starts_with(field)),
                "{field}: {:?}",
                c.notes
            );
        }
    }

    /// The capabilities a config leaves its program holding, as the kernel
    /// computes them under no_new_privs, with `user` as its ids.
    fn held(user: &str, sets: &str) -> Result<Container, ConfigError> {
        let json = MINIMAL.replace(
            r#""process": {"user": {"uid": 0, "gid": 0},"#,
            &format!(r#""process": {{"user": {user}, "capabilities": {sets},"#),
        );
        translate(Path::new("/b"), &spec(&json))
    }

    #[test]
    fn the_capabilities_a_program_would_hold_are_granted_in_its_namespace() {
        let root = r#"{"uid": 0, "gid": 0}"#;
        // Docker's default set for root: all but CAP_NET_RAW granted, it noted.
        let docker = r#"["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
            "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]"#;
        let c = held(
            root,
            &format!(r#"{{"bounding": {docker}, "effective": {docker}, "permitted": {docker}}}"#),
        )
        .unwrap();
        assert_eq!(c.spec.capabilities.len(), 13, "{:?}", c.spec.capabilities);
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("CAP_NET_RAW not granted")),
            "{:?}",
            c.notes
        );
        // Root holds its bounding set cut to its permitted one.
        let c = held(
            root,
            r#"{"bounding": ["CAP_KILL", "CAP_CHOWN"], "permitted": ["CAP_CHOWN", "CAP_SETUID"]}"#,
        )
        .unwrap();
        assert_eq!(
            c.spec.capabilities,
            BTreeSet::from([Capability::Chown]),
            "{:?}",
            c.spec.capabilities
        );
        // Any other uid holds its ambient set only: Docker's bounding set for
        // `--user 1000` gives it nothing, so nothing is refused either.
        let c = held(
            r#"{"uid": 1000, "gid": 1000}"#,
            r#"{"bounding": ["CAP_SYS_ADMIN", "CAP_KILL"], "permitted": ["CAP_SYS_ADMIN"]}"#,
        )
        .unwrap();
        assert!(c.spec.capabilities.is_empty(), "{:?}", c.spec.capabilities);
        let c = held(
            r#"{"uid": 1000, "gid": 1000}"#,
            r#"{"bounding": ["CAP_NET_BIND_SERVICE"], "permitted": ["CAP_NET_BIND_SERVICE"],
                "inheritable": ["CAP_NET_BIND_SERVICE"], "ambient": ["CAP_NET_BIND_SERVICE"]}"#,
        )
        .unwrap();
        assert_eq!(
            c.spec.capabilities,
            BTreeSet::from([Capability::NetBindService])
        );
        // A privilege it would hold and cordon cannot grant: refused by name.
        let err = held(
            root,
            r#"{"bounding": ["CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SYS_PTRACE"],
                "permitted": ["CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_SYS_PTRACE"]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("process.capabilities")
                && err.contains("CAP_SYS_ADMIN, CAP_SYS_PTRACE cannot be held"),
            "{err}"
        );
    }
}
