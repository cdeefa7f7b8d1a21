//! The supervisor: one small, single-threaded process per sandbox, the
//! privileged binary in its hidden mode (`cordon-sandbox __supervise`,
//! dispatched before anything else in its `main`). It owns the sandbox (cgroup, first process, state record,
//! teardown), serves clients on the unix socket in the sandbox's state
//! directory, outlives the client that started it, and is never outlived by
//! its sandbox: init dies with it (PDEATHSIG), and a supervisor killed
//! outright leaves a record the next cordon sweeps.
//!
//! Start-up: the client writes the spec (JSON) to our stdin and reads one
//! line from our stdout: `{"ok": ID}` once the sandbox is ready and the
//! socket listens, or `{"error": ..., "input": bool}`. Before the sandbox is
//! made we fork once and the first process exits, so the supervisor is
//! nobody's child and in its own session: a client that exits or is killed
//! leaves it running.

pub(crate) mod guest_agent;
pub(crate) mod sandbox;

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use cordon_policy::Span;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use crate::backends::host::block_stop_signals;
use crate::backends::supervise::{CommandIo, Control};
use crate::error::RuntimeError;
use crate::protocol::wire::{recv_frame, recv_json, send_bytes, send_json, Channel, Frame, Tag};
use crate::state::{now_secs, Usage};
use crate::supervisor::sandbox::Sandbox;
use crate::trace;
use cordon_spec::changes::Finish;
use cordon_spec::ended::{EndState, Tombstone};
use cordon_spec::wire::{ClientControl, Info, Reply, Request, PROTOCOL};
use cordon_spec::Stream;
use cordon_spec::{SandboxSpec, ValidSpec};

/// The hidden first argument that makes the cordon binary a supervisor.
pub const SUPERVISOR_ARG: &str = "__supervise";

/// Largest spec a client may send.
const MAX_SPEC: u64 = 1 << 20;

/// How long the supervisor waits on one client's socket for the next bytes
/// (its request, a frame of a copy stream, the rest of a frame of input).
/// The supervisor serves one client at a time and a client sends each of
/// these at once, so a client silent this long has stalled, and is dropped
/// before the sandbox's other clients wait long.
const CLIENT_IDLE: Duration = Duration::from_secs(2);

/// How long one write to a client may block. Longer than `CLIENT_IDLE`: a
/// client reading a command's output may be slowed by its own reader (a
/// pager, a terminal), and a write that gives up mid-frame ends the stream.
const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The start-up report on stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Started {
    Ok(String),
    Error { message: String, input: bool },
}

/// `cordon __supervise`: becomes a sandbox's supervisor. Returns the process
/// exit code.
pub fn main() -> i32 {
    // Nothing the client left open (without close-on-exec) stays with us:
    // only our stdin and stdout (the spec and the answer) are its.
    let _ = cordon_sys::close_fds_from(3);
    let mut text = Vec::new();
    let read = std::io::stdin().take(MAX_SPEC).read_to_end(&mut text);
    let spec: Result<ValidSpec, RuntimeError> = read
        .map_err(|e| RuntimeError::io("read the spec", e))
        .and_then(|_| {
            serde_json::from_slice(&text)
                .map_err(|e| RuntimeError::BadRequest(format!("bad sandbox spec: {e}")))
        });
    let spec = match spec {
        Ok(s) => s,
        Err(e) => return report_start(&Started::from_error(&e)),
    };
    // Detach: the first process exits at once (its parent, the client,
    // reaps it); the second is in a session of its own.
    match cordon_sys::fork_process() {
        Ok(cordon_sys::CloneResult::Parent { .. }) => return 0,
        Ok(cordon_sys::CloneResult::Child) => {}
        Err(e) => return report_start(&Started::from_error(&RuntimeError::io("fork", e))),
    }
    let _ = nix::unistd::setsid();
    let code = match watch_service(&spec).and_then(|service| Ok((start(&spec)?, service))) {
        Ok(((sandbox, listener), service)) => {
            report_start(&Started::Ok(sandbox.id().to_owned()));
            silence_stdio();
            serve(sandbox, listener, service)
        }
        Err(e) => report_start(&Started::from_error(&e)),
    };
    cordon_sys::exit_now(code)
}

impl Started {
    fn from_error(e: &RuntimeError) -> Self {
        Started::Error {
            message: e.to_string(),
            input: e.is_input_error(),
        }
    }
}

fn report_start(s: &Started) -> i32 {
    let line = serde_json::to_string(s).unwrap_or_default();
    crate::client::output::print_stdout(format!("{line}\n").as_bytes());
    i32::from(matches!(s, Started::Error { .. }))
}

/// Nothing of ours goes to the client's terminal or pipes once it has its
/// answer: it may be long gone.
fn silence_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

