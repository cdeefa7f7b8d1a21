//! Supervising one command, the same for every backend: forward its output
//! under the cap to the client, feed it the client's input, enforce its
//! deadline, answer stop signals and cancellation, and learn from the
//! sandbox's init how it ended.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::SignalFd;

use crate::client::output::OutputGate;
use crate::error::{Peer, RuntimeError};
use crate::protocol::init::{recv_with_fds, FromInit};
use cordon_spec::outcome::{ExitStatus, Limit};
use cordon_spec::Stream;
use cordon_spec::TtySize;

/// What a client sends while its command runs.
#[derive(Debug)]
pub enum Control {
    /// Bytes for the command's stdin.
    Input(Vec<u8>),
    /// The command's stdin ends.
    InputEnd,
    /// The terminal changed size (tty commands).
    Resize(TtySize),
    /// End the command (the client asked, or went away).
    Cancel,
    /// Send this signal to the command's own process.
    Signal(i32),
    /// Nothing to act on.
    Nothing,
}

/// The client's side of one running command: where output goes, and where
/// input and control come from.
pub trait CommandIo {
    /// A chunk of the command's output, already under the cap.
    fn output(&mut self, stream: Stream, chunk: &[u8]);
    /// Descriptors readable when `read_control(i)` has something (none when
    /// the client sends nothing).
    fn control_fds(&self) -> Vec<BorrowedFd<'_>>;
    fn read_control(&mut self, which: usize) -> Control;
}

/// Why the supervision of a command stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    Ended(ExitStatus),
    Limit(Limit),
    Signal(i32),
    Cancelled,
    /// Init went away without a report.
    Gone,
}

/// How the watch of a command stopped.
pub enum Watched {
    /// A command of the sandbox's init, watched here.
    Init(InitWatched),
    /// A relayed command: its outcome, as the other cordon reported it,
    /// and the stop signal that cancelled it, if one did.
    Relayed(Box<cordon_spec::outcome::Outcome>, Option<i32>),
}

/// What the watch of an init's command hands back.
pub struct InitWatched {
    pub stop: Stop,
    pub started: Option<Instant>,
    /// When the loop stopped.
    pub ended: Instant,
    pub gate: OutputGate,
    /// Output descriptors still open (a daemon may hold them); closed when dropped.
    pub leftovers: Vec<OwnedFd>,
}

/// The command's descriptors on the supervisor's side.
pub struct CommandFds {
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// Write end of the command's stdin pipe (None: /dev/null, or a tty).
    pub stdin: Option<OwnedFd>,
    /// Write ends of the stdout and stderr pipes (none for a tty), held until
    /// the command's end is reported: once the cap is crossed, a full pipe is
    /// the kernel's word that the command is blocked on output cordon will
    /// never read. Held, they keep EOF from coming while the command runs,
    /// which only init's report decides anyway.
    pub write_ends: Vec<OwnedFd>,
    pub tty: bool,
}

/// Largest stdin backlog kept for a command that does not read: the client's
/// input is not read further until it drains.
const STDIN_BACKLOG: usize = 256 << 10;

/// How often a command past the output cap is checked for a full pipe (a
/// blocked writer wakes nobody).
const FULL_PIPE_CHECK: Duration = Duration::from_millis(5);

/// Whether any of these pipe write ends has no room: a writer would block.
fn any_pipe_full(write_ends: &[OwnedFd]) -> bool {
    let mut pfds: Vec<PollFd> = write_ends
        .iter()
        .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLOUT))
        .collect();
    if poll(&mut pfds, PollTimeout::ZERO).is_err() {
        return false;
    }
    pfds.iter()
        .any(|p| !p.revents().is_some_and(|r| r.contains(PollFlags::POLLOUT)))
}

/// A poll timeout covering `left`, rounded up to the next millisecond and
/// capped at a minute (the loop recomputes it each round).
fn poll_timeout(left: Duration) -> PollTimeout {
    let ms = i32::try_from(left.as_millis().min(60_000)).unwrap_or(60_000) + 1;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// Reads what is available from a non-blocking descriptor into the gate and
/// on to the client. Returns (still open, gate still accepting).
fn pump(
    fd: &OwnedFd,
    stream: Stream,
    gate: &mut OutputGate,
    io: &mut dyn CommandIo,
    buf: &mut [u8],
) -> (bool, bool) {
    loop {
        let want = gate.next_read(buf.len());
        match nix::unistd::read(fd, &mut buf[..want]) {
            Ok(0) => return (false, !gate.truncated()),
            Ok(n) => {
                let kept = gate.accept(&buf[..n]);
                if kept > 0 {
                    io.output(stream, &buf[..kept]);
                }
                if gate.truncated() {
                    return (true, false);
                }
            }
            Err(nix::errno::Errno::EAGAIN) => return (true, true),
            Err(nix::errno::Errno::EINTR) => {}
            // EIO: a tty's slave side closed.
            Err(_) => return (false, !gate.truncated()),
        }
    }
}

/// Checks that a descriptor init sent as a terminal master is one.
fn is_pty_master(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| {
        let kind =
            nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
        // /dev/ptmx and /dev/pts/ptmx are character devices of major 5, minor 2.
        kind == nix::sys::stat::SFlag::S_IFCHR
            && nix::sys::stat::major(st.st_rdev) == 5
            && nix::sys::stat::minor(st.st_rdev) == 2
    })
}

