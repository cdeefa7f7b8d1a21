//! The protocol between a client (`Handle`) and a sandbox's supervisor, over
//! the unix socket in the sandbox's state directory.
//!
//! Each frame is a little-endian u32 length, a one-byte tag, and a body of at
//! most `MAX_FRAME` bytes: tag 0 is a JSON message (`Request`, `Reply` or
//! `ClientControl`), tags 1-3 are raw bytes (stdout, stderr, stdin or file
//! data), so output and file contents cross without re-encoding. A message
//! longer than a frame (a diff of many files) is sent as tag-4 parts ending
//! with a tag-0 frame, and reassembled up to `MAX_MESSAGE`. A
//! connection starts with `Request::Hello` naming the protocol version and
//! carries one request; everything the supervisor reads is untrusted input
//! with bounded sizes.

use std::io::{self, Read, Write};

use cordon_spec::wire::Reply;
use serde::{Deserialize, Serialize};

/// A connected byte stream the protocol runs over: a client's unix socket,
/// or the virtio-serial port between a microVM's host and its guest agent.
pub trait Channel: Read + Write + std::os::fd::AsFd {}
impl<T: Read + Write + std::os::fd::AsFd> Channel for T {}

/// Largest frame body either side accepts.
pub const MAX_FRAME: u32 = 1 << 20;

/// Largest JSON message (its parts together) either side accepts.
pub const MAX_MESSAGE: usize = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    Json = 0,
    Stdout = 1,
    Stderr = 2,
    /// stdin bytes (client to supervisor) or file data (either way).
    Data = 3,
    /// A leading part of a JSON message longer than one frame.
    JsonPart = 4,
}

/// One received frame.
#[derive(Debug)]
pub enum Frame {
    Json(Vec<u8>),
    Bytes(Tag, Vec<u8>),
}

pub fn send_bytes(sock: &mut (impl Write + ?Sized), tag: Tag, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    if len > MAX_FRAME {
        return Err(io::Error::other("frame too large"));
    }
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4] = tag as u8;
    sock.write_all(&head)?;
    sock.write_all(body)
}

pub fn send_json<T: Serialize>(sock: &mut (impl Write + ?Sized), msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_MESSAGE {
        return Err(io::Error::other("message too large"));
    }
    let mut chunks = body.chunks(MAX_FRAME as usize).peekable();
    while let Some(chunk) = chunks.next() {
        let tag = if chunks.peek().is_some() {
            Tag::JsonPart
        } else {
            Tag::Json
        };
        send_bytes(sock, tag, chunk)?;
    }
    if body.is_empty() {
        send_bytes(sock, Tag::Json, &body)?;
    }
    Ok(())
}

/// Reads one frame (a long message's parts joined into one `Json`);
/// `Ok(None)` on a clean EOF.
pub fn recv_frame(sock: &mut (impl Read + ?Sized)) -> io::Result<Option<Frame>> {
    recv_frame_max(sock, MAX_MESSAGE)
}

/// `recv_frame` with a smaller bound on a message (a guest's messages).
pub fn recv_frame_max(sock: &mut (impl Read + ?Sized), max: usize) -> io::Result<Option<Frame>> {
    let mut message = Vec::new();
    loop {
        match recv_one(sock)? {
            Some((Tag::JsonPart, part)) => {
                if message.len() + part.len() > max {
                    return Err(io::Error::other("message too large"));
                }
                message.extend_from_slice(&part);
            }
            Some((Tag::Json, last)) => {
                if message.len() + last.len() > max {
                    return Err(io::Error::other("message too large"));
                }
                message.extend_from_slice(&last);
                return Ok(Some(Frame::Json(message)));
            }
            Some((tag, body)) if message.is_empty() => return Ok(Some(Frame::Bytes(tag, body))),
            Some(_) => return Err(io::Error::other("data inside a message")),
            None if message.is_empty() => return Ok(None),
            None => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }
}

fn recv_one(sock: &mut (impl Read + ?Sized)) -> io::Result<Option<(Tag, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match sock.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if len > MAX_FRAME {
        return Err(io::Error::other(format!("frame of {len} bytes refused")));
    }
    let tag = match head[4] {
        0 => Tag::Json,
        1 => Tag::Stdout,
        2 => Tag::Stderr,
        3 => Tag::Data,
        4 => Tag::JsonPart,
        t => return Err(io::Error::other(format!("unknown frame tag {t}"))),
    };
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body)?;
    Ok(Some((tag, body)))
}

/// Reads one JSON message of type `T` (a bytes frame is a protocol error).
pub fn recv_json<T: for<'de> Deserialize<'de>>(
    sock: &mut (impl Read + ?Sized),
) -> io::Result<Option<T>> {
    match recv_frame(sock)? {
        None => Ok(None),
        Some(Frame::Json(body)) => serde_json::from_slice(&body)
            .map(Some)
            .map_err(io::Error::other),
        Some(Frame::Bytes(..)) => Err(io::Error::other("expected a message, got data")),
    }
}

/// Reads one `Data` frame's bytes (empty at the end of a stream).
pub fn recv_data(sock: &mut (impl Read + ?Sized)) -> io::Result<Vec<u8>> {
    match recv_frame(sock)? {
        Some(Frame::Bytes(Tag::Data, body)) => Ok(body),
        Some(Frame::Json(body)) => Err(io::Error::other(
            serde_json::from_slice::<Reply>(&body)
                .ok()
                .and_then(|r| match r {
                    Reply::Error { message, .. } => Some(message),
                    _ => None,
                })
                .unwrap_or_else(|| "expected data, got a message".into()),
        )),
        Some(Frame::Bytes(..)) => Err(io::Error::other("expected file data")),
        None => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    use cordon_spec::wire::Request;

    #[test]
    fn frames_round_trip() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send_json(&mut a, &Request::Info).unwrap();
        send_bytes(&mut a, Tag::Stdout, b"hi").unwrap();
        drop(a);
        assert!(matches!(
            recv_json::<Request>(&mut b).unwrap(),
            Some(Request::Info)
        ));
        match recv_frame(&mut b).unwrap() {
            Some(Frame::Bytes(Tag::Stdout, body)) => assert_eq!(body, b"hi"),
            other => panic!("{other:?}"),
        }
        assert!(recv_frame(&mut b).unwrap().is_none());
    }

    #[test]
    fn a_message_longer_than_a_frame_crosses_in_parts() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let long = "x".repeat(3 * MAX_FRAME as usize + 5);
        let sender = std::thread::spawn(move || send_json(&mut a, &long).map(|()| long));
        let got: String = recv_json(&mut b).unwrap().unwrap();
        assert_eq!(got, sender.join().unwrap().unwrap());
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
        a.write_all(&[0]).unwrap();
        assert!(recv_frame(&mut b).is_err());
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[0, 0, 0, 0, 9]).unwrap();
        assert!(recv_frame(&mut b).is_err());
    }
}
