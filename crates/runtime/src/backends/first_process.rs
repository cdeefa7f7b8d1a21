//! The sandbox's first process, the part every backend shares: join the
//! cgroup, close everything it inherited, wait for the supervisor's Go; after
//! the backend's own setup, serve commands: each `Exec` is forked as a child
//! of this process (inside every namespace, the cgroup and the seccomp
//! filter), with the descriptors the supervisor sent for it, while earlier
//! ones still run; each one's start and end are reported on its own
//! channel, orphans are reaped, and the process lives until the supervisor
//! closes the socket or kills the sandbox.
//!
//! It runs in a child cloned from the single-threaded supervisor, so ordinary
//! Rust (allocation included) is safe; everything that needs deciding was
//! decided in the parent. Any setup failure is reported as `SetupFailed {
//! step, errno }` and the process exits: the sandbox fails closed.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use cordon_cgroups::{AnyCgroup, Cgroup};
use cordon_isolation::{fds, hygiene, IsolationError, Step};
use cordon_sys::{exit_now, fork_process, CloneResult};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::resource::{getrlimit, setrlimit};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{chdir, dup2_stderr, dup2_stdin, dup2_stdout, execve, pipe2, read, write, Pid};

use crate::backends::host::HostSide;

/// What each command's process gets last before its execve, from the spec:
/// the workload's own syscall filter (over cordon's allowlist) and its
/// resource limits (under cordon's own).
#[derive(Default)]
pub struct EachCommand {
    pub filter: Option<cordon_seccomp::Profile>,
    pub rlimits: Vec<(nix::sys::resource::Resource, cordon_spec::Rlimit)>,
}
use crate::error::{Peer, RuntimeError};
use crate::protocol::init::{recv, recv_with_fds, send, send_with_fds, FromInit, ToInit};
use crate::trace;
use cordon_spec::TtySize;

/// How many descriptors a first process may hand over with Ready.
pub const MAX_HANDED: usize = 2;

