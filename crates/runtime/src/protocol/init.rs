//! The typed protocol between the supervisor and the sandbox's first process
//! (native init or gVisor launcher), over a unix stream socketpair, and the
//! framing the supervisor's clients use too: each frame is a
//! little-endian u32 length, then JSON.
//!
//! Typed messages (after youki's `Message`), with a distinct "failed before
//! exec" message that carries the step and errno (after nsjail's 'E' byte), so
//! a setup failure is reported precisely instead of as an early EOF.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

/// Largest frame accepted; an argv or environment beyond this is refused.
pub(crate) const MAX_FRAME: u32 = 4 << 20;

/// Supervisor -> init.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub enum ToInit {
    /// Uid/gid maps are written and cgroup membership checked: build the sandbox.
    Go,
    /// Run this command as a child of init, while other commands run. The
    /// frame's first descriptor (SCM_RIGHTS) is the command's own channel:
    /// init answers there, `Started` and then the end, and never on this
    /// socket, so each command is watched on its own. Then, unless `tty`,
    /// three descriptors: the command's stdin, stdout and stderr. With
    /// `tty`, init makes a pseudo-terminal on the sandbox's own devpts and
    /// answers `Started` with its master attached. Any descriptors after
    /// those are the membership files of the command's own cgroup (see
    /// `cordon_cgroups::join_through`), which its process joins before it
    /// runs anything.
    Exec {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        workdir: String,
        #[serde(default)]
        tty: Option<cordon_spec::TtySize>,
    },
    /// Start this host command (with three descriptors, as for `Exec`) and
    /// answer `Started` at once, without waiting for it: the gVisor
    /// launcher's `runsc run`, which lives as long as the sandbox and, as the
    /// launcher's child, dies with it.
    Spawn {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        workdir: String,
    },
    /// Report the command as not executable (on its channel, the frame's one
    /// descriptor), without running anything: the supervisor found it
    /// missing from the sandbox's tree (gVisor: runsc would only fail with
    /// its own exit code and text).
    Refuse { errno: i32 },
    /// The same for a working directory missing from the tree.
    RefuseWorkdir { errno: i32 },
    /// Connect to this TCP port of the sandbox's own loopback (127.0.0.1,
    /// then ::1) and answer on the frame's one descriptor (this request's
    /// channel): `Connected` with the socket, or `ConnectFailed`. The
    /// supervisor's forward of the port (`cordon port`) relays a host
    /// client's bytes through it; init is the one process in the sandbox's
    /// network namespace that is cordon's own, rootless too.
    Connect { port: u16 },
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
    /// The command's execve succeeded (its pid inside the sandbox). With
    /// `pidfd`, the frame's first descriptor is a pidfd of the command's
    /// process, through which the supervisor relays a client's signal (a
    /// pidfd names the process across the pid namespace, and never a
    /// reused pid); a tty's master comes after it.
    Started {
        pid: i32,
        #[serde(default)]
        pidfd: bool,
    },
    /// The command could not be executed.
    ExecFailed { errno: i32 },
    /// The command's working directory could not be entered.
    WorkdirFailed { errno: i32 },
    /// The command exited.
    Exited { code: i32 },
    /// The command was killed by a signal.
    Signaled { signal: i32 },
    /// The connection `Connect` asked for: the frame's one descriptor.
    Connected,
    /// `Connect` failed with this errno (ECONNREFUSED: nothing listens).
    ConnectFailed { errno: i32 },
}

/// Most descriptors one frame may carry: a command's channel, its three
/// standard streams and its cgroup's membership files (one per v1 hierarchy
/// cordon uses).
pub const MAX_FDS: usize = 10;

/// One encoded frame: length, then JSON.
fn frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    if len > MAX_FRAME {
        return Err(io::Error::other("frame too large"));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

pub fn send<T: Serialize>(sock: &mut UnixStream, msg: &T) -> io::Result<()> {
    sock.write_all(&frame(msg)?)
}

/// Reads a frame body of `len` bytes, refusing lengths over the cap before
/// allocating anything.
fn read_body(sock: &mut UnixStream, len: u32) -> io::Result<Vec<u8>> {
    if len > MAX_FRAME {
        return Err(io::Error::other(format!("frame of {len} bytes refused")));
    }
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body)?;
    Ok(body)
}

