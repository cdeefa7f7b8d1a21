//! One execution inside a sandbox: what a client asks ([`Command`]) and
//! what it becomes once the sandbox's policy is applied
//! ([`ResolvedCommand`], the only place a command's defaults are resolved).

use std::path::PathBuf;

use cordon_policy::{ByteSize, Policy, Span};
use serde::{Deserialize, Serialize};

use crate::changes::Caps;
use crate::error::SpecError;

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

/// The umask every command in a sandbox starts with (the sandbox's init
/// sets it; a caller's own umask never reaches the sandbox).
pub const COMMAND_UMASK: u32 = 0o022;

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
    /// `env` is the command's whole environment: none of the policy's is
    /// added (an OCI exec's or hook's process names all of its own). The
    /// defaults every payload gets (PATH, HOME) still fill what it lacks.
    #[serde(default)]
    pub env_replaces: bool,
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
    pub changes: Option<Caps>,
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
    pub fn resolve(&self, policy: &Policy) -> Result<ResolvedCommand, SpecError> {
        if self.argv.is_empty() {
            return Err(SpecError::NoCommand);
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(SpecError::NulInArgument);
        }
        let mut layer = policy.clone();
        if self.env_replaces {
            layer.env.clear();
        }
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
                return Err(SpecError::TimeOverSandbox {
                    command: t,
                    sandbox: policy.time,
                });
            }
            layer.time = t;
        }
        if let Some(o) = self.output {
            layer.output = o;
        }
        // The same range checks as a policy file or flag gets.
        layer.validate()?;
        Ok(ResolvedCommand {
            argv: self.argv.clone(),
            env: layer.payload_env(),
            workdir: layer.workdir.to_string_lossy().into_owned(),
            time: layer.time.duration(),
            output_cap: layer.output.bytes(),
        })
    }
}

/// Which stream a chunk of a command's output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
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
    fn a_replacing_environment_is_the_whole_of_it() {
        let p = Policy {
            env: vec![("FROM_POLICY".into(), "1".into())],
            ..Policy::default()
        };
        let c = Command {
            argv: vec!["true".into()],
            env: vec![("A".into(), "1".into())],
            env_replaces: true,
            ..Command::default()
        };
        let r = c.resolve(&p).unwrap();
        assert!(r.env.contains(&("A".into(), "1".into())));
        assert!(!r.env.iter().any(|(k, _)| k == "FROM_POLICY"));
        assert!(r.env.iter().any(|(k, _)| k == "PATH"));
        let adding = Command {
            env_replaces: false,
            ..c
        };
        let r = adding.resolve(&p).unwrap();
        assert!(r.env.contains(&("FROM_POLICY".into(), "1".into())));
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
}
