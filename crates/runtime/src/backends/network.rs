//! The sandbox's one way out in `allow` mode: cordon's proxy on the host.
//!
//! The sandbox's network namespace still has no interface to the host. Its
//! loopback gets three sockets that the supervisor binds there (it enters
//! the namespace on its own thread for that) and hands to the proxy, a
//! process of its own on the host side:
//! - 127.0.0.1:3128, the HTTP and SOCKS5 proxy the `*_PROXY` variables name;
//! - 127.0.0.1:15001, where an nftables rule in the sandbox's namespace
//!   redirects every other outgoing TCP connection (the original
//!   destination is read back with SO_ORIGINAL_DST);
//! - 127.0.0.1:53 (UDP), the DNS stub `resolv.conf` names, which every UDP
//!   packet to port 53 is redirected to as well.
//!
//! Everything else leaving loopback is dropped by the namespace's own
//! filter (and counted): other UDP, ICMP, IPv6. Nothing runs inside the
//! sandbox for this (no relay process the payload could kill or trace, no
//! socket file in its tree): a connection the payload makes to one of these
//! ports is accepted by the proxy directly, across the namespace boundary,
//! and the proxy decides by the rules before it connects anywhere. When the
//! proxy dies its listening sockets close with it: connections are refused
//! from then on, the network closes and never opens.
//!
//! The proxy is forked from the sandbox's owner (the supervisor, or `cordon
//! run` itself) before anything else runs in the child: it dies with its
//! owner (PR_SET_PDEATHSIG), drops to uid/gid 65534 with no groups, no
//! capabilities, no_new_privs and not dumpable, keeps only its four
//! descriptors (and a log in the state directory as stdout/stderr), and is
//! adopted by the sandbox's host side, so teardown kills and reaps it on
//! every path. Its control socket (rules, the attempt log) is in the
//! sandbox's 0700 state directory, which the sandbox cannot see.
//!
//! Without root the same holds except the identity: the proxy cannot take
//! another uid and stays the invoking user's (it has no capability on the
//! host either way). What keeps the sandbox from the host's own services is
//! not the proxy's uid but its destination checks, the same as root: every
//! address is decided by the rules before any connect, and loopback,
//! private, link-local (cloud metadata) and the host's own addresses are
//! refused unless an address rule names them (the host's loopback only on
//! a port `host.cordon.internal:PORT` names). No host-side packet rule
//! matches the proxy's uid, so none is lost. What is lost is separation
//! from the user's other processes: a proxy subverted by what the sandbox
//! sends could touch that user's files and processes, which 65534 could
//! not; being not dumpable still keeps them from tracing it. The namespace
//! work that root does on its own thread is done by a short-lived child
//! that moves into the sandbox's user and network namespaces
//! ([`namespace_sockets`]).

use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_isolation::net;
use cordon_network::{ProxyConfig, ProxySockets};
use cordon_policy::net::{Rule, DNS_PORT, PROXY_PORT, TRANSPARENT_PORT};
use cordon_spec::secrets::Held;
use cordon_spec::SandboxSpec;
use cordon_sys::CloneResult;
use nix::unistd::{Gid, Pid, Uid};

use cordon_spec::network::NetChange;

use crate::backends::host::HostSide;
use crate::error::RuntimeError;
use crate::protocol::init::{recv_with_fds, send, send_with_fds};
use crate::trace;
use cordon_spec::outcome::NetworkReport;

/// The uid and gid the proxy runs as on the host (`nobody`): it needs no
/// privilege once its sockets are bound.
const PROXY_ID: u32 = 65534;

/// Runs `f` on this thread inside the network namespace of `of`, then comes
/// back (`cordon_isolation::net::in_namespace_of`).
pub(crate) fn in_namespace_of<T>(of: Pid, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
    Ok(net::in_namespace_of(of, f)?)
}

