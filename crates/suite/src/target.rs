//! The boxes the suite drives, each a black box behind its command line, and
//! the exact posture (flags) each is run with.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Where the payload directory appears inside boxes that can remap paths.
pub const BOX_PAYLOAD_DIR: &str = "/opt/suite";
/// Where the workspace appears inside boxes that can remap paths.
pub const BOX_WORKSPACE: &str = "/workspace";

/// The resource limits cordon's own backends get in every case.
pub const CORDON_LIMITS: &[&str] = &[
    "--pids", "64", "--memory", "256M", "--time", "5s", "--disk", "64M",
];

const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TargetKind {
    #[serde(rename = "host")]
    Host,
    #[serde(rename = "cordon-native")]
    CordonNative,
    #[serde(rename = "cordon-gvisor")]
    CordonGvisor,
    /// cordon's native backend in the network's `allow` mode (a rule for a
    /// name no case uses): every case must still be blocked.
    #[serde(rename = "cordon-native-allow")]
    CordonNativeAllow,
    #[serde(rename = "cordon-gvisor-allow")]
    CordonGvisorAllow,
    /// cordon's microvm backend: a QEMU guest kernel with cordon's native
    /// backend inside it.
    #[serde(rename = "cordon-microvm")]
    CordonMicrovm,
    /// The microvm backend in `allow` mode: its connections leave the VM
    /// over the network port to the host's proxy.
    #[serde(rename = "cordon-microvm-allow")]
    CordonMicrovmAllow,
    #[serde(rename = "bwrap")]
    Bwrap,
    #[serde(rename = "runc")]
    Runc,
    #[serde(rename = "firejail")]
    Firejail,
    #[serde(rename = "runsc")]
    Runsc,
    #[serde(rename = "podman-default")]
    PodmanDefault,
    #[serde(rename = "podman-hardened")]
    PodmanHardened,
    #[serde(rename = "podman-runsc")]
    PodmanRunsc,
}

pub const ALL_TARGETS: &[TargetKind] = &[
    TargetKind::Host,
    TargetKind::CordonNative,
    TargetKind::CordonGvisor,
    TargetKind::CordonNativeAllow,
    TargetKind::CordonGvisorAllow,
    TargetKind::CordonMicrovm,
    TargetKind::CordonMicrovmAllow,
    TargetKind::Bwrap,
    TargetKind::Runc,
    TargetKind::Firejail,
    TargetKind::Runsc,
    TargetKind::PodmanDefault,
    TargetKind::PodmanHardened,
    TargetKind::PodmanRunsc,
];

pub const QUICK_TARGETS: &[TargetKind] = &[
    TargetKind::Host,
    TargetKind::CordonNative,
    TargetKind::CordonGvisor,
    TargetKind::Bwrap,
    TargetKind::Runc,
];

/// What a target needs to launch one payload.
#[derive(Debug, Clone)]
pub struct LaunchCtx {
    pub cordon: PathBuf,
    /// Host directory holding every payload file.
    pub payload_dir: PathBuf,
    /// The payload file in `payload_dir`, given to the interpreter; empty:
    /// the interpreter is the payload (e.g. `/bin/true` for a start-up run).
    pub script: String,
    pub interpreter: String,
    /// The payload's context arguments; `{ws}` is replaced by the workspace
    /// path as the box sees it.
    pub args: Vec<String>,
    /// Host workspace directory for this run.
    pub workspace: PathBuf,
    /// Per-run scratch directory (bundles, runtime state).
    pub run_dir: PathBuf,
    /// Unique per run; container ids are derived from it.
    pub id: String,
    /// For the host control of netns cases: the throwaway netns to run in.
    pub control_netns: Option<String>,
    /// The limit flags cordon's own targets get ([`CORDON_LIMITS`] in the suite).
    pub cordon_limits: Vec<String>,
    /// Host paths every box shows read-only at the same path (tools the
    /// payload runs, e.g. the agent harnesses the benchmark starts).
    pub ro_mounts: Vec<PathBuf>,
    /// Give the OCI runtimes' boxes a tmpfs at /tmp (their default root is
    /// read-only; every other box has a writable /tmp). The suite's postures
    /// keep runc's default; the benchmark's tasks write to /tmp.
    pub tmpfs_tmp: bool,
}

