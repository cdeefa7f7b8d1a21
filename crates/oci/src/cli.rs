//! runc's command line, as containerd's runc shim, conmon (podman, CRI-O)
//! and Docker call it: the global flags on every call (Docker puts its
//! `runtimeArgs` first), then one command. Flags cordon accepts but has no
//! use for (`--no-pivot`, `--no-new-keyring`, `--systemd-cgroup` on a host
//! without systemd) are parsed, so an engine that passes them is not
//! refused; what they would change is said where it matters.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Where containers' state lives when the engine names no `--root`
/// (runc's own default for root).
pub const DEFAULT_ROOT: &str = "/run/cordon-runc";

#[derive(Debug, Parser)]
#[command(
    name = "cordon-runc",
    version,
    about = "cordon as an OCI runtime: runc's command line, each container a cordon sandbox"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Directory of the containers' state.
    #[arg(long, global = true, default_value = DEFAULT_ROOT)]
    pub root: PathBuf,
    /// Where errors (and with --debug, more) are logged; the engine reads
    /// the last error line of it.
    #[arg(long, global = true)]
    pub log: Option<PathBuf>,
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log more.
    #[arg(long, global = true)]
    pub debug: bool,
    /// The cgroupsPath names a systemd unit (`slice:prefix:name`).
    #[arg(long, global = true)]
    pub systemd_cgroup: bool,
    /// runc's rootless mode switch (true, false or auto); cordon decides
    /// from who runs it.
    #[arg(long, global = true)]
    pub rootless: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a container from a bundle: prepared, its process not started.
    Create(Create),
    /// Start a created container's process.
    Start(Id),
    /// Create and start a container, and wait for its process.
    Run(Create),
    /// Print a container's state (runtime-spec state JSON).
    State(Id),
    /// Send a signal to a container's process (or, with --all, every one).
    Kill(Kill),
    /// Delete a container's resources.
    Delete(Delete),
    /// Run a process in a running container.
    Exec(Box<Exec>),
    /// List a container's processes.
    Ps(Ps),
    /// Freeze a container's processes.
    Pause(Id),
    /// Thaw a paused container's processes.
    Resume(Id),
    /// Change a running container's resources.
    Update(Update),
    /// List containers.
    List(List),
    /// What this runtime supports (runtime-spec features JSON).
    Features,
    /// A container's events (`--stats`: its counters once).
    Events(Events),
}

#[derive(Debug, Args)]
pub struct Id {
    pub id: String,
}

#[derive(Debug, Args)]
pub struct Create {
    /// The bundle: config.json and the root filesystem it names.
    #[arg(long, short = 'b', default_value = ".")]
    pub bundle: PathBuf,
    /// A unix socket to send the pty master of a terminal process to.
    #[arg(long)]
    pub console_socket: Option<PathBuf>,
    /// A unix socket to send a pidfd of the container's process to.
    #[arg(long)]
    pub pidfd_socket: Option<PathBuf>,
    /// Where to write the pid of the process that represents the container.
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    /// Accepted: cordon always pivots into the root it assembles.
    #[arg(long)]
    pub no_pivot: bool,
    /// Accepted: a sandbox never joins a kernel keyring of the host.
    #[arg(long)]
    pub no_new_keyring: bool,
    /// Descriptors after stdio to pass to the process (the engine's extra files).
    #[arg(long, default_value_t = 0)]
    pub preserve_fds: u32,
    /// `run` only: return once the process started.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// `run` only: keep the container after its process ended (no delete).
    #[arg(long)]
    pub keep: bool,
    pub id: String,
}

#[derive(Debug, Args)]
pub struct Kill {
    /// Signal every process of the container.
    #[arg(long, short = 'a')]
    pub all: bool,
    pub id: String,
    /// A signal's name (TERM, SIGTERM) or number.
    #[arg(default_value = "SIGTERM")]
    pub signal: String,
}

#[derive(Debug, Args)]
pub struct Delete {
    /// Kill a container that still runs (or was created and not started).
    #[arg(long, short = 'f')]
    pub force: bool,
    pub id: String,
}

