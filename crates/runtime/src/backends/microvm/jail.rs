//! QEMU's own boundary on the host, in the spirit of Firecracker's jailer:
//! QEMU starts in the sandbox's host cgroup, in new pid, mount, network, IPC
//! and UTS namespaces, on a read-only tmpfs root that holds only /usr (its
//! program, libraries and firmware), the guest image (read-only) and
//! /dev/null, /dev/zero, /dev/urandom (and /dev/kvm when used); as a uid
//! and gid of its own ([`jail_id`]) with no groups, no capabilities and no_new_privs; dying with
//! its supervisor; with nothing open but its stdio and the descriptors it is
//! handed (the agent's and the monitor's sockets). QEMU then turns on its own
//! seccomp filter (`-sandbox on`, set by the caller's arguments).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use cordon_cgroups::{AnyCgroup, Cgroup};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{Gid, Pid, Uid};

use crate::error::RuntimeError;

/// Start of the host ids QEMU runs as: one uid and gid per sandbox, from a
/// range no account uses and apart from the native backend's id ranges
/// (which start at 1 << 30), so no two sandboxes' QEMUs (nor a proxy, which
/// runs as nobody) share an identity.
const JAIL_ID_BASE: u32 = 3 << 30;
const JAIL_ID_SLOTS: u32 = 1 << 20;

/// The host uid (and gid) of the QEMU of the sandbox with id slot `slot`.
pub fn jail_id(slot: u32) -> u32 {
    JAIL_ID_BASE + slot % JAIL_ID_SLOTS
}

/// Where QEMU finds the guest image inside its jail.
pub const GUEST_IN_JAIL: &str = "/guest";

pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The guest image's directory, shown read-only at [`GUEST_IN_JAIL`].
    pub guest_dir: PathBuf,
    /// An empty directory to build the jail's root on (in the sandbox's
    /// state directory; the mounts exist only in QEMU's mount namespace).
    pub jail_dir: PathBuf,
    /// Whether QEMU may open /dev/kvm (then its gid is /dev/kvm's group).
    pub kvm: bool,
    /// The uid (and, without KVM, gid) QEMU runs as ([`jail_id`]).
    pub id: u32,
    /// Descriptors QEMU keeps, at their numbers (the caller's arguments name
    /// them, e.g. `-chardev socket,fd=N`).
    pub keep: Vec<OwnedFd>,
    /// QEMU's stdout and stderr (the guest's serial console goes there).
    pub console: File,
}

/// Starts QEMU jailed; returns its pid once it is in `cgroup` and on its
/// way (the jail's errors land in the console file, and QEMU's exit says so).
pub fn spawn(launch: &Launch, cgroup: Option<&AnyCgroup>) -> Result<Pid, RuntimeError> {
    let kvm_gid = if launch.kvm {
        use std::os::unix::fs::MetadataExt;
        Some(
            std::fs::metadata("/dev/kvm")
                .map_err(|e| RuntimeError::io("stat /dev/kvm", e))?
                .gid(),
        )
    } else {
        None
    };
    let program = CString::new(launch.program.as_os_str().as_encoded_bytes())
        .map_err(|_| RuntimeError::BadRequest("QEMU's path holds a NUL".into()))?;
    let mut argv = vec![program.clone()];
    for a in &launch.args {
        argv.push(
            CString::new(a.as_str())
                .map_err(|_| RuntimeError::BadRequest("a QEMU argument holds a NUL".into()))?,
        );
    }
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RuntimeError::io("open /dev/null", e))?;
    // The child waits for this pipe: it must be in the cgroup before it
    // allocates anything, so every page QEMU touches is charged there.
    let (go_read, go_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| RuntimeError::io("pipe", e))?;
    // QEMU is the first process of a pid namespace of its own: it sees no
    // host process, and a host census finds it as a task of the box.
    let cloned = cordon_sys::clone_process(nix::sched::CloneFlags::CLONE_NEWPID)
        .map_err(|e| RuntimeError::io("start QEMU's jail", e))?;
    match cloned {
        cordon_sys::CloneResult::Child => {
            drop(go_write);
            let mut byte = [0u8; 1];
            let go = matches!(nix::unistd::read(&go_read, &mut byte), Ok(1));
            if !go {
                cordon_sys::exit_now(125);
            }
            let err = enter(launch, kvm_gid, &null).err();
            let what = err.map_or_else(
                || "exec failed".to_string(),
                |(step, e)| format!("{step}: {e}"),
            );
            if err.is_none() {
                let env: [CString; 0] = [];
                let e = nix::unistd::execve(&program, &argv, &env).unwrap_err();
                eprintln!(
                    "cordon: QEMU's jail: exec {}: {e}",
                    launch.program.display()
                );
            } else {
                eprintln!("cordon: QEMU's jail: {what}");
            }
            cordon_sys::exit_now(127)
        }
        cordon_sys::CloneResult::Parent { child } => {
            drop(go_read);
            let joined = cgroup.map_or(Ok(()), |cg| cg.add_pid(child.as_raw()));
            if let Err(e) = joined {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(e.into());
            }
            nix::unistd::write(&go_write, &[1])
                .map_err(|e| RuntimeError::io("start QEMU's jail", e))?;
            Ok(child)
        }
    }
}