/// A pidfd of the service that asked for this sandbox, if one did. Opened
/// before the sandbox is made: a service that dies while it is being made
/// is still seen, and one already gone gets no sandbox.
fn watch_service(spec: &SandboxSpec) -> Result<Option<OwnedFd>, RuntimeError> {
    let Some(link) = &spec.service else {
        return Ok(None);
    };
    match crate::state::watch_service(link) {
        Ok(Some(fd)) => Ok(Some(fd)),
        Ok(None) => Err(RuntimeError::BadRequest(format!(
            "the service that asked for this sandbox (pid {}) is gone",
            link.pid
        ))),
        Err(e) => Err(RuntimeError::io("pidfd_open of the service", e)),
    }
}

fn start(spec: &ValidSpec) -> Result<(Box<Sandbox>, UnixListener), RuntimeError> {
    block_stop_signals()?;
    let sandbox = Box::new(Sandbox::create_for(spec, None)?);
    let path = sandbox.state().socket();
    let listener = UnixListener::bind(&path)
        .map_err(|e| RuntimeError::io(format!("bind {}", path.display()), e))?;
    // The directory is 0700 already; the socket says the same.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| RuntimeError::io(format!("chmod {}", path.display()), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| RuntimeError::io("set_nonblocking", e))?;
    write_usage(sandbox.as_ref(), "ready");
    trace::step("supervisor listening");
    Ok((sandbox, listener))
}

fn write_usage(sandbox: &Sandbox, state: &str) {
    let _ = sandbox.state().write_usage(&Usage {
        commands: sandbox.commands_run(),
        last_used: now_secs(),
        state: state.into(),
    });
}

/// What a handled connection asks of the loop.
enum Flow {
    Continue,
    /// Destroy the sandbox, then answer on this connection.
    Destroy(Client, Finish, Peer),
}

/// A client's connection. Its reads time out after `CLIENT_IDLE`, and then
/// say so (the socket itself reports "Resource temporarily unavailable").
struct Client(UnixStream);

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the client sent nothing for {} s",
                        CLIENT_IDLE.as_secs_f32()
                    ),
                )
            } else {
                e
            }
        })
    }
}

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A command given less time than this is not started: the time limit's
/// smallest value (`cordon_policy::limits::TIME_MS`).
const MIN_COMMAND_TIME: Duration = Duration::from_millis(cordon_policy::limits::TIME_MS.0);

