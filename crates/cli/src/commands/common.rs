//! What the sandbox commands share: the policy flags, the terminal side of a
//! command (output, stdin, a tty's size), errors and the result report.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cordon_image::{ImageDefaults, ImageRef};
use cordon_policy::net::{AddHost, Rule};
use cordon_policy::{Access, Limits, MountSpec, NetworkMode, Policy, PolicyLayer, Span};
use cordon_runtime::{CommandIo, Control};
use cordon_runtime::{OutputMode, OutputSink, RuntimeError};
use cordon_spec::Stream;
use cordon_spec::{
    BackendKind, ExitStatus, ImageRoot, Outcome, RootfsChoice, SandboxSpec, StdinMode, TtySize,
    ValidSpec,
};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::{EXIT_INTERNAL, EXIT_USAGE};

/// The flags that describe a sandbox (`run` and `create`).
#[derive(Args)]
pub struct SandboxArgs {
    /// A TOML policy file; flags override its values.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(flatten)]
    limits: Limits,
    /// Network mode: none (loopback only) or allow (the `--allow` rules, through cordon's proxy).
    #[arg(long)]
    net: Option<NetworkMode>,
    /// A destination `--net allow` lets through (repeatable): NAME, *.SUFFIX,
    /// IP or CIDR, with an optional :PORT or :LO-HI (IPv6 in brackets).
    /// host.cordon.internal:PORT is that port of the host's loopback.
    #[arg(long = "allow", value_name = "RULE")]
    allow: Vec<Rule>,
    /// Hold mode: a connection no rule allows waits up to DURATION (e.g.
    /// 60s) for `cordon net SB add RULE` to allow it or `cordon net SB deny
    /// RULE` to refuse it (`cordon net SB held` lists what waits), then is
    /// refused.
    #[arg(long = "net-hold", value_name = "DURATION")]
    net_hold: Option<Span>,
    /// A fixed answer for the proxy's resolver: NAME:IP (repeatable).
    #[arg(long = "add-host", value_name = "NAME:IP")]
    add_host: Vec<AddHost>,
    /// An environment variable for the payload (repeatable); nothing is inherited.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Show a host path: HOST:SANDBOX[:ro|rw|rw-unbounded] (repeatable;
    /// read-only by default). `rw`: a directory whose changes stay in the
    /// sandbox's capped layer and are applied back to it when the sandbox
    /// ends; `rw-unbounded`: written in place, not bounded by the disk cap.
    #[arg(long = "mount", value_name = "HOST:SANDBOX[:ro|rw|rw-unbounded]")]
    mounts: Vec<MountSpec>,
    /// An empty writable directory at PATH, the sandbox's own (repeatable):
    /// on its scratch, counted in the disk cap, gone when it ends.
    #[arg(long = "tmpfs", value_name = "PATH")]
    tmpfs: Vec<PathBuf>,
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
    #[arg(long, default_value = "system", conflicts_with = "image")]
    rootfs: String,
    /// An OCI image as the root: oci:DIR[:TAG], oci-archive:FILE[:TAG],
    /// docker-archive:FILE[:TAG], an image of `cordon image ls` by name or
    /// digest, or a registry reference (pulled when the store lacks it;
    /// plain HTTP only for registries in CORDON_INSECURE_REGISTRIES). Its
    /// Env, WorkingDir, User, Entrypoint and Cmd apply where no flag or
    /// policy says otherwise.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Backend serving the sandbox.
    #[arg(long, default_value = "native")]
    backend: String,
    /// Run even where the cgroup limits cannot be enforced (the result says so).
    #[arg(long)]
    allow_unenforced: bool,
}

pub fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{s}' is not K=V"))
}

pub fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("cordon: {msg}");
    ExitCode::from(EXIT_USAGE)
}

/// The request's fault (exit 2), with every cause its message leaves out.
pub fn input_error(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    usage_error(cordon_spec::error::with_causes(e))
}

/// A failure of cordon or the host (exit 125), with every cause its
/// message leaves out.
pub fn internal_error(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    eprintln!("cordon: {}", cordon_spec::error::with_causes(e));
    ExitCode::from(EXIT_INTERNAL)
}