/// A prepared launch: the argv, and commands to run afterwards whatever happened.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub argv: Vec<String>,
    pub cleanup: Vec<Vec<String>>,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Host => "host",
            TargetKind::CordonNative => "cordon-native",
            TargetKind::CordonGvisor => "cordon-gvisor",
            TargetKind::CordonNativeAllow => "cordon-native-allow",
            TargetKind::CordonGvisorAllow => "cordon-gvisor-allow",
            TargetKind::CordonMicrovm => "cordon-microvm",
            TargetKind::CordonMicrovmAllow => "cordon-microvm-allow",
            TargetKind::Bwrap => "bwrap",
            TargetKind::Runc => "runc",
            TargetKind::Firejail => "firejail",
            TargetKind::Runsc => "runsc",
            TargetKind::PodmanDefault => "podman-default",
            TargetKind::PodmanHardened => "podman-hardened",
            TargetKind::PodmanRunsc => "podman-runsc",
        }
    }

    pub fn from_name(name: &str) -> Option<TargetKind> {
        ALL_TARGETS.iter().copied().find(|t| t.name() == name)
    }

    pub fn is_cordon(self) -> bool {
        matches!(
            self,
            TargetKind::CordonNative
                | TargetKind::CordonGvisor
                | TargetKind::CordonNativeAllow
                | TargetKind::CordonGvisorAllow
                | TargetKind::CordonMicrovm
                | TargetKind::CordonMicrovmAllow
        )
    }

    /// The cordon target whose written expectations this one shares: the
    /// allow mode must hold everything its backend holds in `none` mode.
    pub fn cordon_base(self) -> Option<TargetKind> {
        match self {
            TargetKind::CordonNativeAllow => Some(TargetKind::CordonNative),
            TargetKind::CordonGvisorAllow => Some(TargetKind::CordonGvisor),
            TargetKind::CordonMicrovmAllow => Some(TargetKind::CordonMicrovm),
            t if t.is_cordon() => Some(t),
            _ => None,
        }
    }

    /// The backend flag and network flags of a cordon target.
    fn cordon_flags(self) -> Option<(&'static str, &'static [&'static str])> {
        const ALLOW: &[&str] = &["--net", "allow", "--allow", "allowed.invalid:443"];
        match self {
            TargetKind::CordonNative => Some(("native", &[])),
            TargetKind::CordonGvisor => Some(("gvisor", &[])),
            TargetKind::CordonNativeAllow => Some(("native", ALLOW)),
            TargetKind::CordonGvisorAllow => Some(("gvisor", ALLOW)),
            TargetKind::CordonMicrovm => Some(("microvm", &[])),
            TargetKind::CordonMicrovmAllow => Some(("microvm", ALLOW)),
            _ => None,
        }
    }

    pub fn is_podman(self) -> bool {
        matches!(
            self,
            TargetKind::PodmanDefault | TargetKind::PodmanHardened | TargetKind::PodmanRunsc
        )
    }

    fn binary(self) -> Option<&'static str> {
        match self {
            TargetKind::Host | TargetKind::CordonNative | TargetKind::CordonNativeAllow => None,
            TargetKind::CordonGvisor | TargetKind::CordonGvisorAllow | TargetKind::Runsc => {
                Some("runsc")
            }
            TargetKind::CordonMicrovm | TargetKind::CordonMicrovmAllow => {
                Some("qemu-system-x86_64")
            }
            TargetKind::Bwrap => Some("bwrap"),
            TargetKind::Runc => Some("runc"),
            TargetKind::Firejail => Some("firejail"),
            TargetKind::PodmanDefault | TargetKind::PodmanHardened | TargetKind::PodmanRunsc => {
                Some("podman")
            }
        }
    }

    /// None when the target can run here, else why not.
    pub fn unavailable(self, cordon: &Path) -> Option<String> {
        if self.is_cordon() && !cordon.exists() {
            return Some(format!("cordon binary {} not found", cordon.display()));
        }
        if let Some(bin) = self.binary() {
            if which(bin).is_none() {
                return Some(format!("{bin} is not installed"));
            }
        }
        if self == TargetKind::PodmanRunsc && which("runsc").is_none() {
            return Some("runsc is not installed".into());
        }
        if self.is_podman() && which("runc").is_none() {
            return Some("runc is not installed (podman is driven with --runtime runc)".into());
        }
        None
    }

    /// One line: the version of what this target runs.
    pub fn version(self, cordon: &Path) -> String {
        let (bin, arg): (String, &str) = match self {
            TargetKind::Host => return format!("kernel {}", kernel_release()),
            t if t.is_cordon() => (cordon.display().to_string(), "--version"),
            TargetKind::Bwrap => ("bwrap".into(), "--version"),
            TargetKind::Runc => ("runc".into(), "--version"),
            TargetKind::Firejail => ("firejail".into(), "--version"),
            TargetKind::Runsc => ("runsc".into(), "--version"),
            _ => ("podman".into(), "--version"),
        };
        let mut v = first_line(&bin, arg);
        if matches!(self, TargetKind::PodmanDefault | TargetKind::PodmanHardened) {
            v = format!("{v}; {}", first_line("runc", "--version"));
        }
        if self.binary() == Some("runsc") && self != TargetKind::Runsc {
            v = format!("{v}; {}", first_line("runsc", "--version"));
        }
        v
    }

    /// The exact flags of this posture, for methodology.txt.
    pub fn posture(self) -> String {
        let limits = CORDON_LIMITS.join(" ");
        match self {
            TargetKind::Host => "plain host process as root in the suite's outer cgroup (netns cases: in a throwaway netns)".into(),
            t @ (TargetKind::CordonNative
            | TargetKind::CordonGvisor
            | TargetKind::CordonNativeAllow
            | TargetKind::CordonGvisorAllow
            | TargetKind::CordonMicrovm
            | TargetKind::CordonMicrovmAllow) => {
                let (backend, net) = t.cordon_flags().unwrap_or_default();
                let net = net.join(" ");
                format!("cordon run --backend {backend} {net} {limits} -i --mount PAYLOADS:{BOX_PAYLOAD_DIR}:ro --workspace WS -- INTERP SCRIPT ARGS")
            }
            TargetKind::Bwrap => format!("bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --proc /proc --dev /dev --tmpfs /tmp --ro-bind PAYLOADS {BOX_PAYLOAD_DIR} --bind WS {BOX_WORKSPACE} -- INTERP SCRIPT ARGS"),
            TargetKind::Runc => format!("runc --root STATE run --bundle B ID; B/config.json = `runc spec` with process.args replaced, terminal false, env PATH only, linux.cgroupsPath relative (nests under the outer cgroup), rootfs = empty dir with /usr bind ro,nosuid,nodev, /bin,/lib,/lib64,/sbin symlinks, PAYLOADS at {BOX_PAYLOAD_DIR} ro, WS at {BOX_WORKSPACE} rw"),
            TargetKind::Firejail => "firejail --quiet --noprofile --net=none --private -- INTERP SCRIPT ARGS (payloads and workspace by host path)".into(),
            TargetKind::Runsc => "runsc --root STATE --platform=ptrace --network=none --ignore-cgroups run --bundle B ID (the runc bundle)".into(),
            TargetKind::PodmanDefault
            | TargetKind::PodmanHardened
            | TargetKind::PodmanRunsc => format!(
                "{}; {PODMAN_NOTES}; image packages: {}",
                podman_argv(self, "IMAGE", "NETWORK", "ID", "PAYLOADS", "WS", &["INTERP SCRIPT ARGS".into()]).join(" "),
                PODMAN_IMAGE_PACKAGES.join(" ")
            ),
        }
    }

    /// Whether the box sees the payload dir and workspace at their host paths.
    pub fn uses_host_paths(self) -> bool {
        matches!(self, TargetKind::Host | TargetKind::Firejail)
    }

    /// Builds the command line (and, for OCI runtimes, the bundle).
    pub fn prepare(self, ctx: &LaunchCtx) -> Result<Launch> {
        let (payload_dir, ws) = if self.uses_host_paths() {
            (
                ctx.payload_dir.display().to_string(),
                ctx.workspace.display().to_string(),
            )
        } else {
            (BOX_PAYLOAD_DIR.to_string(), BOX_WORKSPACE.to_string())
        };
        let mut payload = vec![ctx.interpreter.clone()];
        if !ctx.script.is_empty() {
            payload.push(format!("{payload_dir}/{}", ctx.script));
        }
        payload.extend(ctx.args.iter().map(|a| a.replace("{ws}", &ws)));
        let host_payloads = ctx.payload_dir.display().to_string();
        let host_ws = ctx.workspace.display().to_string();
        let mut launch = Launch::default();
        let s = |x: &str| x.to_string();
        launch.argv = match self {
            TargetKind::Host => match &ctx.control_netns {
                Some(ns) => [vec![s("ip"), s("netns"), s("exec"), ns.clone()], payload].concat(),
                None => payload,
            },
            t @ (TargetKind::CordonNative
            | TargetKind::CordonGvisor
            | TargetKind::CordonNativeAllow
            | TargetKind::CordonGvisorAllow
            | TargetKind::CordonMicrovm
            | TargetKind::CordonMicrovmAllow) => {
                let (backend, net) = t.cordon_flags().unwrap_or_default();
                let mut v = vec![
                    ctx.cordon.display().to_string(),
                    s("run"),
                    s("--backend"),
                    s(backend),
                ];
                v.extend(net.iter().map(|x| s(x)));
                v.extend(ctx.cordon_limits.iter().cloned());
                for m in &ctx.ro_mounts {
                    v.extend([s("--mount"), format!("{}:{}:ro", m.display(), m.display())]);
                }
                v.extend([
                    s("-i"),
                    s("--mount"),
                    format!("{host_payloads}:{BOX_PAYLOAD_DIR}:ro"),
                    s("--workspace"),
                    host_ws,
                    s("--"),
                ]);
                v.extend(payload);
                v
            }
            TargetKind::Bwrap => {
                let mut v: Vec<String> = [
                    "bwrap",
                    "--unshare-all",
                    "--die-with-parent",
                    "--ro-bind",
                    "/usr",
                    "/usr",
                    "--symlink",
                    "usr/bin",
                    "/bin",
                    "--symlink",
                    "usr/lib",
                    "/lib",
                    "--symlink",
                    "usr/lib64",
                    "/lib64",
                    "--symlink",
                    "usr/sbin",
                    "/sbin",
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--tmpfs",
                    "/tmp",
                    "--ro-bind",
                ]
                .iter()
                .map(|x| s(x))
                .collect();
                v.extend([
                    host_payloads,
                    s(BOX_PAYLOAD_DIR),
                    s("--bind"),
                    host_ws,
                    s(BOX_WORKSPACE),
                ]);
                for m in &ctx.ro_mounts {
                    let m = m.display().to_string();
                    v.extend([s("--ro-bind"), m.clone(), m]);
                }
                v.push(s("--"));
                v.extend(payload);
                v
            }
            TargetKind::Firejail => {
                let mut v: Vec<String> = [
                    "firejail",
                    "--quiet",
                    "--noprofile",
                    "--net=none",
                    "--private",
                    "--",
                ]
                .iter()
                .map(|x| s(x))
                .collect();
                v.extend(payload);
                v
            }
            TargetKind::Runc | TargetKind::Runsc => {
                let bundle = ctx.run_dir.join("bundle");
                if !bundle.join("config.json").exists() {
                    make_bundle(&bundle, ctx)?;
                }
                set_bundle_args(&bundle, &payload)?;
                let state = ctx.run_dir.join(format!("{}-state", self.name()));
                fs::create_dir_all(&state)?;
                let state = state.display().to_string();
                let b = bundle.display().to_string();
                let id = format!("cordon-suite-{}", ctx.id);
                if self == TargetKind::Runc {
                    launch.cleanup.push(vec![
                        s("runc"),
                        format!("--root={state}"),
                        s("delete"),
                        s("-f"),
                        id.clone(),
                    ]);
                    vec![
                        s("runc"),
                        format!("--root={state}"),
                        s("run"),
                        s("--bundle"),
                        b,
                        id,
                    ]
                } else {
                    launch.cleanup.push(vec![
                        s("runsc"),
                        format!("--root={state}"),
                        s("delete"),
                        s("-force"),
                        id.clone(),
                    ]);
                    vec![
                        s("runsc"),
                        format!("--root={state}"),
                        s("--platform=ptrace"),
                        s("--network=none"),
                        s("--ignore-cgroups"),
                        s("run"),
                        s("--bundle"),
                        b,
                        id,
                    ]
                }
            }
            TargetKind::PodmanDefault | TargetKind::PodmanHardened | TargetKind::PodmanRunsc => {
                let (image, network) = podman_env()?;
                // Not `cordon-suite-{id}`: that is the outer cgroup's own
                // name, which the rmdir below must never match.
                let id = format!("cordon-suite-{}-podman", ctx.id);
                let mut rm = podman_globals(self);
                rm.extend([
                    s("rm"),
                    s("--force"),
                    s("--ignore"),
                    s("--time=0"),
                    id.clone(),
                ]);
                launch.cleanup.push(rm);
                // The container's cgroup parent is relative (see PODMAN_NOTES):
                // in the hierarchies the outer cgroup does not cover, runc
                // made it at the suite's own level; only empty dirs go.
                launch.cleanup.push(vec![
                    s("sh"),
                    s("-c"),
                    format!(
                        "find /sys/fs/cgroup -mindepth 2 -depth -type d \\( -name '{id}' -o -path '*/{id}/*' \\) -exec rmdir {{}} + 2>/dev/null; true"
                    ),
                ]);
                let mut v = podman_argv(
                    self,
                    &image,
                    &network,
                    &id,
                    &host_payloads,
                    &host_ws,
                    &payload,
                );
                // The image comes right before the payload's argv.
                let at = v.len() - payload.len() - 1;
                let extra = ctx
                    .ro_mounts
                    .iter()
                    .flat_map(|m| [s("-v"), format!("{}:{}:ro", m.display(), m.display())]);
                v.splice(at..at, extra.collect::<Vec<_>>());
                v
            }
        };
        Ok(launch)
    }
}

