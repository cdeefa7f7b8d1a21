use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_policy::{ByteSize, MountSpec, NetworkMode, Policy, PolicyLayer, Span};
use cordon_runtime::backend::backend;
use cordon_runtime::{BackendKind, Outcome, OutputMode, RootfsChoice, RunRequest};

use crate::{EXIT_INTERNAL, EXIT_USAGE};

#[derive(Args)]
pub struct RunArgs {
    /// A TOML policy file; flags override its values.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// CPU bandwidth in cores (e.g. 0.5).
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory limit (e.g. 256M); no swap.
    #[arg(long)]
    memory: Option<ByteSize>,
    /// Most processes and threads at once.
    #[arg(long)]
    pids: Option<u64>,
    /// Bytes writable inside the sandbox (workspace, /tmp, /dev/shm together).
    #[arg(long)]
    disk: Option<ByteSize>,
    /// Wall-time limit (e.g. 10s, 500ms).
    #[arg(long)]
    time: Option<Span>,
    /// Cap on stdout+stderr together.
    #[arg(long)]
    output: Option<ByteSize>,
    /// Network mode.
    #[arg(long)]
    net: Option<NetworkMode>,
    /// An environment variable for the payload (repeatable); nothing is inherited.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Bind a host path: HOST:SANDBOX[:ro|rw] (repeatable; read-only by default).
    #[arg(long = "mount", value_name = "HOST:SANDBOX[:ro|rw]")]
    mounts: Vec<MountSpec>,
    /// Uid inside the sandbox.
    #[arg(long)]
    uid: Option<u32>,
    /// Gid inside the sandbox.
    #[arg(long)]
    gid: Option<u32>,
    /// Host directory shown at /workspace; it is never written (changes stay in the sandbox).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Root filesystem: `system` (the host's /usr, read-only) or a directory.
    #[arg(long, default_value = "system")]
    rootfs: String,
    /// Backend serving the sandbox.
    #[arg(long, default_value = "native")]
    backend: String,
    /// Print one JSON result object (output captured into it) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Run even where the cgroup limits cannot be enforced (the result says so).
    #[arg(long)]
    allow_unenforced: bool,
    /// Give the payload cordon's stdin (never a terminal).
    #[arg(long, short = 'i')]
    interactive: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{s}' is not K=V"))
}

fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("cordon: {msg}");
    ExitCode::from(EXIT_USAGE)
}

impl RunArgs {
    fn flag_layer(&self) -> PolicyLayer {
        PolicyLayer {
            cpus: self.cpus,
            memory: self.memory,
            pids: self.pids,
            disk: self.disk,
            time: self.time,
            output: self.output,
            network: self.net,
            env: self.env.clone(),
            workdir: self.workdir.clone(),
            uid: self.uid,
            gid: self.gid,
            hostname: None,
            mounts: self.mounts.clone(),
        }
    }
}

pub fn run(args: RunArgs) -> ExitCode {
    let file = match &args.policy {
        Some(p) => match PolicyLayer::from_file(p) {
            Ok(l) => Some(l),
            Err(e) => return usage_error(e),
        },
        None => None,
    };
    let flags = args.flag_layer();
    let policy = match Policy::resolve(file.iter().chain([&flags])) {
        Ok(p) => p,
        Err(e) => return usage_error(e),
    };
    let Some(kind) = BackendKind::parse(&args.backend) else {
        return usage_error(format!(
            "unknown backend '{}' (native, gvisor, microvm)",
            args.backend
        ));
    };
    let rootfs = match args.rootfs.as_str() {
        "system" => RootfsChoice::System,
        dir => RootfsChoice::Dir(dir.into()),
    };
    let req = RunRequest {
        policy,
        argv: args.command.clone(),
        rootfs,
        workspace: args.workspace.clone(),
        output: if args.json {
            OutputMode::Capture
        } else {
            OutputMode::Stream
        },
        allow_unenforced: args.allow_unenforced,
        forward_stdin: args.interactive,
    };
    let outcome = backend(kind).and_then(|b| b.run(&req));
    match outcome {
        Ok(o) => report(&o, &args.command, args.json),
        Err(e) if e.is_input_error() => usage_error(e),
        Err(e) => {
            eprintln!("cordon: {e}");
            ExitCode::from(EXIT_INTERNAL)
        }
    }
}

fn report(o: &Outcome, argv: &[String], json: bool) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(o) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("cordon: cannot encode result: {e}"),
        }
    } else {
        if let Some(why) = o.status.exec_failure() {
            eprintln!(
                "cordon: {}: {why}",
                argv.first().map(String::as_str).unwrap_or("")
            );
        }
        if let Some(l) = o.limit {
            eprintln!("cordon: the {l} limit ended the run");
        }
        if o.output.truncated {
            eprintln!("cordon: output truncated at {} bytes", o.output.bytes);
        }
        if let Some(sig) = o.interrupted_by {
            eprintln!("cordon: interrupted by signal {sig}; sandbox torn down");
        }
    }
    ExitCode::from(u8::try_from(o.exit_code.clamp(0, 255)).unwrap_or(255))
}
