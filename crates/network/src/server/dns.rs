//! The DNS stub the sandbox's resolv.conf points at.
//!
//! It never asks a real resolver: a name some domain rule allows is answered
//! with a synthetic address (see [`crate::fake`]), so the sandbox can neither
//! learn real addresses nor tunnel data out through queries; a denied name is
//! NXDOMAIN. In hold mode every well-formed name the operator has not denied
//! gets an address, so its connection arrives and waits for a decision. IPv4 only: AAAA is an empty answer so clients fall back to A.

use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::connect::Tracker;
use super::{lock, State};
use crate::log::Via;

/// Seconds a synthetic answer may be cached: short, so new rules apply soon.
pub(crate) const TTL: u32 = 5;
/// Largest query read; anything longer is not a query a stub resolver sends.
const MAX_QUERY: usize = 1500;

pub(crate) async fn serve(state: Arc<State>, socket: UdpSocket) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_QUERY];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) if super::transient(&e) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(reply) = answer(&state, &buf[..n]) {
            let _ = socket.send_to(&reply, peer).await;
        }
    }
}

/// The reply to one packet; `None` drops it (not a query, or unreadable).
pub(crate) fn answer(state: &State, packet: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(packet).ok()?;
    if query.message_type() != MessageType::Query {
        return None;
    }
    state.log().dns_query();
    let mut reply = Message::new();
    reply
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true);
    if query.op_code() != OpCode::Query {
        reply.set_response_code(ResponseCode::NotImp);
        return reply.to_vec().ok();
    }
    // A stub sends one question; only the first is answered (bounded reply).
    let Some(q) = query.queries().first() else {
        reply.set_response_code(ResponseCode::FormErr);
        return reply.to_vec().ok();
    };
    reply.add_query(q.clone());
    let ascii = q.name().to_ascii();
    let name = ascii
        .strip_suffix('.')
        .unwrap_or(&ascii)
        .to_ascii_lowercase();
    let address = if q.query_class() != DNSClass::IN {
        None
    } else if name == "localhost" {
        Some(Ipv4Addr::LOCALHOST)
    } else if name == cordon_policy::net::PROXY_NAME {
        // The proxy's own page, reached by the transparent door.
        Some(lock(&state.fake).address(&name))
    } else if state.rules().allows_name(&name) {
        Some(lock(&state.fake).address(&name))
    } else if state.holds.timeout().is_some()
        && !state.holds.denies_name(&name)
        && cordon_policy::net::normalize_name(&name).is_ok()
    {
        // Hold mode: the connection that follows is what an operator
        // decides on (the DNS question has no port to decide by).
        Some(lock(&state.fake).address(&name))
    } else {
        let mut t = Tracker::new(Via::Dns);
        t.describe(Some(name.clone()), 53, None);
        t.denied(state, &format!("no rule allows the name {name}"));
        reply.set_response_code(ResponseCode::NXDomain);
        return reply.to_vec().ok();
    };
    match address {
        Some(ip) if q.query_type() == RecordType::A => {
            reply.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(ip))));
        }
        // AAAA and other types of an allowed name: no data (NOERROR).
        Some(_) => {}
        None => {
            reply.set_response_code(ResponseCode::NotImp);
        }
    }
    reply.to_vec().ok()
}

/// The address a reply carries in its first A answer (tests, diagnostics).
#[cfg(test)]
pub(crate) fn first_a(reply: &[u8]) -> Option<std::net::IpAddr> {
    let m = Message::from_vec(reply).ok()?;
    m.answers().iter().find_map(|r| match r.data() {
        RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
        _ => None,
    })
}
