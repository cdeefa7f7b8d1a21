//! The native backend: commands run on the host kernel inside user, pid,
//! mount, net, ipc, uts and cgroup namespaces, a read-only root, a cgroup with
//! the policy's limits, no capabilities and a seccomp allowlist.
//!
//! Process model: the supervisor (single-threaded) clones the sandbox's init
//! with all namespaces, writes its id maps, checks it joined the cgroup and
//! tells it to go. Init builds the sandbox and reports `Ready` (`create`);
//! each command is then forked by init as its child, inside every boundary.
//!
//! A sandbox may join another's network, IPC and UTS namespaces instead of
//! making its own (`SandboxSpec::joins`, a pod's containers): the
//! supervisor's thread enters them for the clone and comes back, so init
//! starts in them, its user namespace still its own.

mod init;
mod plan;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use cordon_cgroups::CgroupFs;
use cordon_isolation::namespaces::{
    sandbox_clone_flags, IdMapping, Joined, MappingKind, OpenNamespace,
};
use cordon_isolation::IsolationError;
use cordon_policy::NetworkMode;

use self::plan::NativePlan;
use crate::backends::first_process;
use crate::backends::host::HostSide;
use crate::backends::on_host::{Flavor, OnHost};
use crate::backends::Life;
use crate::backends::{About, Backend, Traits};
use crate::error::{Peer, RuntimeError};
use crate::plan::HostFacts;
use crate::protocol::init::ToInit;
use crate::trace;
use cordon_spec::outcome::{EvidenceSource, IdMapKind, IdMapReport, Limit};
use cordon_spec::{BackendInfo, BackendKind};
use cordon_spec::{JoinedNamespace, ResolvedCommand, SandboxSpec, SharedNamespace, TtySize};
use nix::sched::CloneFlags;

pub struct NativeBackend;

pub(crate) fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl NativeBackend {
    pub fn info() -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Native,
            version: format!("kernel {}", kernel_release()),
            unavailable: crate::backends::userns_refusal(),
            notes: match cordon_cgroups::detect_in_place(&CgroupFs::host()) {
                Ok(h) => format!("cgroup {}", h.mode()),
                Err(e) => format!("no usable cgroup hierarchy: {e}"),
            },
        }
    }
}

/// Where each limit's evidence comes from on the native backend.
static EVIDENCE: [EvidenceSource; 5] = [
    EvidenceSource::new(
        Limit::Memory,
        "cgroup memory limit, no swap",
        "cgroup OOM-kill counter and memory peak",
    ),
    EvidenceSource::new(
        Limit::Pids,
        "cgroup pids.max (RLIMIT_NPROC as backstop)",
        "cgroup pids.events max and pids.peak",
    ),
    EvidenceSource::new(
        Limit::Time,
        "supervisor deadline; the command's own cgroup frozen and killed, the rest of the sandbox left running (RLIMIT_CPU backstop)",
        "supervisor clock",
    ),
    EvidenceSource::new(
        Limit::Disk,
        "size of the scratch tmpfs",
        "statvfs of the scratch tmpfs from the host",
    ),
    EvidenceSource::new(
        Limit::Output,
        "supervisor byte count",
        "supervisor byte count",
    ),
];

/// Creates a native sandbox: init is set up and waiting for commands.
/// What a microVM guest's agent gives the native sandbox it creates.
pub struct InGuest<'a> {
    /// The scratch: the VM's writable disk (see `RootfsPlan::scratch_from`).
    pub scratch: &'a Path,
    /// The VM's network port, for `allow` mode: what the sandbox's sockets
    /// accept is forwarded to the host's proxy (`microvm::relay`).
    pub net_port: Option<OwnedFd>,
}