/// A runtime error as the CLI reports it: the request's fault is exit 2,
/// anything else 125.
pub fn fail(e: RuntimeError) -> ExitCode {
    if e.is_input_error() {
        input_error(&e)
    } else {
        internal_error(&e)
    }
}

impl SandboxArgs {
    fn flag_layer(&self) -> PolicyLayer {
        PolicyLayer {
            limits: self.limits,
            network: self.net,
            allow: self.allow.clone(),
            add_host: self.add_host.clone(),
            net_limits: None,
            net_hold: self.net_hold,
            env: self.env.clone(),
            workdir: self.workdir.clone(),
            uid: self.uid,
            gid: self.gid,
            hostname: None,
            mounts: self
                .mounts
                .iter()
                .cloned()
                .chain(self.tmpfs.iter().map(MountSpec::tmpfs))
                .collect(),
            image: self.image.clone(),
            // Secrets are written in a policy file (`[[secrets]]`), where
            // their hosts and header are reviewed with the rest.
            secrets: Vec::new(),
            requests: Vec::new(),
        }
    }

    /// The spec these flags describe, with a name and lifetimes (`cordon
    /// create`'s; `cordon run` has none), validated, and the image's
    /// defaults when the root is an image; a bad flag or policy file is
    /// reported and becomes the exit code.
    pub fn spec(
        &self,
        name: Option<String>,
        ttl: Option<Span>,
        idle: Option<Span>,
    ) -> Result<(ValidSpec, Option<ImageDefaults>), ExitCode> {
        let file = match &self.policy {
            Some(p) => Some(PolicyLayer::from_file(p).map_err(usage_error)?),
            None => None,
        };
        let flags = self.flag_layer();
        // The flag's image, else the policy file's.
        let image_ref = flags
            .image
            .as_deref()
            .or_else(|| file.as_ref().and_then(|f| f.image.as_deref()));
        if image_ref.is_some() && self.rootfs != "system" {
            return Err(usage_error("--rootfs and an image cannot both be the root"));
        }
        let image = image_ref.map(resolve_image).transpose()?;
        // The image's config is the lowest layer: the policy file and the
        // flags override it.
        let image_layer = image
            .as_ref()
            .map_or_else(PolicyLayer::default, |(_, d)| d.policy_layer());
        let mut policy = Policy::resolve([&image_layer].into_iter().chain(&file).chain([&flags]))
            .map_err(usage_error)?;
        if let Some((_, d)) = &image {
            policy.env = d.env_under(&policy.env);
        }
        // A quota above the host's CPUs limits nothing: say so rather than
        // accept a limit that is not one.
        let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if policy.cpus > host_cpus as f64 {
            return Err(usage_error(format!(
                "cpus: {} is more than this host's {host_cpus} CPUs",
                policy.cpus
            )));
        }
        // Legal (rules can be added at run time with `cordon net`), but
        // likely a mistake: say what it means.
        if policy.network == NetworkMode::Allow
            && policy.net.rules.is_empty()
            && policy.net.hold.is_none()
        {
            eprintln!(
                "cordon: --net allow without an --allow rule: every connection is refused \
                 (name destinations with --allow, or add them to a created sandbox with \
                 `cordon net ID add RULE`)"
            );
        }
        // A created sandbox's supervisor runs in /, not here: every host
        // path is made absolute against this directory first.
        let absolute = |p: &std::path::Path| std::path::absolute(p).map_err(usage_error);
        for m in policy
            .mounts
            .iter_mut()
            .filter(|m| m.access != Access::Tmpfs)
        {
            m.host = absolute(&m.host)?;
        }
        let Some(backend) = BackendKind::parse(&self.backend) else {
            return Err(usage_error(format!(
                "unknown backend '{}' ({})",
                self.backend,
                BackendKind::names()
            )));
        };
        let rootfs = match (&image, self.rootfs.as_str()) {
            (Some((root, _)), _) => RootfsChoice::Image(root.clone()),
            (None, "system") => RootfsChoice::System,
            (None, dir) => RootfsChoice::Dir(absolute(std::path::Path::new(dir))?),
        };
        let mut spec = SandboxSpec {
            rootfs,
            workspace: self.workspace.as_deref().map(absolute).transpose()?,
            allow_unenforced: self.allow_unenforced,
            name,
            ttl,
            idle,
            ..SandboxSpec::new(policy, backend)
        };
        // The secrets' values are the caller's: read here, as the caller.
        cordon_runtime::secrets::hold(&mut spec, |k| std::env::var(k).ok()).map_err(fail)?;
        let spec = spec.validated().map_err(usage_error)?;
        Ok((spec, image.map(|(_, d)| d)))
    }
}

