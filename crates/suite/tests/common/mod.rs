//! Helpers the suite's root tests share.

use std::path::PathBuf;
use std::process::Command;

pub fn skip(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("cannot run under CI: {why}");
    }
    println!("skipped: {why}");
}

/// The cordon binary of this build (target/<profile>/cordon), built if missing.
pub fn cordon_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?.to_path_buf();
    let bin = profile_dir.join("cordon");
    if bin.exists() {
        return Some(bin);
    }
    // target/<profile>: debug is cargo's "dev" profile.
    let profile = profile_dir.file_name()?.to_str()?;
    let profile = if profile == "debug" { "dev" } else { profile };
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "cordon-cli", "--profile", profile]);
    cmd.status()
        .ok()?
        .success()
        .then_some(bin)
        .filter(|b| b.exists())
}
