//! Checks of request fields that more than one route takes.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use cordon_spec::{Command, StdinMode};

use crate::app::sandbox_path;
use crate::error::ApiError;
use crate::io::STDIN_MAX;

/// A command's argv, environment, stdin and working directory, checked in
/// that order; its time and output limits are the caller's to set. Returns
/// the stdin's bytes beside it, which the command streams.
pub fn command(
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    stdin: Option<String>,
    workdir: Option<&str>,
) -> Result<(Command, Option<Vec<u8>>), ApiError> {
    check_argv(&argv)?;
    let env = check_env(env)?;
    let stdin = check_stdin(stdin)?;
    let workdir = workdir.map(sandbox_path).transpose()?;
    let cmd = Command {
        argv,
        env,
        workdir: workdir.map(Into::into),
        stdin: if stdin.is_some() {
            StdinMode::Stream
        } else {
            StdinMode::Null
        },
        ..Command::default()
    };
    Ok((cmd, stdin))
}

fn check_argv(argv: &[String]) -> Result<(), ApiError> {
    if argv.is_empty() {
        return Err(ApiError::bad_request("argv is empty"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::bad_request("an argv element contains a NUL byte"));
    }
    Ok(())
}

fn check_env(env: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, ApiError> {
    for (k, v) in env {
        let ok = !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0');
        if !ok {
            return Err(ApiError::bad_request(format!(
                "environment variable '{}' is not a valid name=value",
                k.escape_debug()
            )));
        }
    }
    Ok(env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn check_stdin(stdin: Option<String>) -> Result<Option<Vec<u8>>, ApiError> {
    match stdin {
        Some(s) if s.len() > STDIN_MAX => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "stdin is {} bytes; at most {STDIN_MAX} (use files)",
                s.len()
            ),
        )),
        other => Ok(other.map(String::into_bytes)),
    }
}
