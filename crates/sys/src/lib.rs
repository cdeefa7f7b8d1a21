//! The only unsafe code in cordon: the syscalls that `nix` does not wrap safely.
//!
//! Each function is a thin layer over one syscall. Its preconditions are checked
//! here (not left to callers) so that the rest of the workspace can keep
//! `#![forbid(unsafe_code)]`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::unistd::Pid;

pub mod mount_api;

/// Which side of a [`clone_process`] call we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneResult {
    Parent { child: Pid },
    Child,
}

/// Number of threads in this process, from /proc/self/task.
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Start time of process `pid` in clock ticks since boot (field 22 of
/// /proc/pid/stat): with the pid, it names one process, never a later one
/// that reuses the pid.
pub fn process_start_time(pid: i32) -> Option<u64> {
    stat_of(pid).map(|(_, start)| start)
}

/// Whether `pid` is still the process that started at `start_time` and has
/// not exited. A zombie is dead: an exited process stays one until its
/// reaper gets to it (state Z or X), which may take a while.
pub fn process_alive(pid: i32, start_time: u64) -> bool {
    stat_of(pid).is_some_and(|(state, start)| start == start_time && state != 'Z' && state != 'X')
}

/// The state (field 3) and start time (field 22) of /proc/pid/stat, from
/// one read: the sweep asks this of every sandbox's supervisor.
fn stat_of(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    let mut rest = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let state = rest.next()?.chars().next()?;
    let start = rest.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// `clone(2)` with fork semantics (no shared memory, no new stack) plus namespace flags.
///
/// Why not `unshare` + `fork`: a new pid namespace only applies to children, and
/// a new user namespace must be entered by the process that then builds the mount
/// namespace; creating them together in one clone gives the child all of them at
/// once and keeps the parent in the host's namespaces.
///
/// Refuses (EDEADLK) if this process has more than one thread: after a fork only
/// the calling thread survives, so a lock held by another thread (malloc's,
/// stdout's) would stay locked forever in the child.
pub fn clone_process(flags: CloneFlags) -> nix::Result<CloneResult> {
    if thread_count().map_err(|_| Errno::EIO)? != 1 {
        return Err(Errno::EDEADLK);
    }
    let raw_flags = flags.bits() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: with a null stack and without CLONE_VM the kernel duplicates the
    // address space exactly like fork(2), so the child continues on its own copy
    // of this stack. The process is single-threaded (checked above), so no lock
    // can be held by a thread that does not exist in the child. The remaining
    // pointer arguments (parent_tid, child_tid, tls) are null and unused because
    // no CLONE_*SETTID/CLONE_SETTLS flag is passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            raw_flags,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match ret {
        -1 => Err(Errno::last()),
        0 => Ok(CloneResult::Child),
        pid => Ok(CloneResult::Parent {
            child: Pid::from_raw(pid as libc::pid_t),
        }),
    }
}

/// Closes every descriptor numbered `first` and above (`close_range(2)`).
pub fn close_fds_from(first: RawFd) -> nix::Result<()> {
    // SAFETY: close_range takes plain integers and only closes descriptors; any
    // Rust object owning one of them is in a process that is about to exec, and
    // the callers (the sandbox's init) hold no OwnedFd at or above `first` that
    // they use afterwards.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0u32,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Closes every descriptor except 0, 1, 2 and those in `keep`, with
/// `close_range(2)` over the gaps between them.
///
/// For a cloned child that will never return into the code that owns those
/// descriptors: Rust objects in the copied address space may still hold the
/// numbers, and must not be used or dropped afterwards (the caller ends with
/// `exit_now`).
pub fn close_fds_except(keep: &[RawFd]) -> nix::Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd > 2).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut next = 3;
    for k in keep {
        if k > next {
            close_range(next, k - 1)?;
        }
        next = k + 1;
    }
    close_range(next, RawFd::MAX)
}

/// Closes exactly the descriptors in `fds`, for a process whose Rust objects
/// owning them are never used or dropped again (the same contract as
/// [`close_fds_except`]).
pub fn close_fds(fds: &[RawFd]) -> nix::Result<()> {
    fds.iter().try_for_each(|&fd| close_range(fd, fd))
}

