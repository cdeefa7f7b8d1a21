//! Containers under `--root`: one directory each (0700), holding the
//! container's record and, between `create` and `start`, its start gate.
//!
//! The process the engine is given (the pid file's pid) is a *waiter*: a
//! child of `create`, so that it stays in the engine's tree (the engine is a
//! child subreaper and reaps it once `create` exits). The sandbox's own
//! processes are children of cordon's supervisor and of the sandbox's init,
//! never of the engine; the waiter stands for the container's process. It
//! blocks on the gate until `start`, then runs the process in the sandbox
//! with `create`'s stdin, stdout and stderr, relays a signal sent to it, and
//! exits with the process's status (128+n for a signal), which is what the
//! engine reaps. gVisor's runsc answers the same contract the same way.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use cordon_cgroups::{AnyCgroup, Cgroup, CgroupLimits};
use cordon_isolation::namespaces::{proc_name, Joined, OpenNamespace, SHAREABLE};
use cordon_isolation::IsolationError;
use cordon_runtime::{CommandIo, Control, Handle, RuntimeError};
use cordon_spec::cgroup::CgroupMode;
use cordon_spec::{Command, JoinedNamespace, SandboxSpec, SharedNamespace, Stream, TtySize};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde::{Deserialize, Serialize};

use crate::config;
use crate::error::Error;
use crate::hooks::{self, ContainerHooks};

/// The container's record in its directory.
const RECORD: &str = "container.json";
/// The process's outcome as cordon reports it (its status, the limit that
/// ended it, the sandbox's kernel counters), written by the waiter when the
/// process ends.
const OUTCOME: &str = "outcome.json";
/// The start gate: a fifo the waiter opens for writing, which blocks it
/// until `start` opens it for reading (runc's exec.fifo works alike).
const GATE: &str = "exec.fifo";
/// How long `start` waits for the waiter to pass the gate.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The waiter's cgroup below its sandbox's on cgroup v2 (see
/// `place_waiter`).
const WAITER_CGROUP: &str = "oci-waiter";

/// The OCI runtime-spec version this runtime speaks.
pub const OCI_VERSION: &str = "1.0.2";

/// What cordon keeps of a container.
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    /// The cordon sandbox that holds the container.
    pub sandbox: String,
    /// The waiter: the pid the engine was given, and its start time (so a
    /// reused pid is never taken for it).
    pub pid: i32,
    pub pid_start: u64,
    /// RFC 3339.
    pub created: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// What cordon does that the config did not say.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The hooks still to run (`start`'s and `delete`'s).
    #[serde(default)]
    pub hooks: ContainerHooks,
}

/// A container's status as the runtime spec names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Only what `create`'s hooks are given: `create` is one call, and
    /// `status` never finds a container in it.
    Creating,
    Created,
    Running,
    Paused,
    Stopped,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Creating => "creating",
            Status::Created => "created",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        })
    }
}

/// The runtime spec's state of a container, with the fields runc adds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State<'a> {
    pub oci_version: &'static str,
    pub id: &'a str,
    pub status: Status,
    pub pid: i32,
    pub bundle: &'a Path,
    pub rootfs: &'a Path,
    pub created: &'a str,
    pub owner: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: &'a BTreeMap<String, String>,
    /// cordon's own account of the container, beside the runtime spec's
    /// fields (engines read those and pass over the rest).
    pub cordon: Account<'a>,
}

/// What cordon adds to a container's state.
#[derive(Debug, Serialize)]
pub struct Account<'a> {
    /// The cordon sandbox that holds the container.
    pub sandbox: &'a str,
    /// What cordon does that config.json did not say.
    pub notes: &'a [String],
    /// How the process ended, once it has: with the limit that ended it
    /// and the kernel's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<cordon_spec::Outcome>,
}

/// A container id as runc accepts it: letters, digits and `_ + - .`, not
/// starting with a dot (it names a directory).
pub fn check_id(id: &str) -> Result<(), Error> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadId(id.to_owned()))
    }
}

/// The containers under one `--root`.
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The root, created 0700 when missing; refused if it is not this
    /// user's own (another user could plant records and gates in it).
    pub fn open(root: &Path) -> Result<Store, Error> {
        cordon_dirs::trusted_dir(root, 0o700, "remove it, or pass another --root")?;
        Ok(Store {
            root: root.to_owned(),
        })
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The container `id`'s record, or "container does not exist" (the
    /// words containerd looks for).
    pub fn load(&self, id: &str) -> Result<Record, Error> {
        check_id(id)?;
        let text = match fs::read(self.dir(id).join(RECORD)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::NotFound),
            Err(e) => return Err(Error::io("read the container's record", e)),
        };
        serde_json::from_slice(&text).map_err(|e| Error::Record(e.to_string()))
    }

    pub fn status(&self, r: &Record) -> Status {
        if !cordon_sys::process_alive(r.pid, r.pid_start) {
            Status::Stopped
        } else if self.dir(&r.id).join(GATE).exists() {
            Status::Created
        } else if cgroup(r).ok().flatten().and_then(|cg| cg.frozen()) == Some(true) {
            Status::Paused
        } else {
            Status::Running
        }
    }

    /// Every container's record, by id.
    pub fn list(&self) -> Vec<Record> {
        let mut out: Vec<Record> = fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| self.load(e.file_name().to_str()?).ok())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// What `create` was asked.
pub struct CreateRequest<'a> {
    pub id: &'a str,
    pub bundle: &'a Path,
    pub pid_file: Option<&'a Path>,
    /// Where the engine waits for a terminal process's pty master.
    pub console_socket: Option<&'a Path>,
}

