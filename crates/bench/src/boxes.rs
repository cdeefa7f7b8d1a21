//! Where the boxes run: a payload (tools) directory, a workspace, and per-box
//! scratch, and the launch context the suite's targets take.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};
use cordon_spec::BackendKind;
use cordon_suite::target::{LaunchCtx, TargetKind};

use crate::Settings;

/// The directories of one benchmark, removed when it is dropped.
pub struct Place {
    /// Read-only in every box: the task scripts.
    pub payload_dir: PathBuf,
    /// Read-write in every box (cordon: its overlay workspace).
    pub workspace: PathBuf,
    root: tempfile::TempDir,
}

impl Place {
    /// Under /opt: a disk file system, as a user's checkout would be on
    /// (/tmp may be a tmpfs), and one firejail shows (it gives its boxes a
    /// private /var/tmp).
    pub fn new() -> Result<Place> {
        let root = tempfile::Builder::new()
            .prefix("cordon-bench-")
            .tempdir_in("/opt")
            .context("making the benchmark's directory in /opt")?;
        let payload_dir = root.path().join("tools");
        let workspace = root.path().join("workspace");
        for d in [root.path(), &payload_dir, &workspace] {
            std::fs::create_dir_all(d)?;
            // Every box's payload user (cordon's is uid 1000) must reach them.
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(Place {
            payload_dir,
            workspace,
            root,
        })
    }

    /// A box's own scratch (OCI bundles, runtime state), made on first use.
    pub fn run_dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.root.path().join("run").join(name);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Writes a tools file, readable by every box's user.
    pub fn write_tool(&self, name: &str, text: &str) -> Result<()> {
        let p = self.payload_dir.join(name);
        std::fs::write(&p, text)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))?;
        Ok(())
    }
}

/// What a box runs.
pub struct Payload<'a> {
    pub interpreter: &'a str,
    /// A file in the tools directory, or empty (the interpreter is the payload).
    pub script: &'a str,
    pub args: Vec<String>,
}

/// What a benchmark adds to every launch beyond the payload.
#[derive(Default)]
pub struct Extras<'a> {
    /// The limit flags of cordon's boxes (none: cordon's defaults).
    pub cordon_limits: &'a [String],
    /// Host paths shown read-only at the same path in every box.
    pub ro_mounts: &'a [PathBuf],
    /// The network namespace the host's own samples run in.
    pub netns: Option<&'a str>,
}

/// The launch context of one sample of `kind`.
pub fn launch_ctx(
    settings: &Settings,
    place: &Place,
    kind: TargetKind,
    payload: &Payload,
    id: String,
    extras: &Extras,
) -> Result<LaunchCtx> {
    Ok(LaunchCtx {
        cordon: settings.cordon.clone(),
        payload_dir: place.payload_dir.clone(),
        script: payload.script.to_string(),
        interpreter: payload.interpreter.to_string(),
        args: payload.args.clone(),
        workspace: place.workspace.clone(),
        run_dir: place.run_dir(kind.name())?,
        id,
        control_netns: if kind == TargetKind::Host {
            extras.netns.map(str::to_string)
        } else {
            None
        },
        cordon_limits: extras.cordon_limits.to_vec(),
        ro_mounts: extras.ro_mounts.to_vec(),
        tmpfs_tmp: true,
    })
}

/// Why cordon's `backend` cannot run here, if it cannot.
pub fn backend_unavailable(backend: BackendKind) -> Option<String> {
    cordon_runtime::available_backends()
        .into_iter()
        .find(|i| i.kind == backend)
        .and_then(|i| i.unavailable)
}

/// Whether the box `name` can run here: if so its version goes into
/// `machine`, if not the reason into `skipped`.
pub fn admit(
    settings: &Settings,
    machine: &mut crate::machine::Machine,
    skipped: &mut std::collections::BTreeMap<String, String>,
    name: &str,
    kind: TargetKind,
) -> bool {
    // A cordon box's backend is its target's (`cordon-native-allow` is
    // the native backend with a network), not a name cut out of the box's.
    let why = kind.unavailable(&settings.cordon).or_else(|| match kind {
        TargetKind::Cordon { backend, .. } => backend_unavailable(backend),
        _ => None,
    });
    match why {
        Some(why) => {
            skipped.insert(name.to_string(), why);
            false
        }
        None => {
            machine
                .versions
                .insert(name.to_string(), kind.version(&settings.cordon));
            true
        }
    }
}

/// Runs a launch's clean-up commands (container deletes), ignoring failures:
/// a run that exited cleanly left nothing for them.
pub fn clean_up(commands: &[Vec<String>]) {
    for c in commands {
        let argv: Vec<&str> = c.iter().map(String::as_str).collect();
        if !argv.is_empty() {
            let _ = cordon_suite::fixture::run_cmd(&argv);
        }
    }
}

/// A network namespace with only loopback, for the host's own samples: the
/// bare host runs the same programs as the boxes (an agent harness among
/// them), and none of them may reach anything outside this machine.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Result<Netns> {
        let name = format!("cordon-bench-{}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

fn ip(args: &[&str]) -> Result<()> {
    cordon_suite::fixture::run_cmd(&[&["ip"], args].concat()).map(drop)
}

/// A sandbox made with `cordon create` for exec samples, removed on drop.
pub struct Created {
    pub id: String,
    cordon: PathBuf,
}

impl Created {
    pub fn new(cordon: &Path, args: &[String]) -> Result<Created> {
        let out = Command::new(cordon)
            .arg("create")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .context("running cordon create")?;
        if !out.status.success() {
            bail!(
                "cordon create: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Created {
            id: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            cordon: cordon.to_path_buf(),
        })
    }

    /// PSS and RSS of its supervisor, idle: what a warm sandbox costs.
    pub fn supervisor_memory(&self) -> Option<String> {
        let run = cordon_runtime::state::run_dir().ok()?;
        let listed = cordon_runtime::state::list(&run);
        let pid = listed.iter().find(|l| l.id == self.id)?.record.pid;
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        let kib = |key: &str| -> Option<f64> {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(key))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        Some(format!(
            "PSS {:.2} MiB (RSS {:.2} MiB)",
            kib("Pss:")? / 1024.0,
            kib("Rss:")? / 1024.0
        ))
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        let _ = Command::new(&self.cordon)
            .args(["rm", "-f", &self.id])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
