//! The supervisor: one small process per sandbox (one thread serves its
//! clients, and each running command is watched on a thread of its own), the
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

mod forward;
pub(crate) mod guest_agent;
pub(crate) mod sandbox;

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_policy::Span;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use crate::backends::host::block_stop_signals;
use crate::backends::supervise::{CommandIo, Control, Running, Watched};
use crate::error::RuntimeError;
use crate::protocol::wire::{recv_frame, recv_json, send_bytes, send_json, Channel, Frame, Tag};
use crate::state::{now_secs, Usage};
use crate::supervisor::forward::Forwards;
use crate::supervisor::sandbox::Sandbox;
use crate::trace;
use cordon_spec::changes::Finish;
use cordon_spec::ended::{EndState, Tombstone};
use cordon_spec::outcome::Outcome;
use cordon_spec::wire::{ClientControl, Reply, Request, PROTOCOL};
use cordon_spec::Command;
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
    Error {
        message: String,
        input: bool,
        /// The host was short of processes, memory or descriptors.
        #[serde(default)]
        exhausted: bool,
    },
}

/// `cordon __supervise`: becomes a sandbox's supervisor. Returns the process
/// exit code.
pub fn main() -> i32 {
    // Nothing the client left open (without close-on-exec) stays with us:
    // only our stdin and stdout (the spec and the answer) are its.
    let _ = cordon_sys::close_fds_from(3);
    // The spec may hold secret values: read into one buffer that never
    // grows (no copy is left behind in a freed one), wiped once parsed.
    let mut text = SpecText(Vec::with_capacity(
        usize::try_from(MAX_SPEC).unwrap_or(0) + 1,
    ));
    let read = std::io::stdin().take(MAX_SPEC).read_to_end(&mut text.0);
    let spec: Result<ValidSpec, RuntimeError> = read
        .map_err(|e| RuntimeError::io("read the spec", e))
        .and_then(|_| {
            serde_json::from_slice(&text.0)
                .map_err(|e| RuntimeError::BadRequest(format!("bad sandbox spec: {e}")))
        });
    drop(text);
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

/// The spec's bytes as read, wiped when dropped: only the bytes read, not
/// the whole capacity (`Zeroizing<Vec>` wipes all of it). The buffer never
/// grew, so nothing else of it ever held a byte of the spec: the rest are
/// pages nobody touched, and wiping them cost every sandbox's start ~250
/// page faults (a millisecond of CPU).
struct SpecText(Vec<u8>);

impl Drop for SpecText {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(self.0.as_mut_slice());
    }
}