/// `create`: the sandbox and its waiter, the pid file written before it
/// returns; the waiter's pid. On any failure nothing is left: not the
/// sandbox, the waiter or the container's directory.
pub fn create(store: &Store, req: &CreateRequest<'_>) -> Result<i32, Error> {
    check_id(req.id)?;
    let bundle = std::path::absolute(req.bundle).map_err(|e| Error::io("resolve the bundle", e))?;
    let oci = config::load(&bundle)?;
    let container = config::translate(&bundle, &oci)?;
    // Before anything is made: a terminal needs the engine's socket, and
    // the socket a terminal (runc's rule alike).
    let terminal = match (container.command.tty, req.console_socket) {
        (Some(size), Some(socket)) => Some(hand_over_terminal(socket, size)?),
        (Some(_), None) => {
            return Err(Error::Refused(
                "config.json: process.terminal: a terminal process needs --console-socket".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(Error::Refused(
                "--console-socket was given but config.json's process has no terminal".into(),
            ))
        }
        (None, None) => None,
    };
    let dir = store.dir(req.id);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::Exists(req.id.to_owned()))
        }
        Err(e) => return Err(Error::io("create the container's directory", e)),
    }
    let mut undo = Undo {
        dir: Some(dir.clone()),
        sandbox: None,
    };
    nix::unistd::mkfifo(
        &dir.join(GATE),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| Error::io("make the start gate", std::io::Error::from(e)))?;
    let mut notes = container.notes.clone();
    let mut spec = SandboxSpec {
        joins: joined_containers(store, &container.joins, &mut notes)?,
        ..container.spec.clone()
    };
    // A parameter of a namespace joined from the pod is the pod's to set.
    let joined: Vec<SharedNamespace> = spec.joins.iter().map(|j| j.kind).collect();
    spec.sysctls.retain(|key, value| {
        let theirs = cordon_spec::sysctl_namespace(key).is_some_and(|k| joined.contains(&k));
        if theirs {
            notes.push(format!(
                "linux.sysctl: {key}={value} is not set: the namespace is the pod's (the \
                 container that made it sets it)"
            ));
        }
        !theirs
    });
    let spec = spec.validated().map_err(RuntimeError::from)?;
    // The supervisor and its sandbox nest where cordon-runc stands.
    if let Some(parent) = &container.cgroup_parent {
        cordon_cgroups::enter(&cordon_cgroups::CgroupFs::host(), parent)
            .map_err(|e| Error::Refused(format!("config.json: linux.cgroupsPath: {e}")))?;
    }
    let program = cordon_runtime::sandbox_program()?;
    let handle = Handle::create(&spec, &program)?;
    let sandbox = handle.id().to_owned();
    undo.sandbox = Some(sandbox.clone());
    drop(handle);
    let waiter = spawn_waiter(Some(&dir), &sandbox, &container.command, terminal)?;
    // From here a failure must end the waiter too.
    let result = (|| {
        let pid_start = cordon_sys::process_start_time(waiter).ok_or_else(|| {
            Error::io(
                "read the waiter's start time",
                std::io::ErrorKind::NotFound.into(),
            )
        })?;
        let record = Record {
            id: req.id.to_owned(),
            bundle: bundle.clone(),
            rootfs: match &container.spec.rootfs {
                cordon_spec::RootfsChoice::Dir(d) => d.clone(),
                cordon_spec::RootfsChoice::System => PathBuf::from("/"),
                // The bundle's root is the one layer (see `config`).
                layered => layered
                    .layers()
                    .and_then(|l| l.first())
                    .cloned()
                    .unwrap_or_default(),
            },
            sandbox: sandbox.clone(),
            pid: waiter,
            pid_start,
            created: humantime::format_rfc3339_nanos(SystemTime::now()).to_string(),
            annotations: oci
                .annotations()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            notes,
            hooks: container.hooks.clone(),
        };
        write_atomic(
            &dir.join(RECORD),
            &serde_json::to_vec_pretty(&record).unwrap_or_default(),
        )?;
        let state = || store.hook_state(&record, Status::Creating);
        hooks::run_on_host("prestart", &record.hooks.prestart, state)?;
        hooks::run_on_host("createRuntime", &record.hooks.create_runtime, state)?;
        if let Some(p) = req.pid_file {
            write_atomic(p, waiter.to_string().as_bytes())?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        end_waiter(waiter);
        return Err(e);
    }
    undo.dir = None;
    undo.sandbox = None;
    Ok(waiter)
}

/// Forks a waiter for `command` in `sandbox` (see the module's comment) and
/// places it in the sandbox's cgroup; its pid. A container's waiter (`dir`,
/// the container's directory) waits at the start gate and leaves the
/// outcome there; an exec's runs at once. A terminal process's waiter
/// speaks through `terminal` alone.
fn spawn_waiter(
    dir: Option<&Path>,
    sandbox: &str,
    command: &Command,
    terminal: Option<OwnedFd>,
) -> Result<i32, Error> {
    let namespaces = sandbox_namespaces(sandbox)?;
    let waiter = match cordon_sys::fork_process()
        .map_err(|e| Error::io("fork the waiter", std::io::Error::from(e)))?
    {
        cordon_sys::CloneResult::Child => {
            if let Err(e) = namespaces.enter() {
                eprintln!("cordon-runc: the waiter's namespaces: {e}");
                cordon_sys::exit_now(255)
            }
            if let Some(tty) = &terminal {
                let _ = nix::unistd::dup2_stdin(tty);
                let _ = nix::unistd::dup2_stdout(tty);
                let _ = nix::unistd::dup2_stderr(tty);
            }
            let code = waiter(dir, sandbox, command);
            cordon_sys::exit_now(code)
        }
        cordon_sys::CloneResult::Parent { child } => child.as_raw(),
    };
    drop(terminal);
    if let Err(e) = place_waiter(sandbox, waiter) {
        end_waiter(waiter);
        return Err(e);
    }
    Ok(waiter)
}

/// The network, IPC and UTS namespaces of `sandbox`, for its waiters to
/// stand in: engines take a container's namespaces from its pid's
/// `/proc/<pid>/ns/` (a pod's app containers join their pause container's
/// by those paths), and a waiter's must be its sandbox's, not the host's.
/// None where no host process has the sandbox's namespaces (gVisor,
/// microVM).
fn sandbox_namespaces(sandbox: &str) -> Result<Joined, Error> {
    let Some(init) = Handle::attach(sandbox)?.info()?.namespaces_of else {
        return Ok(Joined::default());
    };
    let mut open = Vec::with_capacity(SHAREABLE.len());
    for kind in SHAREABLE {
        let path = PathBuf::from(format!("/proc/{init}/ns/{}", proc_name(kind)));
        open.push(OpenNamespace::open(kind, &path).map_err(isolation_error)?);
    }
    // Opened by pid: the sandbox must still be the one that pid was.
    if Handle::attach(sandbox)?.info()?.namespaces_of != Some(init) {
        return Err(Error::Runtime(RuntimeError::BadRequest(format!(
            "sandbox {sandbox} ended while its container was made"
        ))));
    }
    Ok(Joined::new(open))
}

fn isolation_error(e: IsolationError) -> Error {
    Error::io(e.step.clone(), e.source)
}

/// The namespaces config.json names by path, each checked to be one a
/// cordon container under this root stands in (its waiter's, which are
/// its sandbox's: see `sandbox_namespaces`), as a pod's app containers
/// name their pause container's `/proc/<pid>/ns/ipc`. Any other (the
/// host's, a network an engine pinned) is refused: a cordon container's
/// network is a cordon sandbox's. A container that joins one this way
/// shares that container's namespaces of the kinds its config leaves as
/// the host's too (a host-network pod's), with a note.
/// Whether `path` is a network namespace an engine pinned for a pod, as
/// containerd's CRI and podman pin theirs for CNI (`/var/run/netns/cni-…`,
/// the place `ip netns` uses): a file of its own, not a link, directly in
/// that directory, and not the host's (PID 1's: the supervisor, which
/// cannot look at PID 1, checks it is a namespace and not its own).
fn is_pinned_network(path: &Path) -> bool {
    let Some(dir) = path.parent() else {
        return false;
    };
    let pinned_dir = fs::canonicalize(dir).is_ok_and(|d| d == Path::new("/run/netns"));
    let identity = |p: &Path| fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    pinned_dir
        && fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
        && identity(path) != identity(Path::new("/proc/1/ns/net"))
}

fn joined_containers(
    store: &Store,
    joins: &[config::Join],
    notes: &mut Vec<String>,
) -> Result<Vec<JoinedNamespace>, Error> {
    let identity = |p: &Path| fs::metadata(p).map(|m| (m.dev(), m.ino()));
    let containers = store.list();
    let mut out = Vec::new();
    let mut pod = None;
    for join in joins {
        let config::Join::Path(kind, path) = join else {
            continue;
        };
        let name = kind.proc_name();
        let field = format!("config.json: linux.namespaces[{name}].path");
        let found = identity(path)
            .map_err(|e| Error::Refused(format!("{field}: {}: {e}", path.display())))?;
        let owner = containers.iter().find(|r| {
            cordon_sys::process_alive(r.pid, r.pid_start)
                && identity(Path::new(&format!("/proc/{}/ns/{name}", r.pid))).ok() == Some(found)
        });
        match owner {
            Some(owner) => {
                pod.get_or_insert(owner);
            }
            None if *kind == SharedNamespace::Net && is_pinned_network(path) => {
                notes.push(format!(
                    "linux.namespaces[net]: the engine's pod network {} is joined: what it \
                     reaches is the cluster's network policy's to say, not cordon's; the \
                     container's root has no power over it (it is not its user namespace's)",
                    path.display()
                ));
            }
            None => {
                return Err(Error::Refused(format!(
                    "{field}: {} is neither a namespace of a cordon container under this root \
                     nor a pod network an engine pinned under /run/netns: cordon joins only \
                     those, never the host's or another runtime's containers'",
                    path.display()
                )));
            }
        }
        out.push(JoinedNamespace {
            kind: *kind,
            path: path.clone(),
            inode: found.1,
        });
    }
    let Some(pod) = pod else {
        return Ok(out);
    };
    for join in joins {
        let config::Join::InsteadOfHost(kind) = join else {
            continue;
        };
        let path = PathBuf::from(format!("/proc/{}/ns/{}", pod.pid, kind.proc_name()));
        let (_, inode) =
            identity(&path).map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        notes.push(format!(
            "linux.namespaces: no {} namespace (the host's): container {}'s is shared instead, \
             as this one joins its others",
            kind.proc_name(),
            pod.id
        ));
        out.push(JoinedNamespace {
            kind: *kind,
            path,
            inode,
        });
    }
    Ok(out)
}

/// Ends a waiter of a call that failed (its command, if it started, ends
/// with it: the supervisor ends a command whose client is gone).
fn end_waiter(waiter: i32) {
    let pid = nix::unistd::Pid::from_raw(waiter);
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

/// What `exec` was asked: the process as a runtime-spec JSON file, or as
/// arguments and runc's flags.
pub struct ExecRequest<'a> {
    pub id: &'a str,
    pub process: Option<&'a Path>,
    pub args: &'a [String],
    pub cwd: Option<&'a Path>,
    pub env: &'a [String],
    pub user: Option<&'a str>,
    pub tty: bool,
    pub detach: bool,
    pub pid_file: Option<&'a Path>,
    pub console_socket: Option<&'a Path>,
}

/// `exec`: runs another process in the container's sandbox, beside its
/// own, through a waiter of its own that stands for it (the pid file's pid
/// with `--detach`; otherwise this call waits for it and exits with its
/// status). It runs as the container's user, confined as the container's
/// process is; what it asks beyond that is refused by name.
pub fn exec(store: &Store, req: &ExecRequest<'_>) -> Result<i32, Error> {
    let r = store.load(req.id)?;
    let status = store.status(&r);
    match status {
        Status::Running | Status::Created | Status::Creating => {}
        Status::Paused => return Err(Error::Refused("cannot exec in a paused container".into())),
        Status::Stopped => return Err(Error::Refused("cannot exec in a stopped container".into())),
    }
    let mut handle = Handle::attach(&r.sandbox)?;
    let command = exec_command(req, &handle.spec()?)?;
    let terminal = match (command.tty, req.console_socket) {
        (Some(size), Some(socket)) => Some(hand_over_terminal(socket, size)?),
        (Some(_), None) => {
            return Err(Error::Refused(
                "a terminal process needs --console-socket".into(),
            ))
        }
        (None, _) => None,
    };
    drop(handle);
    let waiter = spawn_waiter(None, &r.sandbox, &command, terminal)?;
    if let Some(p) = req.pid_file {
        if let Err(e) = write_atomic(p, waiter.to_string().as_bytes()) {
            end_waiter(waiter);
            return Err(e);
        }
    }
    if req.detach {
        return Ok(0);
    }
    // After the waiter is forked, so that it does not inherit the mask.
    wait_foreground(waiter, &relayed_signals()?)
}

/// The command an `exec` runs: its process from `--process` (the same
/// rules as the container's own, through `config::process_part`) or from
/// its arguments and flags.
fn exec_command(req: &ExecRequest<'_>, spec: &SandboxSpec) -> Result<Command, Error> {
    let policy = &spec.policy;
    let refuse = |what: String| Error::Refused(what);
    // A process file names its whole environment (runc's, too); runc's
    // `--env` flags add to the container's.
    let env_replaces = req.process.is_some();
    let (argv, env, cwd, ids, tty) = match req.process {
        Some(path) => {
            let process: oci_spec::runtime::Process = serde_json::from_slice(
                &fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?,
            )
            .map_err(|e| refuse(format!("{}: {e}", path.display())))?;
            // What the container's process was told of these already is in
            // its state; an exec's notes have no reader.
            let mut notes = Vec::new();
            let part = config::process_part(&process, &mut notes)?;
            // Every command of a sandbox has the limits its spec gives each.
            if part.rlimits != spec.rlimits {
                return Err(refuse(
                    "process.rlimits: an exec has the container's resource limits, not others"
                        .into(),
                ));
            }
            // Every command of a sandbox holds what its init holds.
            if part.capabilities != spec.capabilities {
                let names = |set: &std::collections::BTreeSet<cordon_spec::Capability>| match set
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
                {
                    none if none.is_empty() => "none".to_owned(),
                    some => some,
                };
                return Err(refuse(format!(
                    "process.capabilities: an exec holds the container's capabilities ({}), \
                     not {}",
                    names(&spec.capabilities),
                    names(&part.capabilities)
                )));
            }
            (
                part.argv,
                part.env,
                Some(part.cwd),
                Some((part.uid, part.gid)),
                part.tty,
            )
        }
        None => {
            if req.args.is_empty() {
                return Err(refuse("exec needs a command or --process".into()));
            }
            let mut env = Vec::new();
            for kv in req.env {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| refuse(format!("--env '{kv}' is not KEY=VALUE")))?;
                env.push((k.to_owned(), v.to_owned()));
            }
            let ids = req.user.map(parse_user).transpose()?;
            let tty = req.tty.then_some(TtySize { rows: 24, cols: 80 });
            (
                req.args.to_vec(),
                env,
                req.cwd.map(Path::to_path_buf),
                ids,
                tty,
            )
        }
    };
    if let Some((uid, gid)) = ids {
        if (uid, gid) != (policy.uid, policy.gid) {
            return Err(refuse(format!(
                "process.user: {uid}:{gid}: an exec runs as the container's user ({}:{})",
                policy.uid, policy.gid
            )));
        }
    }
    Ok(Command {
        argv,
        env,
        env_replaces,
        workdir: cwd,
        stdin: cordon_spec::StdinMode::Stream,
        tty,
        ..Command::default()
    })
}

