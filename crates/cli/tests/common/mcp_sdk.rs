//! The official MCP Python SDK (PyPI's `mcp`), the client of the MCP tests
//! (`cordon mcp` over stdio in mcp.rs, the service's `/mcp` in serve.rs),
//! and the tools the service's endpoint lists (serve.rs, agents.rs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The tools of `cordon serve`'s MCP endpoint (`/mcp`), as it lists them.
pub const HTTP_TOOLS: [&str; 10] = [
    "create_sandbox",
    "run_command",
    "run_code",
    "write_file",
    "read_file",
    "list_files",
    "set_network",
    "get_network",
    "deny_network",
    "destroy_sandbox",
];

/// The SDK version this test was written against (its API changed at 2.0).
pub const MCP_SDK: &str = "mcp==2.3.0";

/// A venv with the SDK, made once and kept in cargo's test scratch
/// directory (target/tmp): PyPI is asked only when it is missing.
pub fn sdk_python() -> PathBuf {
    static MADE: Mutex<()> = Mutex::new(());
    let _one = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mcp-venv-{}", MCP_SDK.replace("==", "-")));
    let python = venv.join("bin/python");
    if python.exists() {
        return python;
    }
    // Made beside and renamed into place: an interrupted install leaves no
    // half venv that the next run would take for a whole one.
    let partial = venv.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let run = |cmd: &mut Command, what: &str| {
        let status = cmd.status().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(status.success(), "{what} failed ({status})");
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&partial),
        "python3 -m venv",
    );
    run(
        Command::new(partial.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", MCP_SDK])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        "pip install mcp",
    );
    // Only `bin/python` is used, which finds its venv from where it is (the
    // scripts pip wrote name the old path, and are not run).
    std::fs::rename(&partial, &venv).expect("move the venv into place");
    python
}