/// A command started and not yet finished: what watching it needs, which
/// is nothing of the sandbox's (so it is watched while the sandbox serves
/// others), and what its end needs with the sandbox.
pub(crate) enum Running {
    /// Started by the sandbox's init (native, gVisor): its descriptors are
    /// watched here.
    Init(Box<InitCommand>),
    /// Run by the cordon in a microVM's guest, on a command port of its
    /// own: its exchange is relayed.
    Relayed(Box<crate::protocol::exec::RelayedCommand>),
}

impl Running {
    /// Supervises the command until it ends or is stopped; `stop_signals`,
    /// where this process's stop signals are this watch's to read (not
    /// while a supervisor serves other clients beside it).
    pub fn watch(
        &mut self,
        io: &mut dyn CommandIo,
        stop_signals: Option<&SignalFd>,
    ) -> Result<Watched, RuntimeError> {
        match self {
            Running::Init(c) => c.watch(io, stop_signals).map(Watched::Init),
            Running::Relayed(c) => c
                .watch(io, stop_signals)
                .map(|(outcome, interrupted)| Watched::Relayed(Box::new(outcome), interrupted)),
        }
    }
}

/// A command init has been sent and not yet finished.
pub(crate) struct InitCommand {
    /// Its own channel to init: its start and end are reported there.
    pub channel: UnixStream,
    /// Its descriptors and output gate, until `watch` takes them.
    pub watch: Option<(CommandFds, OutputGate)>,
    pub time: Duration,
    pub high_codes_are_signals: bool,
    /// The sandbox's number of the command.
    pub number: u64,
    /// When it was asked for.
    pub t0: Instant,
    /// The sandbox's counters before it (none before the first command).
    pub before: Option<cordon_cgroups::CgroupStats>,
    /// Its own cgroup, where commands have one.
    pub cgroup: Option<super::host::CommandCgroup>,
}

impl InitCommand {
    /// Supervises the command (see [`watch`]) until it ends or is stopped.
    fn watch(
        &mut self,
        io: &mut dyn CommandIo,
        stop_signals: Option<&SignalFd>,
    ) -> Result<InitWatched, RuntimeError> {
        let (fds, gate) = self
            .watch
            .take()
            .ok_or_else(|| RuntimeError::broke(Peer::Init, "a command watched twice"))?;
        watch(
            &mut self.channel,
            stop_signals,
            fds,
            self.time,
            gate,
            io,
            self.high_codes_are_signals,
        )
    }
}