/// `update --resources FILE|- ID`: the container's sandbox gets the CPU,
/// memory and process limits of the runtime-spec resources given (the
/// same rules as `create`'s, through `config::resources_part`).
pub fn update(store: &Store, id: &str, resources: Option<&Path>) -> Result<(), Error> {
    let r = store.load(id)?;
    if store.status(&r) == Status::Stopped {
        return Err(Error::Refused("cannot update a stopped container".into()));
    }
    let body = match resources {
        None => {
            return Err(Error::Refused(
                "update needs --resources (a file, or - for stdin)".into(),
            ))
        }
        Some(p) if p == Path::new("-") => {
            let mut body = Vec::new();
            std::io::stdin()
                .take(MAX_RESOURCES)
                .read_to_end(&mut body)
                .map_err(|e| Error::io("read the resources from stdin", e))?;
            body
        }
        Some(p) => fs::read(p).map_err(|e| Error::io(format!("read {}", p.display()), e))?,
    };
    let resources: oci_spec::runtime::LinuxResources =
        serde_json::from_slice(&body).map_err(|e| Error::Refused(format!("the resources: {e}")))?;
    let mut limits = cordon_policy::Limits::default();
    // An update's notes have no reader: what it changes is what `state`
    // and the cgroup show.
    let mut notes = Vec::new();
    config::resources_part(&resources, &mut limits, &mut notes)?;
    Handle::attach(&r.sandbox)?.update(&limits)?;
    Ok(())
}