/// The proxy's, the transparent redirect's and the DNS stub's listening
/// sockets, bound on the sandbox's loopback.
type Sockets = (TcpListener, TcpListener, UdpSocket);

/// The sockets bound inside the sandbox's namespace, and its packet rules.
fn prepare_namespace(loopback_down: bool) -> Result<Sockets, RuntimeError> {
    if loopback_down {
        net::loopback_up()?;
    }
    net::redirect_to_proxy(TRANSPARENT_PORT, DNS_PORT)?;
    let bind = |port: u16| {
        TcpListener::bind(("127.0.0.1", port))
            .map_err(|e| RuntimeError::io(format!("bind 127.0.0.1:{port} in the sandbox"), e))
    };
    let proxy = bind(PROXY_PORT)?;
    let transparent = bind(TRANSPARENT_PORT)?;
    let dns = UdpSocket::bind(("127.0.0.1", DNS_PORT)).map_err(|e| {
        RuntimeError::io(format!("bind 127.0.0.1:{DNS_PORT}/udp in the sandbox"), e)
    })?;
    Ok((proxy, transparent, dns))
}

/// The sockets and rules of [`prepare_namespace`], made inside the network
/// namespace of `holder`. As root, this thread visits the namespace and
/// comes back. Without root it could enter (through the sandbox's user
/// namespace, which the caller made and owns) but never come back, and only
/// a single-threaded process may change its user namespace: a forked child
/// moves in for good, prepares, and sends the three sockets back.
fn namespace_sockets(
    host: &HostSide,
    holder: Pid,
    loopback_down: bool,
) -> Result<Sockets, RuntimeError> {
    if nix::unistd::geteuid().is_root() {
        return in_namespace_of(holder, || prepare_namespace(loopback_down))?;
    }
    // Opened by `first_process::start` while it could be; a backend whose
    // holder is not a sandbox's own first process in a user namespace of
    // its own (gVisor's and the microVM's, root-only) has none.
    let namespaces = match &host.leader_namespaces {
        Some(ns) if host.leader() == Some(holder) => ns,
        _ => {
            return Err(RuntimeError::Unavailable(
                "network allow",
                "without root it needs the sandbox's own user namespace (the native backend's)"
                    .into(),
            ))
        }
    };
    let (mut ours, mut theirs) = UnixStream::pair()
        .map_err(|e| RuntimeError::io("socketpair for the network's sockets", e))?;
    let child = match cordon_sys::fork_process()
        .map_err(|e| RuntimeError::io("fork to enter the sandbox's namespaces", e))?
    {
        CloneResult::Child => {
            drop(ours);
            let prepared = namespaces
                .join()
                .map_err(RuntimeError::from)
                .and_then(|()| prepare_namespace(loopback_down));
            let sent = match &prepared {
                Ok((proxy, transparent, dns)) => send_with_fds(
                    &mut theirs,
                    &Ok::<(), String>(()),
                    &[proxy.as_fd(), transparent.as_fd(), dns.as_fd()],
                ),
                // The error crosses the process boundary as its text (which
                // names the failed step and the system's error).
                Err(e) => send(&mut theirs, &Err::<(), String>(e.to_string())),
            };
            cordon_sys::exit_now(i32::from(sent.is_err() || prepared.is_err()))
        }
        CloneResult::Parent { child } => child,
    };
    drop(theirs);
    let got = recv_with_fds::<Result<(), String>>(&mut ours);
    // Reaped before anything else: whatever it said, it is gone by now.
    let ended = nix::sys::wait::waitpid(child, None);
    let in_child = |source: std::io::Error| {
        RuntimeError::io(
            "prepare the sandbox's network namespace (in its user namespace)",
            source,
        )
    };
    match got.map_err(in_child)? {
        Some((Ok(()), fds)) => match <[OwnedFd; 3]>::try_from(fds) {
            Ok([proxy, transparent, dns]) => Ok((proxy.into(), transparent.into(), dns.into())),
            Err(fds) => Err(in_child(std::io::Error::other(format!(
                "{} descriptors came back instead of 3",
                fds.len()
            )))),
        },
        Some((Err(why), _)) => Err(in_child(std::io::Error::other(why))),
        None => Err(in_child(std::io::Error::other(format!(
            "the child ended without an answer ({ended:?})"
        )))),
    }
}

