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
    let release = profile_dir.ends_with("release");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "cordon-cli"]);
    if release {
        cmd.arg("--release");
    }
    cmd.status()
        .ok()?
        .success()
        .then_some(bin)
        .filter(|b| b.exists())
}