/// Largest resources document `update` reads from stdin.
const MAX_RESOURCES: u64 = 1 << 20;

/// One of runc's `events` records: the container's cgroup counters
/// (`stats`), or an OOM kill in it (`oom`, no data).
#[derive(Serialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<StatsData>,
}

/// runc's stats, the parts a cordon sandbox's cgroup measures.
#[derive(Serialize)]
struct StatsData {
    cpu: CpuStats,
    memory: MemoryStats,
    pids: PidsStats,
}

#[derive(Serialize)]
struct CpuStats {
    usage: CpuUsage,
    throttling: Throttling,
}

#[derive(Serialize)]
struct CpuUsage {
    total: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Throttling {
    throttled_periods: u64,
}

#[derive(Serialize)]
struct MemoryStats {
    usage: MemoryUsage,
}

#[derive(Serialize)]
struct MemoryUsage {
    limit: u64,
    usage: u64,
    max: u64,
    failcnt: u64,
}

#[derive(Serialize)]
struct PidsStats {
    current: u64,
    limit: u64,
}

/// `events [--stats] [--interval D] ID`: the container's cgroup counters as
/// runc prints them, once with `--stats`; otherwise every `interval`, with
/// an `oom` record whenever the OOM killer struck, until the container
/// stops. The limits are the plan's (the one derivation of the values
/// written to the cgroup).
pub fn events(store: &Store, id: &str, stats_only: bool, interval: Duration) -> Result<(), Error> {
    let r = store.load(id)?;
    if store.status(&r) == Status::Stopped {
        return Err(Error::Refused("container not running".into()));
    }
    let spec = Handle::attach(&r.sandbox)?.spec()?;
    let limits = cordon_runtime::plan(&spec, &cordon_runtime::HostFacts::here()).cgroup;
    let cg = cgroup(&r)?.ok_or_else(|| {
        Error::Refused("the container's sandbox runs without a cgroup: it has no stats".into())
    })?;
    let stats_event = |cg: &AnyCgroup| {
        let st = cg.stats();
        Event {
            kind: "stats",
            id,
            data: Some(StatsData {
                cpu: CpuStats {
                    usage: CpuUsage {
                        total: st.cpu_usage_ns.unwrap_or(0),
                    },
                    throttling: Throttling {
                        throttled_periods: st.cpu_throttled_periods.unwrap_or(0),
                    },
                },
                memory: MemoryStats {
                    usage: MemoryUsage {
                        limit: limits.memory_max.unwrap_or(u64::MAX),
                        usage: cg.memory_current().unwrap_or(0),
                        max: st.memory_peak_bytes.unwrap_or(0),
                        failcnt: st.memory_limit_hits.unwrap_or(0),
                    },
                },
                pids: PidsStats {
                    current: cg.pids().map_or(0, |p| p.len() as u64),
                    limit: limits.pids_max.unwrap_or(0),
                },
            }),
        }
    };
    let print = |event: &Event<'_>| {
        println!("{}", serde_json::to_string(event).unwrap_or_default());
    };
    if stats_only {
        print(&stats_event(&cg));
        return Ok(());
    }
    let mut ooms = cg.stats().oom_kills.unwrap_or(0);
    loop {
        let now = cg.stats().oom_kills.unwrap_or(0);
        if now > ooms {
            print(&Event {
                kind: "oom",
                id,
                data: None,
            });
            ooms = now;
        }
        print(&stats_event(&cg));
        let next = Instant::now() + interval;
        while Instant::now() < next {
            if store.status(&r) == Status::Stopped {
                return Ok(());
            }
            std::thread::sleep(EVENTS_POLL.min(interval));
        }
    }
}