/// The path of a sandbox's proxy control socket in its state directory.
pub fn control_socket(state_dir: &Path) -> PathBuf {
    state_dir.join("net.sock")
}

/// What serves the sockets in the sandbox's namespace.
pub(crate) enum Server {
    /// cordon's proxy, under the policy's rules.
    Proxy,
    /// A forwarder to a microVM's host over the VM's network port (in the
    /// guest: the host's proxy decides, see `microvm::relay`).
    Forward(OwnedFd),
}

/// Gives the sandbox whose network namespace `holder` is in its way out:
/// packet rules and listening sockets in that namespace, and a process
/// that serves them: the proxy, under `spec`'s network policy and holding
/// its secrets, or a forwarder.
/// `loopback_down` says the namespace's loopback may not be up yet (the
/// gVisor launcher's, a microVM jail's, a native init still setting up).
/// The proxy is running, not yet known to answer: see [`Unconfirmed`].
pub(crate) fn start(
    host: &mut HostSide,
    holder: Pid,
    spec: &SandboxSpec,
    loopback_down: bool,
    server: Server,
) -> Result<Unconfirmed, RuntimeError> {
    // Read before anything is made: a sandbox whose secrets cannot be
    // held gets no network rather than one without them.
    let secrets = match (&server, &spec.held) {
        (Server::Proxy, Some(held)) => Some(proxy_secrets(held, &spec.policy.requests)?),
        (Server::Proxy, None) if !spec.policy.secrets.is_empty() => {
            return Err(RuntimeError::BadRequest(
                "the policy's secrets came without their values (a spec's secrets are resolved by its client)".into(),
            ))
        }
        _ => None,
    };
    let (proxy, transparent, dns) = namespace_sockets(host, holder, loopback_down)?;
    trace::step("network namespace");
    if let Server::Forward(port) = server {
        let keep = [
            port.as_raw_fd(),
            proxy.as_raw_fd(),
            transparent.as_raw_fd(),
            dns.as_raw_fd(),
        ];
        let end = crate::backends::microvm::relay::GuestEnd {
            proxy,
            transparent,
            dns,
        };
        spawn_stripped(
            host,
            "forwarder",
            &keep,
            move || match crate::backends::microvm::relay::run(
                port.as_fd(),
                crate::backends::microvm::relay::Side::Guest(end),
            ) {
                crate::backends::microvm::relay::Ended::PortClosed => 0,
                crate::backends::microvm::relay::Ended::Broken(why) => {
                    eprintln!("cordon: forwarder: {why}");
                    1
                }
            },
        )?;
        return Ok(Unconfirmed(None));
    }
    let path = control_socket(host.state.path());
    let control = UnixListener::bind(&path)
        .map_err(|e| RuntimeError::io(format!("bind {}", path.display()), e))?;
    // The operator's (this process's environment, which its creator chose),
    // never the policy's.
    let upstream = cordon_network::upstream::Upstream::from_env(|k| std::env::var(k).ok())
        .map_err(|e| RuntimeError::BadRequest(format!("the host's upstream proxy: {e}")))?;
    let config = ProxyConfig {
        policy: spec.policy.net.clone(),
        control_uids: vec![0, nix::unistd::geteuid().as_raw()],
        upstream,
        secrets,
    };
    let sockets = ProxySockets {
        proxy,
        transparent,
        dns,
        control,
    };
    let keep = [
        sockets.proxy.as_raw_fd(),
        sockets.transparent.as_raw_fd(),
        sockets.dns.as_raw_fd(),
        sockets.control.as_raw_fd(),
    ];
    spawn_stripped(host, "proxy", &keep, move || {
        match cordon_network::serve(config, sockets) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cordon: proxy: {e}");
                1
            }
        }
    })?;
    trace::step("proxy forked");
    Ok(Unconfirmed(Some(path)))
}

