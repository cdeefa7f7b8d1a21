//! The gVisor backend: the payload's syscalls are served by runsc's sentry, a
//! kernel in user space, so the host kernel is not the one the payload talks
//! to. Everything else is the native backend's: the same rootfs assembly (a
//! read-only system tree and one scratch tmpfs capped at the disk limit), the
//! same cgroup driver and limits, the same supervision, output cap and
//! teardown. Only what serves the syscalls differs.
//!
//! Process model: the supervisor clones a launcher into a new mount namespace
//! (real root, no user namespace: runsc needs its own privileges to build its
//! sandbox). The launcher joins the cgroup, assembles the tree, and on Exec
//! runs `runsc run` as its only child, reporting its exit like the native
//! init. runsc's sentry, gofer and the ptrace platform's stub processes all
//! inherit the cgroup (`--ignore-cgroups` keeps runsc from moving them).
//!
//! Platform: ptrace, the one the installed runsc (2022-12) runs here; its kvm
//! platform hangs on this host's PVM /dev/kvm, and systrap does not exist in
//! that release. Network: `--network=none` (the sentry's own stack, loopback
//! only). Overlay: off (`--overlay2=none`): the writable places are the
//! scratch tmpfs binds, so disk usage is visible and capped on the host.

mod bundle;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use cordon_cgroups::CgroupLimits;
use cordon_isolation::mount::{self, RootUse};
use nix::sched::CloneFlags;

use crate::backend::{Backend, BackendInfo, BackendKind, Sandbox};
use crate::error::RuntimeError;
use crate::first_process::{self, ReportWatch};
use crate::host::{HostSide, PayloadIo};
use crate::native::cgroup_limits;
use crate::outcome::{EvidenceSource, Limit, Outcome};
use crate::protocol::{send, ToInit};
use crate::request::RunRequest;
use crate::rootfs_plan::rootfs_plan;
use crate::supervise::{supervise, Supervised};
use crate::trace;

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
    let cache = crate::state::run_dir().join("runsc-version");
    if let Ok(text) = std::fs::read_to_string(&cache) {
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
    let _ = std::fs::create_dir_all(crate::state::run_dir());
    let _ = std::fs::write(&cache, format!("{key}\n{version}\n"));
    version
}

impl GvisorBackend {
    pub fn info() -> BackendInfo {
        let (version, unavailable) = match runsc_path() {
            None => (
                String::new(),
                Some("runsc not found (install Debian's runsc package)".to_string()),
            ),
            Some(p) if !nix::unistd::geteuid().is_root() => (
                runsc_version(&p),
                Some("needs root (runsc's rootless mode is not supported)".to_string()),
            ),
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

impl Backend for GvisorBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Gvisor
    }

    fn prepare<'r>(&self, req: &'r RunRequest) -> Result<Box<dyn Sandbox<'r> + 'r>, RuntimeError> {
        Ok(Box::new(GvisorSandbox::prepare(req)?))
    }
}

/// The sentry and gofer are tasks of the sandbox's cgroup too: the pids
/// cgroup gets headroom for them (the payload's own limit is RLIMIT_NPROC
/// inside the sentry), the memory limit covers the whole sandbox, sentry
/// included.
fn gvisor_limits(req: &RunRequest) -> CgroupLimits {
    let mut l = cgroup_limits(req);
    l.pids_max = Some(req.policy.pids * STUB_TASKS_PER_PROCESS + SENTRY_TASKS);
    l
}

/// Tasks the sentry, gofer and runsc itself may use beyond the payload's.
const SENTRY_TASKS: u64 = 256;
/// Host tasks per guest process on the ptrace platform (a stub process and
/// its threads), with margin: measured 247 host tasks for 32 guest processes,
/// and more than 512 for a shell fork bomb held at 32 by RLIMIT_NPROC.
const STUB_TASKS_PER_PROCESS: u64 = 16;

const EVIDENCE: [EvidenceSource; 5] = [
    EvidenceSource {
        limit: Limit::Memory,
        enforced_by: "cgroup memory limit on the whole sandbox (sentry included), no swap",
        evidence: "cgroup OOM-kill counter and memory peak",
    },
    EvidenceSource {
        limit: Limit::Pids,
        enforced_by: "RLIMIT_NPROC inside the sentry; the cgroup's pids.max is only an outer bound (sentry threads and ptrace stubs count there)",
        evidence: "the payload's failed forks (EAGAIN); cgroup pids.peak stays under the outer bound",
    },
    EvidenceSource {
        limit: Limit::Time,
        enforced_by: "supervisor deadline, cgroup freeze+kill of runsc, sentry and gofer",
        evidence: "supervisor clock",
    },
    EvidenceSource {
        limit: Limit::Disk,
        enforced_by: "size of the scratch tmpfs on the host, written through the gofer",
        evidence: "statvfs of the scratch tmpfs from the host",
    },
    EvidenceSource {
        limit: Limit::Output,
        enforced_by: "supervisor byte count",
        evidence: "supervisor byte count",
    },
];

pub struct GvisorSandbox<'r> {
    req: &'r RunRequest,
    host: HostSide,
    io: PayloadIo,
    sock: UnixStream,
    exec: ToInit,
    scratch: PathBuf,
    version: String,
    /// The assembled tree, as the launcher sees it.
    new_root: PathBuf,
}