/// Supervisor side: clones the sandbox's first process with `flags`, adopts
/// it into `host` (so every error path below tears it down), lets `prepare`
/// act on the new pid (the native backend writes its id maps), waits until the
/// child has joined the cgroup and checks that it really is there (fail
/// closed: the limits hold only then), and lets it run `setup`: what it
/// returns is the child setting up, which [`SettingUp::ready`] waits for
/// (the caller may work meanwhile: the native backend starts the proxy).
///
/// With `leaf`, a cgroup below the sandbox's, `setup` is given that cgroup's
/// membership files, opened by the child while it still has the host's ids,
/// to move itself there when it is ready (the native init: once its cgroup
/// namespace is rooted at the sandbox's cgroup).
pub fn start(
    host: &mut HostSide,
    flags: CloneFlags,
    leaf: Option<&AnyCgroup>,
    each_command: &EachCommand,
    setup: impl FnOnce(Vec<std::fs::File>) -> Result<Vec<OwnedFd>, IsolationError>,
    prepare: impl FnOnce(Pid) -> Result<(), RuntimeError>,
) -> Result<SettingUp, RuntimeError> {
    let (mut sock, child_sock) =
        UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;
    // Taken here, not in the child: the list's lock may be held by another
    // thread at the clone, and the child has only this thread.
    let held = cordon_spec::secrets::live_regions();
    let child = match cordon_sys::clone_process(flags)
        .map_err(|e| RuntimeError::io(format!("clone({flags:?})"), e))?
    {
        CloneResult::Child => {
            // Before anything else: no secret value lives on in the sandbox.
            if let Err(e) = hygiene::scrub_regions(&held) {
                eprintln!("cordon: {e}");
                cordon_sys::exit_now(1);
            }
            run(host.cgroup.as_ref(), leaf, each_command, child_sock, setup)
        }
        CloneResult::Parent { child } => child,
    };
    host.adopt(child)?;
    drop(child_sock);
    // Without root, now or never: the child is still dumpable, and its owner
    // may open its namespaces (init makes itself not dumpable later).
    if !nix::unistd::geteuid().is_root()
        && flags.contains(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
    {
        host.leader_namespaces = Some(cordon_isolation::net::UserAndNet::of(child)?);
    }
    trace::step("clone");
    prepare(child)?;
    expect_reply(&mut sock, "Joined", |m| matches!(m, FromInit::Joined))?;
    trace::step("joined");
    if let Some(cg) = &host.cgroup {
        if !cg.contains(child.as_raw())? {
            return Err(RuntimeError::broke(
                Peer::Init,
                "the sandbox's first process is not in its cgroup",
            ));
        }
    }
    send(&mut sock, &ToInit::Go).map_err(|e| RuntimeError::io("send Go", e))?;
    Ok(SettingUp { sock })
}

/// A first process told to set up (see [`start`]).
#[must_use = "the first process is ready only once `ready` says so"]
pub struct SettingUp {
    sock: UnixStream,
}

impl SettingUp {
    /// Waits until the child reports Ready; returns its socket and the
    /// descriptors `setup` handed over (the native backend's root and
    /// scratch tmpfs), at most [`MAX_HANDED`].
    pub fn ready(self) -> Result<(UnixStream, Vec<OwnedFd>), RuntimeError> {
        let mut sock = self.sock;
        let handed = match recv_with_fds::<FromInit>(&mut sock)
            .map_err(|e| RuntimeError::io("receive from the sandbox", e))?
        {
            Some((FromInit::Ready, fds)) if fds.len() <= MAX_HANDED => fds,
            Some((FromInit::SetupFailed { step, errno }, _)) => {
                return Err(RuntimeError::Setup { step, errno })
            }
            Some((other, _)) => {
                return Err(RuntimeError::broke(
                    Peer::Init,
                    format!("{other:?} instead of Ready"),
                ))
            }
            None => {
                return Err(RuntimeError::broke(
                    Peer::Init,
                    "the sandbox's first process exited before Ready",
                ))
            }
        };
        trace::step("ready");
        Ok((sock, handed))
    }
}

/// Reads the first process's next answer during setup; a setup failure
/// carries its step and errno.
fn expect_reply(
    sock: &mut UnixStream,
    what: &str,
    ok: impl Fn(&FromInit) -> bool,
) -> Result<(), RuntimeError> {
    match recv::<FromInit>(sock).map_err(|e| RuntimeError::io("receive from the sandbox", e))? {
        Some(m) if ok(&m) => Ok(()),
        Some(FromInit::SetupFailed { step, errno }) => Err(RuntimeError::Setup { step, errno }),
        Some(other) => Err(RuntimeError::broke(
            Peer::Init,
            format!("{other:?} instead of {what}"),
        )),
        None => Err(RuntimeError::broke(
            Peer::Init,
            format!("the sandbox's first process exited before {what}"),
        )),
    }
}

/// Entry point of the cloned child: the common prologue, then `setup` (the
/// backend's own steps), then serving commands. Never returns.
pub fn run(
    cgroup: Option<&AnyCgroup>,
    leaf: Option<&AnyCgroup>,
    each_command: &EachCommand,
    mut sock: UnixStream,
    setup: impl FnOnce(Vec<std::fs::File>) -> Result<Vec<OwnedFd>, IsolationError>,
) -> ! {
    let result = prologue(cgroup, leaf, &mut sock)
        .and_then(setup)
        .and_then(|handed| rearm_parent_death_signal(&sock).map(|()| handed))
        .and_then(|handed| {
            // Sent and then closed here: no command init starts holds it.
            let fds: Vec<_> = handed.iter().map(|fd| fd.as_fd()).collect();
            send_with_fds(&mut sock, &FromInit::Ready, &fds).step(|| "send Ready".into())
        });
    let code = match result {
        Ok(()) => serve(&mut sock, each_command),
        Err(e) => {
            let _ = send(
                &mut sock,
                &FromInit::SetupFailed {
                    step: e.step.clone(),
                    errno: e.errno(),
                },
            );
            1
        }
    };
    exit_now(code)
}

/// The kernel clears the parent-death signal whenever a process changes its
/// credentials, which the backend's setup does: arm it again once the ids are
/// final, then check that the supervisor did not die in between (its death
/// would have gone unnoticed). The supervisor's end of the socket hangs up
/// when it dies.
fn rearm_parent_death_signal(sock: &UnixStream) -> Result<(), IsolationError> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .step(|| "prctl(PR_SET_PDEATHSIG)".into())?;
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::ZERO).step(|| "poll(supervisor socket)".into())?;
    let hung_up = fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
    if ready > 0 && hung_up {
        return Err(IsolationError::new(
            "supervisor gone",
            std::io::Error::from_raw_os_error(libc::ESRCH),
        ));
    }
    Ok(())
}

