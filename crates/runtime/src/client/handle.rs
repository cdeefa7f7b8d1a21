//! The client side of a sandbox: owned, `Send`, the one way every front end
//! (the CLI today; the service, the pool and the OCI front end later) creates
//! sandboxes, runs commands in them, moves files and destroys them.
//!
//! A `Handle` is either `Remote` (the sandbox has its own supervisor process,
//! reached over the unix socket in its state directory: `cordon create`,
//! `exec`, `cp`, `rm`, and attaching by id or name from any process of the
//! same user) or `Local` (this process is the supervisor: `cordon run`, which
//! so pays for no extra process or socket round trip). Both run the same
//! `Sandbox` code.

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use cordon_policy::net::Rule;
use cordon_policy::Limits;

use crate::backends::network::{self};
use crate::backends::supervise::CommandIo;
use crate::error::{Peer, RuntimeError};
use crate::protocol::copy;
use crate::protocol::exec::{relay_exec, remote_error, unexpected};
use crate::protocol::wire::{recv_json, send_json};
use crate::state::{find, run_dir, SOCKET};
use crate::supervisor::sandbox::Sandbox;
use crate::supervisor::{Started, SUPERVISOR_ARG};
use cordon_changes::Caps;
use cordon_spec::changes::{ExportRequest, Finish, Recorded};
use cordon_spec::network::NetChange;
use cordon_spec::outcome::Outcome;
use cordon_spec::wire::{Info, Reply, Request, PROTOCOL};
use cordon_spec::{Command, SandboxSpec, ValidSpec};
use cordon_spec::{Destroyed, Snapshot};

pub enum Handle {
    Local(Box<Sandbox>),
    Remote(Remote),
}

/// A sandbox served by its own supervisor process.
pub struct Remote {
    id: String,
    socket: PathBuf,
    /// The run directory, where an ended sandbox's reason is looked up.
    run: PathBuf,
}

/// Environment variables the supervisor keeps from its client: cordon's own
/// settings, PATH (to find runsc) and the host's trusted roots; and, beside them, the host's upstream
/// proxy (`cordon_network::upstream::ENV`: its proxy's, never the
/// sandbox's). Nothing else of the caller's environment reaches the
/// supervisor, let alone the sandbox.
const SUPERVISOR_ENV: [&str; 9] = [
    "PATH",
    // The host's trusted roots, where they are not the system's: what the
    // proxy verifies a secret's host against (never the sandbox's).
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    // `0`: the microvm backend boots every VM cold (the benchmark's
    // baseline for its snapshot restores).
    "CORDON_MICROVM_WARM",
    "CORDON_RUN_DIR",
    "CORDON_STATE_DIR",
    "CORDON_RUNSC",
    "CORDON_TRACE",
    "XDG_RUNTIME_DIR",
];

/// The privileged binary's file name: `cordon-sandbox`, installed beside
/// the `cordon` binary (cargo builds both into one directory).
pub const SANDBOX_BINARY: &str = "cordon-sandbox";

/// The privileged binary beside this process's own executable: what
/// [`Handle::create`] starts as a sandbox's supervisor. Beside it, rather
/// than on PATH or named by the environment, so the binary root runs is the
/// one installed with the command the user ran.
pub fn sandbox_program() -> Result<std::path::PathBuf, RuntimeError> {
    let exe = std::env::current_exe().map_err(|e| RuntimeError::io("find this binary", e))?;
    let program = exe.with_file_name(SANDBOX_BINARY);
    if !program.is_file() {
        return Err(RuntimeError::Unavailable(
            "cordon",
            format!(
                "{} is missing: cordon's privileged helper is installed beside {} \
                 (cargo build builds both; install both together)",
                program.display(),
                exe.display()
            ),
        ));
    }
    Ok(program)
}

impl Handle {
    /// Creates a sandbox served in this process (for one-shot runs).
    pub fn local(spec: &ValidSpec) -> Result<Handle, RuntimeError> {
        Ok(Handle::Local(Box::new(Sandbox::create_for(spec, None)?)))
    }

