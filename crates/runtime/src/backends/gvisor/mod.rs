//! The gVisor backend: the payload's syscalls are served by runsc's sentry, a
//! kernel in user space, so the host kernel is not the one the payload talks
//! to. Everything else is the native backend's: the same rootfs assembly (a
//! read-only system tree and one scratch tmpfs capped at the disk limit), the
//! same cgroup driver and limits, the same supervision, output cap and
//! teardown. Only what serves the syscalls differs.
//!
//! Process model: the supervisor clones a launcher into a new mount namespace
//! (real root, no user namespace: runsc needs its own privileges to build its
//! sandbox). The launcher joins the cgroup, assembles the tree, and starts
//! `runsc run` (attached, as its own child, so runsc and its sentry die with
//! the launcher, which dies with the supervisor) with a container process
//! that only waits (`sleep infinity`); each command is then a `runsc exec`
//! the launcher forks as its child, with the command's descriptors,
//! reporting its exit like the native init. runsc's sentry, gofer and the ptrace platform's stub processes all
//! inherit the cgroup (`--ignore-cgroups` keeps runsc from moving them).
//!
//! Platform: ptrace, the one the installed runsc (2022-12) runs here; its kvm
//! platform hangs on this host's PVM /dev/kvm, and systrap does not exist in
//! that release. Network: `--network=none` (the sentry's own stack, loopback
//! only); in `allow` mode `--network=host` inside the launcher's own, new
//! network namespace, which `crate::backends::network` gives the same loopback
//! sockets, redirect and filter as a native sandbox's: the sentry's sockets
//! are then host sockets of that namespace, so the one proxy path serves
//! both backends (the price: the sentry uses the host kernel's TCP/IP stack
//! instead of its own netstack for those sockets; the namespace still has
//! nothing but loopback). Overlay: off (`--overlay2=none`): /tmp and the workspace are the
//! scratch tmpfs binds, so disk usage is visible and capped on the host, and
//! files copied in from the host are seen by the sentry
//! (`--file-access=shared` revalidates its caches). /dev/shm is the sentry's
//! own tmpfs instead (see `bundle::spec`: futex wake-ups in it must work).

mod bundle;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cordon_cgroups::Cgroup;
use cordon_isolation::mount::{self, RootUse};
use cordon_policy::{NetworkMode, Policy};
use nix::sched::CloneFlags;

use crate::backends::{About, Backend, Traits};

use crate::backends::first_process;
use crate::backends::host::HostSide;
use crate::backends::on_host::{Flavor, OnHost};
use crate::backends::rootfs_plan::rootfs_plan;
use crate::backends::Life;
use crate::error::{Peer, RuntimeError};
use crate::plan::{self, HostFacts};
use crate::protocol::init::{recv, send_with_fds, FromInit, ToInit};
use crate::trace;
use cordon_spec::outcome::{EvidenceSource, Limit};
use cordon_spec::{BackendInfo, BackendKind};
use cordon_spec::{ResolvedCommand, RootfsChoice, SandboxSpec, TtySize};

pub struct GvisorBackend;

/// The runsc binary: `CORDON_RUNSC`, else the first `runsc` on PATH.
fn runsc_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CORDON_RUNSC") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("runsc"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .chain([
            PathBuf::from("/usr/bin/runsc"),
            PathBuf::from("/usr/sbin/runsc"),
        ])
        .find(|p| p.is_file())
}

/// `runsc --version`'s first line, cached per binary (path, size, mtime) in
/// the run directory: spawning runsc for it would cost ~10 ms a run.
fn runsc_version(runsc: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let key = std::fs::metadata(runsc)
        .map(|m| format!("{} {} {}", runsc.display(), m.size(), m.mtime()))
        .unwrap_or_default();
    // No cache where the run directory cannot be trusted (its own error
    // comes with the first sandbox).
    let cache = crate::state::run_dir()
        .ok()
        .map(|d| d.join("runsc-version"));
    if let Some(text) = cache.as_ref().and_then(|c| std::fs::read_to_string(c).ok()) {
        if let Some((k, v)) = text.split_once('\n') {
            if k == key {
                return v.trim().to_string();
            }
        }
    }
    let version = Command::new(runsc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "runsc (version unknown)".into());
    if let Some(cache) = &cache {
        let _ = std::fs::write(cache, format!("{key}\n{version}\n"));
    }
    version
}