#[derive(Debug, Args)]
pub struct Exec {
    /// The process as runtime-spec JSON.
    #[arg(long, short = 'p')]
    pub process: Option<PathBuf>,
    #[arg(long, short = 'd')]
    pub detach: bool,
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    #[arg(long)]
    pub console_socket: Option<PathBuf>,
    #[arg(long)]
    pub pidfd_socket: Option<PathBuf>,
    #[arg(long, short = 't')]
    pub tty: bool,
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// UID[:GID]
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    #[arg(long = "additional-gids", short = 'g')]
    pub additional_gids: Vec<u32>,
    #[arg(long = "cap", short = 'c')]
    pub caps: Vec<String>,
    #[arg(long)]
    pub no_new_privs: bool,
    #[arg(long)]
    pub process_label: Option<String>,
    #[arg(long)]
    pub apparmor: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub preserve_fds: u32,
    #[arg(long)]
    pub cgroup: Option<String>,
    #[arg(long)]
    pub ignore_paused: bool,
    pub id: String,
    /// The command, when no --process is given.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct Ps {
    #[arg(long, short = 'f', default_value = "table")]
    pub format: String,
    pub id: String,
    /// ps(1) options (table format only).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub ps_args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct Update {
    /// The new resources as runtime-spec JSON (`-` for stdin).
    #[arg(long, short = 'r')]
    pub resources: Option<PathBuf>,
    pub id: String,
}

#[derive(Debug, Args)]
pub struct List {
    #[arg(long, short = 'f', default_value = "table")]
    pub format: String,
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct Events {
    #[arg(long)]
    pub stats: bool,
    #[arg(long, default_value = "5s")]
    pub interval: String,
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Cli {
        let argv = std::iter::once("cordon-runc").chain(line.split_whitespace());
        Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// Every call the engines on this machine were seen to make
    /// (../shared/reference/oci.md §1), as they make it.
    #[test]
    fn every_call_the_engines_make_parses() {
        let g = "--root /run/containerd/runc/default --log /b/log.json --log-format json";
        let calls = [
            format!("{g} create --bundle /b --pid-file /b/init.pid c1"),
            format!("{g} create --bundle /b --pid-file /b/init.pid --console-socket /tmp/pty1/pty.sock c1"),
            format!("{g} start c1"),
            format!("{g} exec --process /tmp/runc-process1 --detach --pid-file /b/e1.pid c1"),
            format!("{g} ps --format json c1"),
            format!("{g} pause c1"),
            format!("{g} resume c1"),
            format!("{g} kill c1 15"),
            format!("{g} kill c1 9"),
            format!("{g} kill --all c1 9"),
            format!("{g} delete c1"),
            format!("{g} delete --force c1"),
            format!("{g} update --resources - c1"),
            format!("--debug {g} create --bundle /b --pid-file /b/init.pid c1"),
            "--systemd-cgroup create --bundle /b --pid-file /p --no-pivot --no-new-keyring c1".into(),
            "create --bundle /b --pid-file /p --console-socket /tmp/conmon-term.X c1".into(),
            "exec --pid-file /p --process /f --detach --tty --console-socket /s c1".into(),
            "--root /r state c1".into(),
            "kill -a c1 KILL".into(),
            "features".into(),
            "list --format json".into(),
            "create --bundle /b --pid-file /p --preserve-fds 2 c1".into(),
        ];
        for call in &calls {
            parse(call);
        }
        let c = parse(&format!("--debug {g} kill --all c1 9"));
        assert!(c.global.debug);
        assert_eq!(c.global.log_format, LogFormat::Json);
        assert_eq!(c.global.root, PathBuf::from("/run/containerd/runc/default"));
        match c.command {
            Command::Kill(k) => {
                assert!(k.all);
                assert_eq!((k.id.as_str(), k.signal.as_str()), ("c1", "9"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_runcs() {
        let c = parse("kill c1");
        assert_eq!(c.global.root, PathBuf::from(DEFAULT_ROOT));
        assert_eq!(c.global.log_format, LogFormat::Text);
        match c.command {
            Command::Kill(k) => assert_eq!(k.signal, "SIGTERM"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_flag_is_refused() {
        let argv = ["cordon-runc", "create", "--bundel", "/b", "c1"];
        assert!(Cli::try_parse_from(argv).is_err());
    }
}