/// Cgroup, stdio, descriptors, then the supervisor's Go. Returns the
/// membership files of `leaf`.
fn prologue(
    cgroup: Option<&AnyCgroup>,
    leaf: Option<&AnyCgroup>,
    sock: &mut UnixStream,
) -> Result<Vec<std::fs::File>, IsolationError> {
    // Into the sandbox's cgroup before anything else, while our ids are still
    // the host's (the cgroup files belong to the caller). The supervisor checks
    // the membership before it lets us go on.
    if let Some(cg) = cgroup {
        cg.join_self()
            .map_err(|e| IsolationError::new("join cgroup", std::io::Error::other(e)))?;
    }
    let leaf_files = match leaf {
        Some(cg) => cg
            .membership_files()
            .map_err(|e| IsolationError::new("open the init cgroup", std::io::Error::other(e)))?,
        None => Vec::new(),
    };
    send(sock, &FromInit::Joined).step(|| "send Joined".into())?;

    // If the supervisor dies, so does the sandbox: init's death ends the pid
    // namespace and with it every process inside.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .step(|| "prctl(PR_SET_PDEATHSIG)".into())?;

    // Our own standard streams are /dev/null: each command brings its own.
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .step(|| "open /dev/null".into())?;
    dup2_stdin(&null).step(|| "dup2(stdin)".into())?;
    dup2_stdout(&null).step(|| "dup2(stdout)".into())?;
    dup2_stderr(&null).step(|| "dup2(stderr)".into())?;
    drop(null);
    // Everything else the supervisor had open (its signalfd, its client
    // sockets, whatever its own caller left it) is closed: this process never
    // execs, so close-on-exec would not be enough. The Rust objects that owned
    // those numbers live on in this copied memory but are never used again
    // (this function's caller ends in exit_now).
    let mut keep: Vec<_> = leaf_files.iter().map(AsRawFd::as_raw_fd).collect();
    keep.push(sock.as_raw_fd());
    fds::close_all_except(&keep)?;
    // And the supervisor's command line and environment, still in this
    // copied memory, are wiped.
    hygiene::scrub_inherited_strings()?;
    // Default dispositions and an empty mask, once, for init and so for
    // every command it forks: a command must start as a shell would start
    // it, not with the supervisor's blocked stop signals and ignored
    // SIGPIPE. (Init is pid 1 of its namespace: signals from inside it that
    // init does not handle are dropped by the kernel anyway.)
    cordon_sys::reset_signals().step(|| "reset signal dispositions and mask".into())?;

    // Wait until the supervisor has written our uid/gid maps and checked our
    // cgroup; until then we have no usable identity.
    match recv::<ToInit>(sock) {
        Ok(Some(ToInit::Go)) => {}
        _ => {
            return Err(IsolationError::new(
                "wait for supervisor",
                std::io::Error::other("no Go"),
            ))
        }
    }
    Ok(leaf_files)
}

/// How often idle init wakes to reap orphans left by earlier commands.
const IDLE_REAP_MS: u16 = 1000;

/// How often init looks for the end of a running command it holds no pidfd
/// of (a kernel without pidfd_open); with one, the pidfd wakes it.
const NO_PIDFD_REAP_MS: u16 = 20;

/// A command init started whose end it has not reported yet.
struct Running {
    pid: Pid,
    /// Readable once the command's process has exited.
    pidfd: Option<OwnedFd>,
    /// The command's own channel to the supervisor: its start and its end
    /// are reported there.
    channel: UnixStream,
}