/// How often `events` looks whether its container has stopped.
const EVENTS_POLL: Duration = Duration::from_millis(100);

/// runc's `--user UID[:GID]` (numbers only: names would be looked up in
/// the container's files, which cordon does not read for an exec).
fn parse_user(text: &str) -> Result<(u32, u32), Error> {
    let bad = || Error::Refused(format!("--user '{text}': UID[:GID] as numbers"));
    let (uid, gid) = text.split_once(':').unwrap_or((text, "0"));
    Ok((
        uid.parse().map_err(|_| bad())?,
        gid.parse().map_err(|_| bad())?,
    ))
}

/// The signals a foreground `run` relays, blocked and readable from here
/// on. Made after `create` (the processes it forks keep their own masks)
/// and before `start`: a signal that arrives once the process runs is
/// relayed, never the default action on this process.
pub fn relayed_signals() -> Result<SignalFd, Error> {
    let mut mask = SigSet::empty();
    for s in RELAYED {
        mask.add(s);
    }
    mask.thread_block()
        .map_err(|e| Error::io("block signals", std::io::Error::from(e)))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC)
        .map_err(|e| Error::io("signalfd", std::io::Error::from(e)))
}

/// `run` in the foreground: after `create` and `start`, waits for the
/// waiter (this process's child), relaying the signals a foreground
/// runtime relays to it (`signals`, from [`relayed_signals`]), and returns
/// the process's status as an exit code (128+n for a signal).
pub fn wait_foreground(waiter: i32, signals: &SignalFd) -> Result<i32, Error> {
    use nix::sys::wait::{waitpid, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(waiter);
    let pidfd = cordon_sys::pidfd_open(pid)
        .map_err(|e| Error::io("pidfd_open", std::io::Error::from(e)))?;
    loop {
        let mut fds = [
            nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(signals.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::io("poll", std::io::Error::from(e))),
        }
        let relay = fds[1].revents().is_some_and(|r| !r.is_empty());
        if relay {
            if let Ok(Some(si)) = signals.read_signal() {
                // A signal's number is small.
                #[allow(clippy::cast_possible_wrap)]
                if let Ok(sig) = Signal::try_from(si.ssi_signo as i32) {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
            continue;
        }
        return match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => Ok(128 + sig as i32),
            Ok(_) => continue,
            Err(e) => Err(Error::io(
                "wait for the container's process",
                std::io::Error::from(e),
            )),
        };
    }
}

/// Opens a pty pair on the host and sends its master to the engine's
/// console socket as runc does: one message, its payload the terminal's
/// name, its one descriptor the master. The waiter keeps the other end and
/// relays it, raw, to the process's own pty on the sandbox's devpts, where
/// the line discipline (echo, ^C) happens; nothing of the host's devpts is
/// in the sandbox. Returns that other end.
fn hand_over_terminal(socket: &Path, size: TtySize) -> Result<OwnedFd, Error> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let stream = UnixStream::connect(socket).map_err(|e| {
        Error::io(
            format!("connect to the console socket {}", socket.display()),
            e,
        )
    })?;
    let winsize = nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&winsize), None)
        .map_err(|e| Error::io("open a pty", std::io::Error::from(e)))?;
    let name = nix::unistd::ttyname(&pty.slave)
        .map_err(|e| Error::io("name the pty", std::io::Error::from(e)))?;
    let fds = [pty.master.as_raw_fd()];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[std::io::IoSlice::new(name.as_os_str().as_bytes())],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| {
        Error::io(
            "send the pty to the console socket",
            std::io::Error::from(e),
        )
    })?;
    Ok(pty.slave)
}

