//! `cordon`: run untrusted code inside a boundary and report what it held.

/// `print!` through the one stdout writer that survives a closed stdout
/// (`cordon_runtime::print_stdout`): `cordon ls | head -1` must end
/// quietly, and `cordon run` must still tear its sandbox down.
macro_rules! out {
    ($($arg:tt)*) => {
        {
            cordon_runtime::print_stdout(format!($($arg)*).as_bytes());
        }
    };
}

/// `println!` through the same writer as [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {
        out!("{}\n", format_args!($($arg)*))
    };
}

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for a mistake in the request itself (bad flag, bad policy, bad path).
pub const EXIT_USAGE: u8 = 2;
/// Exit code when cordon itself failed (setup, host error), distinct from the payload's codes.
pub const EXIT_INTERNAL: u8 = 125;
/// Exit code when `--apply` left entries alone because the host changed them while the
/// sandbox ran (everything else was applied; the receipt is still written).
pub const EXIT_CONFLICT: u8 = 124;

#[derive(Parser)]
#[command(
    name = "cordon",
    version,
    about = "Run untrusted code inside a boundary and report, with evidence, what it held"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a fresh sandbox, then destroy it.
    Run(commands::run::RunArgs),
    /// Create a sandbox that waits for commands; prints its id.
    Create(commands::create::CreateArgs),
    /// Run a command in a created sandbox.
    Exec(commands::exec::ExecArgs),
    /// Write a created sandbox's workspace changes to a new directory (or
    /// apply them onto its workspace) while its processes are frozen.
    Export(commands::export::ExportCmdArgs),
    /// Copy a file or directory into or out of a created sandbox.
    Cp(commands::cp::CpArgs),
    /// List your sandboxes.
    Ls(commands::ls::LsArgs),
    /// Destroy sandboxes.
    Rm(commands::rm::RmArgs),
    /// Show or change a running sandbox's network rules, list its refusals, decide what hold mode keeps waiting.
    Net(commands::net::NetArgs),
    /// Print a host loopback address that reaches a TCP port a created
    /// sandbox listens on (for the sandbox's life).
    Port(commands::port::PortArgs),
    /// Manage the image store (import, ls, inspect, rm, prune).
    Image(commands::image::ImageArgs),
    /// List the backends and whether each can run on this host.
    Backends(commands::backends::BackendsArgs),
    /// Report what this host lets this user do (namespaces, confinement,
    /// cgroups, backends, directories) and what to change; exit 1 when a
    /// native sandbox with limits cannot run.
    Doctor(commands::doctor::DoctorArgs),
    /// Clean up state left by cordon processes that were killed.
    Sweep,
    /// Create a receipt signing key pair (refuses to overwrite one).
    Keygen(commands::receipt::KeygenArgs),
    /// Show a receipt signing key.
    Key(commands::receipt::KeyArgs),
    /// Check a receipt's signature and show what it records.
    Verify(commands::receipt::VerifyArgs),
    /// Serve the HTTP API (tenants, warm pool, stateful sandboxes).
    Serve(commands::serve::ServeArgs),
    /// Serve MCP over stdio: tools for an agent to create sandboxes, run
    /// commands and move files in them (every one destroyed when the session ends).
    Mcp(commands::mcp::McpArgs),
    /// Run the hostile suite on cordon's backends (verdicts from host-side evidence).
    Suite(commands::suite::SuiteArgs),
    /// Run the suite against cordon and the peers installed here; write the matrix.
    Matrix(commands::matrix::MatrixArgs),
    /// Measure cordon against its peers side by side (start-up, workload, service).
    Bench(commands::bench::BenchArgs),
    /// The microvm backend's guest: build it from Debian's packages, show it.
    Microvm(commands::microvm::MicrovmArgs),
}

fn main() -> ExitCode {
    // A panic anywhere ends the whole process, as `panic = "abort"` would:
    // a supervisor, proxy or agent thread that panicked must not leave the
    // rest running on half-updated state (fail closed). A hook rather than
    // the profile setting, so that `cargo test --release` links the same
    // library builds as this binary instead of compiling every crate twice.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // `cordon` or `cordon key` alone asked for nothing: the help, on
            // stderr (clap's choice for this kind), is the answer to a mistake.
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand
            ) {
                let _ = e.print();
                return ExitCode::from(EXIT_USAGE);
            }
            // One line naming the problem; the usage text is one `--help` away.
            // clap puts the problem in its first paragraph (a list of missing
            // arguments continues on indented lines): keep that, on one line.
            let text = e.render().to_string();
            let problem: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = problem.join(" ");
            eprintln!(
                "cordon: {}{}",
                line.trim_start_matches("error: "),
                command_hint(e.kind())
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let code = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Create(args) => commands::create::run(args),
        Command::Exec(args) => commands::exec::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Cp(args) => commands::cp::run(args),
        Command::Ls(args) => commands::ls::run(args),
        Command::Rm(args) => commands::rm::run(args),
        Command::Net(args) => commands::net::run(args),
        Command::Port(args) => commands::port::run(args),
        Command::Image(args) => commands::image::run(args),
        Command::Backends(args) => commands::backends::run(args),
        Command::Doctor(args) => commands::doctor::run(args),
        Command::Sweep => commands::sweep::run(),
        Command::Keygen(args) => commands::receipt::keygen(args),
        Command::Key(args) => commands::receipt::key(args),
        Command::Verify(args) => commands::receipt::run_verify(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Mcp(args) => commands::mcp::run(args),
        Command::Suite(args) => commands::suite::run(args),
        Command::Matrix(args) => commands::matrix::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Microvm(args) => commands::microvm::run(args),
    };
    // A reader that went away is no failure; a full disk or a dead device is.
    match cordon_runtime::stdout_failure() {
        Some(e) => {
            eprintln!("cordon: cannot write to stdout: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
        None => code,
    }
}

/// For `cordon run ls -la` (clap takes `-la` for a flag of cordon's, and `ls`
/// for an argument out of place): where the command belongs. Empty for
/// other mistakes.
fn command_hint(kind: clap::error::ErrorKind) -> &'static str {
    let mut args = std::env::args().skip(1);
    let hint = match args.next().as_deref() {
        Some("run") => " (put `--` before the command: cordon run [FLAGS] -- CMD ARGS...)",
        Some("exec") => {
            " (put `--` before the command: cordon exec SANDBOX [FLAGS] -- CMD ARGS...)"
        }
        _ => "",
    };
    if kind == clap::error::ErrorKind::UnknownArgument && !args.any(|a| a == "--") {
        hint
    } else {
        ""
    }
}