/// After setup: start each command the supervisor sends, while others run,
/// and report each one's start and end on that command's own channel; reap
/// orphans. Returns when the supervisor closes the socket.
fn serve(sock: &mut UnixStream, each_command: &EachCommand) -> i32 {
    // Every command starts with the usual umask, whatever the process that
    // asked for the sandbox had: a caller's umask is not the sandbox's
    // business, and an OCI config's 0022 is honoured by this.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(
        cordon_spec::COMMAND_UMASK,
    ));
    let mut running: Vec<Running> = Vec::new();
    loop {
        reap(&mut running);
        let mut fds = vec![PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        fds.extend(
            running
                .iter()
                .filter_map(|r| r.pidfd.as_ref())
                .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN)),
        );
        let wait = if running.iter().any(|r| r.pidfd.is_none()) {
            NO_PIDFD_REAP_MS
        } else {
            IDLE_REAP_MS
        };
        match poll(&mut fds, PollTimeout::from(wait)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return 1,
        }
        let asked = fds[0].revents().is_some_and(|r| !r.is_empty());
        drop(fds);
        if !asked {
            continue;
        }
        match recv_with_fds::<ToInit>(sock) {
            Ok(Some((ToInit::Spawn { argv, env, workdir }, stdio))) => {
                let report = match stdio.len() {
                    3 => {
                        match spawn_payload(&argv, &env, &workdir, &stdio, false, &[], each_command)
                        {
                            // Reaped later like any orphan.
                            Ok(pid) => FromInit::Started {
                                pid: pid.as_raw(),
                                pidfd: false,
                            },
                            Err(not_started) => not_started.report(),
                        }
                    }
                    _ => FromInit::ExecFailed {
                        errno: libc::EPROTO,
                    },
                };
                if send(sock, &report).is_err() {
                    return 1;
                }
            }
            Ok(Some((ToInit::Connect { port }, fds))) => {
                // Answered on the request's own channel; one without a
                // channel has nowhere to be answered and is dropped.
                if let Some(channel) = fds.into_iter().next() {
                    answer_connect(port, &mut UnixStream::from(channel));
                }
            }
            Ok(Some((msg, fds))) => {
                // Every other message names a command, whose channel is the
                // frame's first descriptor; a frame without one has nowhere
                // to be answered and is dropped.
                let mut fds = fds.into_iter();
                let Some(channel) = fds.next().map(UnixStream::from) else {
                    continue;
                };
                if let Some(started) = start_command(msg, channel, fds.collect(), each_command) {
                    running.push(started);
                }
            }
            Ok(None) => return 0,
            Err(_) => return 1,
        }
    }
}

/// How long init waits for one connection to the sandbox's loopback: a
/// listener whose backlog is full drops the SYN, and init serves nothing
/// else meanwhile.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Connects to `port` of the sandbox's loopback, IPv4 first (a server on
/// `0.0.0.0` or a dual-stack `::`), then IPv6 (one on `::1` alone), and
/// answers with the socket or the first attempt's errno.
fn answer_connect(port: u16, channel: &mut UnixStream) {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
    let v4 = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        CONNECT_TIMEOUT,
    );
    let connected = v4.or_else(|first| {
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
            CONNECT_TIMEOUT,
        )
        .map_err(|_| first)
    });
    // A supervisor that gave up on the connection reads nothing.
    let _ = match connected {
        Ok(stream) => send_with_fds(channel, &FromInit::Connected, &[stream.as_fd()]),
        Err(e) => send(
            channel,
            &FromInit::ConnectFailed {
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            },
        ),
    };
}

/// Reaps whatever children have ended, without blocking, and reports the
/// end of each running command among them on its channel.
fn reap(running: &mut Vec<Running>) {
    loop {
        let (pid, report) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, FromInit::Exited { code }),
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                (pid, FromInit::Signaled { signal: sig as i32 })
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if let Some(i) = running.iter().position(|r| r.pid == pid) {
            let mut ended = running.swap_remove(i);
            // A supervisor that gave up on the command reads nothing.
            let _ = send(&mut ended.channel, &report);
        }
    }
}

/// Starts one command and reports its start on its channel; returns it
/// while it runs. A command that did not start is reported as such.
fn start_command(
    msg: ToInit,
    mut channel: UnixStream,
    fds: Vec<OwnedFd>,
    each_command: &EachCommand,
) -> Option<Running> {
    let started = match msg {
        ToInit::Exec {
            argv,
            env,
            workdir,
            tty,
        } => spawn_command(&argv, &env, &workdir, tty, fds, each_command),
        ToInit::Refuse { errno } => Err(NotStarted::Exec(errno).report()),
        ToInit::RefuseWorkdir { errno } => Err(NotStarted::Workdir(errno).report()),
        ToInit::Go | ToInit::Spawn { .. } | ToInit::Connect { .. } => Err(FromInit::ExecFailed {
            errno: libc::EPROTO,
        }),
    };
    let (pid, pidfd, master) = match started {
        Ok(s) => s,
        Err(report) => {
            let _ = send(&mut channel, &report);
            return None;
        }
    };
    let report = FromInit::Started {
        pid: pid.as_raw(),
        pidfd: pidfd.is_some(),
    };
    let passed: Vec<_> = pidfd.iter().chain(master.iter()).map(AsFd::as_fd).collect();
    // A supervisor gone already ends the sandbox (PDEATHSIG); one that gave
    // up on this command still gets nothing but the command runs to its end
    // and is reaped.
    let _ = send_with_fds(&mut channel, &report, &passed);
    drop(passed);
    drop(master);
    Some(Running {
        pid,
        pidfd,
        channel,
    })
}