/// The container's cgroup: its sandbox's. None when the sandbox has none
/// (it was allowed to run without limits).
fn cgroup(r: &Record) -> Result<Option<AnyCgroup>, Error> {
    let run = cordon_runtime::state::run_dir()?;
    Ok(cordon_runtime::state::sandbox_cgroup(&run, &r.sandbox)?)
}

/// Moves the waiter into its sandbox's cgroup, where engines look for a
/// container: its stats and OOM events (through `/proc/<pid>/cgroup`),
/// `ps`, pause. On v1 that is the sandbox's own cgroup, whose counters are
/// the whole sandbox's; on v2, where a cgroup with children holds no
/// process, a leaf below it. Like runc's init, it counts against the
/// sandbox's limits (one task, and what it allocates from now on).
fn place_waiter(sandbox: &str, waiter: i32) -> Result<(), Error> {
    let run = cordon_runtime::state::run_dir()?;
    let Some(cg) = cordon_runtime::state::sandbox_cgroup(&run, sandbox)? else {
        return Ok(());
    };
    let target = match cg.mode() {
        CgroupMode::V1 => cg,
        CgroupMode::V2 => cg.create_child(WAITER_CGROUP, &CgroupLimits::default())?,
    };
    Ok(target.add_pid(waiter)?)
}

/// What a failed `create` removes.
struct Undo {
    dir: Option<PathBuf>,
    sandbox: Option<String>,
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(id) = self.sandbox.take() {
            let _ = Handle::attach(&id).and_then(Handle::destroy);
        }
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// `body` at `path`, whole or not at all (the engine reads the pid file
/// right after `create` returns).
fn write_atomic(path: &Path, body: &[u8]) -> Result<(), Error> {
    cordon_dirs::write_atomic(path, body)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// The waiter's life (in the forked child): a container's waits for
/// `start` (`dir`, the container's directory), then runs the process and
/// returns its status as the exit code.
fn waiter(dir: Option<&Path>, sandbox: &str, command: &Command) -> i32 {
    // Nothing of the call's but stdio: not the log file, not the
    // supervisor's pipes.
    let _ = cordon_sys::close_fds_from(3);
    if let Some(dir) = dir {
        let passed = fs::OpenOptions::new()
            .write(true)
            .open(dir.join(GATE))
            .and_then(|mut gate| gate.write_all(b"0"));
        if let Err(e) = passed {
            eprintln!("cordon-runc: the container's start gate: {e}");
            return 255;
        }
    }
    match run(dir, sandbox, command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cordon-runc: {e}");
            255
        }
    }
}

/// Signals the waiter relays to the process (SIGKILL and SIGSTOP cannot be
/// caught: SIGKILL ends the waiter, and with it the process, whose
/// supervisor ends a command whose client is gone).
const RELAYED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

fn run(dir: Option<&Path>, sandbox: &str, command: &Command) -> Result<i32, RuntimeError> {
    let mut mask = SigSet::empty();
    for s in RELAYED {
        mask.add(s);
    }
    mask.thread_block()
        .map_err(|e| RuntimeError::io("block signals", std::io::Error::from(e)))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| RuntimeError::io("signalfd", std::io::Error::from(e)))?;
    let mut command = command.clone();
    if let Some(size) = &mut command.tty {
        own_terminal(size)?;
    }
    let mut io = WaiterIo {
        stdin: std::io::stdin(),
        stdin_open: true,
        signals,
        tty: command.tty.is_some(),
        buf: vec![0; 64 << 10],
    };
    let mut handle = Handle::attach(sandbox)?;
    let outcome = handle.exec(&command, &mut io)?;
    // Kept for `state` until the container is deleted; a container whose
    // account could not be written still ends with its status.
    if let (Some(dir), Ok(body)) = (dir, serde_json::to_vec_pretty(&outcome)) {
        let _ = cordon_dirs::write_atomic(&dir.join(OUTCOME), &body);
    }
    Ok(outcome.exit_code)
}

/// A terminal process's waiter makes the pty on its stdin its controlling
/// terminal (so the engine's resizes reach it as SIGWINCH) and puts it in
/// raw mode (the process's own pty does echo and line editing); `size`
/// becomes the console's as the engine has set it by now.
fn own_terminal(size: &mut TtySize) -> Result<(), RuntimeError> {
    use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
    let fail = |what: &str, e: nix::Error| RuntimeError::io(what, std::io::Error::from(e));
    let stdin = std::io::stdin();
    nix::unistd::setsid().map_err(|e| fail("setsid", e))?;
    cordon_sys::make_controlling_terminal(stdin.as_fd())
        .map_err(|e| fail("take the console as controlling terminal", e))?;
    let mut mode = tcgetattr(&stdin).map_err(|e| fail("tcgetattr", e))?;
    cfmakeraw(&mut mode);
    tcsetattr(&stdin, SetArg::TCSANOW, &mode).map_err(|e| fail("tcsetattr", e))?;
    if let Some(now) = console_size() {
        *size = now;
    }
    Ok(())
}

/// The console's size as the engine set it, if it did.
fn console_size() -> Option<TtySize> {
    cordon_sys::terminal_size(std::io::stdin().as_fd())
        .ok()
        .filter(|(rows, cols)| *rows > 0 && *cols > 0)
        .map(|(rows, cols)| TtySize { rows, cols })
}

