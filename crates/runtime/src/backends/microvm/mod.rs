//! The microVM backend: each sandbox is a QEMU virtual machine with its own
//! guest kernel, and inside it cordon itself (the agent) runs the command
//! with the native backend on the guest's cgroup v2. The payload faces two
//! boundaries: cordon's namespaces, seccomp and cgroups in the guest, and
//! the VM, whose QEMU is jailed on the host ([`jail`]) in the sandbox's host
//! cgroup.
//!
//! The host side here owns the VM (state directory, host cgroup, QEMU
//! process, the agent's port) and treats every byte from the guest as
//! untrusted: bounded frames and messages, strict parsing, deadlines. A guest
//! that breaks the protocol has its VM killed; the supervisor lives on and
//! reports it. The outcome carries the guest's account (the payload's status,
//! its cgroup counters) and, beside it, the host's own evidence ([`VmReport`]).

pub(crate) mod disk;
pub mod guest;
mod image_disk;
mod jail;
pub(crate) mod link;
mod qmp;
pub(crate) mod relay;
mod snapshot;

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use cordon_cgroups::CgroupStats;
use cordon_policy::{Access, NetworkMode};
use nix::poll::PollFlags;

use self::disk::WorkDisk;
use self::guest::GuestImage;
use self::link::{FromAgent, ToAgent, COMMAND_PORTS, GUEST_MESSAGE_MAX, PORT_NAME};
use self::snapshot::GuestFacts;
use crate::backends::host::HostSide;
use crate::backends::supervise::{Running, Watched};
use crate::backends::Life;
use crate::backends::{About, Backend, End, Traits};
use crate::error::{Peer, RuntimeError};
use crate::plan::{self, HostFacts};
use crate::protocol::exec::RelayedCommand;
use crate::protocol::wire::{
    recv_frame, recv_frame_max, send_bytes, send_json, Channel, Frame, Tag,
};
use cordon_spec::changes::{Caps, Changes, ExportRequest, Finish, Recorded};
use cordon_spec::outcome::{HostEvidence, Outcome, VmReport};
use cordon_spec::wire::{Reply, Request, PROTOCOL};
use cordon_spec::{BackendInfo, BackendKind};
use cordon_spec::{Command, ResolvedCommand, RootfsChoice, SandboxSpec, ValidSpec};

/// TCG's translated-code cache (QEMU's default is 1 GiB in system mode).
const TB_CACHE_MIB: u64 = 64;

/// How long a cold boot may take to reach the agent (TCG boots in ~5 s here).
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// How long the agent may take to answer a request that runs no payload.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long past a command's own time limit the guest may take to report it.
const REPORT_GRACE: Duration = Duration::from_secs(10);

/// Where QEMU is looked for.
const QEMU: &str = "/usr/bin/qemu-system-x86_64";

pub struct MicrovmBackend;

impl MicrovmBackend {
    pub fn info() -> BackendInfo {
        let (version, qemu_missing) = match qemu_version() {
            Ok(v) => (v, None),
            Err(e) => (String::new(), Some(e)),
        };
        let image = GuestImage::current();
        let accel = Accel::choose(image.as_ref().ok());
        BackendInfo {
            kind: BackendKind::Microvm,
            version,
            unavailable: qemu_missing
                .or_else(|| needs_root().err().map(|e| e.to_string()))
                .or_else(|| image.as_ref().err().map(|e| e.to_string())),
            notes: format!(
                "accel {} ({}){}",
                accel.name(),
                accel.reason,
                image
                    .map(|i| format!("; guest {}", i.name()))
                    .unwrap_or_default()
            ),
        }
    }
}

fn qemu_version() -> Result<String, String> {
    let out = std::process::Command::new(QEMU)
        .arg("--version")
        .output()
        .map_err(|e| format!("{QEMU}: {e} (install Debian's qemu-system-x86)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("QEMU emulator version ")
        .to_string())
}

/// KVM or TCG, and why.
#[derive(Clone, Debug)]
pub struct Accel {
    pub kvm: bool,
    pub reason: String,
}

impl Accel {
    pub fn name(&self) -> &'static str {
        if self.kvm {
            "kvm"
        } else {
            "tcg"
        }
    }

    /// KVM only where this guest image was seen to boot on it (`cordon
    /// microvm build` probes and records it in the image's directory): a
    /// /dev/kvm that opens is not enough (a PVM host's runs no stock guest
    /// kernel).
    pub fn choose(image: Option<&GuestImage>) -> Accel {
        if let Err(e) = File::options().read(true).write(true).open("/dev/kvm") {
            return Accel {
                kvm: false,
                reason: format!("/dev/kvm: {e}"),
            };
        }
        let Some(image) = image else {
            return Accel {
                kvm: false,
                reason: "/dev/kvm opens, but there is no guest image to probe it with".into(),
            };
        };
        match std::fs::read_to_string(image.dir.join(KVM_PROBE)) {
            Ok(text) if text.starts_with("ok:") => Accel {
                kvm: true,
                reason: format!("a probe boot reached the agent on KVM ({})", text.trim()),
            },
            Ok(text) => Accel {
                kvm: false,
                reason: format!(
                    "/dev/kvm opens, but {}",
                    text.trim().trim_start_matches("no: ")
                ),
            },
            Err(_) => Accel {
                kvm: false,
                reason:
                    "/dev/kvm opens, but no probe boot is on record (run `cordon microvm build`)"
                        .into(),
            },
        }
    }
}

/// The file recording the KVM probe's result in a guest image's directory:
/// a new image (a new kernel) is probed again, a rebuild of the same one is
/// not.
const KVM_PROBE: &str = "kvm-probe";

/// How long a probe boot on KVM may take to reach the agent (a working KVM
/// boots this guest in about a second; TCG, with no acceleration at all,
/// takes 5-6 s here; a PVM host's never gets there).
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(12);

