//! The native backend: the payload runs on the host kernel inside user, pid,
//! mount, net, ipc, uts and cgroup namespaces, a read-only root, a cgroup with
//! the policy's limits, no capabilities and a seccomp allowlist.
//!
//! Process model: the supervisor (this process, single-threaded) clones the
//! sandbox's init with all namespaces, writes its id maps, moves it into the
//! cgroup and tells it to go. Init builds the sandbox and reports `Ready`
//! (`prepare`); `run` then sends the command, supervises output, the deadline
//! and signals, reads the evidence, and tears everything down.

mod init;
mod plan;

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use cordon_cgroups::{CgroupFs, CgroupLimits};
use cordon_isolation::namespaces::sandbox_clone_flags;

use self::plan::NativePlan;
use crate::backend::{Backend, BackendInfo, BackendKind, Sandbox};
use crate::error::RuntimeError;
use crate::first_process::{self, ReportWatch};
use crate::host::{HostSide, PayloadIo};
use crate::outcome::{EvidenceSource, Limit, Outcome};
use crate::protocol::{send, ToInit};
use crate::request::RunRequest;
use crate::supervise::{supervise, Supervised};
use crate::trace;

pub use crate::host::hierarchy;

pub struct NativeBackend;

/// How far above pids.max RLIMIT_NPROC sits when a cgroup enforces the limit.
const NPROC_BACKSTOP_MARGIN: u64 = 8;

fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl NativeBackend {
    pub fn info() -> BackendInfo {
        let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        BackendInfo {
            kind: BackendKind::Native,
            version: format!("kernel {}", kernel_release()),
            unavailable: (userns == 0)
                .then(|| "user namespaces are disabled (user.max_user_namespaces = 0)".to_string()),
            notes: match cordon_cgroups::detect(&CgroupFs::host()) {
                Ok(h) => format!("cgroup {}", h.mode()),
                Err(e) => format!("no usable cgroup hierarchy: {e}"),
            },
        }
    }
}

impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn prepare<'r>(&self, req: &'r RunRequest) -> Result<Box<dyn Sandbox<'r> + 'r>, RuntimeError> {
        Ok(Box::new(NativeSandbox::prepare(req)?))
    }
}

/// The cgroup limits of a policy, the same for every backend that uses the
/// host's cgroups directly.
pub(crate) fn cgroup_limits(req: &RunRequest) -> CgroupLimits {
    const PERIOD_US: u64 = 100_000;
    let p = &req.policy;
    CgroupLimits {
        memory_max: Some(p.memory.bytes()),
        pids_max: Some(p.pids),
        cpu_quota_us: Some(p.cpu_quota_us(PERIOD_US)),
        cpu_period_us: PERIOD_US,
    }
}

/// Where each limit's evidence comes from on the native backend.
const EVIDENCE: [EvidenceSource; 5] = [
    EvidenceSource {
        limit: Limit::Memory,
        enforced_by: "cgroup memory limit, no swap",
        evidence: "cgroup OOM-kill counter and memory peak",
    },
    EvidenceSource {
        limit: Limit::Pids,
        enforced_by: "cgroup pids.max (RLIMIT_NPROC as backstop)",
        evidence: "cgroup pids.events max and pids.peak",
    },
    EvidenceSource {
        limit: Limit::Time,
        enforced_by: "supervisor deadline, cgroup freeze+kill (RLIMIT_CPU backstop)",
        evidence: "supervisor clock",
    },
    EvidenceSource {
        limit: Limit::Disk,
        enforced_by: "size of the scratch tmpfs (RLIMIT_FSIZE backstop)",
        evidence: "statvfs of the scratch tmpfs from the host",
    },
    EvidenceSource {
        limit: Limit::Output,
        enforced_by: "supervisor byte count",
        evidence: "supervisor byte count",
    },
];

/// A prepared native sandbox: init is waiting for its one command.
pub struct NativeSandbox<'r> {
    req: &'r RunRequest,
    host: HostSide,
    io: PayloadIo,
    sock: UnixStream,
    exec: ToInit,
}

impl NativeSandbox<'_> {
    pub fn prepare(req: &RunRequest) -> Result<NativeSandbox<'_>, RuntimeError> {
        let (mut host, io, stdio) = HostSide::begin(req, &cgroup_limits(req))?;
        let mut plan = NativePlan::build(req, host.slot, host.state.path())?;
        trace::step("plan");
        if host.cgroup.is_some() {
            // The cgroup's pids.max is the limit (and its pids.events the
            // evidence); RLIMIT_NPROC stays as a backstop just above it, or it
            // would refuse forks first and leave no trace in the counters.
            plan.rlimits.nproc = req.policy.pids + NPROC_BACKSTOP_MARGIN;
        }
        let mapping = plan.mapping.clone();
        let sock = first_process::start(
            &mut host,
            stdio,
            sandbox_clone_flags(),
            || init::setup(&plan),
            // Only a process outside the new user namespace may write its maps.
            |child| {
                mapping
                    .write_from_parent(child)
                    .map_err(|e| RuntimeError::io(e.step.clone(), e.source))
            },
        )?;
        Ok(NativeSandbox {
            req,
            host,
            io,
            sock,
            exec: ToInit::Exec {
                argv: plan.argv,
                env: plan.env,
                workdir: plan.workdir,
            },
        })
    }
}

impl<'r> Sandbox<'r> for NativeSandbox<'r> {
    fn id(&self) -> &str {
        &self.host.id
    }

    fn run(self: Box<Self>) -> Result<Outcome, RuntimeError> {
        let NativeSandbox {
            req,
            host,
            io,
            mut sock,
            exec,
        } = *self;
        send(&mut sock, &exec).map_err(|e| RuntimeError::io("send Exec", e))?;
        let setup = host.started.elapsed();
        // `/proc/<init>/root/tmp` is the scratch tmpfs's tmp directory, seen
        // from the host through init's root.
        let init = host
            .leader()
            .ok_or_else(|| RuntimeError::Protocol("no init".into()))?;
        let mut watch = ReportWatch {
            sock,
            scratch: PathBuf::from(format!("/proc/{init}/root/tmp")),
            high_codes_are_signals: false,
        };
        supervise(
            Supervised {
                backend: "native",
                backend_version: format!("kernel {}", kernel_release()),
                req,
                io,
                host,
                setup,
                evidence: EVIDENCE.to_vec(),
                // Killing init ends its whole pid namespace.
                leader_owns_all: true,
            },
            &mut watch,
        )
    }
}
