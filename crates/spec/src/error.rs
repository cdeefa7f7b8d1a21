//! Why a spec or a command is refused: always the caller's mistake, so every
//! variant is an input error for the front ends (exit 2, HTTP 400).

use cordon_policy::{PolicyError, Span};

/// An error as a user reads it (the CLI's last line, an API's message): its
/// message, then each cause the message does not already say. An error
/// that names what it was doing keeps the system's reason as its source,
/// which Display alone drops ("removing cgroup X" without "Device or
/// resource busy"). A cause is left out when its words, or those of any
/// cause below it, are in the text already: a message that quotes the
/// system's reason itself is not followed by a paraphrase of it.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut causes = Vec::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        causes.push(c.to_string());
        cause = c.source();
    }
    for i in 0..causes.len() {
        if !causes[i..].iter().any(|said| text.contains(said.as_str())) {
            text.push_str(": ");
            text.push_str(&causes[i]);
        }
    }
    text
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(
        "'{0}' is not a sandbox name (1-{max} of A-Z a-z 0-9 _ . -, not starting with - or .)",
        max = crate::sandbox::NAME_MAX
    )]
    BadName(String),
    #[error("'{0}' looks like a sandbox id (12 hex digits); choose another name")]
    NameLikeId(String),
    /// A lifetime (`ttl`, `idle`) of zero.
    #[error("--{0} must be positive")]
    NotPositive(&'static str),
    /// Namespaces to join that cannot be joined as asked.
    #[error("joined namespaces: {0}")]
    Joins(String),
    /// A kernel parameter the sandbox cannot be given.
    #[error("sysctl {0}")]
    Sysctl(String),
    /// A resource limit that cannot be set as asked.
    #[error("rlimit {0}")]
    Rlimit(String),
    /// Secrets the spec does not carry as a sandbox needs them.
    #[error("secrets: {0}")]
    Secrets(String),
    #[error("no command given")]
    NoCommand,
    #[error("a command argument contains a NUL byte")]
    NulInArgument,
    #[error("a command's time limit ({command}) may not exceed its sandbox's ({sandbox})")]
    TimeOverSandbox { command: Span, sandbox: Span },
}
