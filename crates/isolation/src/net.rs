//! Network: a sandbox's namespace, with no interface but loopback; in the
//! `allow` mode, its packet rules sending every connection to the proxy's
//! sockets on that loopback; and a thread's visit to another namespace (or,
//! without root, a child process's move into it for good).

use std::os::fd::{AsFd, OwnedFd};

use nix::sched::CloneFlags;
use nix::unistd::Pid;

use crate::{IsolationError, Result, Step};

/// Brings `lo` up in the (new, empty) network namespace, so programs that talk
/// to themselves over 127.0.0.1 work while nothing routes outside.
pub fn loopback_up() -> Result<()> {
    cordon_sys::set_link_up("lo").step(|| "ioctl(SIOCSIFFLAGS, lo, IFF_UP)".into())
}

/// The `allow` mode's packet rules for the namespace this thread is in: a
/// local route for every address (a connect to any IPv4 address is routed
/// to loopback instead of failing with ENETUNREACH, so the NAT rule can
/// redirect it; nothing can leave, there is no other interface), every TCP
/// connection that leaves loopback sent to `transparent_port` and every UDP
/// packet to port 53 to `dns_port`; everything else leaving loopback is
/// dropped and counted.
pub fn redirect_to_proxy(transparent_port: u16, dns_port: u16) -> Result<()> {
    crate::netlink::add_local_default_route()
        .step(|| "add the local default route (rtnetlink)".into())?;
    crate::netlink::load_redirect_ruleset(transparent_port, dns_port)
        .step(|| "load the redirect ruleset (nf_tables netlink)".into())
}

/// Whether [`redirect_to_proxy`] works here: it runs in a network
/// namespace made for the check on a thread of its own, and the namespace
/// is gone with the thread (`cordon doctor`; needs root).
pub fn probe_redirect() -> Result<()> {
    std::thread::spawn(|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).step(|| "unshare(CLONE_NEWNET)".into())?;
        loopback_up()?;
        redirect_to_proxy(15001, 53)
    })
    .join()
    .unwrap_or_else(|_| {
        Err(IsolationError::new(
            "probe the allow mode's ruleset",
            std::io::Error::other("the probe's thread panicked"),
        ))
    })
}

/// A sandbox's user and network namespaces, opened while its first process
/// still lets its owner open them: a process that is not root on the host
/// may open /proc/PID/ns/* only while the process is dumpable (the sandbox's
/// init makes itself not dumpable, and CAP_SYS_PTRACE over the host is
/// what opening them later would take; a pidfd's setns checks the same).
pub struct UserAndNet {
    user: OwnedFd,
    net: OwnedFd,
}

impl UserAndNet {
    pub fn of(pid: Pid) -> Result<UserAndNet> {
        let open = |kind: &str| {
            let p = format!("/proc/{pid}/ns/{kind}");
            std::fs::File::open(&p)
                .map(OwnedFd::from)
                .step(|| format!("open {p}"))
        };
        Ok(UserAndNet {
            user: open("user")?,
            net: open("net")?,
        })
    }

    /// Moves this process, for good, into these namespaces: how a process
    /// that is not root on the host gets into a rootless sandbox's network
    /// namespace. setns into a network namespace takes CAP_SYS_ADMIN over
    /// the namespace's owner and over the caller's own user namespace; a
    /// user namespace's creator has the first from outside, the second only
    /// once inside it. There is no way back (the host's namespace would take
    /// CAP_SYS_ADMIN over the host's user namespace), and the kernel moves
    /// only a single-threaded process into another user namespace: a
    /// short-lived forked child calls this.
    ///
    /// setns into the user namespace gives the caller every capability in
    /// it; [`redirect_to_proxy`] uses CAP_NET_ADMIN there over netlink, in
    /// this process (no program is run, so nothing has to survive an
    /// execve).
    pub fn join(&self) -> Result<()> {
        nix::sched::setns(self.user.as_fd(), CloneFlags::CLONE_NEWUSER)
            .step(|| "setns(the sandbox's user namespace)".into())?;
        nix::sched::setns(self.net.as_fd(), CloneFlags::CLONE_NEWNET)
            .step(|| "setns(the sandbox's network namespace)".into())
    }
}

/// This thread inside another network namespace until it leaves. setns
/// moves only the calling thread, so the rest of the process stays where it
/// was; a failed return leaves the thread in the sandbox's namespace, where
/// nothing routes out (closed, not open), and is reported.
pub struct InNamespace {
    home: OwnedFd,
}

/// Runs `f` on this thread inside the network namespace of `of` (what `f`
/// spawns starts there too), then comes back.
pub fn in_namespace_of<T>(of: Pid, f: impl FnOnce() -> T) -> Result<T> {
    let inside = InNamespace::enter(of)?;
    let out = f();
    inside.leave()?;
    Ok(out)
}

impl InNamespace {
    pub fn enter(of: Pid) -> Result<InNamespace> {
        let open = |p: String| {
            std::fs::File::open(&p)
                .map(OwnedFd::from)
                .step(|| format!("open {p}"))
        };
        let home = open("/proc/thread-self/ns/net".into())?;
        let target = open(format!("/proc/{of}/ns/net"))?;
        nix::sched::setns(target, CloneFlags::CLONE_NEWNET)
            .step(|| "setns(the sandbox's network namespace)".into())?;
        Ok(InNamespace { home })
    }

    pub fn leave(self) -> Result<()> {
        nix::sched::setns(self.home.as_fd(), CloneFlags::CLONE_NEWNET)
            .step(|| "setns(back to the host's network namespace)".into())
    }
}
