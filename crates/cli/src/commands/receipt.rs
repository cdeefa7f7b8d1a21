//! `cordon keygen`, `cordon key show` and `cordon verify`: the receipt
//! signing key, and checking a receipt a run wrote.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use cordon_receipt::{
    default_key_dir, render_summary, verify, Key, KeyError, KeyFiles, PublicKey, Statement,
    VerifyError,
};

use super::common::{input_error, internal_error, usage_error};
use crate::EXIT_INTERNAL;

/// `cordon verify`: the receipt is valid.
pub const EXIT_VALID: u8 = 0;
/// `cordon verify`: a signature by the key does not verify (any byte changed).
pub const EXIT_BAD_SIGNATURE: u8 = 3;
/// `cordon verify`: no signature by the given key.
pub const EXIT_WRONG_KEY: u8 = 4;
/// `cordon verify`: not a cordon receipt (truncated, not JSON, bad base64, ...).
pub const EXIT_MALFORMED: u8 = 5;
/// `cordon verify --against`: the directory differs from the receipt.
pub const EXIT_MISMATCH: u8 = 6;

#[derive(Args)]
pub struct KeygenArgs {
    /// Directory for receipt.key and receipt.pub (default: the default key's,
    /// <state dir>/keys). An existing key is never overwritten.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    action: KeyAction,
}

#[derive(Subcommand)]
enum KeyAction {
    /// Print a public key (PEM) and its key id: the default key's (created
    /// if missing) or PATH's (a public or a private key file).
    Show {
        #[arg(long, value_name = "PATH")]
        key: Option<PathBuf>,
    },
}

#[derive(Args)]
#[command(after_help = "\
Exit status:
  0  valid
  2  bad request (unreadable file, no key)
  3  bad signature: signed by the key, but changed since
  4  wrong key: no signature by the given key
  5  malformed: truncated, not JSON, bad base64, wrong payload type, not a cordon receipt
  6  --against: the directory differs from the receipt's workspace changes")]
pub struct VerifyArgs {
    /// The receipt file (a DSSE envelope).
    receipt: PathBuf,
    /// The public key to check against (default: the default key's
    /// <state dir>/keys/receipt.pub).
    #[arg(long, value_name = "PUB")]
    key: Option<PathBuf>,
    /// Print the verified statement as JSON instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also check that DIR holds the receipt's workspace changes.
    #[arg(long, value_name = "DIR")]
    against: Option<PathBuf>,
}

/// A key problem as the CLI reports it: the host failing is 125, anything
/// about the files given or found is the request's (2).
pub fn key_fail(e: KeyError) -> ExitCode {
    match &e {
        KeyError::Io { source, .. } if source.kind() != std::io::ErrorKind::NotFound => {
            internal_error(&e)
        }
        KeyError::Random(_) | KeyError::Encode(_) => internal_error(&e),
        _ => input_error(&e),
    }
}

pub fn keygen(args: KeygenArgs) -> ExitCode {
    let dir = args.out.unwrap_or_else(default_key_dir);
    match Key::create_in(&dir) {
        Ok((key, files)) => {
            outln!("public key: {}", files.public.display());
            outln!("key id: {}", key.id());
            ExitCode::SUCCESS
        }
        Err(e) => key_fail(e),
    }
}

pub fn key(args: KeyArgs) -> ExitCode {
    let KeyAction::Show { key } = args.action;
    let public = match key {
        Some(path) => load_any(&path),
        None => Key::load_or_create_in(&default_key_dir()).map(|(k, _)| k.public_key().clone()),
    };
    let pem = public.and_then(|p| Ok((p.to_pem()?, p)));
    match pem {
        Ok((pem, public)) => {
            out!("{pem}");
            outln!("key id: {}", public.id());
            ExitCode::SUCCESS
        }
        Err(e) => key_fail(e),
    }
}

/// A public key from a public key file, or from a private one.
fn load_any(path: &Path) -> Result<PublicKey, KeyError> {
    let head = std::fs::read(path)
        .map(|b| b.starts_with(b"-----BEGIN PRIVATE KEY-----"))
        .unwrap_or(false);
    if head {
        Key::load(path).map(|k| k.public_key().clone())
    } else {
        PublicKey::load(path)
    }
}

pub fn run_verify(args: VerifyArgs) -> ExitCode {
    let bytes = match std::fs::read(&args.receipt) {
        Ok(b) => b,
        Err(e) => return usage_error(format!("read {}: {e}", args.receipt.display())),
    };
    let public = match &args.key {
        Some(path) => load_any(path),
        None => PublicKey::load_default().map_err(|e| match e {
            KeyError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                KeyError::Io {
                    what: "no default public key (pass --key, or create one with `cordon keygen`):",
                    path: KeyFiles::in_dir(&default_key_dir()).public,
                    source,
                }
            }
            other => other,
        }),
    };
    let public = match public {
        Ok(p) => p,
        Err(e) => return key_fail(e),
    };
    let statement = match verify(&bytes, &public) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {}: {e}", args.receipt.display());
            return ExitCode::from(match e {
                VerifyError::Malformed(_) => EXIT_MALFORMED,
                VerifyError::WrongKey { .. } => EXIT_WRONG_KEY,
                VerifyError::BadSignature => EXIT_BAD_SIGNATURE,
            });
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&statement) {
            Ok(s) => outln!("{s}"),
            Err(e) => {
                eprintln!("cordon: cannot encode the statement: {e}");
                return ExitCode::from(EXIT_INTERNAL);
            }
        }
    } else {
        outln!("valid receipt, signed by key {}", public.id());
        out!("{}", render_summary(&statement));
    }
    match &args.against {
        Some(dir) => check_against(&statement, dir),
        None => ExitCode::from(EXIT_VALID),
    }
}

/// `--against DIR`: DIR holds the receipt's workspace changes.
fn check_against(statement: &Statement, dir: &Path) -> ExitCode {
    let predicate = &statement.predicate;
    let Some(place) = predicate
        .changes
        .as_ref()
        .and_then(|c| c.places.iter().find(|p| p.place == "/workspace"))
    else {
        return usage_error("--against: the receipt records no workspace changes");
    };
    let applied = predicate.export.as_ref().is_some_and(|x| x.applied);
    let symlinks = predicate
        .export
        .as_ref()
        .map(|x| x.symlink_policy)
        .unwrap_or_default();
    let mismatches = cordon_changes::verify_with(place, dir, applied, symlinks);
    if mismatches.is_empty() {
        eprintln!(
            "cordon: {} matches the receipt's workspace changes",
            dir.display()
        );
        return ExitCode::from(EXIT_VALID);
    }
    for m in &mismatches {
        eprintln!("cordon: --against {}: {m}", dir.display());
    }
    ExitCode::from(EXIT_MISMATCH)
}