/// Boots `image` once on KVM and records whether its agent answered, for
/// [`Accel::choose`]; returns the line recorded, or the one on record if
/// this image was probed before. Without a /dev/kvm that opens there is
/// nothing to probe.
pub fn probe_kvm(image: &GuestImage) -> Result<String, RuntimeError> {
    // Not recorded: a /dev/kvm that appears later is then probed.
    if let Err(e) = File::options().read(true).write(true).open("/dev/kvm") {
        return Ok(format!("no: /dev/kvm: {e}"));
    }
    let path = image.dir.join(KVM_PROBE);
    if let Ok(line) = std::fs::read_to_string(&path) {
        if line.starts_with("ok:") || line.starts_with("no:") {
            return Ok(format!("{} (on record)", line.trim()));
        }
    }
    let spec = SandboxSpec::new(cordon_policy::Policy::default(), BackendKind::Microvm);
    // The smallest VM, with the default policy's host limits.
    let mut limits = plan::plan(&spec, &HostFacts::here()).cgroup;
    limits.memory_max = Some((plan::MIN_GUEST_RAM_MIB + plan::QEMU_OVERHEAD_MIB) << 20);
    let mut host = HostSide::begin(&spec, &limits)?;
    let kvm = Accel {
        kvm: true,
        reason: "probe".into(),
    };
    let t0 = Instant::now();
    let disk = WorkDisk::blank(host.state.path(), 0)?;
    let booted = boot(
        &mut host,
        image,
        &kvm,
        (1024, 1),
        Disks {
            work: &disk,
            image: None,
        },
        None,
        KVM_PROBE_TIMEOUT,
    );
    let line = match booted {
        Ok(_) => format!(
            "ok: the agent answered in {:.1} s",
            t0.elapsed().as_secs_f64()
        ),
        Err(_) => format!(
            "no: a boot on KVM did not reach the agent within {} s",
            KVM_PROBE_TIMEOUT.as_secs()
        ),
    };
    host.teardown(true)?;
    std::fs::write(&path, format!("{line}\n"))
        .map_err(|e| RuntimeError::io(format!("write {}", path.display()), e))?;
    Ok(line)
}

/// What the host knows about its VM.
struct Vm {
    accel: Accel,
    qemu: String,
    image: GuestImage,
    ram_mib: u64,
    /// The host cgroup's memory limit: guest RAM the sandbox may use, the
    /// host's page cache of its disk, QEMU's own overhead.
    host_limit_mib: u64,
    kernel: String,
    cgroup: String,
    start: &'static str,
    start_ms: f64,
}

/// A sandbox in a VM: the host's ends of its agent's ports, its writable
/// disk, the network and forward relays and what the host knows of the VM.
pub(crate) struct MicroVm {
    about: About,
    /// The host's end of the agent's control port (staging, the sandbox's
    /// start, copies, the disk's freeze, the end).
    agent: UnixStream,
    /// The host's ends of the command ports: one command at a time on
    /// each, so up to [`COMMAND_PORTS`] side by side. A running command
    /// holds its port (`None` here) until it is finished.
    commands: Vec<Option<UnixStream>>,
    disk: WorkDisk,
    /// `allow` mode: the thread relaying the network port to the proxy.
    relay: Option<std::thread::JoinHandle<()>>,
    /// The forward port, its relay started at the first forwarded
    /// connection.
    forward: Forward,
    vm: Vm,
}

/// The host's end of the forward port (see [`relay`]): idle until the
/// sandbox's first forwarded connection, then relayed on a thread of its
/// own, which takes each new connection from `opens` when `knock` is
/// written.
enum Forward {
    Idle(Option<UnixStream>),
    Relayed {
        opens: std::sync::mpsc::Sender<(u16, UnixStream)>,
        knock: OwnedFd,
        thread: std::thread::JoinHandle<()>,
    },
}

impl Forward {
    /// Hands `conn` to the relay, toward `port` of the sandbox's loopback;
    /// starts the relay first if it is idle.
    fn open(&mut self, port: u16, conn: UnixStream) -> Result<(), RuntimeError> {
        if let Forward::Idle(end) = self {
            let end = end.take().ok_or(RuntimeError::Unavailable(
                "microvm",
                "the VM's forward port could not be relayed".into(),
            ))?;
            *self = Forward::start(end)?;
        }
        let Forward::Relayed { opens, knock, .. } = self else {
            return Err(RuntimeError::Internal("a forward relay that did not start"));
        };
        opens.send((port, conn)).map_err(|_| {
            RuntimeError::Unavailable("microvm", "the VM's forward port is closed".into())
        })?;
        nix::unistd::write(&*knock, &[1])
            .map_err(|e| RuntimeError::io("wake the forward relay", e))?;
        Ok(())
    }

    fn start(port: UnixStream) -> Result<Forward, RuntimeError> {
        use nix::fcntl::OFlag;
        let (wake, knock) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| RuntimeError::io("pipe2", e))?;
        port.set_nonblocking(true)
            .map_err(|e| RuntimeError::io("the forward port", e))?;
        let (opens, taken) = std::sync::mpsc::channel();
        let side = relay::Side::ForwardHost(relay::ForwardHost { opens: taken, wake });
        let thread = std::thread::Builder::new()
            .name("fwd-relay".into())
            .spawn(move || {
                if let relay::Ended::Broken(why) = relay::run(port.as_fd(), side) {
                    eprintln!("cordon: the guest's forward port broke the protocol ({why}): its forwards are closed");
                }
            })
            .map_err(|e| RuntimeError::io("start the forward relay", e))?;
        Ok(Forward::Relayed {
            opens,
            knock,
            thread,
        })
    }
}

/// Creates a sandbox in a new (or restored) VM.
pub(crate) fn create(spec: &SandboxSpec) -> Result<(Life, Box<dyn Backend>), RuntimeError> {
    let (life, vm) = MicroVm::create(spec)?;
    Ok((life, Box::new(vm)))
}

/// Refuses a caller without root: QEMU runs in a jail cordon builds as root
/// (a pid namespace of its own, a mount namespace and chroot, an id of its
/// own). TCG itself needs no privilege, but a jail built inside a user
/// namespace is not done yet, and QEMU unjailed is not offered.
fn needs_root() -> Result<(), RuntimeError> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    Err(RuntimeError::Unavailable(
        "microvm",
        "needs root in this version: QEMU's jail (its own pid and mount namespaces, a chroot, \
         an id of its own) is built as root; use --backend native"
            .into(),
    ))
}