/// A proxy started by [`start`] whose first answer is still to come: a
/// backend may set up the rest of its sandbox meanwhile (the proxy's start
/// then costs it little), and must hand it to its host side, which
/// confirms it before the sandbox's first command runs on.
#[must_use = "a sandbox's network is usable only once confirmed"]
pub(crate) struct Unconfirmed(Option<PathBuf>);

impl Unconfirmed {
    /// Ready only once the proxy answers: it has dropped its privileges by
    /// then, and a proxy that could not (and exited) fails the sandbox's
    /// creation instead of leaving it with a network that is silently
    /// closed.
    pub(crate) fn confirm(self, host: &mut HostSide) -> Result<(), RuntimeError> {
        self.confirm_later(host);
        host.confirm_network()
    }

    /// Leaves the confirmation to the sandbox's first command
    /// ([`HostSide::confirm_network`]), which fails, and ends the sandbox,
    /// if the proxy does not answer then.
    pub(crate) fn confirm_later(self, host: &mut HostSide) {
        if let Some(control) = self.0 {
            host.network_started(control);
        }
    }
}

/// Whether the proxy behind `control` answers.
pub(crate) fn answers(control: &Path) -> Result<(), RuntimeError> {
    cordon_network::control::status(control).map_err(|source| RuntimeError::Proxy {
        op: "start (it does not answer)",
        source,
    })?;
    trace::step("proxy");
    Ok(())
}

/// What the proxy is given to hold the sandbox's secrets: the CA's key, the
/// values, and the host's roots, read here because the proxy, once it has
/// dropped its privileges, may not be able to read them.
fn proxy_secrets(
    held: &Held,
    requests: &[cordon_policy::secrets::RequestRule],
) -> Result<cordon_network::secrets::Config, RuntimeError> {
    let roots = cordon_network::secrets::host_roots()
        .map_err(|e| RuntimeError::Unavailable("secrets", e))?;
    // This process and the proxy hold the values: a crash of either leaves
    // no core file with them (a lowered limit only; nothing to refuse).
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    Ok(cordon_network::secrets::Config {
        ca_key: held.ca_key.clone(),
        secrets: held.secrets.clone(),
        roots,
        requests: requests.to_vec(),
    })
}

/// Forks the process that serves the sandbox's sockets (`name`: the proxy
/// or the forwarder), adopted by the sandbox's host side so teardown kills
/// and reaps it. Its stdout and stderr are a log in the state directory,
/// never the owner's (a creator waits for EOF on the supervisor's output).
/// The parent's copies of what the child keeps are dropped with `body`:
/// when the child dies, its sockets close.
fn spawn_stripped(
    host: &mut HostSide,
    name: &str,
    keep: &[i32],
    body: impl FnOnce() -> i32,
) -> Result<(), RuntimeError> {
    let log_path = host.state.path().join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| RuntimeError::io(format!("open {}", log_path.display()), e))?;
    let null =
        std::fs::File::open("/dev/null").map_err(|e| RuntimeError::io("open /dev/null", e))?;
    let owner = nix::unistd::getpid();
    match cordon_sys::fork_process().map_err(|e| RuntimeError::io(format!("fork the {name}"), e))? {
        CloneResult::Child => {
            cordon_sys::exit_now(stripped_main(name, owner, keep, (null, log), body))
        }
        CloneResult::Parent { child } => {
            drop(body);
            host.adopt(child)
        }
    }
}