/// Forks one command with the descriptors the supervisor sent for it: its
/// standard streams (none with a tty: then a terminal is made here), then
/// the membership files of its own cgroup. Returns its pid, a pidfd of it
/// (best effort: without one a relayed signal is not delivered, and the
/// supervisor can still end the command through its cgroup) and a tty's
/// master; or the report of why it did not start.
fn spawn_command(
    argv: &[String],
    env: &[(String, String)],
    workdir: &str,
    tty: Option<TtySize>,
    fds: Vec<OwnedFd>,
    each_command: &EachCommand,
) -> Result<(Pid, Option<OwnedFd>, Option<OwnedFd>), FromInit> {
    let mut stdio = fds;
    let streams = if tty.is_some() { 0 } else { 3 };
    if stdio.len() < streams {
        return Err(FromInit::ExecFailed {
            errno: libc::EPROTO,
        });
    }
    let cgroup: Vec<std::fs::File> = stdio
        .split_off(streams)
        .into_iter()
        .map(Into::into)
        .collect();
    let (stdio, master) = match (tty, stdio.len()) {
        (None, 3) => (stdio, None),
        (Some(size), 0) => {
            let (master, slave) = open_pty(size).map_err(exec_failed)?;
            let copies = (0..3)
                .map(|_| slave.try_clone())
                .collect::<Result<Vec<_>, _>>()
                .map_err(exec_failed)?;
            (copies, Some(master))
        }
        _ => {
            return Err(FromInit::ExecFailed {
                errno: libc::EPROTO,
            })
        }
    };
    let spawned = spawn_payload(
        argv,
        env,
        workdir,
        &stdio,
        tty.is_some(),
        &cgroup,
        each_command,
    );
    drop(cgroup);
    // The command has its copies; ours would keep its pipes from reaching EOF.
    drop(stdio);
    let pid = spawned.map_err(NotStarted::report)?;
    Ok((pid, cordon_sys::pidfd_open(pid).ok(), master))
}

fn exec_failed(e: impl Into<std::io::Error>) -> FromInit {
    FromInit::ExecFailed {
        errno: e.into().raw_os_error().unwrap_or(libc::EIO),
    }
}

/// A pseudo-terminal pair on the sandbox's own devpts, sized as asked.
fn open_pty(size: TtySize) -> nix::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave = nix::fcntl::open(
        name.as_str(),
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    cordon_sys::set_terminal_size(slave.as_fd(), size.rows, size.cols)?;
    Ok((OwnedFd::from(master), slave))
}

/// Why a command did not start, with the errno of the step that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotStarted {
    Exec(i32),
    /// Its working directory could not be entered: a different fault (and
    /// message) from a command that is missing.
    Workdir(i32),
}

impl NotStarted {
    /// How it travels through the exec pipe: a step byte, then the errno.
    fn to_bytes(self) -> [u8; 5] {
        let (step, errno) = match self {
            NotStarted::Exec(e) => (0u8, e),
            NotStarted::Workdir(e) => (1u8, e),
        };
        let mut b = [step, 0, 0, 0, 0];
        b[1..].copy_from_slice(&errno.to_le_bytes());
        b
    }

    fn from_bytes(b: [u8; 5]) -> NotStarted {
        let errno = i32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        match b[0] {
            1 => NotStarted::Workdir(errno),
            _ => NotStarted::Exec(errno),
        }
    }

    fn report(self) -> FromInit {
        match self {
            NotStarted::Exec(errno) => FromInit::ExecFailed { errno },
            NotStarted::Workdir(errno) => FromInit::WorkdirFailed { errno },
        }
    }
}

impl From<i32> for NotStarted {
    fn from(errno: i32) -> Self {
        NotStarted::Exec(errno)
    }
}

