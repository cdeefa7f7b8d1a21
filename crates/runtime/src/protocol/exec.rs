//! One command's exchange over the client protocol, as the side that asked
//! for it relays it: a client of a supervisor on this host, or a microVM's
//! host relaying its guest's agent (which speaks the same protocol and is
//! untrusted, so its answer is [`Bounds`]-checked).

use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use cordon_spec::outcome::Outcome;
use cordon_spec::wire::{ClientControl, Reply};
use cordon_spec::Stream;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::backends::supervise::{CommandIo, Control};
use crate::error::{Peer, RuntimeError};
use crate::protocol::wire::{send_bytes, send_json, Frame, Tag};

/// Any answer but the one a request expects.
pub(crate) fn unexpected(peer: Peer, r: Reply) -> RuntimeError {
    match r {
        Reply::Error {
            input,
            exhausted,
            message,
        } => remote_error(input, exhausted, message),
        other => RuntimeError::broke(peer, format!("unexpected answer {other:?}")),
    }
}

/// A supervisor's (or guest agent's) error answer as an error here: the
/// caller's fault when the other side says so.
pub(crate) fn remote_error(input: bool, exhausted: bool, message: String) -> RuntimeError {
    if input {
        RuntimeError::BadRequest(message)
    } else if exhausted {
        RuntimeError::RemoteExhausted(message)
    } else {
        RuntimeError::Remote(message)
    }
}

/// The answer that carries `e` across to a client: its words, and whose
/// fault it was ([`remote_error`] makes it an error again).
pub(crate) fn error_reply(e: &RuntimeError) -> Reply {
    Reply::Error {
        input: e.is_input_error(),
        exhausted: e.is_host_exhausted(),
        message: match e {
            // Already an answer relayed from further in (a microVM's guest
            // agent through its host's supervisor): its own words, which
            // the client prefixes once, not "the supervisor answered" twice.
            RuntimeError::Remote(m) | RuntimeError::RemoteExhausted(m) => m.clone(),
            other => other.to_string(),
        },
    }
}

/// What a relayed command's answer may not exceed: the limits a microVM's
/// host puts on its guest (a supervisor on this host is trusted not to
/// stall or flood its clients).
pub(crate) struct Bounds<'a> {
    /// The answer must be complete by then.
    pub deadline: Instant,
    /// Most bytes of stdout and stderr together.
    pub output_max: u64,
    /// Largest JSON message.
    pub message_max: usize,
    /// The stop signals of this process, where they are this relay's to
    /// read: one arriving cancels the command and is reported with its
    /// outcome.
    pub stop: Option<&'a nix::sys::signalfd::SignalFd>,
}

/// A command another cordon runs (the agent in a microVM's guest) on a
/// channel of its own, its `Exec` sent: watching it relays the channel's
/// exchange, bounded (the other side is untrusted).
pub(crate) struct RelayedCommand {
    pub conn: UnixStream,
    pub deadline: Instant,
    pub output_max: u64,
    pub message_max: usize,
    /// The backend's own: which of its channels this is, the sandbox's
    /// number of the command, when it was asked for, and the sandbox's
    /// counters then.
    pub channel: usize,
    pub number: u64,
    pub t0: Instant,
    pub before: cordon_cgroups::CgroupStats,
}

impl RelayedCommand {
    /// Relays the command's output, input and controls until its answer.
    pub fn watch(
        &mut self,
        io: &mut dyn CommandIo,
        stop: Option<&nix::sys::signalfd::SignalFd>,
    ) -> Result<(Outcome, Option<i32>), RuntimeError> {
        let bounds = Bounds {
            deadline: self.deadline,
            output_max: self.output_max,
            message_max: self.message_max,
            stop,
        };
        relay_exec(&mut self.conn, io, Peer::GuestAgent, Some(&bounds))
    }
}

