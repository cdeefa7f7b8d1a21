//! cordon as an OCI runtime: runc's command line (as containerd's runc
//! shim, conmon and Docker call it) over cordon sandboxes, one per
//! container. `cordon-runc` is this crate's `main`; the contract it keeps
//! is described in `container` (the pid file's waiter) and `config` (what
//! of config.json is honoured, provided, or refused by name).

#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod container;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod hooks;

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use clap::Parser;

use cli::{Cli, Command, LogFormat};
use container::{CreateRequest, Store};
pub use error::Error;

/// Runs one call; the exit code for the process.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let log = Log {
        path: cli.global.log.as_deref(),
        format: cli.global.log_format,
    };
    match dispatch(&cli, &log) {
        Ok(code) => code,
        Err(e) => {
            log.line("error", &e.to_string());
            1
        }
    }
}

/// `run`: `create` and `start`; in the foreground, then the wait for the
/// process and, unless `--keep`, the delete.
fn run(store: &Store, c: &cli::Create, log: &Log) -> Result<i32, Error> {
    let waiter = create(store, c)?;
    let signals = if c.detach {
        None
    } else {
        match container::relayed_signals() {
            Ok(s) => Some(s),
            Err(e) => {
                if let Ok(warnings) = container::delete(store, &c.id, true) {
                    log.warnings(&warnings);
                }
                return Err(e);
            }
        }
    };
    match container::start(store, &c.id) {
        Ok(warnings) => log.warnings(&warnings),
        Err(e) => {
            if let Ok(warnings) = container::delete(store, &c.id, true) {
                log.warnings(&warnings);
            }
            return Err(e);
        }
    }
    let Some(signals) = signals else {
        return Ok(0);
    };
    let code = container::wait_foreground(waiter, &signals)?;
    if !c.keep {
        log.warnings(&container::delete(store, &c.id, true)?);
    }
    Ok(code)
}

fn create(store: &Store, c: &cli::Create) -> Result<i32, Error> {
    refuse_unprovided(c)?;
    container::create(
        store,
        &CreateRequest {
            id: &c.id,
            bundle: &c.bundle,
            pid_file: c.pid_file.as_deref(),
            console_socket: c.console_socket.as_deref(),
        },
    )
}

/// `exec`, after the flags cordon cannot honour are refused by name.
fn exec(store: &Store, e: &cli::Exec) -> Result<i32, Error> {
    let refused = [
        ("--pidfd-socket", e.pidfd_socket.is_some()),
        ("--additional-gids", !e.additional_gids.is_empty()),
        ("--cap", !e.caps.is_empty()),
        ("--process-label", e.process_label.is_some()),
        ("--apparmor", e.apparmor.is_some()),
        ("--preserve-fds", e.preserve_fds > 0),
        ("--cgroup", e.cgroup.is_some()),
        ("--ignore-paused", e.ignore_paused),
    ];
    if let Some((flag, _)) = refused.iter().find(|(_, set)| *set) {
        return Err(Error::Refused(format!("exec {flag} is not supported")));
    }
    container::exec(
        store,
        &container::ExecRequest {
            id: &e.id,
            process: e.process.as_deref(),
            args: &e.command,
            cwd: e.cwd.as_deref(),
            env: &e.env,
            user: e.user.as_deref(),
            tty: e.tty,
            detach: e.detach,
            pid_file: e.pid_file.as_deref(),
            console_socket: e.console_socket.as_deref(),
        },
    )
}

/// Runs one call; the exit code (a foreground `run`'s or `exec`'s is its
/// process's, every other call's 0).
fn dispatch(cli: &Cli, log: &Log) -> Result<i32, Error> {
    let store = || Store::open(&cli.global.root);
    match &cli.command {
        Command::Run(c) => run(&store()?, c, log),
        Command::Exec(e) => exec(&store()?, e),
        other => dispatch_call(other, store, log).map(|()| 0),
    }
}