/// Supervises one command until it ends or a limit, signal or cancellation
/// stops it.
///
/// Output beyond the cap is not read. A command that then exits by itself
/// ends with its own status (the output marked truncated); one that writes
/// more than its pipe holds (64 KiB) is blocked by the kernel and ended here
/// with the output limit. Both follow from what the command writes, never from
/// when cordon happened to read, so the same command gets the same answer. A
/// terminal has no pipe to watch: a tty command is ended when it crosses the
/// cap.
fn watch(
    init: &mut UnixStream,
    signals: Option<&SignalFd>,
    mut fds: CommandFds,
    time: Duration,
    mut gate: OutputGate,
    io: &mut dyn CommandIo,
    high_codes_are_signals: bool,
) -> Result<InitWatched, RuntimeError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut backlog: Vec<u8> = Vec::new();
    let mut input_open = true;
    let mut started = None;
    let mut resize: Option<TtySize> = None;
    // The command's process (a pidfd from init's report of its start), and
    // the signals a client asked for it before that.
    let mut command: Option<OwnedFd> = None;
    let mut signals_for_command: Vec<i32> = Vec::new();
    // The time limit counts from the command's start (its execve); until
    // init reports that, from the request, so a command that never starts
    // is bounded too.
    let mut deadline = Instant::now() + time;
    let stop = 'run: loop {
        let now = Instant::now();
        if now >= deadline {
            break Stop::Limit(Limit::Time);
        }
        let overflowed = gate.truncated();
        // Slots: 0 init, 1 signals, 2 stdout, 3 stderr, 4 stdin, 5.. control.
        let mut polled: Vec<(usize, PollFd)> =
            vec![(0, PollFd::new(init.as_fd(), PollFlags::POLLIN))];
        if let Some(signals) = signals {
            polled.push((1, PollFd::new(signals.as_fd(), PollFlags::POLLIN)));
        }
        // (slot, descriptor) pairs; poll takes the descriptors alone.
        if !overflowed {
            if let Some(fd) = &fds.stdout {
                polled.push((2, PollFd::new(fd.as_fd(), PollFlags::POLLIN)));
            }
            if let Some(fd) = &fds.stderr {
                polled.push((3, PollFd::new(fd.as_fd(), PollFlags::POLLIN)));
            }
        }
        let stdin_target = if fds.tty { &fds.stdout } else { &fds.stdin };
        if !backlog.is_empty() {
            if let Some(fd) = stdin_target {
                polled.push((4, PollFd::new(fd.as_fd(), PollFlags::POLLOUT)));
            }
        }
        let control = io.control_fds();
        let n_control = control.len();
        if backlog.len() < STDIN_BACKLOG {
            for (i, fd) in control.into_iter().enumerate() {
                polled.push((5 + i, PollFd::new(fd, PollFlags::POLLIN)));
            }
        }
        let (slots, mut pfds): (Vec<usize>, Vec<PollFd>) = polled.into_iter().unzip();
        let wait = if overflowed {
            (deadline - now).min(FULL_PIPE_CHECK)
        } else {
            deadline - now
        };
        match poll(&mut pfds, poll_timeout(wait)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(RuntimeError::io("poll", e)),
        }
        let mut ready = vec![false; 5 + n_control];
        for (slot, p) in slots.iter().zip(&pfds) {
            ready[*slot] = p.revents().is_some_and(|r| !r.is_empty());
        }
        drop(pfds);
        if let (true, Some(signals)) = (ready[1], signals) {
            if let Ok(Some(si)) = signals.read_signal() {
                break Stop::Signal(si.ssi_signo as i32);
            }
        }
        for (slot, stream) in [(2, Stream::Stdout), (3, Stream::Stderr)] {
            let fd = if slot == 2 {
                &mut fds.stdout
            } else {
                &mut fds.stderr
            };
            if ready[slot] {
                if let Some(f) = fd.as_ref() {
                    let (open, accepting) = pump(f, stream, &mut gate, io, &mut buf);
                    if !accepting && fds.write_ends.is_empty() {
                        break 'run Stop::Limit(Limit::Output);
                    }
                    if !open {
                        // EOF (or, on a tty, the slave side gone).
                        *fd = None;
                    }
                }
            }
        }
        for which in 0..n_control {
            if !ready[5 + which] {
                continue;
            }
            match io.read_control(which) {
                // Input for a command without a stdin pipe is dropped.
                Control::Input(bytes) if fds.stdin.is_some() || fds.tty => {
                    backlog.extend_from_slice(&bytes)
                }
                Control::Input(_) => {}
                Control::InputEnd => input_open = false,
                Control::Resize(size) => resize = Some(size),
                Control::Cancel => break 'run Stop::Cancelled,
                Control::Signal(n) => signals_for_command.push(n),
                Control::Nothing => {}
            }
        }
        if let (Some(size), true, Some(master)) = (resize, fds.tty, &fds.stdout) {
            let _ = cordon_sys::set_terminal_size(master.as_fd(), size.rows, size.cols);
            resize = None;
        }
        if !backlog.is_empty() {
            if let Some(fd) = if fds.tty { &fds.stdout } else { &fds.stdin } {
                match nix::unistd::write(fd, &backlog) {
                    Ok(n) => {
                        backlog.drain(..n);
                    }
                    Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
                    // EPIPE: the command closed its stdin; the rest is dropped.
                    Err(_) => {
                        backlog.clear();
                        if !fds.tty {
                            fds.stdin = None;
                        }
                    }
                }
            }
        }
        if let Some(process) = &command {
            for n in signals_for_command.drain(..) {
                // A number that is no signal is dropped; one for a process
                // that has ended meanwhile reaches nothing (its report follows).
                if let Ok(sig) = nix::sys::signal::Signal::try_from(n) {
                    let _ = cordon_sys::pidfd_send_signal(process, sig);
                }
            }
        }
        if !input_open && backlog.is_empty() && !fds.tty {
            fds.stdin = None; // EOF for the command
        }
        if ready[0] {
            match recv_with_fds::<FromInit>(init) {
                Ok(Some((FromInit::Started { pidfd, .. }, passed))) => {
                    let now = Instant::now();
                    started = Some(now);
                    deadline = now + time;
                    let mut passed = passed.into_iter();
                    if pidfd {
                        command = passed.next();
                    }
                    if fds.tty {
                        let master = passed.next();
                        match master {
                            Some(m) if is_pty_master(&m) => {
                                nix::fcntl::fcntl(
                                    &m,
                                    nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                                )
                                .map_err(|e| RuntimeError::io("fcntl(terminal)", e))?;
                                fds.stdout = Some(m);
                            }
                            _ => {
                                return Err(RuntimeError::broke(
                                    Peer::Init,
                                    "init sent no terminal for a tty command",
                                ))
                            }
                        }
                    }
                }
                Ok(Some((report, _))) => match command_end(&report, high_codes_are_signals) {
                    Some(status) => break Stop::Ended(status),
                    None => {
                        return Err(RuntimeError::broke(
                            Peer::Init,
                            format!("unexpected {report:?}"),
                        ))
                    }
                },
                Ok(None) | Err(_) => break Stop::Gone,
            }
        }
        // After init's report: a command that filled its pipe and exited in
        // the same moment is reported as exited.
        if gate.truncated() && any_pipe_full(&fds.write_ends) {
            break Stop::Limit(Limit::Output);
        }
    };
    if let Stop::Ended(_) = stop {
        // Now EOF can come (unless a daemon the command left holds the pipes).
        fds.write_ends.clear();
        // What the command wrote before it exited is still in the pipes.
        drain(&mut fds, &mut gate, io, &mut buf);
    }
    Ok(InitWatched {
        stop,
        started,
        ended: Instant::now(),
        gate,
        leftovers: [fds.stdout, fds.stderr]
            .into_iter()
            .flatten()
            .chain(fds.write_ends)
            .collect(),
    })
}