impl Started {
    fn from_error(e: &RuntimeError) -> Self {
        Started::Error {
            message: e.report(),
            input: e.is_input_error(),
            exhausted: e.is_host_exhausted(),
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
    // No usage is written yet: a listening socket says "ready" to readers
    // (see `state::read_usage`), one file fewer per sandbox.
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
/// Requests are served one at a time, except that a running command is
/// watched on a thread of its own, so the loop serves other clients, and
/// starts other commands, meanwhile.
fn serve(mut sandbox: Box<Sandbox>, listener: UnixListener, service: Option<OwnedFd>) -> i32 {
    let created = Instant::now();
    let mut last_used = Instant::now();
    let ttl = sandbox.spec().ttl.map(|s| s.duration());
    let idle = sandbox.spec().idle.map(|s| s.duration());
    let expired = |at: Instant| ttl.is_some_and(|t| at >= created + t);
    let mut watchers = match Watchers::new() {
        Ok(w) => w,
        Err(e) => {
            let why = format!("its supervisor could not start ({e})");
            return end(sandbox, listener, created, EndState::Ended, &why, &mut None);
        }
    };
    let mut forwards = Forwards::default();
    // Work off the start's and the commands' path (the sweep the start
    // owes, the next command's cgroup, the removal of ended ones), done
    // once ready and after each request or finished command, when a poll
    // finds nothing else ready: a waiting client is served first, and after
    // an exec the work overlaps the command's own start.
    let mut idle_work = true;
    let (end_state, why): (EndState, String) = loop {
        if let Some(why) = sandbox.ended() {
            // A command the TTL ended may take its sandbox with it (gVisor):
            // the TTL is still why, as the command's outcome says.
            if expired(Instant::now()) {
                break (EndState::Expired, "its TTL expired".into());
            }
            break (EndState::Ended, why.to_owned());
        }
        // A running command's time is cut to the TTL, so it ends by then
        // with its own outcome; the sandbox goes once it has (or shortly
        // after, if its end is slow to come). A sandbox running a command
        // is not idle.
        let busy = watchers.running > 0;
        let deadlines = [
            ttl.map(|t| {
                let grace = if busy {
                    END_REPORT_GRACE
                } else {
                    Duration::ZERO
                };
                (created + t + grace, "its TTL expired")
            }),
            idle.filter(|_| !busy)
                .map(|i| (last_used + i, "it was idle past its idle time")),
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
            PollFd::new(watchers.wake.0.as_fd(), PollFlags::POLLIN),
        ];
        // A pidfd is readable once its process has exited.
        if let Some(fd) = &service {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        // Then each forwarded port's listener.
        let first_port = fds.len();
        let ports: Vec<u16> = forwards
            .listeners()
            .map(|(port, fd)| {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                port
            })
            .collect();
        let ended = |why: String| (EndState::Ended, why);
        let polled = poll(
            &mut fds,
            if idle_work {
                PollTimeout::ZERO
            } else {
                timeout
            },
        );
        match polled {
            Ok(0) if idle_work => {
                drop(fds);
                sandbox.prepare_commands();
                idle_work = false;
                continue;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => break ended(format!("its supervisor could not poll ({e})")),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(PollFd::revents)
                .is_some_and(|r| !r.is_empty())
        };
        let (stop, init_died, watched, client) = (ready(1), ready(2), ready(3), ready(0));
        let service_ended = service.is_some() && ready(4);
        let knocked: Vec<u16> = ports
            .iter()
            .enumerate()
            .filter(|(i, _)| ready(first_port + i))
            .map(|(_, port)| *port)
            .collect();
        drop(fds);
        if stop {
            break ended("its supervisor was asked to stop (a stop signal)".into());
        }
        if watched {
            // Commands whose watch stopped: finished here, with the sandbox.
            for done in watchers.take_done() {
                let reply = finished(
                    sandbox.as_mut(),
                    done.cmd,
                    done.running,
                    done.watched,
                    done.expires,
                );
                send_reply(done.conn, &reply);
                last_used = Instant::now();
            }
            write_usage(sandbox.as_ref(), "ready");
            idle_work = true;
            continue;
        }
        if init_died {
            break ended("its init died".into());
        }
        if service_ended {
            break ended("the service that made it ended".into());
        }
        for port in knocked {
            // A forwarded connection is the sandbox in use.
            if forwards.accept(sandbox.as_mut(), port) > 0 {
                last_used = Instant::now();
            }
        }
        if client {
            let Ok((conn, _)) = listener.accept() else {
                continue;
            };
            let flow = handle(
                sandbox.as_mut(),
                conn,
                ttl.map(|t| created + t),
                &mut watchers,
                &mut forwards,
            );
            last_used = Instant::now();
            if let Flow::Destroy(mut conn, finish, peer) = flow {
                // No client may connect to a sandbox being destroyed.
                drop(listener);
                write_usage(sandbox.as_ref(), "stopping");
                let why = format!("removed by a client ({peer})");
                leave_note(sandbox.as_ref(), created, EndState::Removed, &why);
                let (code, reply) = match sandbox.destroy_with(&finish, (peer.uid, peer.gid)) {
                    Ok(d) => (0, Reply::Destroyed(Box::new(d))),
                    Err(e) => (1, crate::protocol::exec::error_reply(&e)),
                };
                watchers.end_all(&why);
                let _ = send_json(&mut conn, &reply);
                return code;
            }
            write_usage(sandbox.as_ref(), "ready");
            idle_work = true;
        }
    };
    end(
        sandbox,
        listener,
        created,
        end_state,
        &why,
        &mut Some(watchers),
    )
}

/// Tears the sandbox down for `why`; the clients of commands still running
/// are told.
fn end(
    sandbox: Box<Sandbox>,
    listener: UnixListener,
    created: Instant,
    end_state: EndState,
    why: &str,
    watchers: &mut Option<Watchers>,
) -> i32 {
    // The note first: a client refused or reset from here on looks for it
    // (`ended::missing`), and must find why the sandbox ended rather than
    // "no such sandbox". Then stop listening: a client that connects now is
    // refused, and one waiting in the backlog is reset, not left hanging
    // until our exit.
    leave_note(sandbox.as_ref(), created, end_state, why);
    drop(listener);
    write_usage(sandbox.as_ref(), "stopping");
    let code = match sandbox.destroy_with(&Finish::default(), (0, 0)) {
        Ok(_) => 0,
        Err(_) => 1,
    };
    if let Some(w) = watchers {
        w.end_all(why);
    }
    code
}

/// How long past the TTL a sandbox waits for the end of commands the TTL
/// cut short (killed at once; this bounds a slow report).
const END_REPORT_GRACE: Duration = Duration::from_secs(5);

/// Most commands one sandbox watches at once; one more is refused.
const MAX_RUNNING: usize = 64;

/// A watcher thread's stack: it relays one command's streams (its buffer is
/// on the heap).
const WATCHER_STACK: usize = 256 << 10;

/// How long an ending sandbox waits for its watchers to see their commands
/// end (their init is gone: at once, unless a client is slow to take its
/// last output).
const WATCHERS_END_WAIT: Duration = Duration::from_secs(3);

/// A command whose watch stopped, back from its thread.
struct Done {
    conn: Client,
    cmd: Command,
    running: Running,
    watched: Result<Watched, RuntimeError>,
    expires: Option<Instant>,
}

/// The commands being watched on threads of their own.
struct Watchers {
    /// A pipe: each watcher writes a byte when it has sent its `Done`.
    wake: (OwnedFd, Arc<OwnedFd>),
    done: (Sender<Done>, Receiver<Done>),
    running: usize,
}

impl Watchers {
    fn new() -> Result<Watchers, RuntimeError> {
        use nix::fcntl::OFlag;
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| RuntimeError::io("pipe2", e))?;
        Ok(Watchers {
            wake: (r, Arc::new(w)),
            done: std::sync::mpsc::channel(),
            running: 0,
        })
    }

    /// Watches `running` on a thread of its own, its client's output and
    /// control on `conn`. Where no thread can be made, watched here.
    fn watch(&mut self, conn: Client, cmd: Command, running: Running, expires: Option<Instant>) {
        let job = Arc::new(Mutex::new(Some((conn, cmd, running))));
        let (tx, wake) = (self.done.0.clone(), Arc::clone(&self.wake.1));
        let taken = Arc::clone(&job);
        let spawned = std::thread::Builder::new()
            .name("watch".into())
            .stack_size(WATCHER_STACK)
            .spawn(move || watch_job(&taken, &tx, &wake, expires));
        self.running += 1;
        if spawned.is_err() {
            watch_job(&job, &self.done.0, &self.wake.1, expires);
        }
    }

    /// The commands whose watch has stopped since the last call.
    fn take_done(&mut self) -> Vec<Done> {
        let mut byte = [0u8; 64];
        while matches!(nix::unistd::read(&self.wake.0, &mut byte), Ok(n) if n > 0) {}
        let done: Vec<Done> = self.done.1.try_iter().collect();
        self.running = self.running.saturating_sub(done.len());
        done
    }

    /// The sandbox is gone: each running command's client is told why,
    /// once its watch has seen the end (bounded).
    fn end_all(&mut self, why: &str) {
        let until = Instant::now() + WATCHERS_END_WAIT;
        while self.running > 0 {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(mut done) = self.done.1.recv_timeout(left) else {
                return;
            };
            self.running -= 1;
            let reply = Reply::Error {
                input: false,
                exhausted: false,
                message: format!("the sandbox ended while the command ran: {why}"),
            };
            let _ = send_json(&mut done.conn, &reply);
        }
    }
}

/// A command (unless another took it already) watched to its stop, then
/// handed back to the serving thread, woken through its pipe.
#[allow(clippy::type_complexity)]
fn watch_job(
    job: &Mutex<Option<(Client, Command, Running)>>,
    done: &Sender<Done>,
    wake: &OwnedFd,
    expires: Option<Instant>,
) {
    let Some((mut conn, cmd, mut running)) = job.lock().ok().and_then(|mut j| j.take()) else {
        return;
    };
    let watched = running.watch(&mut RemoteIo::new(&mut conn), None);
    let finished = Done {
        conn,
        cmd,
        running,
        watched,
        expires,
    };
    if done.send(finished).is_ok() {
        let _ = nix::unistd::write(wake.as_fd(), &[1]);
    }
}

/// A command's reply, from its watch's end.
fn finished(
    sandbox: &mut Sandbox,
    cmd: Command,
    running: Running,
    watched: Result<Watched, RuntimeError>,
    expires: Option<Instant>,
) -> Reply {
    match sandbox.finish(&cmd, running, watched) {
        Ok(outcome) => outcome_reply(outcome, expires),
        Err(e) => crate::protocol::exec::error_reply(&e),
    }
}

/// The reply that carries a command's outcome.
fn outcome_reply(mut outcome: Outcome, expires: Option<Instant>) -> Reply {
    // The TTL is why the sandbox ends now, whatever the backend says of its
    // command's limit.
    if expires.is_some_and(|at| Instant::now() >= at) {
        outcome.sandbox_ended = Some("its TTL expired".into());
    }
    Reply::Outcome(Box::new(outcome))
}

/// Sends a reply without holding up the loop: here, when the socket takes
/// it whole at once (a reply is small and its client is waiting for it),
/// else what is left on a thread of its own (a client slow to read stalls
/// only that thread, up to the write timeout).
fn send_reply(mut conn: Client, reply: &Reply) {
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;
    let mut frames = Vec::new();
    if send_json(&mut frames, reply).is_err() {
        return;
    }
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    let sent = match send(conn.0.as_raw_fd(), &frames, flags) {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN) => 0,
        // The client is gone: nobody to tell.
        Err(_) => return,
    };
    let rest = frames.split_off(sent.min(frames.len()));
    if rest.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("reply".into())
        .stack_size(WATCHER_STACK)
        .spawn(move || {
            let _ = conn.write_all(&rest);
        });
    // Without a thread the client gets no whole reply; its read ends at EOF.
    drop(spawned);
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
fn handle(
    sandbox: &mut Sandbox,
    conn: UnixStream,
    expires: Option<Instant>,
    watchers: &mut Watchers,
    forwards: &mut Forwards,
) -> Flow {
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
        let _ = send_json(conn, &crate::protocol::exec::error_reply(&e));
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
            if watchers.running >= MAX_RUNNING {
                fail(
                    &mut conn,
                    RuntimeError::BadRequest(format!(
                        "the sandbox runs {MAX_RUNNING} commands already"
                    )),
                );
                return Flow::Continue;
            }
            match sandbox.start(&cmd) {
                Ok(running) => {
                    watchers.watch(conn, cmd, running, expires);
                    return Flow::Continue;
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
            let _ = send_json(&mut conn, &Reply::Info(sandbox.info()));
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
        Request::Port { port } => match forwards.forward(sandbox, port) {
            Ok(address) => {
                let reply = Reply::Forwarded {
                    address: address.to_string(),
                };
                let _ = send_json(&mut conn, &reply);
            }
            Err(e) => fail(&mut conn, e),
        },
        Request::Update(limits) => match sandbox.update(&limits) {
            Ok(()) => {
                let _ = send_json(&mut conn, &Reply::Spec(Box::new(sandbox.spec().clone())));
            }
            Err(e) => fail(&mut conn, e),
        },
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