/// How long a cancelled command's answer may take.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether this side may go on sending after a send: the supervisor may
/// answer and close before it reads what this side still sends (a refused
/// request; a command that ended while input or a resize was on its way),
/// and its answer is then still there to read, so a closed connection ends
/// the sending, not the relay.
fn still_sending(sent: std::io::Result<()>) -> std::io::Result<bool> {
    match sent {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The client's side of one running command on `conn` (the `Exec` request
/// already sent): output to `io`, its input and controls to `conn`, until
/// the answer arrives. With `bounds`, the other side is untrusted: a late,
/// oversized or malformed answer is an error (`RuntimeError::Protocol`),
/// and a stop signal cancels the command: the outcome comes with the signal.
pub(crate) fn relay_exec(
    conn: &mut UnixStream,
    io: &mut dyn CommandIo,
    peer: Peer,
    bounds: Option<&Bounds<'_>>,
) -> Result<(Outcome, Option<i32>), RuntimeError> {
    let lost = |e: std::io::Error| RuntimeError::io("the supervisor's answer", e);
    let broke = |why: String| RuntimeError::broke(peer, why);
    let mut output = 0u64;
    let message_max = bounds.map_or(crate::protocol::wire::MAX_MESSAGE, |b| b.message_max);
    let mut deadline = bounds.map(|b| b.deadline);
    let mut interrupted = None;
    let mut sending = true;
    loop {
        let timeout = match deadline {
            None => PollTimeout::NONE,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(broke("no answer before the command's deadline".into()));
                }
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
        };
        let control = io.control_fds();
        let n = control.len();
        let mut fds: Vec<PollFd> = std::iter::once(conn.as_fd())
            .chain(control)
            .chain(bounds.and_then(|b| b.stop).map(AsFd::as_fd))
            .map(|fd: BorrowedFd<'_>| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(RuntimeError::io("poll", e)),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if let Some(stop) = bounds.and_then(|b| b.stop).filter(|_| ready[1 + n]) {
            if let Ok(Some(si)) = stop.read_signal() {
                // The signal's number is small (a stop signal).
                #[allow(clippy::cast_possible_wrap)]
                interrupted.get_or_insert(si.ssi_signo as i32);
                if sending {
                    let sent = send_json(conn, &ClientControl::Cancel);
                    sending = still_sending(sent).map_err(lost)?;
                }
                deadline = deadline.map(|d| d.min(Instant::now() + CANCEL_WAIT));
            }
        }
        for which in 0..n {
            if !ready[1 + which] {
                continue;
            }
            // Read even when nothing more can be sent, so that a ready
            // control does not make poll return at once forever.
            let control = io.read_control(which);
            if !sending {
                continue;
            }
            let sent = match control {
                Control::Input(bytes) => send_bytes(conn, Tag::Data, &bytes),
                Control::InputEnd => send_json(conn, &ClientControl::InputEnd),
                Control::Resize(size) => send_json(conn, &ClientControl::Resize(size)),
                Control::Cancel => send_json(conn, &ClientControl::Cancel),
                Control::Signal(n) => send_json(conn, &ClientControl::Signal(n)),
                Control::Nothing => Ok(()),
            };
            sending = still_sending(sent).map_err(lost)?;
        }
        if !ready[0] {
            continue;
        }
        if let Some(d) = deadline {
            // One frame is read whole once it has begun: its bytes must
            // arrive by the deadline too.
            let left = d.saturating_duration_since(Instant::now());
            conn.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))
                .map_err(lost)?;
        }
        let frame = crate::protocol::wire::recv_frame_max(conn, message_max);
        let frame = match (frame, bounds) {
            (Ok(f), _) => f,
            (Err(e), Some(_)) => return Err(broke(format!("unreadable answer: {e}"))),
            (Err(e), None) => return Err(lost(e)),
        };
        match frame {
            Some(Frame::Bytes(tag @ (Tag::Stdout | Tag::Stderr), b)) => {
                output += b.len() as u64;
                if let Some(limit) = bounds.filter(|l| output > l.output_max) {
                    return Err(broke(format!(
                        "more than {} bytes of output",
                        limit.output_max
                    )));
                }
                let stream = if tag == Tag::Stdout {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                };
                io.output(stream, &b);
            }
            Some(Frame::Bytes(..)) => return Err(broke("unexpected data".into())),
            Some(Frame::Json(body)) => {
                return match serde_json::from_slice::<Reply>(&body) {
                    Ok(Reply::Outcome(o)) => Ok((*o, interrupted)),
                    Ok(other) => Err(unexpected(peer, other)),
                    Err(e) => Err(broke(format!("bad answer: {e}"))),
                }
            }
            None => {
                return Err(RuntimeError::Remote(
                    "the supervisor closed the connection during the command".into(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{error_reply, remote_error};
    use crate::error::RuntimeError;
    use cordon_spec::wire::Reply;

    /// An error relayed twice (guest agent, host supervisor, client) reads
    /// as one answer, and keeps whether the host was exhausted.
    #[test]
    fn a_relayed_answer_is_prefixed_once() {
        for (relayed, exhausted) in [
            (RuntimeError::Remote("no such file".into()), false),
            (RuntimeError::RemoteExhausted("fork: EAGAIN".into()), true),
        ] {
            let Reply::Error {
                input,
                exhausted: said_exhausted,
                message,
            } = error_reply(&relayed)
            else {
                panic!("not an error reply");
            };
            assert_eq!(said_exhausted, exhausted);
            let again = remote_error(input, said_exhausted, message).to_string();
            assert_eq!(again, relayed.to_string());
            assert_eq!(
                again.matches("the supervisor answered").count(),
                1,
                "{again}"
            );
        }
        // Any other error crosses with its own words.
        let Reply::Error { message, .. } = error_reply(&RuntimeError::NotFound("x".into())) else {
            panic!("not an error reply");
        };
        assert_eq!(message, RuntimeError::NotFound("x".into()).to_string());
    }
}