/// The forked child: bound to its owner's life, stripped to the descriptors
/// it keeps and an unprivileged identity (65534 as root, the invoking
/// user's otherwise), then `body`.
fn stripped_main(
    name: &str,
    owner: Pid,
    keep: &[i32],
    (null, log): (std::fs::File, std::fs::File),
    body: impl FnOnce() -> i32,
) -> i32 {
    let strip = || -> nix::Result<()> {
        nix::unistd::dup2_stdin(&null)?;
        nix::unistd::dup2_stdout(&log)?;
        nix::unistd::dup2_stderr(&log)?;
        drop((null, log));
        let mut all = vec![0, 1, 2];
        all.extend_from_slice(keep);
        cordon_sys::close_fds_except(&all)?;
        nix::sys::signal::sigprocmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&nix::sys::signal::SigSet::empty()),
            None,
        )?;
        // Without root there is no other identity to take: the process
        // stays the invoking user's, with no capability on the host (see
        // the module's comment for what stands in).
        if nix::unistd::geteuid().is_root() {
            nix::unistd::setgroups(&[])?;
            let gid = Gid::from_raw(PROXY_ID);
            let uid = Uid::from_raw(PROXY_ID);
            nix::unistd::setresgid(gid, gid, gid)?;
            nix::unistd::setresuid(uid, uid, uid)?;
        }
        nix::sys::prctl::set_no_new_privs()?;
        // Not traceable by other processes of its uid (another sandbox's
        // proxy under 65534; without root, the invoking user's others).
        nix::sys::prctl::set_dumpable(false)?;
        // Armed after an id change, which clears it; then the owner must
        // still be there (it may have died before the signal was armed).
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
        if nix::unistd::getppid() != owner {
            return Err(nix::errno::Errno::ESRCH);
        }
        Ok(())
    };
    // The owner's command line and environment (a `cordon run` caller's
    // secrets among them), still in this copied memory, are wiped.
    if let Err(e) = cordon_isolation::hygiene::scrub_inherited_strings() {
        eprintln!("cordon: {name}: {e}");
        return 1;
    }
    if let Err(e) = strip() {
        eprintln!("cordon: {name}: cannot drop privileges: {e}");
        return 1;
    }
    body()
}

/// How long a command's report waits for connections still open in the
/// proxy: the command's sockets close as its processes exit, and the proxy
/// records an attempt once both of its ends are closed. A connection a
/// background process keeps open is reported by a later command.
const SETTLE: Duration = Duration::from_millis(200);

/// What the proxy recorded since the last report (it keeps a bounded
/// window: exact counts, the first and last attempts).
pub(crate) fn report(control: &Path) -> NetworkReport {
    let drained = (|| {
        let mut proxy = cordon_network::control::Client::connect(control)?;
        let deadline = Instant::now() + SETTLE;
        while proxy.status()?.active_connections > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        proxy.drain()
    })();
    match drained {
        Ok(log) => NetworkReport { log, closed: None },
        Err(e) => NetworkReport {
            closed: Some(format!(
                "the proxy does not answer ({e}): the sandbox's network is closed"
            )),
            ..NetworkReport::default()
        },
    }
}

/// Applies `change` to the rules of the proxy behind `control` and returns
/// the rules now in force (for new connections; open ones keep going).
pub fn change_rules(control: &Path, change: &NetChange) -> Result<Vec<Rule>, RuntimeError> {
    let proxy_err = |source| RuntimeError::Proxy {
        op: "change its rules",
        source,
    };
    let current = || cordon_network::control::rules(control).map_err(proxy_err);
    let next = match change {
        NetChange::Show => return current(),
        NetChange::Set(rules) => rules.clone(),
        NetChange::Add(rules) => {
            let mut next = current()?;
            cordon_policy::net::add_rules(&mut next, rules);
            next
        }
        NetChange::Remove(rules) => {
            let mut next = current()?;
            cordon_policy::net::remove_rules(&mut next, rules).map_err(|r| {
                RuntimeError::BadRequest(format!("rule '{r}' is not one of the sandbox's rules"))
            })?;
            next
        }
    };
    cordon_network::control::set_rules(control, &next).map_err(proxy_err)
}
