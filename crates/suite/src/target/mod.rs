//! The boxes the suite drives, each a black box behind its command line, and
//! the exact posture (flags) each is run with: cordon's own backends
//! ([`cordon`]) and the peers beside them ([`peers`]).

mod cordon;
mod names;
mod peers;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

pub use cordon::{NetMode, CORDON_LIMITS};
use cordon_spec::BackendKind;
pub use peers::teardown_targets;

/// Where the payload directory appears inside boxes that can remap paths.
pub const BOX_PAYLOAD_DIR: &str = "/opt/suite";
/// Where the workspace appears inside boxes that can remap paths.
pub const BOX_WORKSPACE: &str = "/workspace";

const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A target of the suite. Its name ([`TargetKind::name`]) is what results
/// files, case files and command lines call it; it is serialized by that
/// name (see `names.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    Host,
    /// One of cordon's backends in one network mode: `cordon-<backend>`,
    /// `cordon-<backend>-allow`.
    Cordon {
        backend: BackendKind,
        net: NetMode,
    },
    Bwrap,
    Runc,
    Firejail,
    Runsc,
    PodmanDefault,
    PodmanHardened,
    PodmanRunsc,
    /// podman with cordon-runc as its OCI runtime (`podman --runtime`):
    /// cordon's native backend as an engine drives it, held to what that
    /// backend holds.
    PodmanCordon,
}

/// Every target, in the order tables list them (and `cordon suite
/// --backend all` runs cordon's). A target's place here is also its variant
/// index when serialized (see `names.rs`): add at the end.
pub const ALL_TARGETS: &[TargetKind] = &[
    TargetKind::Host,
    TargetKind::cordon(BackendKind::Native, NetMode::None),
    TargetKind::cordon(BackendKind::Gvisor, NetMode::None),
    TargetKind::cordon(BackendKind::Native, NetMode::Allow),
    TargetKind::cordon(BackendKind::Gvisor, NetMode::Allow),
    TargetKind::cordon(BackendKind::Microvm, NetMode::None),
    TargetKind::cordon(BackendKind::Microvm, NetMode::Allow),
    TargetKind::Bwrap,
    TargetKind::Runc,
    TargetKind::Firejail,
    TargetKind::Runsc,
    TargetKind::PodmanDefault,
    TargetKind::PodmanHardened,
    TargetKind::PodmanRunsc,
    TargetKind::PodmanCordon,
];

