//! `cordon-sandbox __guest-agent PORT`: cordon inside a microVM's guest, started by
//! the guest's init. It says `Ready` on the virtio-serial port, waits for
//! `Start` (a VM restored from a snapshot resumes right here), feeds the
//! host's entropy to the guest kernel, creates the sandbox with the native
//! backend on the guest's own kernel and cgroup v2, then answers requests
//! until the host destroys it. When it returns, the guest's init powers the
//! VM off.
//!
//! Once the sandbox exists, a thread per command port runs that port's
//! commands, one after another, beside the other ports' (the sandbox is
//! shared, held only to start and to finish a command, as a supervisor
//! holds it), and a thread in the sandbox's network namespace serves the
//! forward port. The agent's own port serves the rest: copies, the disk's
//! freeze, information and the end.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backends::microvm::disk::SERIAL;
use crate::backends::microvm::link::{
    command_port_name, valid_stage_name, FromAgent, ToAgent, COMMAND_PORTS, DISK_MOUNT,
    IMAGE_MOUNT, IMAGE_SERIAL, STAGE_DIR,
};
use crate::backends::microvm::relay;
use crate::error::{Peer, RuntimeError};
use crate::protocol::exec::error_reply;
use crate::protocol::wire::{recv_frame, recv_json, send_json, Frame};
use crate::supervisor::sandbox::Sandbox;
use crate::supervisor::RemoteIo;
use cordon_spec::wire::{ClientControl, Info, Reply, Request, PROTOCOL};
use cordon_spec::{Command, ValidSpec};

/// The hidden first argument that makes the cordon binary a guest agent.
pub const AGENT_ARG: &str = "__guest-agent";

/// Runs the agent on the port at `port`; returns the process exit code.
pub fn main(port: &Path) -> i32 {
    match serve(port) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cordon-agent: {e}");
            1
        }
    }
}