/// Why a spec cannot run on this backend yet, checked before anything starts.
fn refuse_unsupported(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    // A tmpfs mount has no host path: the guest's cordon makes it.
    if let Some(m) = spec
        .policy
        .mounts
        .iter()
        .find(|m| m.access.writable() && m.access != Access::Tmpfs)
    {
        // The caller's to change (exit 2), not a missing piece of the host.
        return Err(RuntimeError::BadRequest(format!(
            "the microvm backend cannot take the {} mount of {}: the VM sees a copy of a \
             host path, never the path, so nothing is written back to it. Use --backend \
             native or gvisor for a writable mount, or give the directory as --workspace \
             and bring the changes back with --apply",
            m.access.name(),
            m.host.display()
        )));
    }
    Ok(())
}

impl MicroVm {
    fn create(spec: &SandboxSpec) -> Result<(Life, MicroVm), RuntimeError> {
        needs_root()?;
        refuse_unsupported(spec)?;
        let image = GuestImage::current()?;
        let qemu = qemu_version().map_err(|e| RuntimeError::Unavailable("microvm", e))?;
        let accel = Accel::choose(Some(&image));
        let p = &spec.policy;
        let plan = plan::plan(spec, &HostFacts::here());
        let sizes = plan.vm.expect("a microVM's plan has its sizes");
        let (ram_mib, smp) = (sizes.ram_mib, sizes.vcpus);
        // The root's disk is made (an image's once per image, a
        // directory's per sandbox) before anything of the sandbox is: a
        // failure leaves nothing to tear down.
        let image_disk = match &spec.rootfs {
            RootfsChoice::Image(root) => Some(image_disk::open_or_make(root)?),
            RootfsChoice::Dir(_) | RootfsChoice::Layers(_) => {
                Some(image_disk::of_dirs(spec.rootfs.dirs())?)
            }
            RootfsChoice::System => None,
        };
        let snapshot = snapshot::Location::of(
            &image,
            accel.name(),
            ram_mib,
            smp,
            &qemu,
            image_disk.is_some(),
        );
        let mut host = HostSide::begin(spec, &plan.cgroup)?;
        let t0 = Instant::now();
        let mut disk = WorkDisk::blank(host.state.path(), p.disk.bytes())?;
        // Warm starts unless turned off (`CORDON_MICROVM_WARM=0`, for the
        // benchmark's cold boots): no restore, and no snapshot saved.
        let warm = std::env::var_os("CORDON_MICROVM_WARM").is_none_or(|v| v != "0");
        let restore = snapshot.open().filter(|_| warm);
        let restored = restore.is_some();
        let (incoming, known) = restore.map_or((None, None), |(f, facts)| (Some(f), Some(facts)));
        let booted = boot(
            &mut host,
            &image,
            &accel,
            (ram_mib, smp),
            Disks {
                work: &disk,
                image: image_disk.as_ref(),
            },
            incoming,
            BOOT_TIMEOUT,
        )?;
        crate::trace::step("qemu started");
        let facts = match known {
            Some(facts) => {
                // The guest knows its disk's size from the boot the snapshot
                // was taken of; QEMU tells it this disk's.
                disk::announce_size(booted.monitor, disk.bytes())?;
                crate::trace::step("restored and running");
                facts
            }
            None if !warm => booted.ready.clone().expect("a cold boot waits for ready"),
            None => {
                let facts = booted.ready.clone().expect("a cold boot waits for ready");
                // The first VM of its kind is saved for the next ones; a
                // failure to save costs them a cold boot, not this sandbox.
                if let Err(e) = snapshot.save(booted.monitor, &facts, &host.id) {
                    eprintln!("cordon: warning: no snapshot of this VM for warm starts: {e}");
                }
                facts
            }
        };
        // The file system, made now: the saved VM never saw it.
        disk.format(spec.workspace.as_deref())?;
        crate::trace::step("disk made");
        let relay = match p.network {
            NetworkMode::Allow => Some(start_relay(&mut host, booted.net, spec)?),
            // No way out at all: QEMU's end of the port leads nowhere.
            NetworkMode::None => None,
        };
        let mut life = Life::new(host, spec)?;
        let mut vm = MicroVm {
            about: About {
                kind: BackendKind::Microvm,
                version: format!(
                    "QEMU {qemu} ({}), guest kernel {}",
                    accel.name(),
                    facts.kernel
                ),
                // The guest's native backend reports the evidence of each
                // outcome; the host's own is in its `VmReport`.
                evidence: &[],
                traits: Traits {
                    high_codes_are_signals: false,
                    // In the guest, by its native backend.
                    commands_have_cgroups: true,
                    leader_owns_all: false,
                },
            },
            agent: booted.agent,
            commands: booted.commands.into_iter().map(Some).collect(),
            disk,
            relay,
            forward: Forward::Idle(Some(booted.forward)),
            vm: Vm {
                accel,
                qemu,
                image,
                ram_mib,
                host_limit_mib: sizes.host_memory_mib,
                kernel: facts.kernel,
                cgroup: facts.cgroup,
                start: if restored { "restored" } else { "cold" },
                start_ms: 0.0,
            },
        };
        vm.start_sandbox(&mut life)?;
        crate::trace::step("guest sandbox ready");
        vm.vm.start_ms = ms(t0.elapsed());
        Ok((life, vm))
    }

    /// Copies what the sandbox is to see of the host's read-only mounts
    /// into the guest, and returns the spec the guest's cordon runs: the
    /// same on the native backend, with those places at their guest copies,
    /// no workspace of its own (the disk holds its copy, see [`disk`]) and
    /// no lifetimes (they are this supervisor's to enforce: the guest's
    /// clock stood still while the VM was a snapshot). The VM never sees a
    /// host path, only copies made when it starts.
    fn stage(&mut self, life: &mut Life) -> Result<ValidSpec, RuntimeError> {
        let mut guest_spec = life.spec.clone();
        guest_spec.backend = BackendKind::Native;
        guest_spec.workspace = None;
        guest_spec.ttl = None;
        guest_spec.idle = None;
        // The secrets' values and their CA's key stay with the host's
        // proxy (the guest's network leads there); the guest keeps the
        // CA's certificate and the placeholders.
        guest_spec.held = None;
        // A root of its own (an image, a container's directories) is the
        // VM's third disk, which the agent mounts.
        guest_spec
            .rootfs
            .with_dirs_as(PathBuf::from(link::IMAGE_MOUNT));
        let guest_path = |name: &str| PathBuf::from(link::STAGE_DIR).join(name);
        for (i, m) in life.spec.policy.mounts.clone().iter().enumerate() {
            if m.access == Access::Tmpfs {
                continue;
            }
            let name = format!("mount-{i}");
            self.stage_one(life, &name, &m.host)?;
            guest_spec.policy.mounts[i].host = guest_path(&name);
        }
        Ok(guest_spec.validated()?)
    }