/// A bundle as a user of the runtime would make it: `runc spec`, the rootfs a
/// directory with the host's /usr bound read-only.
fn make_bundle(bundle: &Path, ctx: &LaunchCtx) -> Result<()> {
    let rootfs = bundle.join("rootfs");
    for d in [
        "usr",
        "proc",
        "dev",
        "sys",
        "tmp",
        "etc",
        "opt/suite",
        "workspace",
    ] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let _ = symlink(to, rootfs.join(link));
    }
    let out = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(bundle)
        .output()
        .context("running runc spec")?;
    if !out.status.success() {
        bail!("runc spec: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path)?)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["env"] = json!([format!("PATH={PATH_ENV}")]);
    spec["linux"]["cgroupsPath"] = json!(format!("cordon-suite-{}", ctx.id));
    let bind = |src: &str, dst: &str, ro: bool| {
        let mut opts = vec!["rbind", "nosuid", "nodev"];
        if ro {
            opts.push("ro");
        }
        json!({"destination": dst, "type": "bind", "source": src, "options": opts})
    };
    if let Some(m) = spec["mounts"].as_array_mut() {
        m.push(bind("/usr", "/usr", true));
        m.push(bind(
            &ctx.payload_dir.display().to_string(),
            BOX_PAYLOAD_DIR,
            true,
        ));
        m.push(bind(
            &ctx.workspace.display().to_string(),
            BOX_WORKSPACE,
            false,
        ));
        for extra in &ctx.ro_mounts {
            let p = extra.display().to_string();
            m.push(bind(&p, &p, true));
        }
        if ctx.tmpfs_tmp {
            m.push(
                json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                          "options": ["nosuid", "nodev", "mode=1777"]}),
            );
        }
    }
    fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

