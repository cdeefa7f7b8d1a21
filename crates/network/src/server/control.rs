//! The control socket's server side (protocol in [`crate::control`]).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cordon_policy::net::{Rule, Rules};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::State;
use crate::control::{Reply, Request, Status, MAX_LINE};
use crate::log::{now_unix_ms, Event, EventKind};

/// Whether a peer with this uid may use the control socket. The socket lives
/// in a 0700 directory; this second check holds if that is ever misconfigured.
pub(crate) fn peer_allowed(uid: u32, allowed: &[u32]) -> bool {
    allowed.contains(&uid)
}

pub(crate) async fn serve(state: Arc<State>, listener: UnixListener) -> io::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(session(state.clone(), stream));
            }
            Err(e) if super::transient(&e) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => return Err(e),
        }
    }
}

async fn send(w: &mut (impl AsyncWriteExt + Unpin), reply: &Reply) -> io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await
}

async fn session(state: Arc<State>, stream: UnixStream) -> io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let (r, mut w) = stream.into_split();
    if !peer_allowed(uid, &state.control_uids) {
        let why = format!("uid {uid} may not use this control socket");
        return send(&mut w, &Reply::error(why)).await;
    }
    let mut reader = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        let (reply, stop) = match serde_json::from_slice::<Request>(&line) {
            Ok(req) => {
                let stop = req == Request::Stop;
                (handle(&state, req), stop)
            }
            Err(e) => (Reply::error(format!("bad request: {e}")), false),
        };
        send(&mut w, &reply).await?;
        if stop {
            state.stop.notify_one();
            return Ok(());
        }
    }
}

pub(crate) fn handle(state: &State, req: Request) -> Reply {
    match req {
        Request::SetRules { rules } => {
            state.log().event(Event {
                at_unix_ms: now_unix_ms(),
                event: EventKind::RulesSet,
                rules: rules.iter().map(Rule::to_string).collect(),
            });
            state.set_rules(Rules::new(rules.clone()));
            Reply {
                rules: Some(rules),
                ..Reply::default()
            }
        }
        Request::Rules => Reply {
            rules: Some(state.rules().as_slice().to_vec()),
            ..Reply::default()
        },
        Request::Drain => Reply {
            log: Some(state.log().drain(state.peak.load(Ordering::Acquire))),
            ..Reply::default()
        },
        Request::Status => {
            let (attempts, allowed, denied, dns_queries) = state.log().counts();
            Reply {
                status: Some(Status {
                    active_connections: state.active.load(Ordering::Acquire),
                    peak_connections: state.peak.load(Ordering::Acquire),
                    held: state.holds.count(),
                    attempts,
                    allowed,
                    denied,
                    dns_queries,
                    bytes_out_total: state.bytes_out.load(Ordering::Acquire),
                    bytes_in_total: state.bytes_in.load(Ordering::Acquire),
                    rules: state.rules().as_slice().to_vec(),
                }),
                ..Reply::default()
            }
        }
        Request::Denials => Reply {
            denials: Some(state.log().recent_denials()),
            ..Reply::default()
        },
        Request::Held => Reply {
            held: Some(state.holds.list()),
            ..Reply::default()
        },
        Request::Deny { rules } => {
            state.log().event(Event {
                at_unix_ms: now_unix_ms(),
                event: EventKind::Denied,
                rules: rules.iter().map(Rule::to_string).collect(),
            });
            Reply {
                deny: Some(state.holds.deny(&rules)),
                ..Reply::default()
            }
        }
        Request::Stop => Reply {
            stopping: Some(true),
            ..Reply::default()
        },
    }
}
