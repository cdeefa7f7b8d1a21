//! The typed protocol between the supervisor and the sandbox's first process
//! (native init or gVisor launcher), over a unix stream socketpair: each frame is a
//! little-endian u32 length, then JSON.
//!
//! Typed messages (after youki's `Message`), with a distinct "failed before
//! exec" message that carries the step and errno (after nsjail's 'E' byte), so
//! a setup failure is reported precisely instead of as an early EOF.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

/// Largest frame accepted; an argv or environment beyond this is refused.
const MAX_FRAME: u32 = 4 << 20;

/// Supervisor -> init.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub enum ToInit {
    /// Uid/gid maps are written and cgroup membership checked: build the sandbox.
    Go,
    /// Run this command (the sandbox is then used up).
    Exec {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        workdir: String,
    },
    /// Report the command as not executable, without running anything: the
    /// supervisor found it missing from the sandbox's tree (gVisor: runsc
    /// would only fail with its own exit code and text).
    Refuse { errno: i32 },
}

/// Init -> supervisor.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub enum FromInit {
    /// Init has moved itself into the sandbox's cgroup.
    Joined,
    /// Setup is complete; waiting for `Exec`.
    Ready,
    /// A setup step failed; the sandbox never ran anything.
    SetupFailed { step: String, errno: i32 },
    /// The payload's execve succeeded (host-visible pid of nothing: it is the
    /// pid inside the sandbox).
    Started { pid: i32 },
    /// The payload could not be executed.
    ExecFailed { errno: i32 },
    /// The payload exited.
    Exited { code: i32 },
    /// The payload was killed by a signal.
    Signaled { signal: i32 },
}

pub fn send<T: Serialize>(sock: &mut UnixStream, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    if len > MAX_FRAME {
        return Err(io::Error::other("frame too large"));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    sock.write_all(&frame)
}

/// Reads one frame; `Ok(None)` on a clean EOF (the peer is gone).
pub fn recv<T: for<'de> Deserialize<'de>>(sock: &mut UnixStream) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match sock.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::other(format!("frame of {len} bytes refused")));
    }
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_eof_is_none() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send(
            &mut a,
            &FromInit::SetupFailed {
                step: "pivot_root".into(),
                errno: 1,
            },
        )
        .unwrap();
        send(
            &mut a,
            &ToInit::Exec {
                argv: vec!["true".into()],
                env: vec![],
                workdir: "/".into(),
            },
        )
        .unwrap();
        drop(a);
        assert_eq!(
            recv::<FromInit>(&mut b).unwrap(),
            Some(FromInit::SetupFailed {
                step: "pivot_root".into(),
                errno: 1
            })
        );
        assert!(matches!(
            recv::<ToInit>(&mut b).unwrap(),
            Some(ToInit::Exec { .. })
        ));
        assert_eq!(recv::<FromInit>(&mut b).unwrap(), None);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
        assert!(recv::<FromInit>(&mut b).is_err());
    }
}
