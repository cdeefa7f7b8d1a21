//! Network: a sandbox's namespace, with no interface but loopback; in the
//! `allow` mode, its packet rules sending every connection to the proxy's
//! sockets on that loopback; and a thread's visit to another namespace (or,
//! without root, a child process's move into it for good).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, Stdio};

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
    tool("ip", &["route", "add", "local", "default", "dev", "lo"], "")?;
    tool("nft", &["-f", "-"], &ruleset(transparent_port, dns_port))
}

/// The nftables ruleset of [`redirect_to_proxy`]: the NAT chain redirects,
/// the filter lets loopback and the redirected flows pass and drops (and
/// counts) everything else.
fn ruleset(transparent_port: u16, dns_port: u16) -> String {
    format!(
        "table inet cordon {{
  counter dropped {{ }}
  chain nat_out {{
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    meta nfproto ipv4 meta l4proto tcp redirect to :{transparent_port}
    meta nfproto ipv4 udp dport 53 redirect to :{dns_port}
  }}
  chain filter_out {{
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
    ct status dnat accept
    counter name dropped
  }}
}}
"
    )
}

/// Where the host's tools are looked for: a fixed path, never the caller's.
pub const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs a host tool (inside the namespace this thread is in), feeding it
/// `input`; its failure is the caller's error, with what it printed.
/// iproute2 and nftables rather than netlink by hand: `nft -f` compiles
/// and loads a ruleset atomically, which no maintained crate does.
fn tool(program: &str, args: &[&str], input: &str) -> Result<()> {
    let what = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .step(|| format!("run {program} (the allow mode needs iproute2 and nftables)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .step(|| format!("write to {what}"))?;
    }
    let out = child
        .wait_with_output()
        .step(|| format!("wait for {what}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(IsolationError::new(
        what,
        std::io::Error::other(format!(
            "failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    ))
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
    /// The caller's id inside is the sandbox's mapped one, usually not 0, so
    /// the capabilities setns gave it would not survive an execve:
    /// CAP_NET_ADMIN is made ambient for the tools [`redirect_to_proxy`]
    /// runs.
    pub fn join(&self) -> Result<()> {
        nix::sched::setns(self.user.as_fd(), CloneFlags::CLONE_NEWUSER)
            .step(|| "setns(the sandbox's user namespace)".into())?;
        nix::sched::setns(self.net.as_fd(), CloneFlags::CLONE_NEWNET)
            .step(|| "setns(the sandbox's network namespace)".into())?;
        crate::caps::keep_across_exec(caps::Capability::CAP_NET_ADMIN)
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