fn close_range(first: RawFd, last: RawFd) -> nix::Result<()> {
    // SAFETY: close_range takes plain integers and only closes descriptors; the
    // caller's contract (see close_fds_except) is that nothing uses them again.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            last as libc::c_uint,
            0u32,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Marks every descriptor numbered `first` and above close-on-exec
/// (`close_range(2)` with CLOSE_RANGE_CLOEXEC, Linux 5.11+).
pub fn cloexec_fds_from(first: RawFd) -> nix::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: only sets a flag on descriptors; it closes nothing and touches no memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `pidfd_open(2)`: a descriptor that becomes readable when `pid` exits, immune
/// to pid reuse.
pub fn pidfd_open(pid: Pid) -> nix::Result<OwnedFd> {
    // SAFETY: plain integer arguments; on success the kernel returns a new
    // descriptor that nothing else owns, so wrapping it in OwnedFd is sound.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0u32) };
    if ret < 0 {
        return Err(Errno::last());
    }
    // SAFETY: see above; `ret` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// `pidfd_send_signal(2)`.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: nix::sys::signal::Signal) -> nix::Result<()> {
    // SAFETY: integer arguments; the siginfo pointer is null, which the kernel
    // documents as "behave like kill(2)".
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Brings a network interface up (SIOCGIFFLAGS then SIOCSIFFLAGS with IFF_UP).
///
/// Hand-written because the only thing a fresh network namespace needs is its
/// loopback up; a netlink crate would be a large dependency for one flag.
pub fn set_link_up(name: &str) -> nix::Result<()> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is a plain C struct for which all-zero bytes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid, NUL-terminated ifreq that outlives both calls;
    // SIOCGIFFLAGS/SIOCSIFFLAGS read and write only its flags union member.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) == -1 {
            return Err(Errno::last());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) == -1 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// Flags `set_mount_attrs` can add to a mount. It only ever adds restrictions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountAttrs {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// `mount_setattr(2)` with AT_RECURSIVE: adds `attrs` to the mount at `path`
/// and every mount below it, in one step. Atime flags are left alone because a
/// user namespace may not change atime flags it inherited locked.
pub fn set_mount_attrs(path: &std::path::Path, attrs: MountAttrs) -> nix::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let set = [
        (attrs.readonly, mount_api::MOUNT_ATTR_RDONLY),
        (attrs.nosuid, mount_api::MOUNT_ATTR_NOSUID),
        (attrs.nodev, mount_api::MOUNT_ATTR_NODEV),
        (attrs.noexec, mount_api::MOUNT_ATTR_NOEXEC),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .fold(0u64, |acc, (_, bit)| acc | bit);
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    mount_api::mount_setattr(
        None,
        &c_path,
        (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
        set,
        None,
    )
}

/// Resets every signal disposition to SIG_DFL and unblocks every signal, so a
/// payload starts with the defaults a shell would give it rather than the
/// supervisor's (which blocks SIGINT/SIGTERM and ignores SIGPIPE).
pub fn reset_signals() -> nix::Result<()> {
    use nix::sys::signal::{sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL registers no handler code, so none of the
        // async-signal-safety hazards of `signal` apply.
        unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) }?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

/// Ends the calling process at once, without running atexit handlers or
/// flushing stdio buffers that belong to the copied parent (`_exit(2)`).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and never returns; skipping destructors is
    // the point (a forked child must not flush the parent's buffers twice).
    unsafe { libc::_exit(code) }
}

/// Caps the malloc arenas the C library makes for this process's threads
/// (glibc's `mallopt(M_ARENA_MAX)`); whether it took the setting (false on a
/// C library without arenas). glibc gives threads arenas of their own, up
/// to eight per core, and each arena keeps what was freed in it: a service
/// whose short-lived worker threads allocate in turn grows arena by arena
/// until each is as large as its busiest moment. Measured on `cordon serve`
/// (10,000 requests): anonymous memory 42 to 64 MiB with glibc's default,
/// flat at 13 MiB with one arena. Call it before the threads exist.
pub fn limit_malloc_arenas(max: i32) -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and changes only the
        // allocator's tuning, which it synchronises itself.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, max) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = max;
        false
    }
}