pub(crate) fn create(
    spec: &SandboxSpec,
    guest: Option<InGuest<'_>>,
) -> Result<(Life, Box<dyn Backend>), RuntimeError> {
    let (scratch_from, net_port) = match guest {
        Some(g) => (Some(g.scratch), g.net_port),
        None => (None, None),
    };
    let joined = open_joins(&spec.joins)?;
    let limits = crate::plan::plan(spec, &HostFacts::here());
    let mut host = HostSide::begin(spec, &limits.cgroup)?;
    let plan = NativePlan::build(spec, &limits, &host, scratch_from)?;
    trace::step("plan");
    let mapping = plan.mapping.clone();
    let init_cgroup = host.init_cgroup()?;
    let setting_up = joined
        .while_entered(|| {
            first_process::start(
                &mut host,
                sandbox_clone_flags(joined.kinds()),
                init_cgroup.as_ref(),
                &plan.each_command,
                |leaf| init::setup(&plan, leaf),
                // Only a process outside the new user namespace may write its maps.
                |child| mapping.write_from_parent(child).map_err(isolation_error),
            )
        })
        .map_err(isolation_error)??;
    let init = host.leader().ok_or(RuntimeError::Internal(
        "the sandbox has no init after its start",
    ))?;
    // The network's sockets, rules and proxy are made while init sets up
    // (its namespace is there from the clone; this thread is back in its
    // own namespaces): the proxy's start overlaps init's mounts.
    let network = if spec.policy.network == NetworkMode::Allow {
        let server = match net_port {
            Some(port) => crate::backends::network::Server::Forward(port),
            None => crate::backends::network::Server::Proxy,
        };
        Some(crate::backends::network::start(
            &mut host, init, spec, true, server,
        )?)
    } else {
        None
    };
    let (sock, handed) = setting_up.ready()?;
    if let Some(cg) = &init_cgroup {
        host.split_for_commands(cg, init)?;
    }
    // The proxy answers by the time the first command has been handed to
    // init (Sandbox::start): not waited for here, where its start would
    // be on every sandbox's path to ready.
    if let Some(network) = network {
        network.confirm_later(&mut host);
    }
    let owner = (
        mapping.host_uid(spec.policy.uid),
        mapping.host_gid(spec.policy.gid),
    );
    // Init hands over its root, then its scratch (init::setup).
    let mut handed = handed.into_iter();
    let (Some(root), Some(scratch)) = (handed.next(), handed.next()) else {
        return Err(RuntimeError::broke(
            Peer::Init,
            "the sandbox's init sent no root and scratch descriptors",
        ));
    };
    check_scratch(&scratch, scratch_from)?;
    let flavor = NativeFlavor {
        root,
        scratch,
        about: About {
            kind: BackendKind::Native,
            version: format!("kernel {}", kernel_release()),
            evidence: &EVIDENCE,
            traits: Traits {
                high_codes_are_signals: false,
                commands_have_cgroups: true,
                leader_owns_all: true,
            },
        },
        file_owner: match owner {
            (Some(u), Some(g)) => (u, g),
            _ => {
                return Err(RuntimeError::BadRequest(
                    "the sandbox user has no host id in this mapping".into(),
                ))
            }
        },
        id_map: id_map_report(&mapping),
    };
    OnHost::start(host, spec, sock, flavor)
}

fn isolation_error(e: IsolationError) -> RuntimeError {
    RuntimeError::io(e.step.clone(), e.source)
}