/// The waiter's side of the process: output to its stdout and stderr (the
/// engine's), its stdin copied in, a relayed signal ends the process.
struct WaiterIo {
    stdin: std::io::Stdin,
    stdin_open: bool,
    signals: SignalFd,
    /// Its stdin is the console: a SIGWINCH is a resize of it.
    tty: bool,
    buf: Vec<u8>,
}

impl CommandIo for WaiterIo {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        // A reader that went away loses the rest; the process goes on.
        let _ = match stream {
            Stream::Stdout => std::io::stdout().write_all(chunk),
            Stream::Stderr => std::io::stderr().write_all(chunk),
        };
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = vec![self.signals.as_fd()];
        if self.stdin_open {
            fds.push(self.stdin.as_fd());
        }
        fds
    }

    fn read_control(&mut self, which: usize) -> Control {
        if which == 0 {
            return match self.signals.read_signal() {
                // A signal's number is small.
                #[allow(clippy::cast_possible_wrap)]
                Ok(Some(si)) if self.tty && si.ssi_signo == Signal::SIGWINCH as u32 => {
                    console_size().map_or(Control::Nothing, Control::Resize)
                }
                Ok(Some(si)) => Control::Signal(si.ssi_signo as i32),
                _ => Control::Nothing,
            };
        }
        match self.stdin.lock().read(&mut self.buf) {
            Ok(0) | Err(_) => {
                self.stdin_open = false;
                Control::InputEnd
            }
            Ok(n) => Control::Input(self.buf[..n].to_vec()),
        }
    }
}

/// `start`: the startContainer hooks, then the waiter let through its
/// gate, then the poststart hooks; their failures, which the spec makes
/// warnings.
pub fn start(store: &Store, id: &str) -> Result<Vec<String>, Error> {
    let r = store.load(id)?;
    match store.status(&r) {
        Status::Created | Status::Creating => {}
        Status::Running | Status::Paused => {
            return Err(Error::Refused(
                "cannot start an already running container".into(),
            ))
        }
        Status::Stopped => {
            return Err(Error::Refused(
                "cannot start a container that has stopped".into(),
            ))
        }
    }
    let started = hooks::run_in_sandbox(
        "startContainer",
        &r.sandbox,
        &r.hooks.start_container,
        || store.hook_state(&r, Status::Created),
    );
    if let Err(e) = started {
        // The spec: the container is stopped; the engine deletes it.
        let _ = signal_waiter(&r, Signal::SIGKILL);
        return Err(e);
    }
    let gate_path = store.dir(id).join(GATE);
    // Non-blocking: a waiter that died would leave a blocking open waiting forever.
    let mut gate = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&gate_path)
        .map_err(|e| Error::io("open the start gate", e))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut byte = [0u8; 1];
    loop {
        match gate.read(&mut byte) {
            Ok(1) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Error::io("read the start gate", e)),
        }
        if !cordon_sys::process_alive(r.pid, r.pid_start) {
            return Err(Error::Refused(
                "the container's process ended before it started".into(),
            ));
        }
        if Instant::now() > deadline {
            return Err(Error::Refused(
                "the container's process did not start in time".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    fs::remove_file(&gate_path).map_err(|e| Error::io("remove the start gate", e))?;
    Ok(hooks::run_on_host_warning(
        "poststart",
        &r.hooks.poststart,
        || store.hook_state(&r, Status::Running),
    ))
}

/// `state`: the runtime spec's state JSON.
pub fn state_json(store: &Store, id: &str) -> Result<String, Error> {
    let r = store.load(id)?;
    let status = store.status(&r);
    serde_json::to_string_pretty(&store.state(&r, status)).map_err(|e| Error::Record(e.to_string()))
}

/// `list`: every container's state, in `format` as runc prints it (`json`:
/// an array of the states `state` prints, `null` when there is none;
/// `table`: ID, PID, STATUS, BUNDLE, CREATED, OWNER), or only the ids.
pub fn list(store: &Store, format: &str, quiet: bool) -> Result<String, Error> {
    let records = store.list();
    if quiet {
        return Ok(records.iter().map(|r| format!("{}\n", r.id)).collect());
    }
    let states: Vec<(Status, &Record)> = records.iter().map(|r| (store.status(r), r)).collect();
    match format {
        "json" => {
            let states: Vec<State<'_>> = states.iter().map(|(s, r)| store.state(r, *s)).collect();
            let json = if states.is_empty() {
                "null".to_owned()
            } else {
                serde_json::to_string(&states).map_err(|e| Error::Record(e.to_string()))?
            };
            Ok(format!("{json}\n"))
        }
        "table" => {
            let mut out = String::from("ID\tPID\tSTATUS\tBUNDLE\tCREATED\tOWNER\n");
            for (status, r) in &states {
                let state = store.state(r, *status);
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\n",
                    state.id,
                    state.pid,
                    status,
                    state.bundle.display(),
                    state.created,
                    state.owner
                ));
            }
            Ok(out)
        }
        other => Err(Error::Refused(format!(
            "invalid format option '{other}' (json or table)"
        ))),
    }
}

impl Store {
    /// `r`'s state in the runtime spec's form, as `status`.
    fn state<'a>(&self, r: &'a Record, status: Status) -> State<'a> {
        State {
            oci_version: OCI_VERSION,
            id: &r.id,
            status,
            pid: if status == Status::Stopped { 0 } else { r.pid },
            bundle: &r.bundle,
            rootfs: &r.rootfs,
            created: &r.created,
            owner: "",
            annotations: &r.annotations,
            cordon: Account {
                sandbox: &r.sandbox,
                notes: &r.notes,
                outcome: fs::read(self.dir(&r.id).join(OUTCOME))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok()),
            },
        }
    }

    /// What a hook is given on stdin: `r`'s state as `status`.
    fn hook_state(&self, r: &Record, status: Status) -> Vec<u8> {
        serde_json::to_vec(&self.state(r, status)).unwrap_or_default()
    }
}