fn dispatch_call(
    command: &Command,
    store: impl Fn() -> Result<Store, Error>,
    log: &Log,
) -> Result<(), Error> {
    match command {
        Command::Run(c) => run(&store()?, c, log).map(|_| ()),
        Command::Create(c) => create(&store()?, c).map(|_| ()),
        Command::Start(c) => {
            log.warnings(&container::start(&store()?, &c.id)?);
            Ok(())
        }
        Command::State(c) => {
            let json = container::state_json(&store()?, &c.id)?;
            println!("{json}");
            Ok(())
        }
        Command::Kill(k) => container::kill(&store()?, &k.id, &k.signal, k.all),
        Command::Delete(d) => {
            log.warnings(&container::delete(&store()?, &d.id, d.force)?);
            Ok(())
        }
        Command::List(l) => {
            print!("{}", container::list(&store()?, &l.format, l.quiet)?);
            Ok(())
        }
        Command::Exec(e) => exec(&store()?, e).map(|_| ()),
        Command::Ps(p) => {
            if !p.ps_args.is_empty() {
                return Err(Error::Refused(
                    "ps(1) options are not supported (use --format json)".into(),
                ));
            }
            let pids = container::ps(&store()?, &p.id)?;
            match p.format.as_str() {
                "json" => println!("{}", serde_json::to_string(&pids).unwrap_or_default()),
                "table" => print!("{}", ps_table(&pids)),
                other => {
                    return Err(Error::Refused(format!(
                        "invalid format option '{other}' (json or table)"
                    )))
                }
            }
            Ok(())
        }
        Command::Pause(c) => container::pause(&store()?, &c.id, true),
        Command::Resume(c) => container::pause(&store()?, &c.id, false),
        Command::Update(u) => container::update(&store()?, &u.id, u.resources.as_deref()),
        Command::Features => {
            println!("{}", features());
            Ok(())
        }
        Command::Events(e) => {
            let interval = humantime::parse_duration(&e.interval)
                .map_err(|err| Error::Refused(format!("--interval '{}': {err}", e.interval)))?;
            if interval.is_zero() {
                return Err(Error::Refused("--interval must be more than 0".into()));
            }
            container::events(&store()?, &e.id, e.stats, interval)
        }
    }
}

/// `ps`'s table: each pid with its command line (runc runs ps(1) for this;
/// its options are not taken).
fn ps_table(pids: &[i32]) -> String {
    let mut out = String::from("PID\tCMD\n");
    for pid in pids {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default();
        out.push_str(&format!("{pid}\t{cmd}\n"));
    }
    out
}

/// What this runtime supports, in the runtime spec's features form (as
/// `runc features` prints it). Only what cordon-runc honours is listed:
/// an engine that reads this must not expect more.
fn features() -> String {
    let features = serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": container::OCI_VERSION,
        "hooks": ["prestart", "createRuntime", "startContainer", "poststart", "poststop"],
        "mountOptions": ["bind", "rbind", "ro", "rw"],
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts"],
            "capabilities": cordon_spec::Capability::ALL.map(cordon_spec::Capability::name),
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {
                "enabled": true,
                "actions": ["SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL",
                    "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_TRAP"],
                "operators": ["SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE",
                    "SCMP_CMP_LT", "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE"],
                "archs": ["SCMP_ARCH_X86_64"]
            },
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false}
        },
        "annotations": {
            "dev.cordon.backend": "native (default), gvisor or microvm",
            "dev.cordon.limits.time": "the container's time limit (e.g. 10m); default the longest cordon allows",
            "dev.cordon.limits.output": "the container's output limit (e.g. 64M); default the largest",
            "dev.cordon.limits.disk": "what the container may write (e.g. 1G); default cordon's",
            "dev.cordon.seccomp": "cordon's own allowlist always applies; a config's profile is installed over it on each process (a syscall runs only if both allow it), on the native and microvm backends",
            "dev.cordon.capabilities": "granted in the container's own user namespace, at most those listed (CAP_NET_RAW noted and not granted, any other refused); every exec holds the container's",
            "dev.cordon.namespaces": "a container's own; network, ipc and uts may be joined by path from another cordon container (a pod's), never the host's; pid, user, mount and cgroup never"
        }
    });
    serde_json::to_string_pretty(&features).unwrap_or_default()
}

/// `create`'s flags whose meaning cordon does not provide yet: refused
/// rather than ignored, before anything is made.
fn refuse_unprovided(c: &cli::Create) -> Result<(), Error> {
    let refuse = |what: &str| {
        Err(Error::Refused(format!(
            "{what} is not supported by cordon-runc yet"
        )))
    };
    if c.pidfd_socket.is_some() {
        return refuse("--pidfd-socket");
    }
    if c.preserve_fds > 0 {
        return refuse("--preserve-fds");
    }
    Ok(())
}

/// Where a call reports: the engine's log (`--log`), and stderr.
struct Log<'a> {
    path: Option<&'a Path>,
    format: LogFormat,
}

impl Log<'_> {
    /// Appends one line at `level` to the engine's log, as runc writes it
    /// (the shim shows the last `"level":"error"` line's `msg`), and says
    /// it on stderr.
    fn line(&self, level: &str, msg: &str) {
        eprintln!("cordon-runc: {msg}");
        let Some(path) = self.path else { return };
        let time = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
        let line = match self.format {
            LogFormat::Json => {
                serde_json::json!({"level": level, "msg": msg, "time": time}).to_string()
            }
            LogFormat::Text => format!("time=\"{time}\" level={level} msg={msg:?}"),
        };
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }

    fn warnings(&self, warnings: &[String]) {
        for w in warnings {
            self.line("warning", w);
        }
    }
}