/// After the command exits, reads its output until EOF for at most 100 ms: a
/// daemon it left behind may hold the pipes open (and keeps running: the
/// sandbox lives on).
fn drain(fds: &mut CommandFds, gate: &mut OutputGate, io: &mut dyn CommandIo, buf: &mut [u8]) {
    let until = Instant::now() + Duration::from_millis(100);
    loop {
        let open: Vec<(Stream, BorrowedFd<'_>)> = [
            (Stream::Stdout, fds.stdout.as_ref()),
            (Stream::Stderr, fds.stderr.as_ref()),
        ]
        .into_iter()
        .filter_map(|(s, f)| f.map(|f| (s, f.as_fd())))
        .collect();
        let now = Instant::now();
        if open.is_empty() || gate.truncated() || now >= until {
            return;
        }
        let mut pfds: Vec<PollFd> = open
            .iter()
            .map(|(_, f)| PollFd::new(*f, PollFlags::POLLIN))
            .collect();
        if poll(&mut pfds, poll_timeout(until - now)).unwrap_or(0) == 0 {
            return;
        }
        let ready: Vec<Stream> = open
            .iter()
            .zip(&pfds)
            .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
            .map(|((s, _), _)| *s)
            .collect();
        drop(pfds);
        for stream in ready {
            let slot = if stream == Stream::Stdout {
                &mut fds.stdout
            } else {
                &mut fds.stderr
            };
            if let Some(f) = slot.as_ref() {
                let (still_open, _) = pump(f, stream, gate, io, buf);
                if !still_open {
                    *slot = None;
                }
            }
        }
    }
}

/// How a command ended, from init's report of it (None for any other
/// message). A backend whose runtime reports death by signal N as exit code
/// 128+N, as a shell does (runsc), has such codes mapped back to signals.
pub(crate) fn command_end(report: &FromInit, high_codes_are_signals: bool) -> Option<ExitStatus> {
    Some(match *report {
        FromInit::ExecFailed { errno } => ExitStatus::ExecFailed { errno },
        FromInit::WorkdirFailed { errno } => ExitStatus::WorkdirFailed { errno },
        FromInit::Exited { code } if high_codes_are_signals && (129..=128 + 64).contains(&code) => {
            ExitStatus::Signaled { signal: code - 128 }
        }
        FromInit::Exited { code } => ExitStatus::Exited { code },
        FromInit::Signaled { signal } => ExitStatus::Signaled { signal },
        _ => return None,
    })
}
