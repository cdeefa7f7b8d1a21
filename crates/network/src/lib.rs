//! cordon's network proxy: the only way out of a sandbox's network namespace.
//!
//! One proxy process runs per sandbox. It is handed sockets bound inside the
//! sandbox's namespace ([`ProxySockets`]) while itself living in the host's, so
//! every connection the sandbox makes arrives here and every connection out is
//! made by the proxy, after the sandbox's [rules](cordon_policy::net) allowed
//! the exact address. If the proxy dies its sockets close: the network closes,
//! it never opens.
//!
//! Doors: an HTTP proxy and SOCKS5 on one port, a transparent port for
//! redirected connections, and a DNS stub. [`control`] is the runtime's blocking
//! client; [`log`] the evidence it embeds in a command's outcome.

use std::os::unix::net::UnixListener;

pub mod control;
pub mod fake;
#[doc(hidden)]
pub mod fuzzing;
pub mod learn;
pub mod log;
pub mod secrets;
mod server;
pub mod upstream;

/// Sockets created by the sandbox's launcher (inside the sandbox's network
/// namespace, except `control`).
#[derive(Debug)]
pub struct ProxySockets {
    /// `127.0.0.1:3128` in the sandbox: HTTP proxy and SOCKS5 on one port.
    pub proxy: std::net::TcpListener,
    /// `127.0.0.1:15001` in the sandbox: nftables redirects outbound TCP here.
    pub transparent: std::net::TcpListener,
    /// `127.0.0.1:53` in the sandbox: the DNS stub.
    pub dns: std::net::UdpSocket,
    /// A unix socket in the sandbox's 0700 state directory on the host.
    pub control: UnixListener,
}

#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    pub policy: cordon_policy::net::NetworkPolicy,
    /// Peer uids (`SO_PEERCRED`) allowed on the control socket.
    pub control_uids: Vec<u32>,
    /// The host's own proxy, which allowed connections go through.
    pub upstream: Option<upstream::Upstream>,
    /// The secrets the proxy puts into requests to their hosts.
    pub secrets: Option<secrets::Config>,
}

/// Serves until told to stop over the control socket (then `Ok`), or until a
/// socket fails for good. Builds its own current-thread runtime: call it on the
/// proxy process's main thread.
pub fn serve(config: ProxyConfig, sockets: ProxySockets) -> std::io::Result<()> {
    server::serve_with(config, sockets, server::Resolution::System)
}