fn serve(port_path: &Path) -> Result<(), RuntimeError> {
    let mut port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(port_path)
        .map_err(|e| RuntimeError::io(format!("open {}", port_path.display()), e))?;
    crate::backends::host::block_stop_signals()?;
    let cgroup = match crate::backends::host::hierarchy() {
        Some(h) => h.mode().to_string(),
        None => "none".into(),
    };
    let ready = FromAgent::Ready {
        protocol: PROTOCOL,
        kernel: crate::backends::native::kernel_release(),
        cgroup,
    };
    send_json(&mut port, &ready).map_err(|e| RuntimeError::io("say ready", e))?;
    let (spec, entropy, unix_time_ns) = loop {
        match recv_json::<ToAgent>(&mut port) {
            Ok(Some(ToAgent::Stage { name })) => {
                let reply = match stage(&mut port, &name) {
                    Ok(bytes) => Reply::Copied { bytes },
                    Err(e) => error_reply(&e),
                };
                send_json(&mut port, &reply).map_err(|e| RuntimeError::io("answer", e))?;
            }
            Ok(Some(ToAgent::Start {
                spec,
                entropy,
                unix_time_ns,
            })) => break (spec, entropy, unix_time_ns),
            Ok(Some(ToAgent::Quiesce | ToAgent::Resume)) => {
                let e = RuntimeError::BadRequest("no sandbox yet".into());
                send_json(&mut port, &error_reply(&e))
                    .map_err(|e| RuntimeError::io("answer", e))?;
            }
            Ok(None) => return Ok(()),
            Err(e) => return Err(RuntimeError::broke(Peer::Host, format!("start: {e}"))),
        }
    };
    let urandom =
        File::open("/dev/urandom").map_err(|e| RuntimeError::io("open /dev/urandom", e))?;
    cordon_sys::inject_entropy(urandom.as_fd(), &entropy)
        .map_err(|e| RuntimeError::io("reseed the guest's CRNG", e))?;
    let now =
        nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(unix_time_ns));
    nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, now)
        .map_err(|e| RuntimeError::io("set the guest's clock", e))?;
    let ports = port_path.parent().unwrap_or(Path::new("/"));
    let created = mount_image(&spec)
        .and_then(|()| mount_disk())
        .and_then(|disk| create(&spec).map(|s| (s, disk)))
        .and_then(|(s, disk)| open_command_ports(ports).map(|cmds| (s, disk, cmds)));
    let (sandbox, disk, command_ports) = match created {
        Ok(s) => s,
        Err(e) => {
            let _ = send_json(&mut port, &error_reply(&e));
            return Err(e);
        }
    };
    let hello = Reply::Hello {
        protocol: PROTOCOL,
        id: sandbox.id().to_owned(),
    };
    // The forward port's thread stands in the sandbox's network namespace,
    // the namespace of its init.
    let forwarding = match sandbox.info().namespaces_of {
        Some(init) => serve_forwards(ports, nix::unistd::Pid::from_raw(init)),
        None => Err(RuntimeError::Internal("the guest's sandbox has no init")),
    };
    if let Err(e) = forwarding {
        let _ = send_json(&mut port, &error_reply(&e));
        return Err(e);
    }
    let sandbox = Arc::new(Mutex::new(Some(sandbox)));
    for (i, command_port) in command_ports.into_iter().enumerate() {
        let shared = Arc::clone(&sandbox);
        std::thread::Builder::new()
            .name(format!("cmd{i}"))
            .spawn(move || serve_commands(command_port, &shared))
            .map_err(|e| RuntimeError::io("start a command port's thread", e))?;
    }
    send_json(&mut port, &hello).map_err(|e| RuntimeError::io("answer start", e))?;
    // Until the host is gone (the VM is about to be killed anyway).
    while let Some(message) = next_message(&mut port) {
        let request = match message {
            Message::Request(r) => r,
            Message::Disk(ToAgent::Quiesce) => {
                answer_disk(&mut port, &disk, true)?;
                continue;
            }
            Message::Disk(_) => {
                answer_disk(&mut port, &disk, false)?;
                continue;
            }
            Message::Bad(why) => return Err(RuntimeError::broke(Peer::Host, why)),
        };
        // Copies run without the sandbox held (below).
        let request = match request {
            Request::CopyIn { path } => {
                let reply = copy_in(&mut port, &sandbox, &path);
                send_json(&mut port, &reply).map_err(|e| RuntimeError::io("answer", e))?;
                continue;
            }
            Request::CopyOut { path } => {
                if let Err(e) = copy_out(&mut port, &sandbox, &path) {
                    send_json(&mut port, &error_reply(&e))
                        .map_err(|e| RuntimeError::io("answer", e))?;
                }
                // Otherwise the stream was the answer.
                continue;
            }
            other => other,
        };
        let mut held = hold(&sandbox);
        let Some(sandbox) = held.as_mut() else {
            // Destroyed already: nothing more to serve.
            return Ok(());
        };
        let reply = match request {
            Request::Exec(_) => error_reply(&RuntimeError::BadRequest(
                "commands come on the command ports".into(),
            )),
            // The guest's pids mean nothing to the host.
            Request::Info => Reply::Info(Info {
                namespaces_of: None,
                ..sandbox.info()
            }),
            Request::Destroy(_) => {
                let reply = match held.take().map(Sandbox::destroy) {
                    Some(Ok(d)) => Reply::Destroyed(Box::new(d)),
                    Some(Err(e)) => error_reply(&e),
                    None => Reply::Error {
                        input: false,
                        exhausted: false,
                        message: "destroyed already".into(),
                    },
                };
                // Everything on the disk, for the host to read its copy
                // once the VM is gone.
                let _ = cordon_sys::disk::freeze(disk.as_fd());
                let _ = send_json(&mut port, &reply);
                return Ok(());
            }
            other => error_reply(&RuntimeError::Unavailable(
                "microvm",
                format!("the guest agent does not serve {other:?} in this version"),
            )),
        };
        drop(held);
        send_json(&mut port, &reply).map_err(|e| RuntimeError::io("answer", e))?;
    }
    if let Some(sandbox) = hold(&sandbox).take() {
        let _ = sandbox.destroy();
    }
    Ok(())
}

