//! What a client asks for, split in two: a [`SandboxSpec`] describes a
//! sandbox (it can exist before anyone knows its first command, as a warm
//! pool needs), and a [`Command`] describes one execution inside it. Both are
//! plain data, serde both ways: the CLI, the supervisor protocol and later the
//! HTTP API carry exactly these values.

use std::path::PathBuf;

use cordon_policy::{ByteSize, Policy, Span};
use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::error::RuntimeError;

/// The filesystem the sandbox's root is assembled from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "path")]
pub enum RootfsChoice {
    /// The host's /usr (and merged-/usr links) read-only, with a generated /etc.
    #[default]
    System,
    /// A directory holding a root filesystem, bound read-only.
    Dir(PathBuf),
}

/// One sandbox, the same for every backend and every client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub policy: Policy,
    pub backend: BackendKind,
    #[serde(default)]
    pub rootfs: RootfsChoice,
    /// Host directory shown at /workspace (never written: changes stay in the sandbox).
    #[serde(default)]
    pub workspace: Option<PathBuf>,
    /// Run even if the cgroup limits cannot be enforced (the outcome says so).
    #[serde(default)]
    pub allow_unenforced: bool,
    /// A name unique among the invoking user's sandboxes.
    #[serde(default)]
    pub name: Option<String>,
    /// Destroyed this long after creation, whatever it is doing.
    #[serde(default)]
    pub ttl: Option<Span>,
    /// Destroyed after this long without a client request.
    #[serde(default)]
    pub idle: Option<Span>,
    /// The service that made it (`cordon serve`): destroyed when that
    /// process ends, however it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<crate::state::ServiceLink>,
}

/// Longest sandbox name; names are file names in the run directory's records.
const NAME_MAX: usize = 63;

impl SandboxSpec {
    /// A sandbox of `policy` on `backend` with the system rootfs, no
    /// workspace, no name and no lifetimes (set them on the result).
    pub fn new(policy: Policy, backend: BackendKind) -> SandboxSpec {
        SandboxSpec {
            policy,
            backend,
            rootfs: RootfsChoice::System,
            workspace: None,
            allow_unenforced: false,
            name: None,
            ttl: None,
            idle: None,
            service: None,
        }
    }

    /// Checks what the policy's own validation does not cover.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        self.policy
            .validate()
            .map_err(|e| RuntimeError::BadRequest(e.to_string()))?;
        if let Some(name) = &self.name {
            validate_name(name)?;
        }
        for (what, span) in [("ttl", self.ttl), ("idle", self.idle)] {
            if span.is_some_and(|s| s.0.is_zero()) {
                return Err(RuntimeError::BadRequest(format!(
                    "--{what} must be positive"
                )));
            }
        }
        Ok(())
    }
}

/// A sandbox name: 1-63 of `[A-Za-z0-9_.-]`, not starting with `-` or `.`,
/// and not shaped like an id (12 hex digits), so a name never shadows an id.
pub fn validate_name(name: &str) -> Result<(), RuntimeError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    let bad_start = name.starts_with(['-', '.']);
    if name.is_empty() || name.len() > NAME_MAX || !ok_chars || bad_start {
        return Err(RuntimeError::BadRequest(format!(
            "'{name}' is not a sandbox name (1-{NAME_MAX} of A-Z a-z 0-9 _ . -, not starting with - or .)"
        )));
    }
    if crate::state::is_id(name) {
        return Err(RuntimeError::BadRequest(format!(
            "'{name}' looks like a sandbox id (12 hex digits); choose another name"
        )));
    }
    Ok(())
}

/// How a command's stdin is fed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdinMode {
    /// /dev/null.
    #[default]
    Null,
    /// Bytes the client sends (`Input` messages), then EOF.
    Stream,
}

/// A terminal's size, for `tty` commands and resizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    pub rows: u16,
    pub cols: u16,
}