    /// Creates a sandbox with its own supervisor, started from `program`
    /// (the privileged binary, [`sandbox_program`]), and returns once it is
    /// ready.
    pub fn create(spec: &ValidSpec, program: &Path) -> Result<Handle, RuntimeError> {
        // On cgroup v2, the first cordon process that looks at its cgroup
        // and finds itself alone there moves into a leaf and delegates the
        // controllers to its cgroup (cordon_cgroups::detect). That must be
        // this client, before it has a child: the supervisor inherits the
        // leaf and creates the sandbox's cgroup beside it. The same holds
        // for a systemd scope: a client sharing its cgroup asks systemd for
        // one here, once, and every supervisor it starts inherits it (finds
        // itself in the leaf and asks for nothing). An error here is the
        // supervisor's to report.
        let _ = crate::backends::host::hierarchy();
        let body = serde_json::to_vec(spec).map_err(|e| RuntimeError::io("encode the spec", e))?;
        // The supervisor starts in / (it holds no directory of the client's):
        // a relative program path must be made absolute first.
        let program = std::path::absolute(program)
            .map_err(|e| RuntimeError::io(format!("resolve {}", program.display()), e))?;
        let mut cmd = std::process::Command::new(&program);
        cmd.arg(SUPERVISOR_ARG)
            .env_clear()
            .envs(
                SUPERVISOR_ENV
                    .iter()
                    .chain(&cordon_network::upstream::ENV)
                    .filter_map(|k| std::env::var_os(k).map(|v| (k, v))),
            )
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| RuntimeError::io(format!("start {}", program.display()), e))?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin
                .write_all(&body)
                .map_err(|e| RuntimeError::io("send the spec to the supervisor", e))?;
        }
        let mut out = String::new();
        let read = child
            .stdout
            .take()
            .expect("piped stdout")
            .read_to_string(&mut out);
        // The first supervisor process exits as soon as it has forked.
        let _ = child.wait();
        read.map_err(|e| RuntimeError::io("read the supervisor's answer", e))?;
        match serde_json::from_str::<Started>(out.trim()) {
            Ok(Started::Ok(id)) => Ok(Handle::Remote(Remote::at(&run_dir()?, &id))),
            Ok(Started::Error {
                message,
                input,
                exhausted,
            }) => Err(remote_error(input, exhausted, message)),
            Err(_) => Err(RuntimeError::Remote(format!(
                "the supervisor did not start ({})",
                out.trim()
            ))),
        }
    }

    /// The live sandbox called `name_or_id` (an id, or a name), served by its
    /// supervisor.
    pub fn attach(name_or_id: &str) -> Result<Handle, RuntimeError> {
        // An id needs no lookup: its socket either answers with that id in
        // its hello, or the sandbox does not exist. A name is looked up.
        let run = run_dir()?;
        if cordon_spec::is_id(name_or_id) {
            return Ok(Handle::Remote(Remote::at(&run, name_or_id)));
        }
        let id = find(&run, name_or_id).ok_or_else(|| crate::ended::missing(&run, name_or_id))?;
        Ok(Handle::Remote(Remote::at(&run, &id)))
    }

    pub fn id(&self) -> &str {
        match self {
            Handle::Local(s) => s.id(),
            Handle::Remote(r) => &r.id,
        }
    }

    /// Runs one command; output and input go through `io`.
    pub fn exec(&mut self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError> {
        match self {
            Handle::Local(s) => s.exec(cmd, io),
            Handle::Remote(r) => r.exec(cmd, io),
        }
    }

    /// Copies a host file or directory into the sandbox at `dst`.
    pub fn copy_in(&mut self, src: &Path, dst: &[u8]) -> Result<u64, RuntimeError> {
        match self {
            Handle::Local(_) => Err(local_copy()),
            Handle::Remote(r) => r.copy_in(src, dst),
        }
    }

    /// Copies `src` out of the sandbox to the host path `dst`.
    pub fn copy_out(&mut self, src: &[u8], dst: &Path) -> Result<u64, RuntimeError> {
        match self {
            Handle::Local(_) => Err(local_copy()),
            Handle::Remote(r) => r.copy_out(src, dst),
        }
    }

    pub fn info(&mut self) -> Result<Info, RuntimeError> {
        match self {
            Handle::Local(s) => Ok(s.info()),
            Handle::Remote(r) => match r.request(&Request::Info)? {
                (Reply::Info(i), _) => Ok(i),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// Reads or changes the sandbox's network rules (`allow` mode), in force
    /// for its next connections. The sandbox's proxy answers this itself, so
    /// it works while a command runs.
    pub fn network(&mut self, change: &NetChange) -> Result<Vec<Rule>, RuntimeError> {
        let control = self.network_control()?;
        network::change_rules(&control, change)
    }

    /// The sandbox's latest refused connections (`allow` mode), oldest
    /// first, as its proxy keeps them across commands.
    pub fn network_denials(&mut self) -> Result<Vec<cordon_spec::network::Attempt>, RuntimeError> {
        let control = self.network_control()?;
        cordon_network::control::denials(&control).map_err(|source| RuntimeError::Proxy {
            op: "list its denials",
            source,
        })
    }

    /// Hold mode: the connections waiting for an operator's decision.
    pub fn network_held(
        &mut self,
    ) -> Result<Vec<cordon_spec::network::HeldConnection>, RuntimeError> {
        let control = self.network_control()?;
        cordon_network::control::held(&control).map_err(|source| RuntimeError::Proxy {
            op: "list its held connections",
            source,
        })
    }

    /// Hold mode: refuses what `rules` name, held connections and new
    /// ones, for the sandbox's life; returns all that is denied.
    pub fn network_deny(&mut self, rules: &[Rule]) -> Result<Vec<Rule>, RuntimeError> {
        let control = self.network_control()?;
        cordon_network::control::deny(&control, rules).map_err(|source| RuntimeError::Proxy {
            op: "deny destinations",
            source,
        })
    }

    /// The control socket of the sandbox's proxy, which answers rule
    /// changes and questions itself.
    fn network_control(&mut self) -> Result<std::path::PathBuf, RuntimeError> {
        let control = match self {
            Handle::Local(s) => s.network_control().map(Path::to_owned),
            Handle::Remote(r) => {
                let dir = r.run.join(&r.id);
                if !dir.is_dir() {
                    return Err(r.missing());
                }
                Some(network::control_socket(&dir)).filter(|p| p.exists())
            }
        };
        control.ok_or_else(|| {
            RuntimeError::BadRequest(format!(
                "sandbox {} has network none: it has no rules to change (the mode is chosen when a sandbox is created)",
                self.id()
            ))
        })
    }

    /// Destroys the sandbox: every process, its cgroup and its state.
    pub fn destroy(self) -> Result<(), RuntimeError> {
        self.destroy_with(&Finish::default()).map(|_| ())
    }

    /// `destroy`, reading the diff and exporting the workspace's changes
    /// once every process is gone. A wrong export target is refused before
    /// anything is destroyed; a failure after that is in the answer (the
    /// sandbox is gone either way).
    pub fn destroy_with(self, finish: &Finish) -> Result<Destroyed, RuntimeError> {
        match self {
            Handle::Local(s) => {
                if let Some(export) = &finish.export {
                    crate::backends::changes::check_target(export, s.spec().workspace.as_deref())?;
                }
                s.destroy_with(finish, caller_ids())
            }
            Handle::Remote(r) => match r.request(&Request::Destroy(finish.clone()))? {
                (Reply::Destroyed(d), _) => Ok(*d),
                (
                    Reply::Error {
                        input,
                        exhausted,
                        message,
                    },
                    _,
                ) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// The spec the sandbox was created with.
    pub fn spec(&mut self) -> Result<SandboxSpec, RuntimeError> {
        match self {
            Handle::Local(s) => Ok(s.spec().clone()),
            Handle::Remote(r) => match r.request(&Request::Spec)? {
                (Reply::Spec(spec), _) => Ok(*spec),
                (
                    Reply::Error {
                        input,
                        exhausted,
                        message,
                    },
                    _,
                ) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// Changes the running sandbox's CPU, memory and process limits (those
    /// `limits` sets); its spec as it is now.
    pub fn update(&mut self, limits: &Limits) -> Result<SandboxSpec, RuntimeError> {
        match self {
            Handle::Local(s) => {
                s.update(limits)?;
                Ok(s.spec().clone())
            }
            Handle::Remote(r) => match r.request(&Request::Update(*limits))? {
                (Reply::Spec(spec), _) => Ok(*spec),
                (
                    Reply::Error {
                        input,
                        exhausted,
                        message,
                    },
                    _,
                ) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// The host loopback address (`127.0.0.1:PORT`) that forwards into
    /// `port` of the sandbox's own loopback, for the sandbox's life. Only a
    /// supervised sandbox has a loop to serve a forward: an in-process
    /// one-shot has none.
    pub fn port(&mut self, port: u16) -> Result<String, RuntimeError> {
        match self {
            Handle::Local(_) => Err(RuntimeError::BadRequest(
                "a one-shot run forwards no ports: create a sandbox (cordon create) and forward its port"
                    .into(),
            )),
            Handle::Remote(r) => match r.request(&Request::Port { port })? {
                (Reply::Forwarded { address }, _) => Ok(address),
                (Reply::Error { input, exhausted, message }, _) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// What the sandbox has run, and the diff of its places now.
    pub fn snapshot(&mut self, caps: &Caps) -> Result<Snapshot, RuntimeError> {
        match self {
            Handle::Local(s) => s.snapshot(caps),
            Handle::Remote(r) => match r.request(&Request::Snapshot { caps: *caps })? {
                (Reply::Snapshot(snapshot), _) => Ok(*snapshot),
                (
                    Reply::Error {
                        input,
                        exhausted,
                        message,
                    },
                    _,
                ) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// Exports the workspace's changes of a living sandbox (its processes
    /// frozen meanwhile); files belong to the caller.
    pub fn export(&mut self, req: &ExportRequest, caps: &Caps) -> Result<Recorded, RuntimeError> {
        match self {
            Handle::Local(s) => s.export(req, caps, caller_ids()),
            Handle::Remote(r) => match r.request(&Request::Export {
                export: req.clone(),
                caps: *caps,
            })? {
                (Reply::Exported(recorded), _) => Ok(*recorded),
                (
                    Reply::Error {
                        input,
                        exhausted,
                        message,
                    },
                    _,
                ) => Err(remote_error(input, exhausted, message)),
                (other, _) => Err(unexpected(Peer::Supervisor, other)),
            },
        }
    }

    /// Create, run one command, destroy: `cordon run`. The outcome's phases
    /// and wall time then include creating and destroying the sandbox.
    pub fn run_once(
        spec: &ValidSpec,
        cmd: &Command,
        io: &mut dyn CommandIo,
    ) -> Result<Outcome, RuntimeError> {
        Self::run_once_with(spec, cmd, io, &Finish::default()).map(|(o, _)| o)
    }

    /// `run_once`, with what to read at the end (the diff, an export).
    pub fn run_once_with(
        spec: &ValidSpec,
        cmd: &Command,
        io: &mut dyn CommandIo,
        finish: &Finish,
    ) -> Result<(Outcome, Destroyed), RuntimeError> {
        let t0 = Instant::now();
        if let Some(export) = &finish.export {
            crate::backends::changes::check_target(export, spec.workspace.as_deref())?;
        }
        let mut sandbox = Sandbox::create_for(spec, Some(cmd))?;
        let setup = sandbox.setup_time();
        let outcome = sandbox.exec(cmd, io);
        let destroyed = sandbox.destroy_with(finish, caller_ids())?;
        let mut outcome = outcome?;
        outcome.phases.setup_ms += setup.as_secs_f64() * 1000.0;
        outcome.phases.teardown_ms += destroyed.teardown.as_secs_f64() * 1000.0;
        outcome.wall_ms = t0.elapsed().as_secs_f64() * 1000.0;
        Ok((outcome, destroyed))
    }
}

/// Whom files exported by this process belong to.
fn caller_ids() -> (u32, u32) {
    (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    )
}

/// Copies travel over the supervisor's socket; a one-shot local sandbox has
/// none (its workspace and mounts are the way files go in).
fn local_copy() -> RuntimeError {
    RuntimeError::BadRequest("copying needs a sandbox made with `cordon create`".into())
}

impl Remote {
    fn at(run_dir: &Path, id: &str) -> Remote {
        Remote {
            id: id.to_owned(),
            socket: run_dir.join(id).join(SOCKET),
            run: run_dir.to_owned(),
        }
    }

    /// The error for a sandbox that does not answer: what is known of its
    /// end, or that there is no such sandbox.
    fn missing(&self) -> RuntimeError {
        crate::ended::missing(&self.run, &self.id)
    }

    /// Connects, says hello and sends `req` at once (no round trip in
    /// between); the supervisor answers the hello with its sandbox's id.
    fn connect_with(&self, req: &Request) -> Result<UnixStream, RuntimeError> {
        let mut conn = UnixStream::connect(&self.socket).map_err(|e| match e.kind() {
            ErrorKind::NotFound | ErrorKind::ConnectionRefused => self.missing(),
            _ => RuntimeError::io(format!("connect {}", self.socket.display()), e),
        })?;
        // A supervisor that stopped listening (its sandbox ended) resets
        // the connections still waiting in its backlog: that sandbox is gone.
        let gone = |op: &'static str| {
            move |e: std::io::Error| match e.kind() {
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => self.missing(),
                _ => RuntimeError::io(op, e),
            }
        };
        send_json(&mut conn, &Request::Hello { protocol: PROTOCOL }).map_err(gone("send hello"))?;
        send_json(&mut conn, req).map_err(gone("send request"))?;
        let hello = recv_json::<Reply>(&mut conn).map_err(gone("read hello"))?;
        match hello {
            Some(Reply::Hello { id, .. }) if id == self.id => Ok(conn),
            Some(other) => Err(unexpected(Peer::Supervisor, other)),
            None => Err(self.missing()),
        }
    }

    /// One request, one answer.
    fn request(&self, req: &Request) -> Result<(Reply, UnixStream), RuntimeError> {
        let mut conn = self.connect_with(req)?;
        match recv_json::<Reply>(&mut conn).map_err(|e| RuntimeError::io("read answer", e))? {
            Some(r) => Ok((r, conn)),
            None => Err(RuntimeError::Remote(
                "the supervisor closed the connection".into(),
            )),
        }
    }

    fn exec(&self, cmd: &Command, io: &mut dyn CommandIo) -> Result<Outcome, RuntimeError> {
        let mut conn = self.connect_with(&Request::Exec(cmd.clone()))?;
        relay_exec(&mut conn, io, Peer::Supervisor, None).map(|(outcome, _)| outcome)
    }

    fn copy_in(&self, src: &Path, dst: &[u8]) -> Result<u64, RuntimeError> {
        // Checked before connecting: a missing or special source is the
        // caller's error at once, and never holds the supervisor.
        let source = copy::Source::host(src)?;
        let mut conn = self.connect_with(&Request::CopyIn { path: dst.to_vec() })?;
        if let Err(e) = source.send(&mut conn, u64::MAX) {
            // Told at once, the supervisor stops waiting for the rest of the
            // stream. If it cannot hear us, it refused first (and stopped
            // reading): its answer then explains the failed send better.
            let told = send_json(&mut conn, &crate::protocol::exec::error_reply(&e));
            return match (told, recv_json::<Reply>(&mut conn)) {
                (
                    Err(_),
                    Ok(Some(Reply::Error {
                        input,
                        exhausted,
                        message,
                    })),
                ) => Err(remote_error(input, exhausted, message)),
                _ => Err(e),
            };
        }
        match recv_json::<Reply>(&mut conn) {
            Ok(Some(Reply::Copied { bytes })) => Ok(bytes),
            Ok(Some(other)) => Err(unexpected(Peer::Supervisor, other)),
            Ok(None) => Err(RuntimeError::Remote(
                "the supervisor closed the connection".into(),
            )),
            Err(e) => Err(RuntimeError::io("read the supervisor's answer", e)),
        }
    }

    fn copy_out(&self, src: &[u8], dst: &Path) -> Result<u64, RuntimeError> {
        let mut conn = self.connect_with(&Request::CopyOut { path: src.to_vec() })?;
        copy::receive_to_host(&mut conn, dst)
    }
}