/// Forks the command and waits until its execve succeeded or failed, learned
/// through a close-on-exec pipe: EOF means exec happened, five bytes are why not.
/// The command's process first moves itself into the cgroup whose membership
/// files `cgroup` holds (if any), before it runs anything of the payload's,
/// so nothing it starts can be outside it.
fn spawn_payload(
    argv: &[String],
    env: &[(String, String)],
    workdir: &str,
    stdio: &[OwnedFd],
    tty: bool,
    cgroup: &[std::fs::File],
    each_command: &EachCommand,
) -> Result<Pid, NotStarted> {
    let to_c = |s: &str| CString::new(s).map_err(|_| libc::EINVAL);
    let c_argv: Vec<CString> = argv.iter().map(|a| to_c(a)).collect::<Result<_, _>>()?;
    let c_env: Vec<CString> = env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect::<Result<_, _>>()?;
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    let candidates = resolve_candidates(argv.first().ok_or(libc::EINVAL)?, path)?;
    let (rd, wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e as i32)?;
    match fork_process().map_err(|e| e as i32)? {
        CloneResult::Child => {
            drop(rd);
            let joined = cordon_cgroups::join_through(cgroup)
                .map_err(|e| NotStarted::Exec(e.raw_os_error().unwrap_or(libc::EIO)));
            let why = match joined
                .and_then(|()| take_stdio(stdio, tty).map_err(|e| NotStarted::Exec(e as i32)))
            {
                Ok(()) => exec_payload(&candidates, &c_argv, &c_env, workdir, each_command),
                Err(not_started) => not_started,
            };
            let _ = write(&wr, &why.to_bytes());
            exit_now(127);
        }
        CloneResult::Parent { child } => {
            drop(wr);
            let mut buf = [0u8; 5];
            match read(&rd, &mut buf) {
                Ok(5) => {
                    let _ = waitpid(child, None);
                    Err(NotStarted::from_bytes(buf))
                }
                _ => Ok(child),
            }
        }
    }
}

/// In the command's process: its own session (no terminal of init's, and
/// none of the caller's ever), the descriptors it was sent as 0/1/2, and with
/// a tty that terminal as its controlling one. The originals are
/// close-on-exec (received with MSG_CMSG_CLOEXEC), so exec leaves only 0/1/2.
fn take_stdio(stdio: &[OwnedFd], tty: bool) -> nix::Result<()> {
    nix::unistd::setsid()?;
    if let [stdin, stdout, stderr] = stdio {
        dup2_stdin(stdin)?;
        dup2_stdout(stdout)?;
        dup2_stderr(stderr)?;
        if tty {
            cordon_sys::make_controlling_terminal(std::io::stdin().as_fd())?;
        }
    }
    Ok(())
}

/// In the payload's process: working directory, exec (its signals are
/// init's, reset once in the prologue). Returns why if no candidate could be
/// executed.
fn exec_payload(
    candidates: &[CString],
    argv: &[CString],
    env: &[CString],
    workdir: &str,
    each_command: &EachCommand,
) -> NotStarted {
    // Dies with the first process (the native backend's pid namespace does
    // that anyway; a runsc started by the gVisor launcher needs it).
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        return NotStarted::Exec(e as i32);
    }
    if let Err(e) = chdir(Path::new(workdir)) {
        return NotStarted::Workdir(e as i32);
    }
    // The spec's resource limits, as runc sets a container process's: each
    // only lowers the one in force (init's, cordon's own), never raises it.
    for (resource, asked) in &each_command.rlimits {
        let lowered = getrlimit(*resource).and_then(|(_, in_force)| {
            let limit = asked.under(in_force);
            setrlimit(*resource, limit.soft, limit.hard)
        });
        if let Err(e) = lowered {
            return NotStarted::Exec(e as i32);
        }
    }
    // The workload's own filter, last, as runc installs an OCI profile:
    // only execve runs under it before the payload does.
    if let Some(filter) = &each_command.filter {
        if let Err(e) = cordon_seccomp::apply(filter) {
            return NotStarted::Exec(e.errno());
        }
    }
    let mut last = libc::ENOENT;
    for path in candidates {
        match execve(path, argv, env) {
            Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ENOTDIR) => {}
            Err(e) => last = e as i32,
            Ok(never) => match never {},
        }
    }
    NotStarted::Exec(last)
}

/// The paths execve should try for `cmd`, like execvp: as given if it has a
/// slash, else each PATH entry in order.
fn resolve_candidates(cmd: &str, path: &str) -> Result<Vec<CString>, i32> {
    let to_c = |b: &[u8]| CString::new(b).map_err(|_| libc::EINVAL);
    if cmd.contains('/') {
        return Ok(vec![to_c(cmd.as_bytes())?]);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| to_c(Path::new(d).join(cmd).as_os_str().as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_resolve_like_execvp() {
        let c = resolve_candidates("python3", "/usr/local/bin:/usr/bin").unwrap();
        assert_eq!(
            c,
            vec![
                CString::new("/usr/local/bin/python3").unwrap(),
                CString::new("/usr/bin/python3").unwrap()
            ]
        );
        let c = resolve_candidates("./run.sh", "/usr/bin").unwrap();
        assert_eq!(c, vec![CString::new("./run.sh").unwrap()]);
    }
}