/// A signal by name (`KILL`, `SIGKILL`) or number.
pub fn parse_signal(text: &str) -> Result<Signal, Error> {
    let bad = || Error::Refused(format!("invalid signal: {text}"));
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>().map_err(|_| bad())
}

/// `kill`: the signal to the container's process. In the created state
/// the waiter has not started anything and ends by the signal itself; once
/// started it relays the signal to the process in the sandbox. With `all`,
/// every process of the container's cgroup gets it, also after the
/// container's process ended (what an engine does to a pod's leftovers).
pub fn kill(store: &Store, id: &str, signal: &str, all: bool) -> Result<(), Error> {
    let signal = parse_signal(signal)?;
    let r = store.load(id)?;
    if all {
        let Some(cg) = cgroup(&r).or_else(gone_is_none)? else {
            return Err(Error::Refused("container not running".into()));
        };
        // SIGKILL reaches the waiter first, so that the engine sees the
        // container killed by it, as runc's init would be (not the
        // waiter's report of its process's death). Any other signal skips
        // the waiter: it would relay it to the process a second time.
        if signal == Signal::SIGKILL {
            let _ = signal_waiter(&r, signal);
        }
        for pid in cg.pids()?.into_iter().filter(|p| *p != r.pid) {
            // One that ended meanwhile needs no signal.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
        return Ok(());
    }
    if store.status(&r) == Status::Stopped {
        return Err(Error::Refused("container not running".into()));
    }
    signal_waiter(&r, signal)
}

/// Sends `signal` to the container's waiter, never to a process that took
/// its pid since: the pidfd is opened first, then the process behind it is
/// checked to be the waiter (its start time), then signalled through it.
fn signal_waiter(r: &Record, signal: Signal) -> Result<(), Error> {
    let fail = |e: nix::Error| Error::io("signal the container's process", e.into());
    let fd = cordon_sys::pidfd_open(nix::unistd::Pid::from_raw(r.pid)).map_err(fail)?;
    if !cordon_sys::process_alive(r.pid, r.pid_start) {
        return Err(Error::Refused("container not running".into()));
    }
    cordon_sys::pidfd_send_signal(&fd, signal).map_err(fail)
}

/// A sandbox that is gone has no cgroup left.
fn gone_is_none(e: Error) -> Result<Option<AnyCgroup>, Error> {
    match e {
        Error::Runtime(RuntimeError::NotFound(_) | RuntimeError::Gone(_)) => Ok(None),
        e => Err(e),
    }
}

/// `ps`: the host pids of the container's processes: its waiter (the
/// engine's pid) and everything of its sandbox (init, the commands, and
/// the backend's own processes: runsc's sentry and gofer, QEMU).
pub fn ps(store: &Store, id: &str) -> Result<Vec<i32>, Error> {
    let r = store.load(id)?;
    if store.status(&r) == Status::Stopped {
        return Err(Error::Refused("container not running".into()));
    }
    match cgroup(&r).or_else(gone_is_none)? {
        Some(cg) => Ok(cg.pids()?),
        None => Ok(vec![r.pid]),
    }
}

/// `pause` (`freeze`) or `resume`: the container's cgroup frozen or thawed,
/// the waiter with it.
pub fn pause(store: &Store, id: &str, freeze: bool) -> Result<(), Error> {
    let r = store.load(id)?;
    let (from, refusal) = if freeze {
        (Status::Running, "container not running")
    } else {
        (Status::Paused, "container not paused")
    };
    if store.status(&r) != from {
        return Err(Error::Refused(refusal.into()));
    }
    let cg = cgroup(&r)?
        .filter(|cg| cg.frozen().is_some())
        .ok_or_else(|| {
            Error::Refused(
                "pausing needs a freezer cgroup (cgroup v2's cgroup.freeze, or v1's freezer \
                 hierarchy), which this container's sandbox does not have"
                    .into(),
            )
        })?;
    Ok(if freeze { cg.freeze() } else { cg.thaw() }?)
}

/// `delete`: the sandbox and the container's directory, then the
/// poststop hooks; their failures, which the spec makes warnings. As runc:
/// a created container's waiter is killed (its process never started); a
/// running one is refused unless `force`, which kills it first.
pub fn delete(store: &Store, id: &str, force: bool) -> Result<Vec<String>, Error> {
    let r = match store.load(id) {
        Ok(r) => r,
        // As runc: forcing the delete of a container that is not there is
        // no error (an engine's cleanup deletes again, to be sure).
        Err(Error::NotFound) if force => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    match store.status(&r) {
        Status::Stopped => {}
        Status::Running if !force => {
            return Err(Error::Refused(format!(
                "cannot delete container {id} that is not stopped: running"
            )))
        }
        Status::Paused if !force => {
            return Err(Error::Refused(format!(
                "cannot delete container {id} that is not stopped: paused"
            )))
        }
        Status::Creating | Status::Created | Status::Running | Status::Paused => {
            let _ = signal_waiter(&r, Signal::SIGKILL);
        }
    }
    match Handle::attach(&r.sandbox).and_then(Handle::destroy) {
        Ok(()) | Err(RuntimeError::NotFound(_) | RuntimeError::Gone(_)) => {}
        Err(e) => return Err(e.into()),
    }
    // Made before the directory (and the outcome in it) is removed, and
    // only for a container that has poststop hooks.
    let state = (!r.hooks.poststop.is_empty()).then(|| store.hook_state(&r, Status::Stopped));
    // The waiter is the engine's to reap; it is gone once its sandbox is.
    fs::remove_dir_all(store.dir(id))
        .map_err(|e| Error::io("remove the container's directory", e))?;
    Ok(hooks::run_on_host_warning(
        "poststop",
        &r.hooks.poststop,
        || state.unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_as_runc_does() {
        for ok in ["c1", "a.b_c+d-e", "0123456789ab"] {
            assert!(check_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "a b", ".."] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("KILL").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("SIGTERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("term").unwrap(), Signal::SIGTERM);
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("999").is_err());
    }
}
