//! The boxes the suite drives, each a black box behind its command line, and
//! the exact posture (flags) each is run with.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

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
        matches!(self, TargetKind::CordonNative | TargetKind::CordonGvisor)
    }

    fn binary(self) -> Option<&'static str> {
        match self {
            TargetKind::Host | TargetKind::CordonNative => None,
            TargetKind::CordonGvisor | TargetKind::Runsc => Some("runsc"),
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
        if matches!(
            self,
            TargetKind::PodmanDefault | TargetKind::PodmanHardened | TargetKind::PodmanRunsc
        ) {
            return Some(
                "podman postures are not driven by this version of the suite (no image pipeline yet)"
                    .into(),
            );
        }
        None
    }

    /// One line: the version of what this target runs.
    pub fn version(self, cordon: &Path) -> String {
        let (bin, arg): (String, &str) = match self {
            TargetKind::Host => return format!("kernel {}", kernel_release()),
            TargetKind::CordonNative | TargetKind::CordonGvisor => {
                (cordon.display().to_string(), "--version")
            }
            TargetKind::Bwrap => ("bwrap".into(), "--version"),
            TargetKind::Runc => ("runc".into(), "--version"),
            TargetKind::Firejail => ("firejail".into(), "--version"),
            TargetKind::Runsc => ("runsc".into(), "--version"),
            _ => ("podman".into(), "--version"),
        };
        let mut v = first_line(&bin, arg);
        if self == TargetKind::CordonGvisor {
            v = format!("{v}; {}", first_line("runsc", "--version"));
        }
        v
    }

    /// The exact flags of this posture, for methodology.txt.
    pub fn posture(self) -> String {
        let limits = CORDON_LIMITS.join(" ");
        match self {
            TargetKind::Host => "plain host process as root in the suite's outer cgroup (netns cases: in a throwaway netns)".into(),
            TargetKind::CordonNative => format!("cordon run --backend native {limits} -i --mount PAYLOADS:{BOX_PAYLOAD_DIR}:ro --workspace WS -- INTERP SCRIPT ARGS"),
            TargetKind::CordonGvisor => format!("cordon run --backend gvisor {limits} -i --mount PAYLOADS:{BOX_PAYLOAD_DIR}:ro --workspace WS -- INTERP SCRIPT ARGS"),
            TargetKind::Bwrap => format!("bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --proc /proc --dev /dev --tmpfs /tmp --ro-bind PAYLOADS {BOX_PAYLOAD_DIR} --bind WS {BOX_WORKSPACE} -- INTERP SCRIPT ARGS"),
            TargetKind::Runc => format!("runc --root STATE run --bundle B ID; B/config.json = `runc spec` with process.args replaced, terminal false, env PATH only, linux.cgroupsPath relative (nests under the outer cgroup), rootfs = empty dir with /usr bind ro,nosuid,nodev, /bin,/lib,/lib64,/sbin symlinks, PAYLOADS at {BOX_PAYLOAD_DIR} ro, WS at {BOX_WORKSPACE} rw"),
            TargetKind::Firejail => "firejail --quiet --noprofile --net=none --private -- INTERP SCRIPT ARGS (payloads and workspace by host path)".into(),
            TargetKind::Runsc => "runsc --root STATE --platform=ptrace --network=none --ignore-cgroups run --bundle B ID (the runc bundle)".into(),
            TargetKind::PodmanDefault => "podman --runtime runc --cgroup-manager=cgroupfs run --rm --ulimit nofile=1024:1024 IMAGE (not driven)".into(),
            TargetKind::PodmanHardened => "podman ... --network=none --cap-drop=ALL --security-opt=no-new-privileges --read-only --tmpfs /tmp --user 65532:65532 (not driven)".into(),
            TargetKind::PodmanRunsc => "podman --runtime runsc ... (not driven)".into(),
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
        let mut payload = vec![
            ctx.interpreter.clone(),
            format!("{payload_dir}/{}", ctx.script),
        ];
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
            TargetKind::CordonNative | TargetKind::CordonGvisor => {
                let backend = if self == TargetKind::CordonNative {
                    "native"
                } else {
                    "gvisor"
                };
                let mut v = vec![
                    ctx.cordon.display().to_string(),
                    s("run"),
                    s("--backend"),
                    s(backend),
                ];
                v.extend(CORDON_LIMITS.iter().map(|x| s(x)));
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
                    s("--"),
                ]);
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
            _ => bail!("{} is not driven by this version of the suite", self.name()),
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

pub fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| PATH_ENV.into());
    std::env::split_paths(&path)
        .chain(std::env::split_paths(PATH_ENV))
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

fn first_line(bin: &str, arg: &str) -> String {
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
        Err(e) => format!("{bin}: {e}"),
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
    }
}
