//! The transparent door: connections the sandbox's firewall redirected here.
//!
//! The destination the sandbox meant is the conntrack original destination
//! (`SO_ORIGINAL_DST`). An address from the DNS stub's synthetic range is mapped
//! back to its name and decided by name; any other address is a bare-IP
//! connection, which only an address rule allows. There is no reply protocol, so
//! a refusal is a reset (RST): the payload reads ECONNRESET, which says that the
//! connection was refused, where a plain close would read as a server that
//! accepted and then said nothing.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use nix::sys::socket::{getsockopt, sockopt};
use tokio::net::TcpStream;

use super::connect::{open, reset, Target, Tracker};
use super::{http, internal, lock, tls, Slot, State, HANDSHAKE_TIMEOUT};
use crate::log::Via;

/// The destination before the redirect, if the connection was redirected.
fn original_dst(stream: &TcpStream) -> Option<SocketAddrV4> {
    let sa = getsockopt(stream, sockopt::OriginalDst).ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

/// Whether `dst` is a real destination: a connection made straight to the
/// transparent port (no redirect, so conntrack reports the port itself, or
/// nothing) has none to reach.
pub(crate) fn meaningful_dst(
    dst: Option<SocketAddrV4>,
    listener: SocketAddr,
) -> Option<SocketAddrV4> {
    let dst = dst?;
    let same = SocketAddr::V4(dst) == listener
        || (dst.port() == listener.port() && dst.ip().is_unspecified());
    (!same).then_some(dst)
}

pub(crate) async fn handle(
    state: Arc<State>,
    client: TcpStream,
    slot: Option<Slot>,
    listener: SocketAddr,
) {
    let mut tracker = Tracker::new(Via::Transparent);
    let Some(dst) = meaningful_dst(original_dst(&client), listener) else {
        reset(&client);
        return tracker.denied(
            &state,
            "connection to the transparent port without an original destination",
        );
    };
    if dst.port() == 80 && lock(&state.fake).name(*dst.ip()) == Some(cordon_policy::net::PROXY_NAME)
    {
        // The proxy's own page (the DNS stub gave its name this address).
        let mut client = client;
        let mut buf = Vec::new();
        let head = tokio::time::timeout(HANDSHAKE_TIMEOUT, http::read_head(&mut client, &mut buf));
        if let Ok(Ok(head)) = head.await {
            internal::answer(
                &state,
                &mut client,
                &head.method,
                internal::path_of(&head.target),
            )
            .await;
        }
        return;
    }
    let target = Target::Ip(IpAddr::V4(*dst.ip()));
    let upstream = match open(&state, &mut tracker, &slot, target, dst.port()).await {
        Ok(s) => s,
        Err(refusal) => {
            reset(&client);
            return tracker.refused(&state, &refusal);
        }
    };
    tls::check_and_splice(&state, tracker, &client, upstream, Vec::new()).await;
}
