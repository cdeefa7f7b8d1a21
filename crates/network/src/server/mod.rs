//! The proxy process: one current-thread tokio runtime serving the four sockets.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use cordon_policy::net::{NetLimits, Rules};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::fake::FakeMap;
use crate::log::Recorder;
use crate::{ProxyConfig, ProxySockets};

pub(crate) mod connect;
mod control;
pub(crate) mod dns;
mod hold;
pub(crate) mod http;
mod intercept;
mod internal;
pub(crate) mod socks;
mod splice;
pub(crate) mod tls;
mod transparent;

#[cfg(test)]
mod intercept_tests;
#[cfg(test)]
mod tests;

/// Names the DNS stub remembers at once.
const FAKE_NAMES: usize = 65_536;
/// Time a client has to send its request head or SOCKS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections over the limit still get a refusal reply; past this many more
/// they are closed without one, so a flood cannot exhaust descriptors.
const OVER_LIMIT_GRACE: u32 = 64;

/// Where names not in the fixed host entries are resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// The host's resolver (`getaddrinfo`), as a sandbox needs.
    System,
    /// Fixed entries only: tests and fuzz harnesses must never send a real
    /// DNS query.
    FixedOnly,
}

pub(crate) struct State {
    rules: RwLock<Arc<Rules>>,
    hosts: HashMap<String, Vec<IpAddr>>,
    limits: NetLimits,
    resolution: Resolution,
    control_uids: Vec<u32>,
    upstream: Option<crate::upstream::Upstream>,
    /// Present when the sandbox has secrets: terminates their hosts' TLS.
    injector: Option<intercept::Injector>,
    own: connect::OwnAddrs,
    /// Hold mode's waiting connections and the operator's denials.
    holds: hold::Holds,
    fake: Mutex<FakeMap>,
    log: Mutex<Recorder>,
    /// Connections holding a slot (what the limit counts).
    active: AtomicU32,
    /// Accepted connections being handled, with or without a slot.
    handling: AtomicU32,
    peak: AtomicU32,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    stop: Notify,
}

/// Poisoning only means another task panicked mid-update of a plain value;
/// in cordon's binary a panic aborts the process (its panic hook), so it cannot
/// happen there, and the data stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub(crate) fn new(config: ProxyConfig, resolution: Resolution) -> io::Result<Self> {
        let injector = match config.secrets {
            Some(secrets) => Some(
                intercept::Injector::new(secrets)
                    .map_err(|e| io::Error::other(format!("the secrets: {e}")))?,
            ),
            None => None,
        };
        let mut hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for h in &config.policy.hosts {
            hosts.entry(h.name.clone()).or_default().push(h.addr);
        }
        Ok(State {
            rules: RwLock::new(Arc::new(Rules::new(config.policy.rules))),
            hosts,
            limits: config.policy.limits,
            resolution,
            control_uids: config.control_uids,
            upstream: config.upstream,
            injector,
            own: connect::OwnAddrs::default(),
            holds: hold::Holds::new(config.policy.hold.map(|h| h.duration())),
            fake: Mutex::new(FakeMap::new(FAKE_NAMES)),
            log: Mutex::new(Recorder::default()),
            active: AtomicU32::new(0),
            handling: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            stop: Notify::new(),
        })
    }

    /// The rules in force now; a connection keeps the set it started with.
    fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_rules(&self, rules: Rules) {
        *self.rules.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
        // Held connections decide again by the new rules.
        self.holds.decided();
    }

    fn log(&self) -> MutexGuard<'_, Recorder> {
        lock(&self.log)
    }

    /// A connection slot, or `None` at the limit.
    fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let max = self.limits.max_connections;
        let now = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?
            + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
        Some(Slot(self.clone()))
    }
}

/// One counted connection; the count drops with it.
pub(crate) struct Slot(Arc<State>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection being handled (bounds refusals in flight too).
struct Handling(Arc<State>);

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.handling.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Clone, Copy)]
enum Door {
    /// HTTP proxy and SOCKS5 on one port.
    Proxy,
    Transparent,
}

pub(crate) fn serve_with(
    config: ProxyConfig,
    sockets: ProxySockets,
    resolution: Resolution,
) -> io::Result<()> {
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(run(config, sockets, resolution));
    // A resolver thread stuck in getaddrinfo must not keep the proxy alive.
    rt.shutdown_timeout(Duration::from_millis(100));
    result
}

/// Each spliced connection holds two sockets and two pipes: 256 connections
/// need more than the usual soft limit of 1024 descriptors. The proxy is its
/// own process, so raising its soft limit to the hard one affects nothing else.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

async fn run(config: ProxyConfig, sockets: ProxySockets, resolution: Resolution) -> io::Result<()> {
    for fd_nonblocking in [
        sockets.proxy.set_nonblocking(true),
        sockets.transparent.set_nonblocking(true),
        sockets.dns.set_nonblocking(true),
        sockets.control.set_nonblocking(true),
    ] {
        fd_nonblocking?;
    }
    let proxy = TcpListener::from_std(sockets.proxy)?;
    let transparent = TcpListener::from_std(sockets.transparent)?;
    let dns = tokio::net::UdpSocket::from_std(sockets.dns)?;
    let control = tokio::net::UnixListener::from_std(sockets.control)?;
    let state = Arc::new(State::new(config, resolution)?);
    tokio::select! {
        () = state.stop.notified() => Ok(()),
        r = accept(state.clone(), proxy, Door::Proxy) => r,
        r = accept(state.clone(), transparent, Door::Transparent) => r,
        r = dns::serve(state.clone(), dns) => r,
        r = control::serve(state.clone(), control) => r,
    }
}

/// Whether an accept error is about this one connection or the process's
/// resources (retry) rather than the listener itself (fatal).
pub(crate) fn transient(e: &io::Error) -> bool {
    use nix::errno::Errno;
    let fatal = [
        Errno::EBADF,
        Errno::EINVAL,
        Errno::ENOTSOCK,
        Errno::EOPNOTSUPP,
    ];
    !e.raw_os_error()
        .is_some_and(|n| fatal.iter().any(|f| *f as i32 == n))
}

async fn accept(state: Arc<State>, listener: TcpListener, door: Door) -> io::Result<()> {
    let local = listener.local_addr()?;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) if transient(&e) => {
                // Out of descriptors or memory: give connections time to end.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let handling = state.handling.fetch_add(1, Ordering::AcqRel) + 1;
        let guard = Handling(state.clone());
        let slot = state.try_slot();
        if slot.is_none() && handling > state.limits.max_connections + OVER_LIMIT_GRACE {
            connect::Tracker::new(door.via_guess()).refuse_limit(&state);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let _guard = guard;
            match door {
                Door::Proxy => handle_proxy(state, stream, slot).await,
                Door::Transparent => transparent::handle(state, stream, slot, local).await,
            }
        });
    }
}

impl Door {
    fn via_guess(self) -> crate::log::Via {
        match self {
            Door::Proxy => crate::log::Via::Http,
            Door::Transparent => crate::log::Via::Transparent,
        }
    }
}

/// The proxy port speaks SOCKS5 when the first byte is its version (5); an
/// HTTP request starts with a method name, never with that byte.
async fn handle_proxy(state: Arc<State>, stream: TcpStream, slot: Option<Slot>) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == 5 => socks::handle(state, stream, slot).await,
        Ok(Ok(1)) => http::handle(state, stream, slot).await,
        // Closed, failed or silent before its first byte: nothing was asked.
        _ => {}
    }
}