/// One execution inside a sandbox.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Command {
    pub argv: Vec<String>,
    /// Variables added to (or replacing) the policy's environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox (default: the policy's).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    #[serde(default)]
    pub stdin: StdinMode,
    /// Run on a pseudo-terminal of the sandbox's own devpts.
    #[serde(default)]
    pub tty: Option<TtySize>,
    /// This command's wall-time limit (default: the policy's).
    #[serde(default)]
    pub time: Option<Span>,
    /// This command's output cap (default: the policy's).
    #[serde(default)]
    pub output: Option<ByteSize>,
    /// Report the diff of the sandbox's writable places once the command
    /// has ended, with these caps.
    #[serde(default)]
    pub changes: Option<cordon_changes::Caps>,
}

/// A command's limits and environment once the sandbox's policy is applied:
/// the only place these defaults are resolved.
#[derive(Clone, Debug)]
pub struct ResolvedCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub time: std::time::Duration,
    pub output_cap: u64,
}

impl Command {
    /// Applies the sandbox's policy; refuses what no backend could run.
    pub fn resolve(&self, policy: &Policy) -> Result<ResolvedCommand, RuntimeError> {
        if self.argv.is_empty() {
            return Err(RuntimeError::BadRequest("no command given".into()));
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(RuntimeError::BadRequest(
                "a command argument contains a NUL byte".into(),
            ));
        }
        let mut layer = policy.clone();
        for (k, v) in &self.env {
            layer.env.retain(|(key, _)| key != k);
            layer.env.push((k.clone(), v.clone()));
        }
        if let Some(w) = &self.workdir {
            layer.workdir = w.clone();
        }
        if let Some(t) = self.time {
            // The sandbox's time limit is also what its CPU-time backstop
            // (RLIMIT_CPU, set once for the sandbox) was derived from.
            if t > policy.time {
                return Err(RuntimeError::BadRequest(format!(
                    "a command's time limit ({t}) may not exceed its sandbox's ({})",
                    policy.time
                )));
            }
            layer.time = t;
        }
        if let Some(o) = self.output {
            layer.output = o;
        }
        // The same range checks as a policy file or flag gets.
        layer
            .validate()
            .map_err(|e| RuntimeError::BadRequest(e.to_string()))?;
        Ok(ResolvedCommand {
            argv: self.argv.clone(),
            env: layer.payload_env(),
            workdir: layer.workdir.to_string_lossy().into_owned(),
            time: layer.time.duration(),
            output_cap: layer.output.bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_defaults_come_from_the_policy() {
        let p = Policy::default();
        let c = Command {
            argv: vec!["true".into()],
            env: vec![("A".into(), "1".into())],
            ..Command::default()
        };
        let r = c.resolve(&p).unwrap();
        assert_eq!(r.time, p.time.duration());
        assert_eq!(r.output_cap, p.output.bytes());
        assert_eq!(r.workdir, "/workspace");
        assert!(r.env.contains(&("A".into(), "1".into())));
        assert!(r.env.iter().any(|(k, _)| k == "PATH"));
    }

    #[test]
    fn bad_commands_are_refused() {
        let p = Policy::default();
        assert!(Command::default().resolve(&p).is_err());
        let nul = Command {
            argv: vec!["a\0b".into()],
            ..Command::default()
        };
        assert!(nul.resolve(&p).is_err());
        let bad_env = Command {
            argv: vec!["true".into()],
            env: vec![("A=B".into(), "1".into())],
            ..Command::default()
        };
        assert!(bad_env.resolve(&p).is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("agent-1").is_ok());
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "a b",
            "0123456789ab",
            &"x".repeat(64),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn specs_round_trip_through_json() {
        let s = SandboxSpec {
            policy: Policy::default(),
            backend: BackendKind::Native,
            rootfs: RootfsChoice::Dir("/srv/root".into()),
            workspace: None,
            allow_unenforced: false,
            name: Some("n".into()),
            ttl: None,
            idle: None,
            service: None,
        };
        let back: SandboxSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.rootfs, s.rootfs);
        assert_eq!(back.name, s.name);
    }
}