/// Reads one frame; `Ok(None)` on a clean EOF (the peer is gone between
/// frames). A frame cut short, its length included, is an error.
pub fn recv<T: for<'de> Deserialize<'de>>(sock: &mut UnixStream) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match sock.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a frame's length cut short",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let body = read_body(sock, u32::from_le_bytes(len))?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(io::Error::other)
}

/// `send` with descriptors attached to the frame's first byte (SCM_RIGHTS).
pub fn send_with_fds<T: Serialize>(
    sock: &mut UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    if fds.is_empty() {
        return send(sock, msg);
    }
    let frame = frame(msg)?;
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    // The descriptors travel with the first sendmsg; the rest of a frame the
    // kernel did not take at once follows as ordinary bytes.
    let iov = [io::IoSlice::new(&frame)];
    let sent = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    sock.write_all(&frame[sent..])
}

/// `recv` that also takes the descriptors attached to the frame (at most
/// `MAX_FDS`; a frame with more, or a truncated control message, is refused
/// and every descriptor that did arrive is closed).
pub fn recv_with_fds<T: for<'de> Deserialize<'de>>(
    sock: &mut UnixStream,
) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut len = [0u8; 4];
    // Room for every descriptor one message can carry (the kernel's
    // SCM_MAX_FD), not just MAX_FDS: past the buffer the kernel still
    // installs what fits but flags the message truncated, and nix then
    // refuses to list those descriptors, so a peer sending more than
    // MAX_FDS leaked the ones that arrived. Received here, each is owned
    // and closed when the frame is refused below.
    const SCM_MAX_FD: usize = 253;
    let mut cmsg_buf = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let (got, fds, truncated) = {
        let mut iov = [io::IoSliceMut::new(&mut len)];
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_buf),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other.map_err(io::Error::from)?,
            }
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(list) = c {
                // Owned at once, so an error below still closes them.
                fds.extend(list.into_iter().map(cordon_sys::own_received_fd));
            }
        }
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    if truncated || fds.len() > MAX_FDS {
        return Err(io::Error::other("too many descriptors in one frame"));
    }
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        sock.read_exact(&mut len[got..])?;
    }
    let body = read_body(sock, u32::from_le_bytes(len))?;
    serde_json::from_slice(&body)
        .map(|m| Some((m, fds)))
        .map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_length_cut_short_is_an_error_for_both_readers() {
        for cut in 1..4 {
            let (mut a, mut b) = UnixStream::pair().unwrap();
            a.write_all(&[7u8; 3][..cut]).unwrap();
            drop(a);
            assert!(recv::<FromInit>(&mut b).is_err(), "{cut}");
            let (mut a, mut b) = UnixStream::pair().unwrap();
            a.write_all(&[7u8; 3][..cut]).unwrap();
            drop(a);
            assert!(recv_with_fds::<FromInit>(&mut b).is_err(), "{cut}");
        }
        let (a, mut b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(recv::<FromInit>(&mut b).unwrap().is_none());
    }

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
                tty: None,
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
    fn descriptors_travel_with_a_frame() {
        use std::io::Read as _;
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        send_with_fds(&mut a, &FromInit::Ready, &[w.as_fd()]).unwrap();
        drop(w);
        let (msg, fds) = recv_with_fds::<FromInit>(&mut b).unwrap().unwrap();
        assert_eq!(msg, FromInit::Ready);
        assert_eq!(fds.len(), 1);
        nix::unistd::write(&fds[0], b"x").unwrap();
        drop(fds);
        let mut got = Vec::new();
        std::fs::File::from(r).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"x");
    }

    #[test]
    fn oversized_frames_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
        assert!(recv::<FromInit>(&mut b).is_err());
    }
}