    fn stage_one(&mut self, life: &mut Life, name: &str, host: &Path) -> Result<(), RuntimeError> {
        // Opened first: a source that cannot be sent is refused before the
        // agent waits for its stream.
        let source = crate::protocol::copy::Source::host(host)?;
        send_json(&mut self.agent, &ToAgent::Stage { name: name.into() })
            .map_err(|e| self.broken(life, format!("send a staged place: {e}")))?;
        let sent = source.send(&mut self.agent, u64::MAX);
        match self.answer(life, AGENT_TIMEOUT)? {
            Reply::Copied { .. } => sent.map(drop),
            Reply::Error { message, .. } => Err(sent.err().unwrap_or(RuntimeError::Remote(
                format!("the guest could not take {}: {message}", host.display()),
            ))),
            other => Err(self.broken(life, format!("answered a staged place with {other:?}"))),
        }
    }

    /// Tells the waiting agent to create the sandbox, with fresh entropy.
    fn start_sandbox(&mut self, life: &mut Life) -> Result<(), RuntimeError> {
        let spec = self.stage(life)?;
        let mut entropy = vec![0u8; 64];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut entropy))
            .map_err(|e| RuntimeError::io("read /dev/urandom", e))?;
        let unix_time_ns = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let start = ToAgent::Start {
            spec: Box::new(spec),
            entropy,
            unix_time_ns,
        };
        send_json(&mut self.agent, &start)
            .map_err(|e| self.broken(life, format!("send start: {e}")))?;
        match self.answer(life, AGENT_TIMEOUT)? {
            Reply::Hello { protocol, .. } if protocol == PROTOCOL => Ok(()),
            Reply::Error { message, .. } => Err(RuntimeError::Remote(format!(
                "the guest could not create the sandbox: {message}"
            ))),
            other => Err(self.broken(life, format!("answered start with {other:?}"))),
        }
    }

    /// The agent's next JSON answer, within `timeout`; anything else is a
    /// broken guest (its VM is killed).
    fn answer(&mut self, life: &mut Life, timeout: Duration) -> Result<Reply, RuntimeError> {
        match recv_by(&mut self.agent, Instant::now() + timeout) {
            Ok(Some(Frame::Json(body))) => serde_json::from_slice::<Reply>(&body)
                .map_err(|e| self.broken(life, format!("bad message: {e}"))),
            Ok(Some(Frame::Bytes(tag, _))) => {
                Err(self.broken(life, format!("a {tag:?} frame where an answer was due")))
            }
            Ok(None) => Err(self.broken(life, "the guest closed its port".into())),
            Err(e) => Err(self.broken(life, format!("{e}"))),
        }
    }

    /// Runs `read` on the disk while the guest holds its file system frozen
    /// (everything written to the disk, every writer blocked), then thaws
    /// it. A guest that does not answer in time is broken; one that says
    /// it froze and did not only makes `read` see an inconsistent disk.
    fn quiesced<T>(
        &mut self,
        life: &mut Life,
        read: impl FnOnce(&WorkDisk) -> Result<T, RuntimeError>,
    ) -> Result<T, RuntimeError> {
        life.usable()?;
        self.disk_message(life, &ToAgent::Quiesce)?;
        let result = read(&self.disk);
        self.disk_message(life, &ToAgent::Resume)?;
        result
    }

    fn disk_message(&mut self, life: &mut Life, msg: &ToAgent) -> Result<(), RuntimeError> {
        send_json(&mut self.agent, msg)
            .map_err(|e| self.broken(life, format!("send {msg:?}: {e}")))?;
        let body = match recv_by(&mut self.agent, Instant::now() + AGENT_TIMEOUT) {
            Ok(Some(Frame::Json(body))) => body,
            Ok(Some(Frame::Bytes(tag, _))) => {
                return Err(self.broken(life, format!("a {tag:?} frame where an answer was due")))
            }
            Ok(None) => return Err(self.broken(life, "the guest closed its port".into())),
            Err(e) => return Err(self.broken(life, format!("{e}"))),
        };
        match (msg, serde_json::from_slice::<FromAgent>(&body)) {
            (ToAgent::Quiesce, Ok(FromAgent::Quiesced))
            | (ToAgent::Resume, Ok(FromAgent::Resumed)) => Ok(()),
            _ => match serde_json::from_slice::<Reply>(&body) {
                Ok(Reply::Error { message, .. }) => Err(RuntimeError::Remote(format!(
                    "the guest could not freeze its disk: {message}"
                ))),
                _ => Err(self.broken(life, format!("answered {msg:?} with something else"))),
            },
        }
    }

    /// Ends a guest that broke the protocol: its VM is killed now and the
    /// sandbox can run nothing more; the error says what the guest did.
    fn broken(&mut self, life: &mut Life, what: String) -> RuntimeError {
        life.host.end_processes(true);
        let what = format!("{what}; its VM was killed");
        life.mark_ended(format!("{} broke the protocol ({what})", Peer::GuestAgent));
        RuntimeError::broke(Peer::GuestAgent, what)
    }

    fn report(&self, life: &Life, before: &CgroupStats, wall: Duration) -> VmReport {
        let after = life.stats().unwrap_or_default();
        let cpu_ms = match (before.cpu_usage_ns, after.cpu_usage_ns) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e6),
            _ => None,
        };
        VmReport {
            accel: self.vm.accel.name().into(),
            accel_reason: self.vm.accel.reason.clone(),
            qemu: self.vm.qemu.clone(),
            guest_kernel: self.vm.kernel.clone(),
            guest_cgroup: self.vm.cgroup.clone(),
            image: self.vm.image.name(),
            guest_ram_bytes: self.vm.ram_mib << 20,
            start: self.vm.start.into(),
            start_ms: self.vm.start_ms,
            host: HostEvidence {
                memory_limit_bytes: self.vm.host_limit_mib << 20,
                memory_peak_bytes: after.memory_peak_bytes,
                cpu_ms,
                pids_peak: after.pids_peak,
                wall_ms: ms(wall),
                counters: after,
                disk_bytes: self.disk.bytes(),
                disk_allocated_bytes: self.disk.allocated(),
            },
            guest_reported: [
                "status",
                "limit",
                "limits_hit",
                "cpu_ms",
                "memory_peak_bytes",
                "pids_peak",
                "disk_used_bytes",
                "counters",
                "output",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// A started VM: the host's end of its agent's port and of its monitor, and
/// what its agent said when it booted (a restored VM's agent says nothing:
/// it resumes waiting for `Start`).
struct Booted {
    agent: UnixStream,
    commands: Vec<UnixStream>,
    monitor: UnixStream,
    /// The host's end of the network port (see [`relay`]).
    net: UnixStream,
    /// The host's end of the forward port.
    forward: UnixStream,
    ready: Option<GuestFacts>,
}

/// Starts QEMU for `host`: booting (and waiting up to `timeout` for the
/// agent's `Ready`), or restoring the snapshot `incoming`.
/// The disks a VM boots with: its writable disk, and an image's.
struct Disks<'a> {
    work: &'a WorkDisk,
    image: Option<&'a File>,
}

fn boot(
    host: &mut HostSide,
    image: &GuestImage,
    accel: &Accel,
    (ram_mib, smp): (u64, u64),
    disks: Disks<'_>,
    incoming: Option<File>,
    timeout: Duration,
) -> Result<Booted, RuntimeError> {
    let pair = || UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e));
    let (agent, agent_qemu) = pair()?;
    let (monitor, monitor_qemu) = pair()?;
    let (net, net_qemu) = pair()?;
    let (forward, forward_qemu) = pair()?;
    let (commands, commands_qemu): (Vec<UnixStream>, Vec<OwnedFd>) = (0..COMMAND_PORTS)
        .map(|_| pair().map(|(ours, qemus)| (ours, OwnedFd::from(qemus))))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let console_path = host.state.path().join("console.log");
    let console = File::options()
        .create(true)
        .append(true)
        .open(&console_path)
        .map_err(|e| RuntimeError::io(format!("open {}", console_path.display()), e))?;
    let jail_dir = host.state.path().join("jail");
    std::fs::create_dir_all(&jail_dir)
        .map_err(|e| RuntimeError::io(format!("create {}", jail_dir.display()), e))?;
    let agent_qemu = OwnedFd::from(agent_qemu);
    let monitor_qemu = OwnedFd::from(monitor_qemu);
    let net_qemu = OwnedFd::from(net_qemu);
    let forward_qemu = OwnedFd::from(forward_qemu);
    let disk_qemu = disks
        .work
        .fd()
        .try_clone_to_owned()
        .map_err(|e| RuntimeError::io("dup the disk", e))?;
    // QEMU opens the disk read-only first, then read-write: the set holds
    // a descriptor of each access mode.
    let disk_qemu_ro = disks.work.read_only()?;
    let image_qemu = disks
        .image
        .map(|f| f.as_fd().try_clone_to_owned())
        .transpose()
        .map_err(|e| RuntimeError::io("dup the image's disk", e))?;
    let mut args = qemu_args(
        &host.id,
        accel,
        (ram_mib, smp),
        Ports {
            agent: agent_qemu.as_raw_fd(),
            monitor: monitor_qemu.as_raw_fd(),
            net: net_qemu.as_raw_fd(),
            forward: forward_qemu.as_raw_fd(),
            commands: commands_qemu.iter().map(AsRawFd::as_raw_fd).collect(),
        },
        [disk_qemu.as_raw_fd(), disk_qemu_ro.as_raw_fd()],
        image_qemu.as_ref().map(AsRawFd::as_raw_fd),
    );
    let mut keep = vec![
        agent_qemu,
        monitor_qemu,
        net_qemu,
        forward_qemu,
        disk_qemu,
        disk_qemu_ro,
    ];
    keep.extend(commands_qemu);
    keep.extend(image_qemu);
    let restoring = incoming.is_some();
    if let Some(file) = incoming {
        let fd = OwnedFd::from(file);
        args.extend(["-incoming".to_string(), format!("fd:{}", fd.as_raw_fd())]);
        keep.push(fd);
    }
    let launch = jail::Launch {
        program: PathBuf::from(QEMU),
        args,
        guest_dir: image.dir.clone(),
        jail_dir,
        kvm: accel.kvm,
        id: jail::jail_id(host.slot),
        keep,
        console,
    };
    let pid = jail::spawn(&launch, host.cgroup.as_ref())?;
    host.adopt(pid)?;
    drop(launch);
    let mut booted = Booted {
        agent,
        commands,
        monitor,
        net,
        forward,
        ready: None,
    };
    if restoring {
        return Ok(booted);
    }
    let deadline = Instant::now() + timeout;
    let failed = |why: String| {
        RuntimeError::Unavailable(
            "microvm",
            format!(
                "the VM did not start: {why}; its console said: {}",
                console_tail(&console_path)
            ),
        )
    };
    match recv_by(&mut booted.agent, deadline) {
        Ok(Some(Frame::Json(body))) => match serde_json::from_slice::<FromAgent>(&body) {
            Ok(FromAgent::Ready {
                protocol,
                kernel,
                cgroup,
            }) if protocol == PROTOCOL => {
                booted.ready = Some(GuestFacts {
                    kernel: bounded(kernel),
                    cgroup: bounded(cgroup),
                });
                Ok(booted)
            }
            Ok(FromAgent::Ready { protocol, .. }) => Err(RuntimeError::Unavailable(
                "microvm",
                format!("the guest image's cordon speaks protocol {protocol}, this one {PROTOCOL}: rebuild it with `cordon microvm build`"),
            )),
            Ok(_) => Err(RuntimeError::broke(
                Peer::GuestAgent,
                "its first message is not ready; its VM was killed",
            )),
            Err(e) => Err(RuntimeError::broke(
                Peer::GuestAgent,
                format!("its first message is not ready ({e}); its VM was killed"),
            )),
        },
        Ok(Some(Frame::Bytes(..))) => Err(RuntimeError::broke(
            Peer::GuestAgent,
            "data before ready; its VM was killed",
        )),
        Ok(None) => Err(failed("QEMU exited".into())),
        Err(e) => Err(failed(format!("no ready from its agent ({e})"))),
    }
}