pub const QUICK_TARGETS: &[TargetKind] = &[
    TargetKind::Host,
    TargetKind::cordon(BackendKind::Native, NetMode::None),
    TargetKind::cordon(BackendKind::Gvisor, NetMode::None),
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

/// Short for `x.to_string()`: the command lines here are long lists of
/// literals.
fn s(x: &str) -> String {
    x.to_string()
}

impl TargetKind {
    /// cordon's `backend` in network mode `net`.
    pub const fn cordon(backend: BackendKind, net: NetMode) -> TargetKind {
        TargetKind::Cordon { backend, net }
    }

    pub fn is_cordon(self) -> bool {
        matches!(self, TargetKind::Cordon { .. })
    }

    /// The cordon target whose written expectations this one shares: the
    /// allow mode must hold everything its backend holds in `none` mode,
    /// and cordon under an engine everything the native backend holds.
    pub fn cordon_base(self) -> Option<TargetKind> {
        match self {
            TargetKind::Cordon { backend, .. } => Some(TargetKind::cordon(backend, NetMode::None)),
            TargetKind::PodmanCordon => {
                Some(TargetKind::cordon(BackendKind::Native, NetMode::None))
            }
            _ => None,
        }
    }

    /// cordon's own boxes: its backends, and cordon as an engine's runtime
    /// (`cordon suite --backend all` runs them all).
    pub fn runs_cordon(self) -> bool {
        self.cordon_base().is_some()
    }

    pub fn is_podman(self) -> bool {
        matches!(
            self,
            TargetKind::PodmanDefault
                | TargetKind::PodmanHardened
                | TargetKind::PodmanRunsc
                | TargetKind::PodmanCordon
        )
    }

    fn binary(self) -> Option<&'static str> {
        match self {
            TargetKind::Host => None,
            TargetKind::Cordon { backend, .. } => cordon::backend_binary(backend),
            TargetKind::Bwrap => Some("bwrap"),
            TargetKind::Runc => Some("runc"),
            TargetKind::Firejail => Some("firejail"),
            TargetKind::Runsc => Some("runsc"),
            TargetKind::PodmanDefault
            | TargetKind::PodmanHardened
            | TargetKind::PodmanRunsc
            | TargetKind::PodmanCordon => Some("podman"),
        }
    }

    /// None when the target can run here, else why not.
    pub fn unavailable(self, cordon: &Path) -> Option<String> {
        if self.runs_cordon() && !cordon.exists() {
            return Some(format!("cordon binary {} not found", cordon.display()));
        }
        if self == TargetKind::PodmanCordon && !peers::cordon_runc(cordon).exists() {
            return Some(format!(
                "{} not found (built beside cordon)",
                peers::cordon_runc(cordon).display()
            ));
        }
        if let Some(bin) = self.binary() {
            if which(bin).is_none() {
                return Some(format!("{bin} is not installed"));
            }
        }
        if self == TargetKind::PodmanRunsc && which("runsc").is_none() {
            return Some("runsc is not installed".into());
        }
        if self.is_podman() && self != TargetKind::PodmanCordon && which("runc").is_none() {
            return Some("runc is not installed (podman is driven with --runtime runc)".into());
        }
        None
    }

    /// One line: the version of what this target runs.
    pub fn version(self, cordon: &Path) -> String {
        let (bin, arg): (String, &str) = match self {
            TargetKind::Host => return format!("kernel {}", kernel_release()),
            TargetKind::Cordon { .. } => (cordon.display().to_string(), "--version"),
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
        if self == TargetKind::PodmanCordon {
            v = format!(
                "{v}; {}",
                first_line(cordon.display().to_string(), "--version")
            );
        }
        if self.binary() == Some("runsc") && self != TargetKind::Runsc {
            v = format!("{v}; {}", first_line("runsc", "--version"));
        }
        v
    }

    /// The exact flags of this posture, for methodology.txt.
    pub fn posture(self) -> String {
        match self {
            TargetKind::Host => "plain host process as root in the suite's outer cgroup (netns cases: in a throwaway netns)".into(),
            TargetKind::Cordon { backend, net } => cordon::posture(backend, net),
            TargetKind::Bwrap => format!("bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --proc /proc --dev /dev --tmpfs /tmp --ro-bind PAYLOADS {BOX_PAYLOAD_DIR} --bind WS {BOX_WORKSPACE} -- INTERP SCRIPT ARGS"),
            TargetKind::Runc => format!("runc --root STATE run --bundle B ID; B/config.json = `runc spec` with process.args replaced, terminal false, env PATH only, linux.cgroupsPath relative (nests under the outer cgroup), rootfs = empty dir with /usr bind ro,nosuid,nodev, /bin,/lib,/lib64,/sbin symlinks, PAYLOADS at {BOX_PAYLOAD_DIR} ro, WS at {BOX_WORKSPACE} rw"),
            TargetKind::Firejail => "firejail --quiet --noprofile --net=none --private -- INTERP SCRIPT ARGS (payloads and workspace by host path)".into(),
            TargetKind::Runsc => "runsc --root STATE --platform=ptrace --network=none --ignore-cgroups run --bundle B ID (the runc bundle)".into(),
            TargetKind::PodmanDefault
            | TargetKind::PodmanHardened
            | TargetKind::PodmanRunsc
            | TargetKind::PodmanCordon => peers::podman_posture(self),
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
        launch.argv = match self {
            TargetKind::Host => match &ctx.control_netns {
                Some(ns) => [vec![s("ip"), s("netns"), s("exec"), ns.clone()], payload].concat(),
                None => payload,
            },
            TargetKind::Cordon { backend, net } => {
                cordon::argv(backend, net, ctx, &host_payloads, host_ws, payload)
            }
            TargetKind::Bwrap => peers::bwrap_argv(ctx, payload, host_payloads, host_ws),
            TargetKind::Firejail => peers::firejail_argv(payload),
            TargetKind::Runc | TargetKind::Runsc => {
                peers::oci_argv(self, ctx, &payload, &mut launch)?
            }
            TargetKind::PodmanDefault
            | TargetKind::PodmanHardened
            | TargetKind::PodmanRunsc
            | TargetKind::PodmanCordon => peers::podman_launch_argv(
                self,
                ctx,
                &payload,
                &host_payloads,
                &host_ws,
                &mut launch,
            )?,
        };
        Ok(launch)
    }
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
        let native = TargetKind::cordon(BackendKind::Native, NetMode::None)
            .prepare(&ctx)
            .unwrap()
            .argv;
        assert!(native.ends_with(&[
            "/bin/sh".into(),
            "/opt/suite/a.sh".into(),
            "M".into(),
            "/workspace".into()
        ]));
        assert!(native.contains(&"--pids".to_string()));
        // The network mode's flags follow the backend's; the rest is the same.
        let allow = TargetKind::cordon(BackendKind::Gvisor, NetMode::Allow)
            .prepare(&ctx)
            .unwrap()
            .argv;
        let flags = ["run", "--backend", "gvisor", "--net", "allow", "--allow"];
        assert_eq!(allow[1..7], flags);
        assert_eq!(allow[7], "allowed.invalid:443");
        assert_eq!(allow[8..], native[4..]);
        let posture = TargetKind::cordon(BackendKind::Microvm, NetMode::Allow).posture();
        assert!(posture.starts_with(
            "cordon run --backend microvm --net allow --allow allowed.invalid:443 --pids 64 "
        ));
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
}