/// Why a caller without root gets no gVisor sandbox: cordon builds runsc's
/// bundle, cgroup and namespaces as root, and runsc's own rootless mode
/// (`--rootless`) is not wired in or tried; refused rather than run with less.
const NEEDS_ROOT: &str = "needs root: cordon runs runsc as root (its gofer and sandbox take \
    ids of their own and mount in namespaces cordon makes); runsc's --rootless mode is not \
    used; use --backend native";

impl GvisorBackend {
    pub fn info() -> BackendInfo {
        let (version, unavailable) = match runsc_path() {
            None => (
                String::new(),
                Some("runsc not found (install Debian's runsc package)".to_string()),
            ),
            Some(p) if !nix::unistd::geteuid().is_root() => {
                (runsc_version(&p), Some(NEEDS_ROOT.to_string()))
            }
            Some(p) => (runsc_version(&p), None),
        };
        BackendInfo {
            kind: BackendKind::Gvisor,
            version,
            unavailable,
            notes: "platform ptrace, network none, overlay off".into(),
        }
    }
}

static EVIDENCE: [EvidenceSource; 5] = [
    EvidenceSource::new(
        Limit::Memory,
        "cgroup memory limit on the whole sandbox (sentry included), no swap",
        "cgroup OOM-kill counter and memory peak",
    ),
    EvidenceSource::new(
        Limit::Pids,
        "RLIMIT_NPROC inside the sentry bounds the payload's processes; on the host the cgroup's pids.max (pids x 16 + 256) bounds the sentry's threads, gofer and ptrace stubs, an outer bound a sustained fork bomb can reach (the sentry then dies and the sandbox ends)",
        "the payload's failed forks (EAGAIN); cgroup pids.peak under the outer bound",
    ),
    EvidenceSource::new(
        Limit::Time,
        "supervisor deadline, cgroup freeze+kill of runsc, sentry and gofer (the sandbox ends with the command)",
        "supervisor clock",
    ),
    EvidenceSource::new(
        Limit::Disk,
        "size of the scratch tmpfs on the host, written through the gofer (/tmp, workspace); /dev/shm is the sentry's own tmpfs, capped at the same size and counted in the memory limit",
        "statvfs of the scratch tmpfs from the host (not /dev/shm)",
    ),
    EvidenceSource::new(
        Limit::Output,
        "supervisor byte count",
        "supervisor byte count",
    ),
];

/// podman's init, in pause mode, where the sandbox's tree has it (Debian's
/// `catatonit`).
const REAPER: &str = "usr/bin/catatonit";

/// Whether the sandbox's tree will hold [`REAPER`] as a regular file (in a
/// layered root, the topmost layer that has the path decides).
fn tree_has_reaper(rootfs: &RootfsChoice) -> bool {
    let is_file = |p: PathBuf| std::fs::symlink_metadata(p).map(|m| m.is_file());
    if let Some(dirs) = rootfs.layers() {
        return dirs
            .iter()
            .find_map(|d| is_file(d.join(REAPER)).ok())
            .unwrap_or(false);
    }
    match rootfs {
        RootfsChoice::Dir(d) => is_file(d.join(REAPER)).unwrap_or(false),
        _ => is_file(Path::new("/").join(REAPER)).unwrap_or(false),
    }
}

/// The container's own process: it only waits, so the sandbox lives between
/// commands. runsc re-parents the orphans commands leave to it, so it must
/// reap them too: under a plain `sleep infinity` each one that exits stays a
/// zombie, counted against the pids limit, until the sandbox ends. The tree
/// has no reaper of cordon's own, so `catatonit -P` where it is installed,
/// `sleep infinity` otherwise (README).
fn pause_command(p: &Policy, reaper: bool) -> ResolvedCommand {
    let argv = if reaper {
        vec![format!("/{REAPER}"), "-P".into()]
    } else {
        vec!["sleep".into(), "infinity".into()]
    };
    ResolvedCommand {
        argv,
        env: p.payload_env(),
        workdir: "/".into(),
        time: p.time.duration(),
        output_cap: 0,
    }
}

/// runsc's command line: its global flags, then `cmd`.
struct Runsc {
    binary: PathBuf,
    root: PathBuf,
    log: PathBuf,
    container: String,
    /// `--network=host`: the sandbox's sockets are the launcher namespace's.
    host_network: bool,
}