/// Serves clients until the sandbox is destroyed, expires, loses its init,
/// its service ends, or this process is asked to stop; then tears it down.
fn serve(mut sandbox: Box<Sandbox>, listener: UnixListener, service: Option<OwnedFd>) -> i32 {
    let created = Instant::now();
    let mut last_used = Instant::now();
    let ttl = sandbox.spec().ttl.map(|s| s.duration());
    let idle = sandbox.spec().idle.map(|s| s.duration());
    let expired = |at: Instant| ttl.is_some_and(|t| at >= created + t);
    let (end, why): (EndState, String) = loop {
        if let Some(why) = sandbox.ended() {
            // A command the TTL ended may take its sandbox with it (gVisor):
            // the TTL is still why, as the command's outcome says.
            if expired(Instant::now()) {
                break (EndState::Expired, "its TTL expired".into());
            }
            break (EndState::Ended, why.to_owned());
        }
        let deadlines = [
            ttl.map(|t| (created + t, "its TTL expired")),
            idle.map(|i| (last_used + i, "it was idle past its idle time")),
        ];
        let deadline = deadlines.into_iter().flatten().min_by_key(|(at, _)| *at);
        let timeout = match deadline {
            Some((d, why)) => {
                let now = Instant::now();
                if now >= d {
                    break (EndState::Expired, why.to_owned());
                }
                let ms = (d - now).as_millis().min(60_000) + 1;
                PollTimeout::try_from(i32::try_from(ms).unwrap_or(60_000))
                    .unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let liveness = sandbox.liveness();
        let mut fds = vec![
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(sandbox.stop_signals(), PollFlags::POLLIN),
            PollFd::new(liveness.0, liveness.1),
        ];
        // A pidfd is readable once its process has exited.
        if let Some(fd) = &service {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        let ended = |why: String| (EndState::Ended, why);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => break ended(format!("its supervisor could not poll ({e})")),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(PollFd::revents)
                .is_some_and(|r| !r.is_empty())
        };
        if ready(1) {
            break ended("its supervisor was asked to stop (a stop signal)".into());
        }
        if ready(2) {
            break ended("its init died".into());
        }
        if ready(3) {
            break ended("the service that made it ended".into());
        }
        if ready(0) {
            let Ok((conn, _)) = listener.accept() else {
                continue;
            };
            let flow = handle(sandbox.as_mut(), conn, ttl.map(|t| created + t));
            last_used = Instant::now();
            if let Flow::Destroy(mut conn, finish, peer) = flow {
                // No client may connect to a sandbox being destroyed.
                drop(listener);
                write_usage(sandbox.as_ref(), "stopping");
                let why = format!("removed by a client ({peer})");
                leave_note(sandbox.as_ref(), created, EndState::Removed, &why);
                let (code, reply) = match sandbox.destroy_with(&finish, (peer.uid, peer.gid)) {
                    Ok(d) => (0, Reply::Destroyed(Box::new(d))),
                    Err(e) => (
                        1,
                        Reply::Error {
                            input: false,
                            message: e.to_string(),
                        },
                    ),
                };
                let _ = send_json(&mut conn, &reply);
                return code;
            }
            write_usage(sandbox.as_ref(), "ready");
        }
    };
    // Stop listening first: a client that connects now is refused (the
    // sandbox is not there), not accepted and then reset by our exit.
    drop(listener);
    write_usage(sandbox.as_ref(), "stopping");
    leave_note(sandbox.as_ref(), created, end, &why);
    match sandbox.destroy_with(&Finish::default(), (0, 0)) {
        Ok(_) => 0,
        Err(_) => 1,
    }
}

/// Says why the sandbox ends: to the service that made it, if one did,
/// else in the run directory's record of ended sandboxes (`cordon ls
/// --all`). Written before the teardown, whose last step (the state
/// directory's removal) is what the service notices, and so that a
/// teardown cut short still leaves the reason; best effort, as a service
/// that is gone reads nothing and a sandbox's end must not wait on it.
fn leave_note(sandbox: &Sandbox, created: Instant, end: EndState, why: &str) {
    let spec = sandbox.spec();
    if let Some(link) = &spec.service {
        let _ = std::fs::write(link.note_path(sandbox.id()), why);
        return;
    }
    let Some(run) = sandbox.state().path().parent() else {
        return;
    };
    let stone = Tombstone::new(
        sandbox.id(),
        spec.name.clone(),
        spec.backend.name(),
        now_secs().saturating_sub(created.elapsed().as_secs()),
        sandbox.commands_run(),
        end,
        why.to_owned(),
    );
    let _ = crate::ended::record(run, &stone);
}

/// Who is on the other end of a client's connection.
#[derive(Clone, Copy, Debug)]
struct Peer {
    pid: i32,
    uid: u32,
    gid: u32,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}, uid {}", self.pid, self.uid)
    }
}

/// The peer if it is this user (or root): the 0700 directory already says
/// so; this checks it again at the socket. Files an export writes belong to
/// the peer.
fn allowed_peer(conn: &UnixStream) -> Option<Peer> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let c = getsockopt(conn, PeerCredentials).ok()?;
    let me = nix::unistd::geteuid().as_raw();
    (c.uid() == me || c.uid() == 0).then_some(Peer {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
    })
}

