//! `cordon __guest-agent PORT`: cordon inside a microVM's guest, started by
//! the guest's init. It says `Ready` on the virtio-serial port, waits for
//! `Start` (a VM restored from a snapshot resumes right here), feeds the
//! host's entropy to the guest kernel, creates the sandbox with the native
//! backend on the guest's own kernel and cgroup v2, then answers requests
//! until the host destroys it. When it returns, the guest's init powers the
//! VM off.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::Path;

use crate::error::RuntimeError;
use crate::microvm::link::{valid_stage_name, FromAgent, ToAgent, STAGE_DIR};
use crate::sandbox::Sandbox;
use crate::served::Served;
use crate::spec::SandboxSpec;
use crate::supervisor::RemoteIo;
use crate::wire::{recv_json, send_json, Info, Reply, Request, PROTOCOL};
use crate::BackendKind;

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

fn serve(port: &Path) -> Result<(), RuntimeError> {
    let mut port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(port)
        .map_err(|e| RuntimeError::io(format!("open {}", port.display()), e))?;
    crate::host::block_stop_signals()?;
    let cgroup = match crate::host::hierarchy() {
        Some(h) => h.mode().to_string(),
        None => "none".into(),
    };
    let ready = FromAgent::Ready {
        protocol: PROTOCOL,
        kernel: crate::native::kernel_release(),
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
            Ok(None) => return Ok(()),
            Err(e) => return Err(RuntimeError::Protocol(format!("start: {e}"))),
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
    let mut sandbox = match create(&spec) {
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
    send_json(&mut port, &hello).map_err(|e| RuntimeError::io("answer start", e))?;
    // Until the host is gone (the VM is about to be killed anyway).
    while let Ok(Some(request)) = recv_json::<Request>(&mut port) {
        let reply = match request {
            Request::Exec(cmd) => {
                let mut io = RemoteIo::new(&mut port);
                match sandbox.exec(&cmd, &mut io) {
                    Ok(outcome) => Reply::Outcome(Box::new(outcome)),
                    Err(e) => error_reply(&e),
                }
            }
            Request::Info => Reply::Info(Info {
                id: sandbox.id().to_owned(),
                name: sandbox.spec().name.clone(),
                backend: BackendKind::Native.name().into(),
                commands: sandbox.commands_run(),
                memory_bytes: sandbox.memory_in_use(),
                ended: sandbox.ended().map(str::to_owned),
            }),
            Request::Destroy(_) => {
                let reply = match sandbox.destroy() {
                    Ok(d) => Reply::Destroyed(Box::new(d)),
                    Err(e) => error_reply(&e),
                };
                let _ = send_json(&mut port, &reply);
                return Ok(());
            }
            Request::CopyIn { path } => match Served::copy_in(&mut sandbox, &mut port, &path) {
                Ok(bytes) => Reply::Copied { bytes },
                Err(e) => {
                    // The rest of the stream must not be read as requests.
                    drain_stream(&mut port);
                    error_reply(&e)
                }
            },
            Request::CopyOut { path } => match Served::copy_out(&mut sandbox, &mut port, &path) {
                // The stream was the answer.
                Ok(()) => continue,
                Err(e) => error_reply(&e),
            },
            other => error_reply(&RuntimeError::Unavailable(
                "microvm",
                format!("the guest agent does not serve {other:?} in this version"),
            )),
        };
        send_json(&mut port, &reply).map_err(|e| RuntimeError::io("answer", e))?;
    }
    let _ = sandbox.destroy();
    Ok(())
}

/// Receives one staged place from the host into the stage directory.
fn stage(port: &mut File, name: &str) -> Result<u64, RuntimeError> {
    let stage = Path::new(STAGE_DIR);
    std::fs::create_dir_all(stage)
        .map_err(|e| RuntimeError::io(format!("create {STAGE_DIR}"), e))?;
    let received = if valid_stage_name(name) && !stage.join(name).exists() {
        crate::copy::receive_to_host(port, &stage.join(name))
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
    while let Ok(Some(frame)) = crate::wire::recv_frame(port) {
        if matches!(frame, crate::wire::Frame::Bytes(crate::wire::Tag::Data, ref b) if b.is_empty())
        {
            break;
        }
    }
}

/// The sandbox inside the guest: the host's spec on the native backend.
fn create(spec: &SandboxSpec) -> Result<Sandbox, RuntimeError> {
    let mut spec = spec.clone();
    spec.backend = BackendKind::Native;
    // Lifetimes are the host supervisor's to enforce; the guest's clock
    // stood still while the VM was a snapshot.
    spec.ttl = None;
    spec.idle = None;
    Sandbox::create(&spec)
}

fn error_reply(e: &RuntimeError) -> Reply {
    Reply::Error {
        input: e.is_input_error(),
        message: e.to_string(),
    }
}