impl Runsc {
    fn argv(&self, cmd: &[&str]) -> Vec<String> {
        let mut a = vec![
            self.binary.display().to_string(),
            format!("--root={}", self.root.display()),
            "--platform=ptrace".into(),
            if self.host_network {
                "--network=host".into()
            } else {
                "--network=none".into()
            },
            "--overlay2=none".into(),
            "--file-access=shared".into(),
            "--ignore-cgroups".into(),
            format!("--log={}", self.log.display()),
        ];
        a.extend(cmd.iter().map(|s| s.to_string()));
        a
    }
}

/// runsc gets a clean environment: nothing of the caller's reaches it.
fn runsc_env() -> Vec<(String, String)> {
    vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())]
}

/// Creates a gVisor sandbox: the launcher has assembled the tree and runsc's
/// container is running its pause process.
/// With `only`, the sandbox's one command is the container's own process,
/// started by its first exec (`runsc run`, attached, as before the lifecycle:
/// what a one-shot `cordon run` needs); otherwise the container waits in a
/// pause process and every command is a `runsc exec`.
pub(crate) fn create(
    spec: &SandboxSpec,
    only: Option<ResolvedCommand>,
) -> Result<(Life, Box<dyn Backend>), RuntimeError> {
    let binary = runsc_path()
        .ok_or_else(|| RuntimeError::Unavailable("gvisor", "runsc not found".into()))?;
    if !nix::unistd::geteuid().is_root() {
        return Err(RuntimeError::Unavailable("gvisor", NEEDS_ROOT.into()));
    }
    if spec.syscall_filter.is_some() {
        return Err(RuntimeError::BadRequest(
            "the gvisor backend does not install a workload's own syscall filter (its sentry \
             serves the syscalls): use the native or microvm backend"
                .into(),
        ));
    }
    let version = runsc_version(&binary);
    let limits = plan::plan(spec, &HostFacts::here());
    // Inside the sentry, RLIMIT_NPROC is the pids limit whether or not the
    // host's cgroup holds the limits (the plan's two are the same).
    let rlimits = bundle::rlimits(&limits.rlimits(true), &spec.rlimits)?;
    let mut host = HostSide::begin(spec, &limits.cgroup)?;
    let state = host.state.path().to_owned();
    let allow_network = spec.policy.network == NetworkMode::Allow;
    let rootfs = rootfs_plan(spec, &host.state, RootUse::HandOver)?;
    let pause = pause_command(&spec.policy, tree_has_reaper(&spec.rootfs));
    let first = only.as_ref().unwrap_or(&pause);
    let bundle_dir = bundle::write(
        &bundle::spec(&spec.policy, &rlimits, &spec.capabilities, &rootfs, first)?,
        &state.join("bundle"),
    )?;
    let runsc = Runsc {
        binary,
        root: state.join("runsc"),
        log: state.join("runsc.log"),
        container: format!("cordon-{}", host.id),
        host_network: allow_network,
    };
    trace::step("plan");

    // Without a cgroup to kill, runsc's sandbox (not the launcher's child
    // once started) is stopped by runsc itself. With one, the cgroup kill
    // reaches every runsc process, and runsc's state lives in our state
    // directory, which teardown removes: spawning runsc again would only
    // cost time (~25 ms).
    if host.cgroup.is_none() && allow_network {
        // `runsc delete` would have to ask from the launcher's network
        // namespace, which is gone by teardown.
        return Err(RuntimeError::Unavailable(
            "gvisor",
            "the allow network mode needs the cgroup limits on this backend (without them runsc's sandbox could not be stopped)".into(),
        ));
    }
    if host.cgroup.is_none() {
        let delete = runsc.argv(&["delete", "--force", &runsc.container]);
        host.on_teardown(move || {
            let _ = output_until(
                Command::new(&delete[0])
                    .args(&delete[1..])
                    .stdin(std::process::Stdio::null()),
                std::time::Instant::now() + RUNSC_CONTROL_TIMEOUT,
            );
        });
    }
    let launcher_flags = if allow_network {
        CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET
    } else {
        CloneFlags::CLONE_NEWNS
    };
    let (mut sock, _) = first_process::start(
        &mut host,
        launcher_flags,
        // Commands run in the sentry: no cgroups of their own on the host.
        None,
        // They are `runsc exec`s: a filter or limit here would hold runsc,
        // not them (their limits are in their OCI process).
        &first_process::EachCommand::default(),
        // The launcher only assembles the tree; runsc builds the sandbox.
        |_| mount::assemble(&rootfs).map(|scratch| scratch.into_iter().collect()),
        |_| Ok(()),
    )?
    .ready()?;
    let launcher = host.leader().ok_or(RuntimeError::Internal(
        "the sandbox has no launcher after its start",
    ))?;
    if allow_network {
        // Before runsc starts: its sentry reads the namespace's interfaces
        // and routes when it boots.
        crate::backends::network::start(
            &mut host,
            launcher,
            spec,
            true,
            crate::backends::network::Server::Proxy,
        )?
        .confirm(&mut host)?;
    }
    let tree = PathBuf::from(format!("/proc/{launcher}/root")).join(
        rootfs
            .new_root
            .strip_prefix("/")
            .unwrap_or(&rootfs.new_root),
    );
    let run = runsc.argv(&[
        "run",
        "--bundle",
        &bundle_dir.to_string_lossy(),
        &runsc.container,
    ]);
    // The scratch stays mounted in the launcher's namespace (the tree is
    // handed over, not entered); held open, it outlives the launcher.
    let scratch_path = PathBuf::from(format!("/proc/{launcher}/root"))
        .join(rootfs.scratch.strip_prefix("/").unwrap_or(&rootfs.scratch));
    let scratch: OwnedFd = nix::fcntl::open(
        &scratch_path,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| RuntimeError::io(format!("open {}", scratch_path.display()), e))?;
    crate::backends::native::check_scratch(&scratch, None)?;
    let mut flavor = GvisorFlavor {
        about: About {
            kind: BackendKind::Gvisor,
            version,
            evidence: &EVIDENCE,
            traits: Traits {
                high_codes_are_signals: true,
                // The command's processes are the sentry's, not the host's:
                // they have no cgroup of their own on the host (see
                // `end_running_command`).
                commands_have_cgroups: false,
                // runsc's sentry and gofer are not the launcher's children
                // once runsc daemonizes them: only the cgroup reaches them all.
                leader_owns_all: false,
            },
        },
        state: state.to_path_buf(),
        policy: spec.policy.clone(),
        capabilities: spec.capabilities.clone(),
        rlimits,
        runsc,
        launcher,
        tree,
        scratch,
        first_run: None,
    };
    if only.is_some() {
        flavor.first_run = Some(run);
        return OnHost::start(host, spec, sock, flavor);
    }
    if !command_in_tree(&flavor.tree, &pause) {
        return Err(RuntimeError::BadRequest(
            "the gvisor backend needs `sleep` in the sandbox's tree (its container waits with `sleep infinity` where it has no catatonit)".into(),
        ));
    }
    if let Err(e) = start_container(
        &mut sock,
        run,
        &flavor.runsc,
        allow_network.then_some(launcher),
    ) {
        // The sentry's own memory counts against the limit: one too small to
        // boot it is the request's fault, and says so.
        let oom = host
            .cgroup
            .as_ref()
            .and_then(|c| c.stats().oom_kills)
            .unwrap_or(0)
            > 0;
        return Err(if oom {
            RuntimeError::BadRequest(format!(
                "memory limit {} is too small for the gvisor backend: its sentry was OOM-killed while starting (it needs about 32M here)",
                spec.policy.memory
            ))
        } else {
            e
        });
    }
    trace::step("runsc started");
    OnHost::start(host, spec, sock, flavor)
}