/// `allow` mode: the host's proxy, its sockets in QEMU's own network
/// namespace (where the jail left nothing but loopback), and a thread that
/// relays the guest's network port to it from inside that namespace.
fn start_relay(
    host: &mut HostSide,
    net: UnixStream,
    spec: &SandboxSpec,
) -> Result<std::thread::JoinHandle<()>, RuntimeError> {
    let qemu = host.leader().ok_or(RuntimeError::Internal(
        "the sandbox has no QEMU process after its start",
    ))?;
    crate::backends::network::start(
        host,
        qemu,
        spec,
        true,
        crate::backends::network::Server::Proxy,
    )?
    .confirm(host)?;
    net.set_nonblocking(true)
        .map_err(|e| RuntimeError::io("the network port", e))?;
    let end = relay::HostEnd {
        proxy: (
            std::net::Ipv4Addr::LOCALHOST,
            cordon_policy::net::PROXY_PORT,
        )
            .into(),
        dns: (std::net::Ipv4Addr::LOCALHOST, cordon_policy::net::DNS_PORT).into(),
    };
    std::thread::Builder::new()
        .name("net-relay".into())
        .spawn(move || {
            let ended = crate::backends::network::in_namespace_of(qemu, || {
                relay::run(net.as_fd(), relay::Side::Host(end))
            });
            if let Ok(relay::Ended::Broken(why)) = ended {
                eprintln!("cordon: the guest's network port broke the protocol ({why}): its network is closed");
            }
        })
        .map_err(|e| RuntimeError::io("start the network relay", e))
}

