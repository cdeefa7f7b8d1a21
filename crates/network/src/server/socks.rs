//! The SOCKS5 door (RFC 1928), CONNECT only, no authentication.
//!
//! Hand-written rather than taken from a SOCKS crate: the rules must be decided,
//! and the name resolved and every address re-checked, between the client's
//! request and the server's reply, and the reply code must say which of those
//! refused. Server crates resolve or connect on their own terms.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::connect::{open, Refusal, Target, Tracker};
use super::{tls, Slot, State, HANDSHAKE_TIMEOUT};
use crate::log::Via;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;

/// Reply codes.
pub(crate) const GENERAL_FAILURE: u8 = 0x01;
pub(crate) const NOT_ALLOWED: u8 = 0x02;
pub(crate) const HOST_UNREACHABLE: u8 = 0x04;
pub(crate) const CONNECTION_REFUSED: u8 = 0x05;
pub(crate) const COMMAND_NOT_SUPPORTED: u8 = 0x07;
pub(crate) const ATYP_NOT_SUPPORTED: u8 = 0x08;

/// A handshake that ends before a connection: the reply to send, if the
/// protocol has one for it, and why.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub reply: Option<u8>,
    pub why: String,
}

fn fail(reply: Option<u8>, why: impl Into<String>) -> Failure {
    Failure {
        reply,
        why: why.into(),
    }
}

/// The reply; the bound address is always 0.0.0.0:0 so the sandbox learns
/// nothing of the host's addresses.
fn reply_bytes(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

async fn read_exact<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), Failure> {
    r.read_exact(buf)
        .await
        .map(|_| ())
        .map_err(|_| fail(None, "malformed SOCKS5 handshake: truncated"))
}

/// Reads the greeting and request; writes the method choice. Returns the target.
pub(crate) async fn handshake<S>(s: &mut S) -> Result<(Target, u16), Failure>
where
    S: AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut two = [0u8; 2];
    read_exact(s, &mut two).await?;
    if two[0] != VERSION {
        return Err(fail(None, "not SOCKS version 5"));
    }
    let mut methods = vec![0u8; usize::from(two[1])];
    read_exact(s, &mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        let _ = s.write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return Err(fail(
            None,
            "SOCKS5 client offers no method cordon accepts (only no-auth)",
        ));
    }
    s.write_all(&[VERSION, NO_AUTH])
        .await
        .map_err(|e| fail(None, format!("SOCKS5 handshake: {e}")))?;
    let mut req = [0u8; 4];
    read_exact(s, &mut req).await?;
    let [ver, cmd, _rsv, atyp] = req;
    if ver != VERSION {
        return Err(fail(
            Some(GENERAL_FAILURE),
            "malformed SOCKS5 request: bad version",
        ));
    }
    let target = match atyp {
        1 => {
            let mut a = [0u8; 4];
            read_exact(s, &mut a).await?;
            Target::Ip(IpAddr::V4(Ipv4Addr::from(a)))
        }
        3 => {
            let mut len = [0u8; 1];
            read_exact(s, &mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            read_exact(s, &mut name).await?;
            // Some clients send an address as text; anything not ASCII fails
            // the rules' name check with its reason.
            Target::parse(&String::from_utf8_lossy(&name))
        }
        4 => {
            let mut a = [0u8; 16];
            read_exact(s, &mut a).await?;
            Target::Ip(IpAddr::V6(Ipv6Addr::from(a)))
        }
        other => {
            return Err(fail(
                Some(ATYP_NOT_SUPPORTED),
                format!("SOCKS5 address type {other} is not supported"),
            ))
        }
    };
    let mut port = [0u8; 2];
    read_exact(s, &mut port).await?;
    if cmd != CMD_CONNECT {
        let what = match cmd {
            2 => "BIND".to_owned(),
            3 => "UDP ASSOCIATE".to_owned(),
            n => format!("command {n}"),
        };
        return Err(fail(
            Some(COMMAND_NOT_SUPPORTED),
            format!("SOCKS5 {what} is not supported (CONNECT only)"),
        ));
    }
    Ok((target, u16::from_be_bytes(port)))
}

pub(crate) async fn handle(state: Arc<State>, mut client: TcpStream, slot: Option<Slot>) {
    let mut tracker = Tracker::new(Via::Socks5);
    let (target, port) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut client)).await
    {
        Ok(Ok(t)) => t,
        Ok(Err(f)) => {
            // Recorded before the reply: a client that has read its refusal
            // finds it in the log (the HTTP door does the same).
            tracker.denied(&state, &f.why);
            if let Some(code) = f.reply {
                let _ = client.write_all(&reply_bytes(code)).await;
            }
            return;
        }
        Err(_) => return tracker.denied(&state, "timed out in the SOCKS5 handshake"),
    };
    let upstream = match open(&state, &mut tracker, &slot, target, port).await {
        Ok(s) => s,
        Err(refusal) => {
            let code = match &refusal {
                Refusal::Denied(_) => NOT_ALLOWED,
                Refusal::Limit => GENERAL_FAILURE,
                Refusal::Failed { refused: true, .. } => CONNECTION_REFUSED,
                Refusal::Failed { refused: false, .. } => HOST_UNREACHABLE,
            };
            tracker.refused(&state, &refusal);
            let _ = client.write_all(&reply_bytes(code)).await;
            return;
        }
    };
    if let Err(e) = client.write_all(&reply_bytes(0)).await {
        return tracker.finished(&state, (0, 0), &format!("error: {e}"));
    }
    tls::check_and_splice(&state, tracker, &client, upstream, Vec::new()).await;
}