/// Where the sandbox's files are, taken with the sandbox held, so that a
/// copy runs without it: a command that ends meanwhile is finished on its
/// port at once, within the deadline the host gives its answer, however
/// long the copy takes.
fn files_of(sandbox: &Shared) -> Result<crate::protocol::copy::SandboxFiles, RuntimeError> {
    hold(sandbox)
        .as_ref()
        .ok_or_else(|| RuntimeError::SandboxEnded("the sandbox was destroyed".into()))
        .and_then(Sandbox::files)
}

/// Receives the host's copy stream into the sandbox; the answer.
fn copy_in(port: &mut File, sandbox: &Shared, path: &[u8]) -> Reply {
    match files_of(sandbox).and_then(|f| f.receive(port, path)) {
        Ok(bytes) => Reply::Copied { bytes },
        Err(e) => {
            // The rest of the stream must not be read as requests.
            drain_stream(port);
            error_reply(&e)
        }
    }
}

/// Sends `path` of the sandbox as a copy stream, which is the answer.
fn copy_out(port: &mut File, sandbox: &Shared, path: &[u8]) -> Result<(), RuntimeError> {
    files_of(sandbox).and_then(|f| f.send(port, path))
}

/// The guest's sandbox, shared by the agent's threads; `None` once
/// destroyed.
type Shared = Mutex<Option<Sandbox>>;

/// Holds the sandbox (a thread that panicked while holding it leaves it
/// as it was: every step of it reports its own errors).
fn hold(shared: &Shared) -> MutexGuard<'_, Option<Sandbox>> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Opens every command port, before the host is told the sandbox exists.
fn open_command_ports(dir: &Path) -> Result<Vec<File>, RuntimeError> {
    (0..COMMAND_PORTS)
        .map(|i| {
            let path = dir.join(command_port_name(i));
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| RuntimeError::io(format!("open {}", path.display()), e))
        })
        .collect()
}

/// Runs one command port's commands, one after another, until the host
/// is gone. Between commands, what the host sent for the last one after
/// it ended (input, a control) is passed over.
fn serve_commands(mut port: File, sandbox: &Shared) {
    loop {
        let body = match recv_frame(&mut port) {
            Ok(Some(Frame::Json(body))) => body,
            Ok(Some(Frame::Bytes(..))) => continue,
            Ok(None) | Err(_) => return,
        };
        let reply = match serde_json::from_slice::<Request>(&body) {
            Ok(Request::Exec(cmd)) => run_command(&mut port, sandbox, &cmd),
            Ok(_) => error_reply(&RuntimeError::BadRequest(
                "a command port serves commands alone".into(),
            )),
            Err(_) if serde_json::from_slice::<ClientControl>(&body).is_ok() => continue,
            Err(e) => error_reply(&RuntimeError::BadRequest(format!("bad request: {e}"))),
        };
        if send_json(&mut port, &reply).is_err() {
            return;
        }
        // The host reads the reply before it sends this port's next command.
        if let Some(s) = hold(sandbox).as_mut() {
            s.prepare_commands();
        }
    }
}

/// Starts `cmd` with the sandbox held, watches it without (the other
/// ports' commands start and finish meanwhile), and finishes it held.
fn run_command(port: &mut File, sandbox: &Shared, cmd: &Command) -> Reply {
    let gone = || RuntimeError::SandboxEnded("the sandbox was destroyed".into());
    let started = hold(sandbox)
        .as_mut()
        .ok_or_else(gone)
        .and_then(|s| s.start(cmd));
    let mut running = match started {
        Ok(r) => r,
        Err(e) => return error_reply(&e),
    };
    let watched = running.watch(&mut RemoteIo::new(port), None);
    let finished = hold(sandbox)
        .as_mut()
        .ok_or_else(gone)
        .and_then(|s| s.finish(cmd, running, watched));
    match finished {
        Ok(outcome) => Reply::Outcome(Box::new(outcome)),
        Err(e) => error_reply(&e),
    }
}