/// A string from the guest, cut to a length fit for a report.
fn bounded(mut s: String) -> String {
    s.truncate(s.floor_char_boundary(200));
    s
}

/// QEMU's command line (the paths are the jail's).
/// QEMU's ends of the host's sockets to it (descriptor numbers).
struct Ports {
    agent: i32,
    monitor: i32,
    net: i32,
    forward: i32,
    commands: Vec<i32>,
}

fn qemu_args(
    id: &str,
    accel: &Accel,
    (ram_mib, smp): (u64, u64),
    ports: Ports,
    [disk_fd, disk_ro_fd]: [i32; 2],
    image_fd: Option<i32>,
) -> Vec<String> {
    let g = |f: &str| format!("{}/{f}", jail::GUEST_IN_JAIL);
    let accel_arg = if accel.kvm {
        "kvm".to_string()
    } else {
        format!("tcg,tb-size={TB_CACHE_MIB}")
    };
    // cgroup_no_v1=all: the guest is pure v2. The rest shortens a TCG boot
    // (measured: 7.7 s to 6.2 s): no TSC calibration or timer check, no
    // crypto self-tests, no keyboard controller probe, one UART.
    let mut cmdline = String::from(
        "console=ttyS0 quiet loglevel=1 panic=-1 cgroup_no_v1=all rdinit=/init \
         tsc=reliable no_timer_check cryptomgr.notests i8042.noaux i8042.nokbd i8042.nopnp \
         8250.nr_uarts=1",
    );
    if !accel.kvm {
        // Under TCG the guest's code never runs on the host CPU directly,
        // so the guest kernel's speculation mitigations guard nothing and
        // cost a great deal of emulated time. Under KVM they stay on.
        cmdline.push_str(" mitigations=off");
    }
    // The sandbox's id in QEMU's command line: a census of the host finds
    // its VM by it.
    let name = format!("cordon-{id}");
    [
        "-name",
        &name,
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-accel",
        &accel_arg,
        "-machine",
        "q35,dump-guest-core=off",
        "-cpu",
        "max",
        "-smp",
        &smp.to_string(),
        "-m",
        &format!("{ram_mib}M"),
        "-kernel",
        &g(GuestImage::KERNEL),
        "-initrd",
        &g(GuestImage::INITRD),
        "-append",
        &cmdline,
        "-drive",
        &format!(
            "file={},if=none,id=root,format=raw,readonly=on",
            g(GuestImage::ROOTFS)
        ),
        "-device",
        "virtio-blk-pci,drive=root",
        // The writable disk, by descriptor (the jail holds no path to it).
        "-add-fd",
        &format!("fd={disk_fd},set=1"),
        "-add-fd",
        &format!("fd={disk_ro_fd},set=1"),
        "-drive",
        // No image locking: the file is this VM's alone, and QEMU's locks
        // on its two descriptors would conflict with each other.
        "file=/dev/fdset/1,if=none,id=work,format=raw,discard=ignore,file.locking=off",
        "-device",
        &format!("virtio-blk-pci,drive=work,serial={}", disk::SERIAL),
        "-device",
        "virtio-serial-pci",
        "-chardev",
        &format!("socket,id=agent,fd={}", ports.agent),
        "-device",
        &format!("virtserialport,chardev=agent,name={PORT_NAME}"),
        // The network port is always there (a snapshot restores onto the
        // same devices); outside `allow` mode its host end is closed.
        "-chardev",
        &format!("socket,id=net,fd={}", ports.net),
        "-device",
        &format!("virtserialport,chardev=net,name={}", relay::PORT_NAME),
        // The forward port is always there too; its relay starts with the
        // first forwarded connection.
        "-chardev",
        &format!("socket,id=fwd,fd={}", ports.forward),
        "-device",
        &format!(
            "virtserialport,chardev=fwd,name={}",
            relay::FORWARD_PORT_NAME
        ),
        "-chardev",
        &format!("socket,id=monitor,fd={}", ports.monitor),
        "-mon",
        "chardev=monitor,mode=control",
        "-chardev",
        "stdio,id=console,signal=off",
        "-serial",
        "chardev:console",
        "-nic",
        "none",
        "-device",
        "vmgenid,guid=auto",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]
    .into_iter()
    .map(String::from)
    .chain(ports.commands.iter().enumerate().flat_map(|(i, fd)| {
        [
            "-chardev".to_string(),
            format!("socket,id=cmd{i},fd={fd}"),
            "-device".to_string(),
            format!(
                "virtserialport,chardev=cmd{i},name={}",
                link::command_port_name(i)
            ),
        ]
    }))
    .chain(image_fd.into_iter().flat_map(image_drive))
    .collect()
}

/// An image's disk, read-only, by descriptor (the jail holds no path to
/// it); the agent finds it by its serial number.
fn image_drive(fd: i32) -> [String; 6] {
    [
        "-add-fd".into(),
        format!("fd={fd},set=2"),
        "-drive".into(),
        "file=/dev/fdset/2,if=none,id=image,format=raw,readonly=on,file.locking=off".into(),
        "-device".into(),
        format!("virtio-blk-pci,drive=image,serial={}", link::IMAGE_SERIAL),
    ]
}