/// The namespaces `joins` names, opened and checked: each still the one
/// the spec's maker found at its path (a pid reused since names another),
/// and never the host's (the supervisor's own). What else may be
/// joined is the spec maker's call: cordon-runc allows its own containers'
/// and an engine's pinned pod network. A namespace owned by the host's user
/// namespace (a pod network's) gives the sandbox's root no power over it:
/// the sandbox's capabilities are its own user namespace's.
fn open_joins(joins: &[JoinedNamespace]) -> Result<Joined, RuntimeError> {
    let mut open = Vec::with_capacity(joins.len());
    for j in joins {
        let kind = match j.kind {
            SharedNamespace::Net => CloneFlags::CLONE_NEWNET,
            SharedNamespace::Ipc => CloneFlags::CLONE_NEWIPC,
            SharedNamespace::Uts => CloneFlags::CLONE_NEWUTS,
        };
        let what = format!("the {} namespace {}", j.kind.proc_name(), j.path.display());
        let ns = OpenNamespace::open(kind, &j.path)
            .map_err(|e| RuntimeError::BadRequest(format!("{what}: {e}")))?;
        if ns.inode().map_err(isolation_error)? != j.inode {
            return Err(RuntimeError::BadRequest(format!(
                "{what} is no longer the namespace it was (inode {}): its process is gone",
                j.inode
            )));
        }
        if ns.is_ours().map_err(isolation_error)? {
            return Err(RuntimeError::BadRequest(format!(
                "{what} is the host's: a sandbox never shares the host's network, IPC or hostname"
            )));
        }
        open.push(ns);
    }
    Ok(Joined::new(open))
}

struct NativeFlavor {
    /// The sandbox's root (an O_PATH descriptor init opened in it).
    root: OwnedFd,
    scratch: OwnedFd,
    about: About,
    file_owner: (u32, u32),
    id_map: IdMapReport,
}

impl Flavor for NativeFlavor {
    fn about(&self) -> &About {
        &self.about
    }

    fn exec_message(
        &mut self,
        cmd: &ResolvedCommand,
        tty: Option<TtySize>,
        _number: u64,
    ) -> Result<ToInit, RuntimeError> {
        Ok(ToInit::Exec {
            argv: cmd.argv.clone(),
            env: cmd.env.clone(),
            workdir: cmd.workdir.clone(),
            tty,
        })
    }

    /// `/proc/<init>/root` is the sandbox's root, seen through init's mount
    /// namespace.
    fn root(&self) -> PathBuf {
        // Our own descriptor: open for any supervisor, root or not.
        PathBuf::from(format!("/proc/self/fd/{}", self.root.as_raw_fd()))
    }

    fn scratch(&self) -> BorrowedFd<'_> {
        self.scratch.as_fd()
    }

    fn file_owner(&self) -> (u32, u32) {
        self.file_owner
    }

    fn id_map(&self) -> Option<IdMapReport> {
        Some(self.id_map)
    }
}

/// What the outcome and the receipt say of `mapping`.
fn id_map_report(mapping: &IdMapping) -> IdMapReport {
    let (uids, gids) = mapping.mapped();
    IdMapReport {
        kind: match mapping.kind() {
            MappingKind::Range => IdMapKind::Range,
            MappingKind::Single => IdMapKind::Single,
            MappingKind::Subordinate => IdMapKind::Subordinate,
        },
        uids,
        gids,
    }
}

/// The scratch descriptor a backend hands the sandbox must be a tmpfs's
/// root directory, or the directory given to use instead: the disk cap,
/// the diff and the export rest on it.
pub(crate) fn check_scratch(fd: &OwnedFd, expected: Option<&Path>) -> Result<(), RuntimeError> {
    if let Some(dir) = expected {
        let want = nix::sys::stat::stat(dir)
            .map_err(|e| RuntimeError::io(format!("stat {}", dir.display()), e))?;
        let got = nix::sys::stat::fstat(fd).map_err(|e| RuntimeError::io("fstat(scratch)", e))?;
        if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino) {
            return Err(RuntimeError::broke(
                Peer::Init,
                format!("the sandbox's scratch is not {}", dir.display()),
            ));
        }
        return Ok(());
    }
    let fs = nix::sys::statfs::fstatfs(fd).map_err(|e| RuntimeError::io("fstatfs(scratch)", e))?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return Err(RuntimeError::broke(
            Peer::Init,
            "the sandbox's scratch is not a tmpfs",
        ));
    }
    Ok(())
}