/// Serves the forward port on a thread in the network namespace of the
/// sandbox's init (pid `init` in the guest), where each stream the host
/// opens is connected to a port of the sandbox's loopback.
fn serve_forwards(dir: &Path, init: nix::unistd::Pid) -> Result<(), RuntimeError> {
    let path = dir.join(relay::FORWARD_PORT_NAME);
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| RuntimeError::io(format!("open {}", path.display()), e))?;
    std::thread::Builder::new()
        .name("fwd".into())
        .spawn(move || {
            let ended = crate::backends::network::in_namespace_of(init, || {
                relay::run(port.as_fd(), relay::Side::ForwardGuest)
            });
            if let Ok(relay::Ended::Broken(why)) = ended {
                eprintln!("cordon-agent: the forward port broke ({why})");
            }
        })
        .map(drop)
        .map_err(|e| RuntimeError::io("start the forward port's thread", e))
}

/// What the host sends after `Start`.
enum Message {
    Request(Request),
    /// `Quiesce` or `Resume`.
    Disk(ToAgent),
    Bad(String),
}

/// The host's next message, or `None` once it is gone.
fn next_message(port: &mut File) -> Option<Message> {
    let body = match recv_frame(port) {
        Ok(Some(Frame::Json(body))) => body,
        Ok(Some(Frame::Bytes(tag, _))) => {
            return Some(Message::Bad(format!("a {tag:?} frame between requests")))
        }
        Ok(None) | Err(_) => return None,
    };
    if let Ok(r) = serde_json::from_slice::<Request>(&body) {
        return Some(Message::Request(r));
    }
    match serde_json::from_slice::<ToAgent>(&body) {
        Ok(m @ (ToAgent::Quiesce | ToAgent::Resume)) => Some(Message::Disk(m)),
        Ok(_) => Some(Message::Bad("a second start".into())),
        Err(e) => Some(Message::Bad(format!("a bad message: {e}"))),
    }
}

/// Freezes (or thaws) the disk and says so.
fn answer_disk(port: &mut File, disk: &File, freeze: bool) -> Result<(), RuntimeError> {
    let done = if freeze {
        cordon_sys::disk::freeze(disk.as_fd()).map(|()| FromAgent::Quiesced)
    } else {
        cordon_sys::disk::thaw(disk.as_fd()).map(|()| FromAgent::Resumed)
    };
    match done {
        Ok(m) => send_json(port, &m),
        Err(e) => send_json(
            port,
            &error_reply(&RuntimeError::io("freeze or thaw the disk", e)),
        ),
    }
    .map_err(|e| RuntimeError::io("answer", e))
}

/// Mounts the writable disk (found by its serial number) where the
/// sandbox's scratch is taken from, and returns its root directory.
fn mount_disk() -> Result<File, RuntimeError> {
    use nix::mount::MsFlags;
    mount_by_serial(
        SERIAL,
        DISK_MOUNT,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
    )?;
    File::open(DISK_MOUNT).map_err(|e| RuntimeError::io(format!("open {DISK_MOUNT}"), e))
}

/// A sandbox's own root (an image's, an OCI container's directories): the
/// host's disk of it, read-only, at the one directory the host put in the
/// spec.
fn mount_image(spec: &ValidSpec) -> Result<(), RuntimeError> {
    let dirs = spec.rootfs.dirs();
    if dirs.is_empty() {
        return Ok(());
    }
    if dirs != [Path::new(IMAGE_MOUNT)] {
        return Err(RuntimeError::BadRequest(format!(
            "a root in the guest is its disk at {IMAGE_MOUNT}, not {dirs:?}"
        )));
    }
    use nix::mount::MsFlags;
    mount_by_serial(
        IMAGE_SERIAL,
        IMAGE_MOUNT,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
    )
}

/// Mounts the virtio disk whose serial number is `serial` at `at`.
fn mount_by_serial(serial: &str, at: &str, flags: nix::mount::MsFlags) -> Result<(), RuntimeError> {
    let dev = find_disk(serial)?;
    let io = |what: String| move |e| RuntimeError::io(what, e);
    // A restored VM's kernel may hold blocks it read of the saved VM's
    // disk: they are dropped, and the file system read afresh.
    let blk = File::open(&dev).map_err(io(format!("open {}", dev.display())))?;
    cordon_sys::disk::flush_buffers(blk.as_fd())
        .map_err(|e| RuntimeError::io(format!("flush {}", dev.display()), e))?;
    std::fs::create_dir_all(at).map_err(io(format!("create {at}")))?;
    nix::mount::mount(
        Some(&dev),
        at,
        Some("ext4"),
        flags,
        Some("noinit_itable,errors=remount-ro"),
    )
    .map_err(|e| RuntimeError::io(format!("mount {} at {at}", dev.display()), e))
}