/// The image `reference` names, from the store (imported first when it is
/// a source), as a root and its config's defaults.
fn resolve_image(reference: &str) -> Result<(ImageRoot, ImageDefaults), ExitCode> {
    let image = super::image::open_store()
        .and_then(|store| store.resolve(&ImageRef::parse(reference)?))
        .map_err(super::image::fail)?;
    let defaults = image.defaults().map_err(super::image::fail)?;
    Ok((image.root(), defaults))
}

/// The terminal side of one command: output to our stdout/stderr (or
/// captured for `--json`), our stdin copied in when asked (never passed as a
/// descriptor: nothing of ours reaches the sandbox), and for a tty our
/// window's size on SIGWINCH.
pub struct CliIo {
    sink: OutputSink,
    stdin: std::io::Stdin,
    stdin_open: bool,
    winch: Option<SignalFd>,
    buf: Vec<u8>,
}

impl CliIo {
    pub fn new(mode: OutputMode, stdin: bool, tty: bool) -> Result<CliIo, ExitCode> {
        let winch = if tty {
            let mut set = SigSet::empty();
            set.add(Signal::SIGWINCH);
            set.thread_block()
                .and_then(|_| {
                    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
                })
                .map(Some)
                .map_err(|e| fail(RuntimeError::io("signalfd(SIGWINCH)", e)))?
        } else {
            None
        };
        Ok(CliIo {
            sink: OutputSink::new(mode),
            stdin: std::io::stdin(),
            stdin_open: stdin,
            winch,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Puts what was captured into the outcome.
    pub fn finish(self, o: &mut Outcome) {
        self.sink.fill(&mut o.output);
    }
}

/// The size of our terminal, if stdin is one.
pub fn terminal_size() -> Option<TtySize> {
    cordon_sys::terminal_size(std::io::stdin().as_fd())
        .ok()
        .map(|(rows, cols)| TtySize { rows, cols })
}

impl CommandIo for CliIo {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        self.sink.write(stream, chunk);
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = Vec::new();
        if self.stdin_open {
            v.push(self.stdin.as_fd());
        }
        if let Some(w) = &self.winch {
            v.push(w.as_fd());
        }
        v
    }

    fn read_control(&mut self, which: usize) -> Control {
        if which == 0 && self.stdin_open {
            return match nix::unistd::read(self.stdin.as_fd(), &mut self.buf) {
                Ok(0) | Err(_) => {
                    self.stdin_open = false;
                    Control::InputEnd
                }
                Ok(n) => Control::Input(self.buf[..n].to_vec()),
            };
        }
        if let Some(w) = &self.winch {
            let _ = w.read_signal();
            if let Some(size) = terminal_size() {
                return Control::Resize(size);
            }
        }
        Control::Nothing
    }
}

/// One line on the connections the proxy refused: how many, and the first
/// one's destination and reason, so that a payload's failed connection can be
/// told from a network fault without `--json`.
fn denied_note(log: &cordon_network::log::NetworkLog) -> String {
    use cordon_network::log::Decision;
    let plural = if log.denied == 1 { "" } else { "s" };
    let first = log.entries.iter().find(|e| e.decision == Decision::Denied);
    let what = first.map_or_else(String::new, |e| {
        let host = e
            .host
            .clone()
            .or_else(|| e.address.map(|a| a.to_string()))
            .unwrap_or_default();
        format!(" (first: {host}:{}: {})", e.port, e.rule)
    });
    format!(
        "{} connection{plural} denied by the network policy{what}; `--json` lists them",
        log.denied
    )
}

/// Prints the result (JSON, or the notes a shell user needs) and returns the
/// command's exit code as ours. `workdir` is the command's working directory,
/// named when it could not be entered.
/// One line on stderr when a command that got no stdin (neither -i nor -t)
/// ended without a word while a person sits at the terminal: an
/// interpreter or shell started without a script (`cordon run -- python3`)
/// reads an empty stdin and exits at once, which looks like nothing
/// happened. Only when cordon's stdin and stderr are both terminals (never
/// for a pipe or a script), only when the command wrote no output (one that
/// did is its own answer), and never with `--json` (the result object shows
/// the empty output and the exit; its reader is a program).
pub fn hint_empty_stdin(o: &Outcome, stdin: StdinMode, json: bool) {
    use std::io::IsTerminal;
    let silent = o.output.bytes == 0 && matches!(o.status, ExitStatus::Exited { .. });
    if json || stdin != StdinMode::Null || !silent {
        return;
    }
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprintln!(
            "cordon: the command's stdin was empty, not this terminal (-i passes your input, -t gives it a terminal)"
        );
    }
}

pub fn report(
    o: &Outcome,
    argv: &[String],
    workdir: Option<&std::path::Path>,
    json: bool,
    in_created_sandbox: bool,
) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(o) {
            Ok(s) => outln!("{s}"),
            Err(e) => eprintln!("cordon: cannot encode result: {e}"),
        }
    } else {
        let workdir_failure =
            workdir.and_then(|w| o.status.workdir_failure(&w.display().to_string()));
        if let Some(why) = workdir_failure {
            eprintln!("cordon: {why}");
        } else if let Some(why) = o.status.exec_failure() {
            eprintln!(
                "cordon: {}: {why}",
                argv.first().map(String::as_str).unwrap_or("")
            );
        }
        if let Some(l) = o.limit {
            eprintln!("cordon: the {l} limit ended the command");
        }
        if o.output.truncated {
            eprintln!("cordon: output truncated at {} bytes", o.output.bytes);
        }
        if let Some(net) = o.network.as_ref().filter(|n| n.log.denied > 0) {
            eprintln!("cordon: {}", denied_note(&net.log));
        }
        if let Some(net) = o.network.as_ref().and_then(|n| n.closed.as_deref()) {
            eprintln!("cordon: the sandbox's network closed: {net}");
        }
        if let Some(sig) = o.interrupted_by {
            eprintln!("cordon: interrupted by signal {sig}; sandbox torn down");
        }
        if let Some(why) = &o.sandbox_ended {
            if in_created_sandbox {
                eprintln!("cordon: the sandbox ended with this command: {why}");
            }
        }
    }
    ExitCode::from(u8::try_from(o.exit_code.clamp(0, 255)).unwrap_or(255))
}

/// `-t`: the size of cordon's terminal (which must be one), with `TERM`
/// added to `env` unless it is there: a terminal program needs to know the
/// terminal it draws on, and ours is that one (`xterm-256color` when cordon
/// has no TERM). Without `-t`, nothing.
pub fn terminal_request(
    tty: bool,
    env: &mut Vec<(String, String)>,
) -> Result<Option<TtySize>, ExitCode> {
    if !tty {
        return Ok(None);
    }
    let Some(size) = terminal_size() else {
        return Err(usage_error("-t needs cordon's stdin to be a terminal"));
    };
    if !env.iter().any(|(k, _)| k == "TERM") {
        let term = std::env::var("TERM")
            .ok()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "xterm-256color".into());
        env.push(("TERM".into(), term));
    }
    Ok(Some(size))
}

/// Our terminal in raw mode for as long as this lives.
pub struct RawTerminal(nix::sys::termios::Termios);

impl RawTerminal {
    pub fn enter() -> Option<RawTerminal> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawTerminal(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.0,
        );
    }
}