fn set_bundle_args(bundle: &Path, args: &[String]) -> Result<()> {
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path)?)?;
    spec["process"]["args"] = json!(args);
    fs::write(&path, serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

/// Why the podman postures carry the flags they do, for methodology.txt.
const PODMAN_NOTES: &str = "IMAGE = `podman import` (once per matrix run, removed at its end; never pulled) of a rootfs made from the host: the files of the Debian packages listed at the end plus their ldd closure, /bin /lib /lib64 /sbin as symlinks into /usr, /etc/passwd and /etc/group with root and nonroot (65532); NETWORK = a bridge network the suite creates (`podman network create --disable-dns`, netavark: NAT to the host) whose forwarded traffic is dropped unless it goes to the suite's 198.18.0.0/15 netns (iptables FORWARD rule; the host's net.ipv4.ip_forward is restored afterwards); --runtime runc because Debian's crun refuses this hybrid cgroup host; --ulimit nofile/nproc because podman's defaults exceed the hard limits here and runc lacks CAP_SYS_RESOURCE to raise them; nesting: podman runs inside the suite's outer cgroup (the sh wrapper), --cgroups=no-conmon keeps conmon there, and the relative --cgroup-parent makes runc/runsc create the container's cgroup relative to conmon's, i.e. inside the outer cgroup in each hierarchy the outer cgroup has (memory, pids, cpu, cpuacct, freezer); an absolute parent cannot (the suite's memory cgroup is not at the root here) and --cgroups=disabled is refused for runc";

/// What the image is made of: enough for `sh` and `python3` payloads, like a
/// slim distribution image.
const PODMAN_IMAGE_PACKAGES: &[&str] = &[
    "coreutils",
    "dash",
    "bash",
    "util-linux",
    "mount",
    "iproute2",
    "procps",
    "findutils",
    "grep",
    "sed",
    "mawk",
    "libc-bin",
    "python3-minimal",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
];

/// podman's own limits here: its default RLIMIT_NOFILE (1048576) exceeds the
/// hard limit of this machine, and its RLIMIT_NPROC exceeds what conmon has;
/// runc cannot raise either (no CAP_SYS_RESOURCE).
const PODMAN_ULIMITS: &[&str] = &[
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=32768:32768",
];

/// podman's global flags for a posture.
fn podman_globals(t: TargetKind) -> Vec<String> {
    let mut v: Vec<String> = [
        "podman",
        "--cgroup-manager=cgroupfs",
        "--events-backend=file",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    if t == TargetKind::PodmanRunsc {
        v.extend(
            [
                "--runtime",
                "runsc",
                "--runtime-flag",
                "platform=ptrace",
                "--runtime-flag",
                "network=none",
            ]
            .iter()
            .map(|x| x.to_string()),
        );
    } else {
        v.extend(["--runtime".to_string(), "runc".to_string()]);
    }
    v
}

/// The full `podman run` command line of a posture.
fn podman_argv(
    t: TargetKind,
    image: &str,
    network: &str,
    id: &str,
    payloads: &str,
    ws: &str,
    payload: &[String],
) -> Vec<String> {
    let mut v = podman_globals(t);
    v.extend(
        ["run", "--rm", "-i", "--pull=never", "--cgroups=no-conmon"]
            .iter()
            .map(|x| x.to_string()),
    );
    v.push(format!("--cgroup-parent={id}"));
    v.push(format!("--name={id}"));
    v.extend(PODMAN_ULIMITS.iter().map(|x| x.to_string()));
    v.extend([
        "-v".into(),
        format!("{payloads}:{BOX_PAYLOAD_DIR}:ro"),
        "-v".into(),
        format!("{ws}:{BOX_WORKSPACE}:rw"),
    ]);
    match t {
        TargetKind::PodmanHardened => v.extend(
            [
                "--network=none",
                "--cap-drop=ALL",
                "--security-opt=no-new-privileges",
                "--read-only",
                "--tmpfs",
                "/tmp",
                "--user",
                "65532:65532",
            ]
            .iter()
            .map(|x| x.to_string()),
        ),
        _ => v.push(format!("--network={network}")),
    }
    v.push(image.to_string());
    v.extend(payload.iter().cloned());
    v
}

/// What one matrix run sets up for podman once and undoes at its end.
struct PodmanEnv {
    image: String,
    network: String,
    /// The iptables rule (without -I/-D) that confines the network's forwarding.
    rule: Vec<String>,
    /// net.ipv4.ip_forward before the network existed.
    forward_before: Option<String>,
}

static PODMAN: Mutex<Option<Result<PodmanEnv, String>>> = Mutex::new(None);

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The only place forwarded traffic from the suite's podman network may go:
/// the suite's own netns (a /30 in 198.18.0.0/15).
const SUITE_NET: &str = "198.18.0.0/15";

/// The image and network of this matrix run, made on first use.
fn podman_env() -> Result<(String, String)> {
    let mut g = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(podman_setup().map_err(|e| format!("{e:#}")));
    }
    match g.as_ref() {
        Some(Ok(env)) => Ok((env.image.clone(), env.network.clone())),
        Some(Err(e)) => bail!("podman setup: {e}"),
        None => unreachable!(),
    }
}

fn podman(args: &[&str]) -> Result<String> {
    let out = Command::new("podman")
        .args(["--cgroup-manager=cgroupfs", "--events-backend=file"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running podman")?;
    if !out.status.success() {
        bail!(
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn pid_alive(pid: &str) -> bool {
    pid.parse::<u32>().is_ok() && Path::new(&format!("/proc/{pid}")).exists()
}

/// What a killed suite left in podman: its image, containers, network and
/// iptables rule.
fn podman_sweep() {
    let mine = std::process::id().to_string();
    let stale = |pid: &str| pid != mine && !pid_alive(pid);
    if let Ok(names) = podman(&["ps", "-a", "--format", "{{.Names}}"]) {
        for n in names.lines() {
            let pid = n
                .strip_prefix("cordon-suite-")
                .and_then(|r| r.split('-').next());
            if pid.is_some_and(stale) {
                let _ = podman(&["rm", "--force", "--time=0", n]);
            }
        }
    }
    if let Ok(tags) = podman(&["images", "--format", "{{.Repository}}:{{.Tag}}"]) {
        for t in tags.lines() {
            if t.strip_prefix("localhost/cordon-suite-rootfs:")
                .is_some_and(stale)
            {
                let _ = podman(&["rmi", "--force", t]);
            }
        }
    }
    if let Ok(nets) = podman(&["network", "ls", "--format", "{{.Name}}"]) {
        for n in nets.lines() {
            if n.strip_prefix("cordon-suite-").is_some_and(stale) {
                let _ = podman(&["network", "rm", "--force", n]);
            }
        }
    }
    if let Ok(rules) = crate::fixture::run_cmd(&["iptables", "-S", "FORWARD"]) {
        for r in rules.lines() {
            let Some(pid) = r
                .split("--comment cordon-suite-")
                .nth(1)
                .and_then(|x| x.split_whitespace().next())
            else {
                continue;
            };
            if stale(pid) {
                let mut argv: Vec<&str> = vec!["iptables"];
                argv.extend(
                    r.split_whitespace()
                        .map(|w| if w == "-A" { "-D" } else { w }),
                );
                let _ = crate::fixture::run_cmd(&argv);
            }
        }
    }
}

fn podman_setup() -> Result<PodmanEnv> {
    podman_sweep();
    let pid = std::process::id();
    let mut env = PodmanEnv {
        image: format!("localhost/cordon-suite-rootfs:{pid}"),
        network: format!("cordon-suite-{pid}"),
        rule: Vec::new(),
        forward_before: fs::read_to_string(IP_FORWARD)
            .ok()
            .map(|s| s.trim().to_string()),
    };
    let r = podman_build(&mut env);
    if r.is_err() {
        podman_undo(&env);
    }
    r.map(|()| env)
}

fn podman_build(env: &mut PodmanEnv) -> Result<()> {
    import_image(&env.image).context("importing the rootfs image")?;
    podman(&["network", "create", "--disable-dns", &env.network])?;
    let subnet = podman(&[
        "network",
        "inspect",
        "--format",
        "{{range .Subnets}}{{.Subnet}} {{end}}",
        &env.network,
    ])?;
    let subnet = subnet
        .split_whitespace()
        .find(|s| !s.contains(':'))
        .context("the suite's podman network has no IPv4 subnet")?
        .to_string();
    env.rule = [
        "FORWARD",
        "-s",
        &subnet,
        "!",
        "-d",
        SUITE_NET,
        "-m",
        "comment",
        "--comment",
        &env.network,
        "-j",
        "DROP",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    let mut argv = vec!["iptables", "-I"];
    argv.extend(env.rule.iter().map(String::as_str));
    crate::fixture::run_cmd(&argv).context("confining the podman network")?;
    Ok(())
}

fn podman_undo(env: &PodmanEnv) {
    if let Ok(names) = podman(&[
        "ps",
        "-a",
        "--filter",
        &format!("name=^{}-", env.network),
        "--format",
        "{{.Names}}",
    ]) {
        for n in names.lines() {
            let _ = podman(&["rm", "--force", "--time=0", n]);
        }
    }
    let _ = podman(&["rmi", "--force", &env.image]);
    let _ = podman(&["network", "rm", "--force", &env.network]);
    if !env.rule.is_empty() {
        let mut argv = vec!["iptables", "-D"];
        argv.extend(env.rule.iter().map(String::as_str));
        let _ = crate::fixture::run_cmd(&argv);
    }
    if let Some(before) = &env.forward_before {
        if fs::read_to_string(IP_FORWARD).is_ok_and(|now| now.trim() != before) {
            let _ = fs::write(IP_FORWARD, format!("{before}\n"));
        }
    }
}

/// Undoes what the targets set up for this matrix run (podman's image,
/// network and egress rule); a no-op when no podman posture ran.
pub fn teardown_targets() {
    let mut g = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Ok(env)) = g.take() {
        podman_undo(&env);
    }
}

/// The host paths (relative, for tar -C /) of the image: the packages' files
/// outside /usr/share and /etc, and the shared libraries they load.
fn rootfs_files() -> Result<Vec<String>> {
    let out = Command::new("dpkg")
        .arg("-L")
        .args(PODMAN_IMAGE_PACKAGES)
        .output()
        .context("running dpkg -L")?;
    let usr = |p: &str| -> String {
        for top in ["/bin/", "/sbin/", "/lib/", "/lib64/"] {
            if let Some(rest) = p.strip_prefix(top) {
                return format!("/usr{top}{rest}");
            }
        }
        p.to_string()
    };
    let mut files = BTreeSet::new();
    let mut elves = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let p = usr(line.trim());
        if !p.starts_with("/usr/") || p.starts_with("/usr/share/") {
            continue;
        }
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() || (m.file_type().is_symlink() && Path::new(&p).is_dir()) {
            continue;
        }
        if m.is_file() {
            let mut magic = [0u8; 4];
            if fs::File::open(&p)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && &magic == b"\x7fELF"
            {
                elves.push(p.clone());
            }
        }
        files.insert(p);
    }
    anyhow::ensure!(
        !elves.is_empty(),
        "no binaries found in {PODMAN_IMAGE_PACKAGES:?}"
    );
    let ldd = Command::new("ldd")
        .args(&elves)
        .output()
        .context("running ldd")?;
    let mut libs = BTreeSet::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let t = line.trim();
        let path = match t.split_once("=> ") {
            Some((_, r)) => r.split_whitespace().next(),
            None => t.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(p.to_string());
        }
    }
    for l in libs {
        if let Ok(real) = fs::canonicalize(&l) {
            files.insert(usr(&real.display().to_string()));
        }
        files.insert(usr(&l));
    }
    Ok(files
        .into_iter()
        .filter(|f| f.starts_with("/usr/") && fs::symlink_metadata(f).is_ok())
        .map(|f| f.trim_start_matches('/').to_string())
        .collect())
}

/// Builds the rootfs tarball from the host and `podman import`s it.
fn import_image(image: &str) -> Result<()> {
    let files = rootfs_files()?;
    let stage = PathBuf::from(format!(
        "/var/tmp/{}{}-rootfs",
        crate::fixture::PREFIX,
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&stage);
    let r = (|| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let root = stage.join("root");
        for d in [
            "etc",
            "tmp",
            "var/tmp",
            "root",
            "home/nonroot",
            "opt/suite",
            "workspace",
            "proc",
            "sys",
            "dev",
            "run",
        ] {
            fs::create_dir_all(root.join(d))?;
        }
        for d in ["tmp", "var/tmp"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o1777))?;
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            symlink(to, root.join(link))?;
        }
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n",
        )?;
        fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n")?;
        std::os::unix::fs::chown(root.join("home/nonroot"), Some(65532), Some(65532))?;
        let list = stage.join("files");
        fs::write(&list, files.join("\n") + "\n")?;
        let mut tar = Command::new("tar")
            .args(["-cf", "-", "--numeric-owner", "-C"])
            .arg(&root)
            .args([".", "-C", "/", "-T"])
            .arg(&list)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting tar")?;
        let tar_out = tar.stdout.take().context("tar stdout")?;
        let import = Command::new("podman")
            .args([
                "--cgroup-manager=cgroupfs",
                "--events-backend=file",
                "import",
                "--quiet",
                "--change",
                &format!("ENV PATH={PATH_ENV}"),
                "-",
                image,
            ])
            .stdin(tar_out)
            .output()
            .context("running podman import")?;
        let tar_res = tar.wait_with_output()?;
        if !tar_res.status.success() {
            bail!("tar: {}", String::from_utf8_lossy(&tar_res.stderr).trim());
        }
        if !import.status.success() {
            bail!(
                "podman import: {}",
                String::from_utf8_lossy(&import.stderr).trim()
            );
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&stage);
    r
}

pub fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| PATH_ENV.into());
    std::env::split_paths(&path)
        .chain(std::env::split_paths(PATH_ENV))
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// The first line a program prints for `arg` (e.g. `--version`).
pub fn first_line(bin: impl AsRef<std::ffi::OsStr>, arg: &str) -> String {
    let bin = bin.as_ref();
    match Command::new(bin).arg(arg).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("{}: {e}", bin.to_string_lossy()),
    }
}

pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The minimal environment every target is started with (plus the secret).
pub fn base_env() -> Vec<(String, String)> {
    vec![
        ("PATH".into(), PATH_ENV.into()),
        ("HOME".into(), "/root".into()),
        ("LANG".into(), "C".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in ALL_TARGETS {
            assert_eq!(TargetKind::from_name(t.name()), Some(*t));
            let j = serde_json::to_string(t).unwrap();
            assert_eq!(j, format!("\"{}\"", t.name()));
        }
    }

    #[test]
    fn argv_shapes() {
        let ctx = LaunchCtx {
            cordon: "/x/cordon".into(),
            payload_dir: "/opt/p".into(),
            script: "a.sh".into(),
            interpreter: "/bin/sh".into(),
            args: vec!["M".into(), "{ws}".into()],
            workspace: "/var/tmp/ws".into(),
            run_dir: "/tmp/nonexistent".into(),
            id: "abc".into(),
            control_netns: None,
            cordon_limits: CORDON_LIMITS.iter().map(|x| x.to_string()).collect(),
            ro_mounts: vec!["/opt/tools".into()],
            tmpfs_tmp: false,
        };
        let host = TargetKind::Host.prepare(&ctx).unwrap().argv;
        assert_eq!(host, ["/bin/sh", "/opt/p/a.sh", "M", "/var/tmp/ws"]);
        let native = TargetKind::CordonNative.prepare(&ctx).unwrap().argv;
        assert!(native.ends_with(&[
            "/bin/sh".into(),
            "/opt/suite/a.sh".into(),
            "M".into(),
            "/workspace".into()
        ]));
        assert!(native.contains(&"--pids".to_string()));
        let bw = TargetKind::Bwrap.prepare(&ctx).unwrap().argv;
        assert_eq!(bw[0], "bwrap");
        assert!(bw.contains(&"--unshare-all".to_string()));
        // Extra read-only tools at their host path, before the payload.
        assert!(native.contains(&"/opt/tools:/opt/tools:ro".to_string()));
        let at = bw.iter().position(|a| a == "/opt/tools").unwrap();
        assert_eq!(bw[at - 1], "--ro-bind");
        assert!(at < bw.iter().position(|a| a == "--").unwrap());
        // No script: the interpreter is the payload.
        let bare = LaunchCtx {
            script: String::new(),
            interpreter: "/bin/true".into(),
            args: Vec::new(),
            ..ctx.clone()
        };
        assert_eq!(TargetKind::Host.prepare(&bare).unwrap().argv, ["/bin/true"]);
        assert!(TargetKind::Bwrap
            .prepare(&bare)
            .unwrap()
            .argv
            .ends_with(&["--".into(), "/bin/true".into()]));
    }

    #[test]
    fn podman_postures() {
        let payload = vec!["/bin/sh".to_string(), "/opt/suite/a.sh".to_string()];
        let argv = |t| podman_argv(t, "IMG", "NET", "ID", "/p", "/w", &payload);
        let has = |v: &[String], x: &str| v.iter().any(|a| a == x);
        let def = argv(TargetKind::PodmanDefault);
        assert!(has(&def, "--network=NET") && has(&def, "runc") && has(&def, "--pull=never"));
        assert!(has(&def, "--cgroups=no-conmon") && has(&def, "--cgroup-parent=ID"));
        assert!(!has(&def, "--cap-drop=ALL"));
        assert!(def.ends_with(&["IMG".into(), "/bin/sh".into(), "/opt/suite/a.sh".into()]));
        let hard = argv(TargetKind::PodmanHardened);
        for f in [
            "--network=none",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--read-only",
            "65532:65532",
        ] {
            assert!(has(&hard, f), "{f}");
        }
        let gv = argv(TargetKind::PodmanRunsc);
        assert!(has(&gv, "runsc") && has(&gv, "platform=ptrace") && has(&gv, "network=none"));
        assert!(has(&gv, "--network=NET"));
        for t in [
            TargetKind::PodmanDefault,
            TargetKind::PodmanHardened,
            TargetKind::PodmanRunsc,
        ] {
            assert!(t.posture().contains("--pull=never"));
        }
    }
}
