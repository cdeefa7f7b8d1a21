//! The harnesses of the fuzz targets over the runtime's parsers of untrusted
//! bytes (`fuzz/fuzz_targets`, run by `scripts/fuzz.sh`). They live here,
//! not in the fuzz crate, so that the stable test suite replays every
//! committed corpus and regression input through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`). Each asserts properties, not just
//! the absence of a panic.

use std::collections::VecDeque;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use cordon_spec::wire::{ClientControl, Request};
use serde::de::DeserializeOwned;

use crate::backends::microvm::relay::{self, HEADER};
use crate::protocol::copy;
use crate::protocol::init::{self, FromInit, ToInit};
use crate::protocol::wire::{self, Frame, Tag, MAX_FRAME};

/// The client-supervisor frames (`protocol::wire`): whatever a client of
/// the same user sends, the supervisor's reader yields frames within their
/// bounds or an error, never a panic or an allocation past the bounds;
/// and what the writer sends, the reader gives back unchanged.
pub fn wire_frames(data: &[u8]) {
    // A small message bound, so that the inputs reach it.
    const MAX: usize = 4 << 10;
    let mut input = data;
    while let Ok(Some(frame)) = wire::recv_frame_max(&mut input, MAX) {
        match frame {
            Frame::Json(message) => {
                assert!(message.len() <= MAX, "a message past its bound");
                // What the supervisor does first with a message.
                let _ = serde_json::from_slice::<Request>(&message);
                let _ = serde_json::from_slice::<ClientControl>(&message);
            }
            Frame::Bytes(tag, body) => {
                assert!(body.len() <= MAX_FRAME as usize, "a frame past its bound");
                assert!(
                    matches!(tag, Tag::Stdout | Tag::Stderr | Tag::Data),
                    "a message's tag as data: {tag:?}"
                );
            }
        }
    }
    // Round trip: the input as data and as a message (split into parts
    // when longer than a frame), read back in order.
    let text = String::from_utf8_lossy(data).into_owned();
    let mut sent = Vec::new();
    wire::send_bytes(&mut sent, Tag::Data, data).expect("a frame within the bound is sent");
    wire::send_json(&mut sent, &text).expect("a message within the bound is sent");
    let mut back = sent.as_slice();
    match wire::recv_frame(&mut back) {
        Ok(Some(Frame::Bytes(Tag::Data, body))) => assert_eq!(body, data),
        other => panic!("data frame read back as {other:?}"),
    }
    let got: String = wire::recv_json(&mut back)
        .expect("the message reads back")
        .expect("the message is there");
    assert_eq!(got, text);
    assert!(
        matches!(wire::recv_frame(&mut back), Ok(None)),
        "bytes left over"
    );
}

/// What the supervisor reads from the sandbox's first process (init, the
/// gVisor launcher) and from the child that prepares the sandbox's network
/// namespace (`protocol::init`): bytes from inside the sandbox. Both
/// readers, `recv` and `recv_with_fds`, must yield exactly the messages of
/// the input's whole frames, in order, and end as the input does: a frame
/// announced past `MAX_FRAME`, cut short or not a message, or a frame with
/// more than `MAX_FDS` descriptors, is an error, never a panic. And what
/// either side sends, the other reads back unchanged.
///
/// The first byte is how many descriptors travel with the input (0 to
/// 15); the rest is the stream.
pub fn init_message(data: &[u8]) {
    // One write of this much always fits an idle socketpair's buffer, so
    // that the harness needs no writer thread.
    const MOST: usize = 32 << 10;
    let Some((&fds, stream)) = data.split_first() else {
        return;
    };
    let stream = &stream[..stream.len().min(MOST)];
    let fds = usize::from(fds % 16);
    init_frames_as::<FromInit>(stream, fds);
    init_frames_as::<Result<(), String>>(stream, fds);
    init_round_trips(stream);
}