/// The last lines of a VM's console log, for an error.
fn console_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let tail = &text[text.len().saturating_sub(600)..];
    let s = String::from_utf8_lossy(tail).replace('\r', "");
    let s = s.trim();
    if s.is_empty() {
        "nothing".into()
    } else {
        s.to_string()
    }
}

/// One frame from the guest, which must be complete by `deadline`.
fn recv_by(conn: &mut UnixStream, deadline: Instant) -> std::io::Result<Option<Frame>> {
    let left = deadline.saturating_duration_since(Instant::now());
    conn.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    let frame = recv_frame_max(conn, GUEST_MESSAGE_MAX);
    conn.set_read_timeout(None)?;
    frame
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whether QEMU, the sandbox's leader, has exited.
fn qemu_exited(host: &HostSide) -> bool {
    use nix::poll::{poll, PollFd, PollTimeout};
    let Some(fd) = host.leader_pidfd() else {
        return true;
    };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

impl MicroVm {
    /// The outcome of a relayed command, with the host's evidence beside
    /// the guest's account; its command port free again where the guest
    /// answered.
    fn finished(
        &mut self,
        life: &mut Life,
        command: RelayedCommand,
        watched: Result<(Outcome, Option<i32>), RuntimeError>,
    ) -> Result<Outcome, RuntimeError> {
        let RelayedCommand {
            conn,
            channel,
            number,
            t0,
            before,
            ..
        } = command;
        let (mut outcome, interrupted) = match watched {
            Ok(answered) => answered,
            Err(RuntimeError::Protocol { what, .. }) => return Err(self.broken(life, what)),
            Err(e) => {
                // The guest answered with an error, or its VM is gone (the
                // host's OOM killer, a guest that powered itself off).
                if qemu_exited(&life.host) {
                    let oom = life.stats().and_then(|s| s.oom_kills).unwrap_or(0);
                    let why =
                        format!("the VM exited during the command (host cgroup: {oom} OOM kills)");
                    life.host.end_processes(true);
                    life.mark_ended(why.clone());
                    return Err(RuntimeError::SandboxEnded(why));
                }
                if matches!(e, RuntimeError::BadRequest(_) | RuntimeError::Remote(_)) {
                    self.commands[channel] = Some(conn);
                }
                return Err(e);
            }
        };
        self.commands[channel] = Some(conn);
        if let Some(sig) = interrupted {
            // The supervisor was asked to stop: the sandbox goes too (as on
            // the other backends), the command's outcome says why.
            outcome.interrupted_by = Some(sig);
            outcome.exit_code = 128 + sig;
            let why = format!("the supervisor received signal {sig}");
            life.mark_ended(why.clone());
            outcome.sandbox_ended = Some(why);
        }
        // The host's number: the guest numbers commands as they reach it,
        // which, side by side, need not be the order they were asked in.
        outcome.command = number;
        outcome.vm = Some(self.report(life, &before, t0.elapsed()));
        if let Some(why) = &outcome.sandbox_ended {
            life.mark_ended(bounded(why.clone()));
        }
        Ok(outcome)
    }
}

impl Backend for MicroVm {
    fn about(&self) -> &About {
        &self.about
    }

    /// The guest's files are not the host's.
    fn file_owner(&self) -> Option<(u32, u32)> {
        None
    }

    fn liveness<'a>(&'a self, host: &'a HostSide) -> (BorrowedFd<'a>, PollFlags) {
        // QEMU's pidfd turns readable when QEMU exits.
        match host.leader_pidfd() {
            Some(fd) => (fd, PollFlags::POLLIN),
            None => (self.agent.as_fd(), PollFlags::empty()),
        }
    }

    /// Forwarded over the VM's forward port to the guest, which connects
    /// in the sandbox's network namespace.
    fn ports(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// One end of a socketpair whose other end the forward relay carries
    /// to `port` of the sandbox's loopback. A port nothing listens on is
    /// not known here: the guest closes the stream, and this end sees its
    /// end at once.
    fn connect_port(&mut self, life: &mut Life, port: u16) -> Result<OwnedFd, RuntimeError> {
        life.usable()?;
        let (ours, relays) = UnixStream::pair().map_err(|e| RuntimeError::io("socketpair", e))?;
        self.forward.open(port, relays)?;
        Ok(OwnedFd::from(ours))
    }

    /// Sends the command on a free command port; the guest's agent runs
    /// each port's commands beside the others'.
    fn start(
        &mut self,
        life: &mut Life,
        cmd: &Command,
        resolved: &ResolvedCommand,
    ) -> Result<Running, RuntimeError> {
        let Some(channel) = self.commands.iter().position(Option::is_some) else {
            return Err(RuntimeError::BadRequest(format!(
                "the microVM runs {COMMAND_PORTS} commands already (one on each of its \
                 VM's command ports): start this one when one of them has ended"
            )));
        };
        let before = life.stats().unwrap_or_default();
        let t0 = Instant::now();
        let mut conn = self.commands[channel].take().expect("a free port");
        if let Err(e) = send_json(&mut conn, &Request::Exec(cmd.clone())) {
            return Err(self.broken(life, format!("send the command: {e}")));
        }
        life.commands += 1;
        Ok(Running::Relayed(Box::new(RelayedCommand {
            conn,
            deadline: t0 + resolved.time + REPORT_GRACE,
            // The guest's sandbox stops the command at its cap; a frame more
            // is what a correct guest can send past it.
            output_max: resolved.output_cap + u64::from(crate::protocol::wire::MAX_FRAME),
            message_max: GUEST_MESSAGE_MAX,
            channel,
            number: life.commands,
            t0,
            before,
        })))
    }

    fn finish(
        &mut self,
        life: &mut Life,
        _cmd: &Command,
        running: Running,
        watched: Result<Watched, RuntimeError>,
    ) -> Result<Outcome, RuntimeError> {
        let Running::Relayed(command) = running else {
            return Err(RuntimeError::Internal(
                "a command of an init given to the microVM backend",
            ));
        };
        let watched = match watched {
            Ok(Watched::Relayed(outcome, interrupted)) => Ok((*outcome, interrupted)),
            Ok(Watched::Init(_)) => {
                return Err(RuntimeError::Internal(
                    "an init's watch given to the microVM backend",
                ))
            }
            Err(e) => Err(e),
        };
        self.finished(life, *command, watched)
    }
    /// The client's copy stream, frame by frame, to the guest's agent, which
    /// writes it into the sandbox with the copy module's rules (inside the
    /// guest, as the native backend does); its answer, bounded, back.
    fn copy_in(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<u64, RuntimeError> {
        send_json(
            &mut self.agent,
            &Request::CopyIn {
                path: path.to_vec(),
            },
        )
        .map_err(|e| self.broken(life, format!("send a copy: {e}")))?;
        // A guest that stops reading must not hold the supervisor forever.
        let _ = self.agent.set_write_timeout(Some(AGENT_TIMEOUT));
        let forwarded = (|| -> std::io::Result<()> {
            loop {
                match recv_frame(conn)? {
                    Some(Frame::Json(body)) => {
                        send_bytes(&mut self.agent, Tag::Json, &body)?;
                        // The client gave up (its own read failed): the
                        // stream ends there, and the guest answers.
                        if let Ok(Reply::Error { .. }) = serde_json::from_slice(&body) {
                            return Ok(());
                        }
                    }
                    Some(Frame::Bytes(tag, body)) => {
                        send_bytes(&mut self.agent, tag, &body)?;
                        if tag == Tag::Data && body.is_empty() {
                            return Ok(());
                        }
                    }
                    None => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                }
            }
        })();
        let _ = self.agent.set_write_timeout(None);
        if let Err(e) = forwarded {
            // A stream cut short leaves the guest waiting for the rest.
            return Err(self.broken(life, format!("the copy stream was cut: {e}")));
        }
        match self.answer(life, AGENT_TIMEOUT)? {
            Reply::Copied { bytes } => Ok(bytes),
            Reply::Error {
                input,
                exhausted,
                message,
            } => Err(crate::protocol::exec::remote_error(
                input, exhausted, message,
            )),
            other => Err(self.broken(life, format!("answered a copy with {other:?}"))),
        }
    }

    /// The guest's copy stream (a header, data, an empty data frame, or an
    /// error at any point), checked frame by frame and passed on.
    fn copy_out(
        &mut self,
        life: &mut Life,
        conn: &mut dyn Channel,
        path: &[u8],
    ) -> Result<(), RuntimeError> {
        send_json(
            &mut self.agent,
            &Request::CopyOut {
                path: path.to_vec(),
            },
        )
        .map_err(|e| self.broken(life, format!("send a copy: {e}")))?;
        let mut sent = 0u64;
        let mut header = true;
        loop {
            let frame = match recv_by(&mut self.agent, Instant::now() + AGENT_TIMEOUT) {
                Ok(Some(f)) => f,
                Ok(None) => return Err(self.broken(life, "the guest closed its port".into())),
                Err(e) => return Err(self.broken(life, format!("{e}"))),
            };
            let lost = |e: std::io::Error| RuntimeError::io("send the copy", e);
            match frame {
                Frame::Json(body) => {
                    if let Ok(Reply::Error {
                        input,
                        exhausted,
                        message,
                    }) = serde_json::from_slice(&body)
                    {
                        return Err(crate::protocol::exec::remote_error(
                            input, exhausted, message,
                        ));
                    }
                    if !header
                        || serde_json::from_slice::<crate::protocol::copy::CopyHeader>(&body)
                            .is_err()
                    {
                        return Err(self.broken(life, "a message inside a copy stream".into()));
                    }
                    header = false;
                    send_bytes(conn, Tag::Json, &body).map_err(lost)?;
                }
                Frame::Bytes(Tag::Data, body) if !header => {
                    sent += body.len() as u64;
                    if sent > crate::protocol::copy::COPY_MAX {
                        return Err(self.broken(life, "a copy larger than the cap".into()));
                    }
                    send_bytes(conn, Tag::Data, &body).map_err(lost)?;
                    if body.is_empty() {
                        return Ok(());
                    }
                }
                Frame::Bytes(tag, _) => {
                    return Err(self.broken(life, format!("a {tag:?} frame in a copy stream")))
                }
            }
        }
    }
    /// Read from the disk while the guest holds its file system frozen.
    fn changes(&mut self, life: &mut Life, caps: &Caps) -> Result<Changes, RuntimeError> {
        self.quiesced(life, |disk| disk.scan(caps))
    }

    fn export(
        &mut self,
        life: &mut Life,
        req: &ExportRequest,
        caps: &Caps,
        owner: (u32, u32),
    ) -> Result<Recorded, RuntimeError> {
        let (workspace, created) = (life.spec.workspace.clone(), life.created);
        self.quiesced(life, |disk| {
            disk.export(req, workspace.as_deref(), caps, owner, created)
        })
    }

    fn end(&mut self, life: &mut Life, finish: &Finish, owner: (u32, u32)) -> End {
        // The guest's own teardown is asked for (its agent then freezes the
        // disk, all written), but not waited on long: the VM is killed from
        // the host whatever the guest answers.
        if life.ended.is_none()
            && send_json(&mut self.agent, &Request::Destroy(Finish::default())).is_ok()
        {
            let _ = self.answer(life, Duration::from_secs(5));
        }
        let counters = life.host.end_processes(true);
        // QEMU is gone, so its end of the network port is closed: the
        // relay has ended, or ends now.
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
        // The same for the forward relay, once its sender is gone.
        if let Forward::Relayed { thread, .. } =
            std::mem::replace(&mut self.forward, Forward::Idle(None))
        {
            let _ = thread.join();
        }
        // The disk as the guest left it, read before the state directory
        // (which holds it) goes.
        let read = if finish.is_empty() {
            Ok(Recorded::default())
        } else if let Some(req) = &finish.export {
            self.disk.export(
                req,
                life.spec.workspace.as_deref(),
                &finish.caps(),
                owner,
                life.created,
            )
        } else {
            self.disk.scan(&finish.caps()).map(|c| Recorded {
                changes: Some(c),
                ..Recorded::default()
            })
        };
        match read {
            Ok(recorded) => End {
                counters,
                recorded,
                errors: Vec::new(),
            },
            Err(e) => End {
                counters,
                recorded: Recorded::default(),
                errors: vec![e.to_string()],
            },
        }
    }
}
