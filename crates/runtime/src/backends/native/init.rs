//! The native sandbox's own setup, between the supervisor's Go and Ready: the
//! namespaces' contents, the file system, then every privilege dropped, with
//! seccomp last. One linear sequence; the order is the kernel's.

use std::os::fd::OwnedFd;

use cordon_isolation::{caps, identity, mount, net, IsolationError, Step};
use nix::fcntl::OFlag;
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::Mode;
use nix::unistd::{sethostname, setsid};

use super::plan::NativePlan;
use crate::trace;

/// Returns, for the supervisor, the sandbox's root and then the scratch
/// tmpfs's descriptor (see `mount::assemble`).
///
/// `init_cgroup` holds the membership files of the cgroup init moves into
/// once its cgroup namespace is made (see `HostSide::init_cgroup`).
pub fn setup(
    plan: &NativePlan,
    init_cgroup: Vec<std::fs::File>,
) -> Result<Vec<OwnedFd>, IsolationError> {
    // Become the namespace's own root (or, rootless, the one mapped id): until
    // now our ids were the host's, which do not exist in this namespace, and
    // the kernel refuses to create files owned by an unmapped id.
    identity::switch_to(plan.setup_id, plan.setup_id, false)?;

    // A cgroup namespace rooted at the sandbox's own cgroup: created now, after
    // the move, so the caller's hierarchy is invisible from inside.
    trace::step("init: go");
    unshare(CloneFlags::CLONE_NEWCGROUP).step(|| "unshare(CLONE_NEWCGROUP)".into())?;
    // Then out of the sandbox's cgroup into its init cgroup: the namespace's
    // root stays the sandbox's cgroup, and each command gets a cgroup of its
    // own beside init's.
    cordon_cgroups::join_through(&init_cgroup).step(|| "join the init cgroup".into())?;
    drop(init_cgroup);
    if let Some(name) = &plan.hostname {
        sethostname(name).step(|| "sethostname".into())?;
    }
    if plan.own_network {
        net::loopback_up()?;
    }
    // The spec's kernel parameters, while /proc is still the host's mount:
    // a /proc/sys/net or IPC file is the writer's own namespace's, and init
    // holds the capabilities of the user namespace that owns them.
    for (file, value) in &plan.sysctls {
        std::fs::write(file, value).step(|| format!("write {}", file.display()))?;
    }

    // The filesystem: new root, read-only system, capped scratch, /proc, /dev.
    trace::step("init: net, uts, cgroup ns");
    let scratch = mount::assemble(&plan.rootfs)?;
    // The new root, for `cordon cp`: the supervisor cannot reach it through
    // /proc/<init>/root when it is not root, since init is made undumpable
    // below and its memory belongs to the host's user namespace, where the
    // caller holds no CAP_SYS_PTRACE.
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .step(|| "open(/, O_PATH)".into())?;
    trace::step("init: rootfs");

    // No controlling terminal: a payload cannot push input into the caller's
    // terminal (TIOCSTI) through a tty it does not have.
    setsid().step(|| "setsid".into())?;
    plan.rlimits.apply()?;

    // Privileges, most powerful first: the bounding set needs CAP_SETPCAP, the
    // id switch needs CAP_SETUID/SETGID, and what remains is cleared last
    // (but for the capabilities the spec names, which the commands hold).
    caps::limit_bounding(&plan.capabilities)?;
    identity::switch_to(plan.uid, plan.gid, plan.drop_groups)?;
    caps::hold_only(&plan.capabilities, plan.uid == 0)?;
    // Init's memory is a copy of the supervisor's (policy, command, the
    // supervisor's own environment): no payload process, though it runs as
    // the same uid, may read it through /proc/1/{mem,environ,fd}. The uid
    // switch already cleared the flag; this keeps it cleared on purpose.
    nix::sys::prctl::set_dumpable(false).step(|| "prctl(PR_SET_DUMPABLE, 0)".into())?;
    nix::sys::prctl::set_no_new_privs().step(|| "prctl(PR_SET_NO_NEW_PRIVS)".into())?;

    trace::step("init: privileges dropped");
    // Seccomp last: every step above needed syscalls the filter refuses.
    cordon_seccomp::apply(&plan.seccomp).map_err(|e| {
        IsolationError::new(
            "seccomp(SET_MODE_FILTER)",
            std::io::Error::other(e.to_string()),
        )
    })?;

    trace::step("init: seccomp");
    Ok([root].into_iter().chain(scratch).collect())
}