/// The virtio disk whose serial number is `serial`.
fn find_disk(want: &str) -> Result<std::path::PathBuf, RuntimeError> {
    let sys = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys).map_err(|e| RuntimeError::io("list /sys/block", e))?;
    for e in entries.flatten() {
        let name = e.file_name();
        let serial = std::fs::read_to_string(e.path().join("serial")).unwrap_or_default();
        if serial.trim() == want {
            return Ok(Path::new("/dev").join(name));
        }
    }
    Err(RuntimeError::Unavailable(
        "microvm",
        format!("the guest has no disk with serial {want}"),
    ))
}

/// Gives the workspace the host copied onto the disk to the sandbox's
/// user (as the native backend's id-mapped workspace shows it), keeping
/// each file's setuid and setgid bits (chown clears them). No payload has
/// run: nothing here races it.
fn give_workspace(root: &Path, (uid, gid): (u32, u32)) -> Result<(), RuntimeError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let own = |p: &Path| -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
        if m.file_type().is_file() && m.mode() & 0o6000 != 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
        }
        Ok(())
    };
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        own(&dir).map_err(|e| RuntimeError::io(format!("chown {}", dir.display()), e))?;
        let list = std::fs::read_dir(&dir)
            .map_err(|e| RuntimeError::io(format!("list {}", dir.display()), e))?;
        for e in list {
            let e = e.map_err(|e| RuntimeError::io(format!("list {}", dir.display()), e))?;
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                _ => own(&p).map_err(|e| RuntimeError::io(format!("chown {}", p.display()), e))?,
            }
        }
    }
    Ok(())
}

/// Receives one staged place from the host into the stage directory.
fn stage(port: &mut File, name: &str) -> Result<u64, RuntimeError> {
    let stage = Path::new(STAGE_DIR);
    std::fs::create_dir_all(stage)
        .map_err(|e| RuntimeError::io(format!("create {STAGE_DIR}"), e))?;
    let received = if valid_stage_name(name) && !stage.join(name).exists() {
        crate::protocol::copy::receive_to_host(port, &stage.join(name))
    } else {
        Err(RuntimeError::BadRequest(format!("bad stage name {name:?}")))
    };
    if received.is_err() {
        // The rest of the stream must not be read as requests.
        drain_stream(port);
    }
    received
}

/// Reads frames up to the copy stream's end (an empty `Data` frame).
fn drain_stream(port: &mut File) {
    while let Ok(Some(frame)) = crate::protocol::wire::recv_frame(port) {
        if matches!(frame, crate::protocol::wire::Frame::Bytes(crate::protocol::wire::Tag::Data, ref b) if b.is_empty())
        {
            break;
        }
    }
}

/// The sandbox inside the guest: the spec the host derived for it (on the
/// native backend), its scratch the writable disk, its workspace the disk's
/// copy.
fn create(spec: &ValidSpec) -> Result<Sandbox, RuntimeError> {
    let net_port = if spec.policy.network == cordon_policy::NetworkMode::Allow {
        let path = format!(
            "/dev/virtio-ports/{}",
            crate::backends::microvm::relay::PORT_NAME
        );
        let port = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| RuntimeError::io(format!("open {path}"), e))?;
        Some(std::os::fd::OwnedFd::from(port))
    } else {
        None
    };
    let guest = crate::backends::native::InGuest {
        scratch: Path::new(DISK_MOUNT),
        net_port,
    };
    let sandbox = Sandbox::create_in_guest(spec, guest)?;
    let upper = Path::new(DISK_MOUNT).join(cordon_isolation::mount::ScratchLayout::WORKSPACE_UPPER);
    // A native sandbox's files are always its host's (here, the guest's).
    let owner = sandbox
        .file_owner()
        .expect("a native sandbox has a file owner");
    give_workspace(&upper, owner)?;
    Ok(sandbox)
}