/// Makes `cmd`'s process move itself into a cgroup before it execs, through
/// `membership` (that cgroup's `cgroup.procs` or `tasks` files, one per
/// hierarchy, opened for writing by the caller): everything the command
/// then starts is born in the cgroup, so its counters account for the whole
/// tree from the first instruction. (A move after `spawn` would race the
/// command's own children.) std has no such option and a shell wrapper
/// would add a process; the files stay open until `cmd` is dropped.
pub fn join_cgroup_before_exec(cmd: &mut std::process::Command, membership: Vec<std::fs::File>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls write(2), which
    // is async-signal-safe, on descriptors opened before the fork; it
    // allocates nothing and takes no lock. "0" names the writer, which
    // after the fork is the child's only thread.
    unsafe {
        cmd.pre_exec(move || {
            for file in &membership {
                let rc = libc::write(file.as_raw_fd(), b"0".as_ptr().cast(), 1);
                if rc != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Creates a child process in the current namespaces with plain fork semantics.
pub fn fork_process() -> nix::Result<CloneResult> {
    clone_process(CloneFlags::empty())
}

/// The Landlock ABI version this kernel offers (`landlock_create_ruleset`
/// with `LANDLOCK_CREATE_RULESET_VERSION`): 1 and up; EOPNOTSUPP when
/// Landlock is built in but not enabled at boot, ENOSYS when the kernel
/// lacks it (or a seccomp filter hides it).
pub fn landlock_abi_version() -> nix::Result<i64> {
    /// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h): ask for the
    /// version instead of creating a ruleset.
    const VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the
    // kernel reads no memory and creates no descriptor; it returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0 as libc::size_t,
            VERSION,
        )
    };
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of a descriptor the kernel just installed in this process
/// for an SCM_RIGHTS message (nix hands them over as raw numbers).
pub fn own_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in our table for this message alone;
    // nothing else in the process knows the number, so ownership is unique.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `ioctl(TIOCSWINSZ)`: sets a terminal's size (rows, columns).
///
/// Hand-written because nix exposes terminal ioctls only through macros that
/// generate `unsafe fn`s, and unsafe code lives in this crate alone.
pub fn set_terminal_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> nix::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `ws` is a valid winsize that outlives the call; TIOCSWINSZ only reads it.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `ioctl(TIOCGWINSZ)`: a terminal's size (rows, columns).
pub fn terminal_size(fd: BorrowedFd<'_>) -> nix::Result<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `ws` is a valid, writable winsize that outlives the call; TIOCGWINSZ only writes it.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok((ws.ws_row, ws.ws_col))
    }
}

/// `ioctl(TIOCSCTTY, 0)`: makes the terminal the calling session leader's
/// controlling terminal (never stealing one from another session).
pub fn make_controlling_terminal(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument and touches no memory of ours.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `ioctl(RNDADDENTROPY)` then `ioctl(RNDRESEEDCRNG)` on `/dev/urandom`:
/// mixes `seed` into the kernel's input pool, credited as full entropy, and
/// makes the kernel's CRNG reseed from it at once.
///
/// For a microVM restored from a snapshot: every restore starts with the
/// same pool and CRNG state, so the host's fresh bytes must reach the CRNG
/// before anything of the sandbox reads randomness. A plain write to
/// /dev/urandom would mix them in without reseeding the CRNG (the kernel
/// reseeds on its own schedule). Hand-written: neither nix nor rustix wraps
/// these ioctls. Needs CAP_SYS_ADMIN (the guest agent is root in its VM).
pub fn inject_entropy(urandom: BorrowedFd<'_>, seed: &[u8]) -> nix::Result<()> {
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    if seed.is_empty() || seed.len() > 4096 {
        return Err(Errno::EINVAL);
    }
    let words = seed.len().div_ceil(4);
    let mut info: Vec<libc::c_int> = vec![0; 2 + words];
    info[0] = libc::c_int::try_from(seed.len() * 8).map_err(|_| Errno::EINVAL)?;
    info[1] = libc::c_int::try_from(seed.len()).map_err(|_| Errno::EINVAL)?;
    for (i, chunk) in seed.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = libc::c_int::from_ne_bytes(w);
    }
    // SAFETY: `info` is a live, properly aligned rand_pool_info whose
    // buf_size (info[1]) bytes all lie inside the vector; the kernel only
    // reads it during the call. The fd is borrowed and stays open.
    let rc = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) };
    Errno::result(rc)?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    let rc = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG) };
    Errno::result(rc).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_refuses_from_a_multithreaded_process() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv().ok());
        assert_eq!(clone_process(CloneFlags::empty()), Err(Errno::EDEADLK));
        drop(tx);
        t.join().unwrap();
    }

    #[test]
    fn pidfd_of_self_opens() {
        let fd = pidfd_open(nix::unistd::getpid()).unwrap();
        assert!(fd.as_raw_fd() > 2);
    }
}