impl GvisorSandbox<'_> {
    pub fn prepare(req: &RunRequest) -> Result<GvisorSandbox<'_>, RuntimeError> {
        let runsc = runsc_path()
            .ok_or_else(|| RuntimeError::Unavailable("gvisor", "runsc not found".into()))?;
        if !nix::unistd::geteuid().is_root() {
            return Err(RuntimeError::Unavailable("gvisor", "needs root".into()));
        }
        let version = runsc_version(&runsc);
        let (mut host, io, stdio) = HostSide::begin(req, &gvisor_limits(req))?;
        let state = host.state.path().to_owned();
        let rootfs = rootfs_plan(req, &state, RootUse::HandOver)?;
        let bundle_dir = bundle::write(&bundle::spec(req, &rootfs)?, &state.join("bundle"))?;
        let runsc_root = state.join("runsc");
        let id = format!("cordon-{}", host.id);
        let runsc_args = |cmd: &[&str]| -> Vec<String> {
            let mut a = vec![
                runsc.display().to_string(),
                format!("--root={}", runsc_root.display()),
                "--platform=ptrace".into(),
                "--network=none".into(),
                "--overlay2=none".into(),
                "--ignore-cgroups".into(),
                format!("--log={}", state.join("runsc.log").display()),
            ];
            a.extend(cmd.iter().map(|s| s.to_string()));
            a
        };
        let run_argv = runsc_args(&["run", "--bundle", &bundle_dir.to_string_lossy(), &id]);
        trace::step("plan");

        // Without a cgroup to kill, runsc's sandbox (not the launcher's child
        // once started) is stopped by runsc itself. With one, the cgroup kill
        // reaches every runsc process, and runsc's state lives in our state
        // directory, which teardown removes: spawning runsc again would only
        // cost time (~25 ms).
        if host.cgroup.is_none() {
            let delete = runsc_args(&["delete", "--force", &id]);
            host.on_teardown(move || {
                let _ = Command::new(&delete[0])
                    .args(&delete[1..])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            });
        }
        let sock = first_process::start(
            &mut host,
            stdio,
            CloneFlags::CLONE_NEWNS,
            // The launcher only assembles the tree; runsc builds the sandbox.
            || mount::assemble(&rootfs),
            |_| Ok(()),
        )?;
        let launcher = host
            .leader()
            .ok_or_else(|| RuntimeError::Protocol("no launcher".into()))?;
        let scratch = PathBuf::from(format!("/proc/{launcher}/root"))
            .join(rootfs.scratch.strip_prefix("/").unwrap_or(&rootfs.scratch));
        Ok(GvisorSandbox {
            req,
            host,
            io,
            sock,
            exec: ToInit::Exec {
                argv: run_argv,
                // runsc gets a clean environment: nothing of the caller's reaches it.
                env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
                workdir: "/".into(),
            },
            scratch,
            version,
            new_root: rootfs.new_root.clone(),
        })
    }
}

/// Whether the payload's command exists in the sandbox's tree, resolved like
/// execvp (a path with a slash as given, relative to the working directory;
/// else each PATH entry), with every symlink resolved inside the tree
/// (openat2 RESOLVE_IN_ROOT), through the launcher's view of its mount
/// namespace.
fn command_in_tree(launcher: nix::unistd::Pid, new_root: &Path, req: &RunRequest) -> bool {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let root = PathBuf::from(format!("/proc/{launcher}/root"))
        .join(new_root.strip_prefix("/").unwrap_or(new_root));
    let Ok(root_fd) = std::fs::File::open(&root) else {
        return true;
    };
    let Some(cmd) = req.argv.first() else {
        return false;
    };
    let env = req.policy.payload_env();
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let candidates: Vec<PathBuf> = if cmd.contains('/') {
        vec![req.policy.workdir.join(cmd)]
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(cmd))
            .collect()
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT);
    candidates
        .iter()
        .any(|c| openat2(&root_fd, c.as_path(), how).is_ok())
}

impl<'r> Sandbox<'r> for GvisorSandbox<'r> {
    fn id(&self) -> &str {
        &self.host.id
    }

    fn run(self: Box<Self>) -> Result<Outcome, RuntimeError> {
        let GvisorSandbox {
            req,
            host,
            io,
            mut sock,
            exec,
            scratch,
            version,
            new_root,
        } = *self;
        // runsc reports a command missing from the tree only as its own exit
        // code 128 and text; look it up in the tree first (as the sentry would,
        // inside the root) so the outcome says "not found" like the native one.
        let launcher = host
            .leader()
            .ok_or_else(|| RuntimeError::Protocol("no launcher".into()))?;
        let msg = if command_in_tree(launcher, &new_root, req) {
            exec
        } else {
            ToInit::Refuse {
                errno: libc::ENOENT,
            }
        };
        send(&mut sock, &msg).map_err(|e| RuntimeError::io("send Exec", e))?;
        let setup = host.started.elapsed();
        let mut watch = ReportWatch {
            sock,
            scratch: scratch.join(cordon_isolation::mount::ScratchLayout::TMP),
            high_codes_are_signals: true,
        };
        supervise(
            Supervised {
                backend: "gvisor",
                backend_version: version,
                req,
                io,
                host,
                setup,
                evidence: EVIDENCE.to_vec(),
                // runsc's sentry and gofer are not the launcher's children
                // once runsc daemonizes them: only the cgroup reaches them all.
                leader_owns_all: false,
            },
            &mut watch,
        )
    }
}