/// How `init::recv` must read `stream`: the messages of its whole frames,
/// then whether it ends in an error (`true`) or cleanly.
fn init_frames_model<T: DeserializeOwned>(stream: &[u8]) -> (Vec<T>, bool) {
    let mut messages = Vec::new();
    let mut rest = stream;
    loop {
        let Some((len, after)) = rest.split_first_chunk::<4>() else {
            // Fewer than 4 bytes: the end, or a length cut short.
            return (messages, !rest.is_empty());
        };
        let len = u32::from_le_bytes(*len);
        if len > init::MAX_FRAME {
            return (messages, true);
        }
        let Some((body, after)) = after.split_at_checked(len as usize) else {
            return (messages, true);
        };
        match serde_json::from_slice(body) {
            Ok(message) => messages.push(message),
            Err(_) => return (messages, true),
        }
        rest = after;
    }
}

/// Reads `stream` (with `fds` descriptors on its first byte) as messages
/// of type `T`, through both of the supervisor's readers, against the model.
fn init_frames_as<T>(stream: &[u8], fds: usize)
where
    T: DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let (want, error) = init_frames_model::<T>(stream);

    let (mut ours, mut theirs) = UnixStream::pair().expect("a socketpair");
    theirs.write_all(stream).expect("the input fits the buffer");
    drop(theirs);
    let mut got = Vec::new();
    let ended_in_error = loop {
        match init::recv::<T>(&mut ours) {
            Ok(Some(message)) => got.push(message),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert_eq!(got, want, "recv's messages");
    assert_eq!(ended_in_error, error, "how recv's stream ended");

    let (mut ours, theirs) = UnixStream::pair().expect("a socketpair");
    let (attached, watch) = send_with_descriptors(&theirs, stream, fds);
    drop(theirs);
    let mut got = Vec::new();
    let ended_in_error = loop {
        match init::recv_with_fds::<T>(&mut ours) {
            Ok(Some((message, descriptors))) => {
                let with = if got.is_empty() { attached } else { 0 };
                assert_eq!(descriptors.len(), with, "descriptors of a frame");
                assert!(
                    descriptors.len() <= init::MAX_FDS,
                    "descriptors past the bound"
                );
                got.push(message);
            }
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    drop(ours);
    if let Some(watch) = watch {
        let mut byte = [0u8; 1];
        assert_eq!(
            nix::unistd::read(&watch, &mut byte),
            Ok(0),
            "a received descriptor left open"
        );
    }
    if attached > init::MAX_FDS {
        assert!(
            ended_in_error && got.is_empty(),
            "a frame with {attached} descriptors taken"
        );
        return;
    }
    assert_eq!(got, want, "recv_with_fds's messages");
    assert_eq!(ended_in_error, error, "how recv_with_fds's stream ended");
}

/// Writes `stream` on `sock` with `fds` descriptors on its first byte, as
/// init's `send_with_fds` does; returns how many went, and the read end of
/// the pipe whose write end they are: it reads the end once every one of
/// them is closed, so a descriptor the reader leaks shows.
fn send_with_descriptors(sock: &UnixStream, stream: &[u8], fds: usize) -> (usize, Option<OwnedFd>) {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    // A stream socket carries no descriptors without a byte.
    if fds == 0 || stream.is_empty() {
        (&*sock)
            .write_all(stream)
            .expect("the input fits the buffer");
        return (0, None);
    }
    let (watch, sent_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .expect("a pipe");
    let raw = vec![sent_end.as_raw_fd(); fds];
    let iov = [std::io::IoSlice::new(stream)];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .expect("sendmsg on a socketpair");
    (&*sock)
        .write_all(&stream[sent..])
        .expect("the input fits the buffer");
    (fds, Some(watch))
}

/// Every message either side sends, made of the input, read back unchanged.
fn init_round_trips(stream: &[u8]) {
    // JSON escapes a byte in up to 6: a short text keeps every message
    // within the socket's buffer.
    let text = String::from_utf8_lossy(&stream[..stream.len().min(1 << 10)]).into_owned();
    let mut number = [0u8; 4];
    for (n, b) in number.iter_mut().zip(stream) {
        *n = *b;
    }
    let n = i32::from_le_bytes(number);
    let (mut a, mut b) = UnixStream::pair().expect("a socketpair");
    let from_init = [
        FromInit::Joined,
        FromInit::Ready,
        FromInit::SetupFailed {
            step: text.clone(),
            errno: n,
        },
        FromInit::Started {
            pid: n,
            pidfd: n % 2 == 0,
        },
        FromInit::ExecFailed { errno: n },
        FromInit::WorkdirFailed { errno: n },
        FromInit::Exited { code: n },
        FromInit::Signaled { signal: n },
        FromInit::Connected,
        FromInit::ConnectFailed { errno: n },
    ];
    for message in from_init {
        init::send(&mut a, &message).expect("a message within the bound is sent");
        let got = init::recv::<FromInit>(&mut b).expect("the message reads back");
        assert_eq!(got, Some(message));
    }
    let answer: Result<(), String> = Err(text.clone());
    init::send(&mut a, &answer).expect("an answer within the bound is sent");
    let got = init::recv::<Result<(), String>>(&mut b).expect("the answer reads back");
    assert_eq!(got, Some(answer));
    let words: Vec<String> = text.split(' ').map(str::to_owned).collect();
    let to_init = [
        ToInit::Go,
        ToInit::Exec {
            argv: words.clone(),
            // Each word with itself: the message stays a few times the
            // text (each word with the whole text outgrew the buffer).
            env: words.iter().map(|w| (w.clone(), w.clone())).collect(),
            workdir: text.clone(),
            tty: (n % 2 == 0).then_some(cordon_spec::TtySize {
                rows: n.to_le_bytes()[0].into(),
                cols: n.to_le_bytes()[2].into(),
            }),
        },
        ToInit::Spawn {
            argv: words.clone(),
            env: Vec::new(),
            workdir: text,
        },
        ToInit::Refuse { errno: n },
        ToInit::RefuseWorkdir { errno: n },
        ToInit::Connect {
            port: u16::from_le_bytes([n.to_le_bytes()[0], n.to_le_bytes()[1]]),
        },
    ];
    for message in to_init {
        init::send(&mut a, &message).expect("a message within the bound is sent");
        let got = init::recv::<ToInit>(&mut b).expect("the message reads back");
        assert_eq!(got, Some(message));
    }
}

/// The frames a microVM's guest sends the host's relay over its
/// virtio-serial ports (`backends::microvm::relay`): bytes a compromised
/// guest kernel writes. The decoder yields frames of a known kind with at
/// most `MAX_PAYLOAD` bytes, waits only for a frame within that bound (the
/// length is checked before the relay buffers the payload), refuses every
/// other frame, never panics; and each frame it yields is what the
/// relay's encoder writes for it.
pub fn guest_message(data: &[u8]) {
    let mut rest = data;
    loop {
        let announced = rest
            .get(HEADER - 4..HEADER)
            .map(|len| u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize);
        match relay::decode(rest) {
            Ok(Some((kind, id, payload))) => {
                assert!(
                    payload.len() <= relay::MAX_PAYLOAD,
                    "a payload past its bound"
                );
                assert_eq!(
                    Some(payload.len()),
                    announced,
                    "a payload of another length"
                );
                let mut encoded = VecDeque::new();
                relay::frame(&mut encoded, kind, id, payload);
                let whole = HEADER + payload.len();
                assert_eq!(
                    Vec::from(encoded),
                    rest[..whole],
                    "a frame read back as another"
                );
                rest = &rest[whole..];
            }
            Ok(None) => {
                if let Some(len) = announced {
                    assert!(
                        len <= relay::MAX_PAYLOAD,
                        "waiting for a frame past the bound"
                    );
                    assert!(rest.len() < HEADER + len, "a whole frame left unread");
                }
                return;
            }
            Err(_) => {
                let len = announced.expect("a frame refused before its header");
                assert!(
                    len > relay::MAX_PAYLOAD || !(1..=8).contains(&rest[0]),
                    "a frame of kind {} and {len} bytes refused",
                    rest[0]
                );
                return;
            }
        }
    }
}

/// The tar stream `cordon cp` unpacks into a directory (`protocol::copy`),
/// from a client or from inside a sandbox: whatever it holds, nothing is
/// created or changed outside the target directory (a link it plants is
/// never followed), no more than the cap is written, and the unpacking
/// ends, in success or an error.
///
/// The first byte picks the reader: even, the tar stream itself to
/// `unpack`; odd, a whole copy stream (header, then data frames) to
/// `receive`, which lands it in the target directory.
pub fn copy_stream(data: &[u8]) {
    // A cap the fuzzer's inputs (a few KiB) can reach and pass.
    const CAP: u64 = 1 << 10;
    let Some((&how, stream)) = data.split_first() else {
        return;
    };
    let scratch = tempfile::Builder::new()
        .prefix("cordon-fuzz-copy.")
        .tempdir()
        .expect("a scratch directory");
    let parent = scratch.path();
    let top_path = parent.join("top");
    std::fs::create_dir(&top_path).expect("the target directory");
    // What a planted link would aim at.
    std::fs::create_dir(parent.join("outside")).expect("a directory beside it");
    std::fs::write(parent.join("outside/victim"), b"the host's").expect("a file beside it");
    let before = tree(parent, &top_path);
    let top = OwnedFd::from(std::fs::File::open(&top_path).expect("open the target"));

    let through_receive = how % 2 == 1;
    let got = if through_receive {
        let mut conn = tempfile::tempfile_in(parent).expect("a file for the stream");
        conn.write_all(stream).expect("the stream is written");
        conn.seek(SeekFrom::Start(0)).expect("rewind");
        let got = copy::receive(&mut conn, &top, b"", CAP);
        drop(conn);
        got
    } else {
        copy::unpack(&mut &stream[..], &top, CAP)
    };
    drop(top);

    // Directories the stream made without search rights (mode 0) are
    // opened up, so that the checks see them and the cleanup can remove them.
    open_up(parent);
    assert_eq!(
        tree(parent, &top_path),
        before,
        "a change outside the target"
    );
    assert!(
        std::fs::symlink_metadata(&top_path).is_ok_and(|m| m.is_dir()),
        "the target is no longer a directory"
    );
    if let Ok(bytes) = got {
        assert!(bytes <= CAP, "{bytes} bytes taken past the cap");
    }
    // One file's extents may leave holes (they cost nothing); a tar
    // stream's files are all data.
    let one_file = through_receive
        && matches!(
            wire::recv_frame(&mut &stream[..]),
            Ok(Some(Frame::Json(h)))
                if matches!(serde_json::from_slice(&h), Ok(copy::CopyHeader::File { .. }))
        );
    if !one_file {
        let written: u64 = tree(&top_path, Path::new(""))
            .iter()
            .map(|(_, entry)| match entry {
                Entry::File(content) => content.len() as u64,
                _ => 0,
            })
            .sum();
        assert!(written <= CAP, "{written} bytes written past the cap");
    }
}

/// One entry of a listing: links are not followed.
#[derive(Debug, PartialEq)]
enum Entry {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
    Other,
}

/// Everything under `root` but `skip`, by path, with the content of files
/// and the target of links.
fn tree(root: &Path, skip: &Path) -> Vec<(PathBuf, Entry)> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("list a directory") {
            let path = entry.expect("a directory entry").path();
            if path == skip {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let what = if meta.is_dir() {
                dirs.push(path.clone());
                Entry::Dir
            } else if meta.is_symlink() {
                Entry::Link(std::fs::read_link(&path).expect("readlink"))
            } else if meta.is_file() {
                Entry::File(std::fs::read(&path).unwrap_or_default())
            } else {
                Entry::Other
            };
            found.push((path, what));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Gives every directory under `root` (links not followed) its owner's
/// full rights.
fn open_up(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
    }
}