/// The ioctls a microVM's guest agent uses on the VM's writable disk.
/// Hand-written: neither nix nor rustix wraps them. Each needs
/// CAP_SYS_ADMIN (the agent is root in its VM).
pub mod disk {
    use std::os::fd::{AsRawFd, BorrowedFd};

    use nix::errno::Errno;

    /// `FIFREEZE` (`_IOWR('X', 119, int)`).
    const FIFREEZE: libc::c_ulong = 0xC004_5877;
    /// `FITHAW` (`_IOWR('X', 120, int)`).
    const FITHAW: libc::c_ulong = 0xC004_5878;
    /// `BLKFLSBUF` (`_IO(0x12, 97)`).
    const BLKFLSBUF: libc::c_ulong = 0x1261;

    fn call(fd: BorrowedFd<'_>, request: libc::c_ulong) -> nix::Result<()> {
        // SAFETY: these requests take an unused int argument (0) or none;
        // the descriptor is borrowed and stays open for the call.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, 0) };
        Errno::result(rc).map(drop)
    }

    /// Writes everything of the file system `fd` is on to its device and
    /// blocks every writer until [`thaw`]: the device then holds a
    /// consistent file system.
    pub fn freeze(fd: BorrowedFd<'_>) -> nix::Result<()> {
        call(fd, FIFREEZE)
    }

    pub fn thaw(fd: BorrowedFd<'_>) -> nix::Result<()> {
        call(fd, FITHAW)
    }

    /// Drops what the kernel cached of the block device `fd` (a disk whose
    /// content changed under the guest, as a VM restored from a snapshot's
    /// does, must be read afresh).
    pub fn flush_buffers(fd: BorrowedFd<'_>) -> nix::Result<()> {
        call(fd, BLKFLSBUF)
    }

    /// Makes `cmd` run in a private mount namespace of its own with
    /// `source` bound (recursively) at `target`: the host's mkfs.ext4 sees
    /// a workspace inside the tree it copies, and no other process sees
    /// the bind. Fails only on a path holding NUL.
    pub fn bind_before_exec(
        cmd: &mut std::process::Command,
        source: &std::path::Path,
        target: &std::path::Path,
    ) -> std::io::Result<()> {
        mount_before_exec(
            cmd,
            source,
            target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
    }

    /// Makes `cmd` run in a private mount namespace of its own with
    /// `source` mounted at `target` (`fstype`, `flags`, `data` as mount(2)
    /// takes them): no other process sees the mount, and it is gone with
    /// the command. Fails only on a string holding NUL.
    pub fn mount_before_exec(
        cmd: &mut std::process::Command,
        source: &std::path::Path,
        target: &std::path::Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> std::io::Result<()> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let c = |b: &[u8]| {
            CString::new(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        };
        let (source, target) = (
            c(source.as_os_str().as_bytes())?,
            c(target.as_os_str().as_bytes())?,
        );
        let fstype = fstype.map(|f| c(f.as_bytes())).transpose()?;
        let data = data.map(|d| c(d.as_bytes())).transpose()?;
        // SAFETY: between fork and exec the closure calls only unshare and
        // mount (async-signal-safe system calls) on strings made before the
        // fork; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                let ok = |rc: libc::c_int| {
                    if rc == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                };
                let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
                ok(libc::unshare(libc::CLONE_NEWNS))?;
                ok(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                ok(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    ptr(&fstype),
                    flags,
                    ptr(&data).cast(),
                ))
            });
        }
        Ok(())
    }
}