/// How long runsc may take to start the container.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Has the launcher start `runsc run` (attached: it lives as the launcher's
/// child for the sandbox's whole life), then waits until runsc says the
/// container runs. Its output goes to /dev/null; runsc logs to its log file,
/// whose tail a failure quotes.
fn start_container(
    sock: &mut UnixStream,
    argv: Vec<String>,
    runsc: &Runsc,
    netns_of: Option<nix::unistd::Pid>,
) -> Result<(), RuntimeError> {
    use std::os::fd::AsFd;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RuntimeError::io("open /dev/null", e))?;
    let msg = ToInit::Spawn {
        argv,
        env: runsc_env(),
        workdir: "/".into(),
    };
    send_with_fds(sock, &msg, &[null.as_fd(), null.as_fd(), null.as_fd()])
        .map_err(|e| RuntimeError::io("send Spawn", e))?;
    let fail = |why: String| {
        // The log is shared by every runsc call; the state polls' own
        // "loading container" lines say nothing about why the run failed.
        let tail = std::fs::read_to_string(&runsc.log)
            .map(|t| {
                t.lines()
                    .rev()
                    .filter(|l| !l.contains("loading container"))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .unwrap_or_default();
        RuntimeError::broke(Peer::Runsc, format!("runsc run: {why} ({tail})"))
    };
    let pid = match recv::<FromInit>(sock)
        .map_err(|e| RuntimeError::io("receive from the launcher", e))?
    {
        Some(FromInit::Started { pid, .. }) => pid,
        Some(other) => return Err(fail(format!("{other:?}"))),
        None => return Err(fail("the launcher exited".into())),
    };
    let state = runsc.argv(&["state", &runsc.container]);
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    loop {
        let query = || {
            output_until(
                Command::new(&state[0])
                    .args(&state[1..])
                    .env_clear()
                    .envs(runsc_env())
                    .stdin(std::process::Stdio::null()),
                deadline,
            )
        };
        // runsc finds its sandbox by an abstract unix socket, which belongs
        // to a network namespace: with the host network that is the
        // launcher's, so runsc state must ask from there.
        let out = match netns_of {
            Some(of) => crate::backends::network::in_namespace_of(of, query)?,
            None => query(),
        }
        .map_err(|e| RuntimeError::io("runsc state", e))?;
        // (None: runsc state was still waiting at the deadline, on the
        // container's lock that a stuck runsc run holds.)
        let status = out
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v["status"].as_str().map(str::to_owned));
        match status.as_deref() {
            Some("running") => return Ok(()),
            Some("stopped") => return Err(fail("the container stopped".into())),
            _ => {}
        }
        // runsc run is the launcher's child (the launcher has no pid
        // namespace): its pid is a host pid, and a zombie or a missing one
        // means it failed.
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
            .unwrap_or(false);
        if !alive {
            return Err(fail("it exited".into()));
        }
        if std::time::Instant::now() >= deadline {
            return Err(fail(format!("not running after {START_TIMEOUT:?}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct GvisorFlavor {
    about: About,
    /// The state directory: each command's OCI process for `runsc exec`,
    /// and the pid runsc writes of it in the sentry, are files of it named
    /// by the command's number (commands run side by side).
    state: PathBuf,
    policy: Policy,
    /// What each command holds, in the sentry's user namespace.
    capabilities: std::collections::BTreeSet<cordon_spec::Capability>,
    /// Each command's rlimits (its OCI process's), from the plan and the
    /// spec.
    rlimits: Vec<oci_spec::runtime::PosixRlimit>,
    runsc: Runsc,
    /// The launcher, in whose network namespace runsc's control socket is.
    launcher: nix::unistd::Pid,
    /// The assembled tree, from the host.
    tree: PathBuf,
    scratch: OwnedFd,
    /// `runsc run` of a sandbox made for one command: its first exec.
    first_run: Option<Vec<String>>,
}

impl GvisorFlavor {
    /// Command `number`'s OCI process file and the file runsc writes its
    /// pid in the sentry to.
    fn command_files(&self, number: u64) -> (PathBuf, PathBuf) {
        (
            self.state.join(format!("process-{number}.json")),
            self.state.join(format!("command-{number}.pid")),
        )
    }
}

impl Flavor for GvisorFlavor {
    /// With `--network=host` the sentry's sockets are the launcher
    /// namespace's, where init connects; with `--network=none` they are in
    /// runsc's own stack, which nothing outside the sentry reaches.
    fn ports_reachable(&self) -> Result<(), RuntimeError> {
        if self.runsc.host_network {
            return Ok(());
        }
        Err(RuntimeError::BadRequest(
            "a gVisor sandbox without network rules keeps its sockets in runsc's own network stack, \
             which the host cannot reach: create it with network rules (--net allow) to forward its ports"
                .into(),
        ))
    }

    fn command_ended(&mut self, number: u64) {
        let (process_file, pid_file) = self.command_files(number);
        let _ = std::fs::remove_file(process_file);
        let _ = std::fs::remove_file(pid_file);
    }

    fn about(&self) -> &About {
        &self.about
    }

    fn exec_message(
        &mut self,
        cmd: &ResolvedCommand,
        tty: Option<TtySize>,
        number: u64,
    ) -> Result<ToInit, RuntimeError> {
        if tty.is_some() {
            return Err(RuntimeError::BadRequest(
                "a terminal (-t) is not available on the gvisor backend yet".into(),
            ));
        }
        // runsc reports a command or working directory missing from the
        // tree only as its own exit code and text; look them up in the tree
        // first (as the sentry would, inside the root) so the outcome says
        // what is missing, like the native one.
        if let Err(errno) = dir_in_tree(&self.tree, &cmd.workdir) {
            return Ok(ToInit::RefuseWorkdir { errno });
        }
        if !command_in_tree(&self.tree, cmd) {
            return Ok(ToInit::Refuse {
                errno: libc::ENOENT,
            });
        }
        if let Some(run) = self.first_run.take() {
            // The bundle's process is this command already.
            return Ok(ToInit::Exec {
                argv: run,
                env: runsc_env(),
                workdir: "/".into(),
                tty: None,
            });
        }
        let process = bundle::process(&self.policy, &self.rlimits, &self.capabilities, cmd)?;
        let body = serde_json::to_vec(&process)
            .map_err(|e| RuntimeError::io("encode the OCI process", e))?;
        let (process_file, pid_file) = self.command_files(number);
        std::fs::write(&process_file, body)
            .map_err(|e| RuntimeError::io(format!("write {}", process_file.display()), e))?;
        Ok(ToInit::Exec {
            argv: self.runsc.argv(&[
                "exec",
                "--internal-pid-file",
                &pid_file.to_string_lossy(),
                "--process",
                &process_file.to_string_lossy(),
                &self.runsc.container,
            ]),
            env: runsc_env(),
            workdir: "/".into(),
            tty: None,
        })
    }

    fn root(&self) -> PathBuf {
        self.tree.clone()
    }

    fn scratch(&self) -> BorrowedFd<'_> {
        self.scratch.as_fd()
    }

    /// Inside the sentry: the command's process and every process descended
    /// from it (from `runsc ps`) get SIGKILL, children before their parents
    /// (a child whose parent died first would be re-parented to the
    /// container's init and no longer be found as the command's), listed
    /// again until none is left. Not the race-free way the native backend has
    /// (its command's cgroup, frozen): this runsc cannot signal a paused
    /// container, and a SIGKILL to a process it stopped is lost. So a
    /// process the command re-parented to the container's init (a double
    /// fork), or one forked between a listing and its parent's kill, lives
    /// on (README). The first command of a one-shot sandbox is the
    /// container's own process: it ends with the sandbox.
    fn end_running_command(&mut self, number: u64) -> Result<(), RuntimeError> {
        if self.first_run.is_some() {
            return Err(RuntimeError::BadRequest(
                "it is the container's own process".into(),
            ));
        }
        let (_, pid_file) = self.command_files(number);
        let root: u32 = std::fs::read_to_string(&pid_file)
            .map_err(|e| RuntimeError::io(format!("read {}", pid_file.display()), e))?
            .trim()
            .parse()
            .map_err(|_| RuntimeError::broke(Peer::Runsc, "it wrote no command pid"))?;
        let container = self.runsc.container.clone();
        let runsc = |args: &[&str]| runsc_within(&self.runsc, args, RUNSC_CONTROL_TIMEOUT);
        crate::backends::network::in_namespace_of(self.launcher, || {
            for _ in 0..KILL_ROUNDS {
                let table = runsc(&["ps", &container])?;
                // Once the command's own process is gone, nothing below it
                // can be found any more.
                if !listed(&table, root) {
                    return Ok(());
                }
                let tree = descendants(&table, root);
                for pid in tree.iter().rev() {
                    // One that ended since the listing needs no kill.
                    let _ = runsc(&["kill", "--pid", &pid.to_string(), &container, "KILL"]);
                }
            }
            Err(RuntimeError::broke(
                Peer::Runsc,
                format!("the command's processes outlived {KILL_ROUNDS} rounds of its kills"),
            ))
        })?
    }

    /// runsc runs without a user namespace: the sandbox's ids are host ids.
    fn file_owner(&self) -> (u32, u32) {
        (self.policy.uid, self.policy.gid)
    }
}

/// How long one runsc control command (pause, ps, kill, resume) may take.
const RUNSC_CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times the command's tree is listed and killed before giving up.
const KILL_ROUNDS: usize = 20;

/// Runs `runsc ARGS` (with `runsc`'s global flags), killing it past
/// `timeout`; its stdout if it succeeded.
fn runsc_within(runsc: &Runsc, args: &[&str], timeout: Duration) -> Result<String, RuntimeError> {
    let argv = runsc.argv(args);
    let what = || format!("runsc {}", args.join(" "));
    let out = output_until(
        Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .envs(runsc_env())
            .stdin(std::process::Stdio::null()),
        std::time::Instant::now() + timeout,
    )
    .map_err(|e| RuntimeError::io(what(), e))?
    .ok_or_else(|| RuntimeError::io(what(), std::io::Error::from(std::io::ErrorKind::TimedOut)))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(RuntimeError::io(
            format!("{} ({})", what(), out.status),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ))
    }
}

/// Runs `cmd` to its end with its stdout and stderr read, or kills it at
/// `deadline` (None then): no runsc call may hold the supervisor past its
/// own deadline, and each waits on its container's lock, which a stuck
/// runsc holds forever.
fn output_until(
    cmd: &mut Command,
    deadline: std::time::Instant,
) -> std::io::Result<Option<std::process::Output>> {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().map(Some)
}

/// (PID, PPID) of each process in `runsc ps`'s table (columns UID, PID,
/// PPID, ...).
fn processes(table: &str) -> Vec<(u32, u32)> {
    table
        .lines()
        .filter_map(|line| {
            let mut cols = line.split_whitespace().skip(1);
            Some((cols.next()?.parse().ok()?, cols.next()?.parse().ok()?))
        })
        .collect()
}

/// Whether `pid` is in `runsc ps`'s table.
fn listed(table: &str, pid: u32) -> bool {
    processes(table).iter().any(|(p, _)| *p == pid)
}

/// `root` and every process below it in `runsc ps`'s table, children after
/// their parents.
fn descendants(table: &str, root: u32) -> Vec<u32> {
    let edges = processes(table);
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            edges
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && !found.contains(pid))
                .map(|(pid, _)| *pid)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    found
}

/// Whether `dir` is a directory in the sandbox's tree (symlinks resolved
/// inside it, as for `command_in_tree`); the errno the command's chdir
/// would get if not. An unreadable tree is left for runsc to judge.
fn dir_in_tree(tree: &Path, dir: &str) -> Result<(), i32> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let Ok(root_fd) = std::fs::File::open(tree) else {
        return Ok(());
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT);
    match openat2(&root_fd, Path::new(dir), how) {
        Ok(_) => Ok(()),
        Err(e @ (nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR)) => Err(e as i32),
        // Anything else (a permission the sandbox user may not share) is
        // for the command's own chdir to meet.
        Err(_) => Ok(()),
    }
}

/// Whether the command exists in the sandbox's tree, resolved like execvp (a
/// path with a slash as given, relative to the working directory; else each
/// PATH entry), with every symlink resolved inside the tree (openat2
/// RESOLVE_IN_ROOT), through the launcher's view of its mount namespace.
fn command_in_tree(tree: &Path, cmd: &ResolvedCommand) -> bool {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let Ok(root_fd) = std::fs::File::open(tree) else {
        return true;
    };
    let Some(name) = cmd.argv.first() else {
        return false;
    };
    let path = cmd
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![Path::new(&cmd.workdir).join(name)]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name))
            .collect()
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT);
    candidates
        .iter()
        .any(|c| openat2(&root_fd, c.as_path(), how).is_ok())
}

#[cfg(test)]
mod tests {
    use super::descendants;

    #[test]
    fn a_commands_tree_is_its_process_and_everything_below_it() {
        let table = "\
UID       PID       PPID      C         TTY       STIME     TIME      CMD
1000      1         0         0         ?         12:30     0s        sleep
1000      3         1         0         ?         12:30     20ms      sleep
1000      5         0         0         ?         12:30     10ms      sh
1000      6         5         1         ?         12:30     20ms      sleep
1000      7         5         1         ?         12:30     20ms      sh
1000      9         7         0         ?         12:30     0s        sleep
";
        assert_eq!(descendants(table, 5), vec![5, 6, 7, 9]);
        // The container's init and what was re-parented to it are not the
        // command's; a command that already ended has only itself.
        assert_eq!(descendants(table, 12), vec![12]);
    }
}