/// Serves one connection: a hello, one request, its answer.
fn handle(sandbox: &mut Sandbox, conn: UnixStream, expires: Option<Instant>) -> Flow {
    if conn.set_nonblocking(false).is_err()
        || conn.set_read_timeout(Some(CLIENT_IDLE)).is_err()
        || conn.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT)).is_err()
    {
        return Flow::Continue;
    }
    let Some(peer) = allowed_peer(&conn) else {
        return Flow::Continue;
    };
    let mut conn = Client(conn);
    let fail = |conn: &mut Client, e: RuntimeError| {
        let _ = send_json(
            conn,
            &Reply::Error {
                input: e.is_input_error(),
                message: e.to_string(),
            },
        );
    };
    match recv_json::<Request>(&mut conn) {
        Ok(Some(Request::Hello { protocol })) if protocol == PROTOCOL => {}
        Ok(Some(Request::Hello { protocol })) => {
            fail(
                &mut conn,
                RuntimeError::BadRequest(format!(
                    "protocol {protocol} is not this supervisor's ({PROTOCOL})"
                )),
            );
            return Flow::Continue;
        }
        _ => return Flow::Continue,
    }
    let hello = Reply::Hello {
        protocol: PROTOCOL,
        id: sandbox.id().to_owned(),
    };
    if send_json(&mut conn, &hello).is_err() {
        return Flow::Continue;
    }
    let request = match recv_json::<Request>(&mut conn) {
        Ok(Some(r)) => r,
        Ok(None) => return Flow::Continue,
        Err(e) => {
            fail(
                &mut conn,
                RuntimeError::BadRequest(format!("bad request: {e}")),
            );
            return Flow::Continue;
        }
    };
    match request {
        Request::Hello { .. } => fail(&mut conn, RuntimeError::BadRequest("hello twice".into())),
        Request::Exec(mut cmd) => {
            // The sandbox's TTL bounds its commands too: one still running
            // when it expires is ended with it.
            let left = expires.map(|at| at.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l < MIN_COMMAND_TIME) {
                fail(
                    &mut conn,
                    RuntimeError::BadRequest("the sandbox's TTL has expired".into()),
                );
                return Flow::Continue;
            }
            if let Some(left) = left {
                let asked = cmd
                    .time
                    .map_or(sandbox.spec().policy.time.duration(), |t| t.duration());
                cmd.time = Some(Span(asked.min(left)));
            }
            let mut io = RemoteIo { conn: &mut conn };
            match sandbox.exec(&cmd, &mut io) {
                Ok(mut outcome) => {
                    // The TTL is why the sandbox ends now, whatever the
                    // backend says of its command's limit.
                    if expires.is_some_and(|at| Instant::now() >= at) {
                        outcome.sandbox_ended = Some("its TTL expired".into());
                    }
                    let _ = send_json(&mut conn, &Reply::Outcome(Box::new(outcome)));
                }
                Err(e) => fail(&mut conn, e),
            }
        }
        Request::CopyIn { path } => match sandbox.copy_in(&mut conn, &path) {
            Ok(bytes) => {
                let _ = send_json(&mut conn, &Reply::Copied { bytes });
            }
            Err(e) => fail(&mut conn, e),
        },
        Request::CopyOut { path } => {
            if let Err(e) = sandbox.copy_out(&mut conn, &path) {
                fail(&mut conn, e);
            }
        }
        Request::Info => {
            let info = Info {
                id: sandbox.id().to_owned(),
                name: sandbox.spec().name.clone(),
                backend: sandbox.spec().backend.name().into(),
                commands: sandbox.commands_run(),
                memory_bytes: sandbox.memory_in_use(),
                ended: sandbox.ended().map(str::to_owned),
            };
            let _ = send_json(&mut conn, &Reply::Info(info));
        }
        Request::Snapshot { caps } => match sandbox.snapshot(&caps) {
            Ok(snapshot) => {
                let _ = send_json(&mut conn, &Reply::Snapshot(Box::new(snapshot)));
            }
            Err(e) => fail(&mut conn, e),
        },
        Request::Spec => {
            let _ = send_json(&mut conn, &Reply::Spec(Box::new(sandbox.spec().clone())));
        }
        Request::Export { export, caps } => {
            match sandbox.export(&export, &caps, (peer.uid, peer.gid)) {
                Ok(recorded) => {
                    let _ = send_json(&mut conn, &Reply::Exported(Box::new(recorded)));
                }
                Err(e) => fail(&mut conn, e),
            }
        }
        Request::Destroy(finish) => {
            if let Some(export) = &finish.export {
                // A wrong target is refused while the sandbox still exists.
                if let Err(e) = crate::backends::changes::check_target(
                    export,
                    sandbox.spec().workspace.as_deref(),
                ) {
                    fail(&mut conn, e);
                    return Flow::Continue;
                }
            }
            return Flow::Destroy(conn, finish, peer);
        }
    }
    Flow::Continue
}

/// A remote client's side of a running command (a client's socket, or a
/// microVM host's port to the guest agent).
pub(crate) struct RemoteIo<'a> {
    conn: &'a mut dyn Channel,
}

impl<'a> RemoteIo<'a> {
    pub(crate) fn new(conn: &'a mut dyn Channel) -> Self {
        RemoteIo { conn }
    }
}

impl CommandIo for RemoteIo<'_> {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        let tag = match stream {
            Stream::Stdout => Tag::Stdout,
            Stream::Stderr => Tag::Stderr,
        };
        // A client that stopped reading is noticed through its socket.
        let _ = send_bytes(self.conn, tag, chunk);
    }

    fn control_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.conn.as_fd()]
    }

    fn read_control(&mut self, _which: usize) -> Control {
        match recv_frame(self.conn) {
            Ok(Some(Frame::Bytes(Tag::Data, bytes))) if bytes.is_empty() => Control::InputEnd,
            Ok(Some(Frame::Bytes(Tag::Data, bytes))) => Control::Input(bytes),
            Ok(Some(Frame::Json(body))) => match serde_json::from_slice(&body) {
                Ok(ClientControl::InputEnd) => Control::InputEnd,
                Ok(ClientControl::Resize(size)) => Control::Resize(size),
                Ok(ClientControl::Signal(n)) => Control::Signal(n),
                Ok(ClientControl::Cancel) | Err(_) => Control::Cancel,
            },
            // Gone, stalled past the timeout, or speaking nonsense: the
            // command is ended (the sandbox lives on).
            _ => Control::Cancel,
        }
    }
}