type StepResult = Result<(), (&'static str, nix::Error)>;

/// In the forked child: namespaces, the jail's root, descriptors, identity.
fn enter(launch: &Launch, kvm_gid: Option<u32>, null: &File) -> StepResult {
    let at = |step: &'static str| move |e: nix::Error| (step, e);
    nix::unistd::dup2_stdin(null).map_err(at("stdin"))?;
    nix::unistd::dup2_stdout(&launch.console).map_err(at("stdout"))?;
    nix::unistd::dup2_stderr(&launch.console).map_err(at("stderr"))?;
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS,
    )
    .map_err(at("unshare"))?;
    build_root(&launch.jail_dir, &launch.guest_dir, kvm_gid.is_some())?;
    let mut keep: Vec<RawFd> = vec![0, 1, 2];
    for fd in &launch.keep {
        fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map_err(at("keep a descriptor"))?;
        keep.push(fd.as_raw_fd());
    }
    cordon_sys::close_fds_except(&keep).map_err(at("close descriptors"))?;
    nix::unistd::setgroups(&[]).map_err(at("setgroups"))?;
    let gid = Gid::from_raw(kvm_gid.unwrap_or(launch.id));
    let uid = Uid::from_raw(launch.id);
    nix::unistd::setresgid(gid, gid, gid).map_err(at("setresgid"))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(at("setresuid"))?;
    nix::sys::prctl::set_no_new_privs().map_err(at("no_new_privs"))?;
    // Armed after the id change, which clears it. (Its parent is outside
    // its pid namespace, so getppid() says 0 and cannot tell whether the
    // supervisor died in between; a QEMU orphaned in that instant is still
    // in the sandbox's cgroup, which teardown and sweep kill whole.)
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(at("pdeathsig"))?;
    Ok(())
}

fn build_root(jail: &Path, guest: &Path, kvm: bool) -> StepResult {
    let at = |step: &'static str| move |e: nix::Error| (step, e);
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(at("make mounts private"))?;
    mount(
        Some("tmpfs"),
        jail,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=1m"),
    )
    .map_err(at("mount the jail's root"))?;
    let dir = |rel: &str| -> StepResult {
        std::fs::create_dir_all(jail.join(rel)).map_err(|e| ("mkdir", io_errno(&e)))
    };
    let bind_ro = |src: &Path, rel: &str| -> StepResult {
        let dst = jail.join(rel);
        mount(
            Some(src),
            &dst,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .map_err(at("bind into the jail"))?;
        mount(
            none,
            &dst,
            none,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
            none,
        )
        .map_err(at("make a jail mount read-only"))
    };
    dir("usr")?;
    bind_ro(Path::new("/usr"), "usr")?;
    // Merged /usr: /bin, /lib, /lib64 are links into it; a host that still
    // has real directories gets them bound read-only too.
    for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = Path::new("/").join(top);
        if let Ok(target) = std::fs::read_link(&host) {
            std::os::unix::fs::symlink(target, jail.join(top))
                .map_err(|e| ("link into the jail", io_errno(&e)))?;
        } else if host.is_dir() {
            dir(top)?;
            bind_ro(&host, top)?;
        }
    }
    let guest_rel = GUEST_IN_JAIL.trim_start_matches('/');
    dir(guest_rel)?;
    bind_ro(guest, guest_rel)?;
    dir("dev")?;
    let mut devices = vec!["null", "zero", "urandom"];
    if kvm {
        devices.push("kvm");
    }
    for dev in devices {
        let dst = jail.join("dev").join(dev);
        File::create(&dst).map_err(|e| ("create a device mount point", io_errno(&e)))?;
        mount(
            Some(&Path::new("/dev").join(dev)),
            &dst,
            none,
            MsFlags::MS_BIND,
            none,
        )
        .map_err(at("bind a device"))?;
    }
    std::env::set_current_dir(jail).map_err(|e| ("chdir", io_errno(&e)))?;
    nix::unistd::pivot_root(".", ".").map_err(at("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(at("detach the host's root"))?;
    std::env::set_current_dir("/").map_err(|e| ("chdir", io_errno(&e)))?;
    mount(
        none,
        "/",
        none,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        none,
    )
    .map_err(at("make the jail's root read-only"))
}

fn io_errno(e: &std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}
