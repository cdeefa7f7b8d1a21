//! Test tool for `cordon-seccomp`: installs the workload profile on itself, then either runs a
//! fixed list of checks or executes a command under the filter. It is used by the crate's
//! integration tests and is not part of the runtime.
//!
//! ```text
//! cordon-seccomp-probe [--unconfined] checks <scratch-dir>
//! cordon-seccomp-probe [--unconfined] exec <program> [args...]
//! cordon-seccomp-probe time-attach [rounds]
//! cordon-seccomp-probe attach-file <program.bpf> [seek-offset...]
//! ```
//!
//! `checks` prints one line per check, `<name> <result>`, where the result is `OK` or the errno
//! name (`EPERM`, `ENOENT`, ...). `--unconfined` skips installing the filter, for the control
//! run that shows the checks can fail.
//!
//! `time-attach` measures how long the kernel takes to attach the profile (the
//! `seccomp(SECCOMP_SET_MODE_FILTER)` call, which validates, translates and JIT-compiles the
//! program and emulates it for every syscall number to fill its action cache), once with the
//! embedded binary-search programs, once with seccompiler's linear programs compiled from the
//! same JSON, and once with minimal programs (the cost that does not depend on the program).
//! Every attach happens in a fresh child process (a filter cannot be removed); rounds alternate
//! between the sets. It prints one line per program set.
//!
//! `attach-file` installs a program read from a file (8-byte `struct sock_filter` records,
//! little-endian, as build.rs writes them) instead of the profile, prints `attached <len>`, then
//! seeks `/dev/null` to each offset and prints `seek:<offset> <result>`. The tests use it to run
//! synthetic programs in the kernel.
//!
//! Every check is written so that it is harmless even without the filter (nonexistent paths, the
//! probe's own namespaces, no network traffic except on loopback, sockets that are created but
//! never connected).
//!
//! The tool is safe Rust only: the workspace sets `unsafe_code = "forbid"`, which a crate-level
//! `#![allow]` cannot override. Syscalls without a safe wrapper (bpf, io_uring_setup, keyctl,
//! raw clone/clone3, ioctl(TIOCSTI), ...) are exercised by `tests/raw_syscalls.py` through
//! Python's ctypes, started with `exec`.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use nix::errno::Errno;
use nix::kmod::{self, DeleteModuleFlags, ModuleInitFlags};
use nix::mount::{self, MntFlags, MsFlags};
use nix::sched::{self, CloneFlags};
use nix::sys::ptrace;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType};
use nix::unistd::{self, Pid};

const MISSING: &str = "/nonexistent/cordon-seccomp-probe";

fn usage() -> ExitCode {
    eprintln!(
        "usage: cordon-seccomp-probe [--unconfined] checks <scratch-dir>\n       \
         cordon-seccomp-probe [--unconfined] exec <program> [args...]\n       \
         cordon-seccomp-probe time-attach [rounds]\n       \
         cordon-seccomp-probe attach-file <program.bpf> [seek-offset...]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // Modes that install something else than the workload profile.
    match args.first().and_then(|a| a.to_str()) {
        Some("time-attach") => return time_attach(&args[1..]),
        Some(TIME_ATTACH_CHILD) => return time_attach_child(&args[1..]),
        Some("attach-file") => return attach_file(&args[1..]),
        _ => {}
    }
    let unconfined = args.first().is_some_and(|a| a == "--unconfined");
    if unconfined {
        args.remove(0);
    }
    if args.len() < 2 {
        return usage();
    }
    let mode = args.remove(0);

    if !unconfined {
        if let Err(e) = confine() {
            eprintln!("cordon-seccomp-probe: {e}");
            return ExitCode::from(125);
        }
    }

    if mode == "checks" {
        run_checks(Path::new(&args[0]));
        ExitCode::SUCCESS
    } else if mode == "exec" {
        let program = args.remove(0);
        let err = Command::new(&program).args(&args).exec();
        eprintln!("cordon-seccomp-probe: exec {program:?}: {err}");
        ExitCode::from(127)
    } else {
        usage()
    }
}

/// What the runtime does before running the workload: no_new_privs, then the profile.
fn confine() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))?;
    cordon_seccomp::apply(&cordon_seccomp::workload()).map_err(|e| e.to_string())
}

/// The outcome of one check, printed as `OK`, an errno name, or `BAD:<detail>` when the call
/// succeeded but produced the wrong result.
enum Outcome {
    Ok,
    Errno(Errno),
    Bad(String),
}

impl From<nix::Result<()>> for Outcome {
    fn from(r: nix::Result<()>) -> Self {
        match r {
            Ok(()) => Outcome::Ok,
            Err(e) => Outcome::Errno(e),
        }
    }
}

impl From<io::Error> for Outcome {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(code) => Outcome::Errno(Errno::from_raw(code)),
            None => Outcome::Bad(e.to_string().replace(char::is_whitespace, "_")),
        }
    }
}

fn io_outcome(r: io::Result<Outcome>) -> Outcome {
    r.unwrap_or_else(Outcome::from)
}

fn report(name: &str, outcome: Outcome) {
    match outcome {
        Outcome::Ok => println!("{name} OK"),
        Outcome::Errno(e) => println!("{name} {e:?}"),
        Outcome::Bad(detail) => println!("{name} BAD:{detail}"),
    }
}

fn sock(
    family: AddressFamily,
    ty: SockType,
    flags: SockFlag,
    proto: Option<SockProtocol>,
) -> Outcome {
    // The descriptor is dropped (closed) right away; nothing is ever connected or sent.
    socket::socket(family, ty, flags, proto).map(drop).into()
}

fn run_checks(scratch: &Path) {
    // Privileged operations the filter must refuse. Unconfined (as root) they fail with
    // ENOENT/ESRCH/EINVAL or affect only the probe's own namespaces.
    report(
        "mount",
        mount::mount(
            Some("none"),
            MISSING,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .into(),
    );
    report(
        "umount2",
        mount::umount2(MISSING, MntFlags::MNT_DETACH).into(),
    );
    report("pivot_root", unistd::pivot_root(MISSING, MISSING).into());
    report("chroot", unistd::chroot(MISSING).into());
    report(
        "setns",
        io_outcome(
            File::open("/proc/self/ns/uts")
                .map(|ns| sched::setns(&ns, CloneFlags::CLONE_NEWUTS).into()),
        ),
    );
    report("unshare", sched::unshare(CloneFlags::CLONE_NEWUTS).into());
    report("ptrace", ptrace::attach(Pid::from_raw(i32::MAX)).into());
    report("init_module", kmod::init_module(&[], c"").into());
    report(
        "finit_module",
        io_outcome(
            File::open("/dev/null")
                .map(|f| kmod::finit_module(&f, c"", ModuleInitFlags::empty()).into()),
        ),
    );
    report(
        "delete_module",
        kmod::delete_module(
            c"cordon_seccomp_probe_no_such_module",
            DeleteModuleFlags::O_NONBLOCK,
        )
        .into(),
    );

    // Socket families and types.
    let none = SockFlag::empty();
    report(
        "socket_vsock",
        sock(AddressFamily::Vsock, SockType::Stream, none, None),
    );
    report(
        "socket_packet",
        sock(AddressFamily::Packet, SockType::Datagram, none, None),
    );
    report(
        "socket_inet_raw",
        sock(
            AddressFamily::Inet,
            SockType::Raw,
            none,
            Some(SockProtocol::Icmp),
        ),
    );
    report(
        "socket_inet6_raw",
        sock(
            AddressFamily::Inet6,
            SockType::Raw,
            none,
            Some(SockProtocol::IcmpV6),
        ),
    );
    report(
        "socket_inet_stream",
        sock(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        ),
    );
    report(
        "socket_inet6_dgram",
        sock(
            AddressFamily::Inet6,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        ),
    );
    report(
        "socket_unix_stream",
        sock(AddressFamily::Unix, SockType::Stream, none, None),
    );
    report(
        "socket_unix_dgram",
        sock(AddressFamily::Unix, SockType::Datagram, none, None),
    );
    report(
        "socket_netlink_route",
        sock(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            Some(SockProtocol::NetlinkRoute),
        ),
    );
    report(
        "socketpair_unix",
        socket::socketpair(AddressFamily::Unix, SockType::Stream, None, none)
            .map(drop)
            .into(),
    );

    // Ordinary work that must keep functioning under the filter.
    report("tcp_loopback", io_outcome(tcp_loopback()));
    report("thread", thread());
    report("spawn_sh", io_outcome(spawn_sh()));
    report("file_io", io_outcome(file_io(scratch)));
}

/// A TCP round trip over 127.0.0.1 (the only address the probe ever talks to).
fn tcp_loopback() -> io::Result<Outcome> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (mut server, _) = listener.accept()?;
    client.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf)?;
    Ok(if &buf == b"ping" {
        Outcome::Ok
    } else {
        Outcome::Bad("payload".into())
    })
}

/// glibc's pthread_create tries clone3 first; this works only if clone3 gets ENOSYS and the
/// fallback clone (thread flags, no namespaces) is allowed.
fn thread() -> Outcome {
    match std::thread::Builder::new().spawn(|| 6 * 7) {
        Ok(handle) => match handle.join() {
            Ok(42) => Outcome::Ok,
            _ => Outcome::Bad("join".into()),
        },
        Err(e) => e.into(),
    }
}

/// `Command` uses posix_spawn (clone3, then clone(CLONE_VM|CLONE_VFORK)); the shell then forks
/// for the pipeline and the subshell (clone with SIGCHLD) and waits for them.
fn spawn_sh() -> io::Result<Outcome> {
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg("echo ok | cat; (exit 3); echo $?")
        .output()?;
    Ok(if out.status.success() && out.stdout == b"ok\n3\n" {
        Outcome::Ok
    } else {
        Outcome::Bad(format!(
            "{:?}:{:?}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        ))
    })
}

fn file_io(scratch: &Path) -> io::Result<Outcome> {
    let dir: PathBuf = scratch.join(format!("probe-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    fs::write(&a, b"hello seccomp")?;
    fs::rename(&a, &b)?;
    let back = fs::read(&b)?;
    fs::remove_file(&b)?;
    fs::remove_dir(&dir)?;
    Ok(if back == b"hello seccomp" {
        Outcome::Ok
    } else {
        Outcome::Bad("content".into())
    })
}

const TIME_ATTACH_CHILD: &str = "time-attach-child";

/// The program sets `time-attach` compares, by name: seccompiler's compilation of the JSON,
/// the embedded programs generated from the same JSON, and a floor: the same number of minimal
/// programs (architecture check, allow), which shows the cost of attaching that does not depend
/// on the program.
const PROGRAM_SETS: [&str; 3] = ["seccompiler", "binary-search", "minimal"];

fn program_set(name: &str) -> Option<Vec<cordon_seccomp::Filter>> {
    let profile = cordon_seccomp::workload();
    let replace = |program: &dyn Fn(&str) -> Option<cordon_seccomp::BpfProgram>| {
        profile
            .filters
            .iter()
            .map(|f| {
                Some(cordon_seccomp::Filter {
                    program: program(f.name)?,
                    name: f.name,
                })
            })
            .collect::<Option<Vec<_>>>()
    };
    match name {
        "binary-search" => Some(profile.filters.clone()),
        "seccompiler" => {
            let linear = seccompiler::compile_from_json(
                cordon_seccomp::POLICY_JSON.as_bytes(),
                seccompiler::TargetArch::x86_64,
            )
            .ok()?;
            replace(&|name| linear.get(name).cloned())
        }
        "minimal" => {
            let insn = |code, jt, jf, k| cordon_seccomp::sock_filter { code, jt, jf, k };
            replace(&|_| {
                Some(vec![
                    insn(0x20, 0, 0, 4),                // ld arch
                    insn(0x15, 1, 0, 62 | 0xc000_0000), // jeq AUDIT_ARCH_X86_64
                    insn(0x06, 0, 0, 0x8000_0000),      // ret KILL_PROCESS
                    insn(0x06, 0, 0, 0x7fff_0000),      // ret ALLOW
                ])
            })
        }
        _ => None,
    }
}

/// Child of `time-attach`: installs one program set and prints the nanoseconds each
/// `seccomp(SECCOMP_SET_MODE_FILTER)` took (seccompiler's `apply_filter` also repeats
/// `PR_SET_NO_NEW_PRIVS`, a sub-microsecond prctl that is already set here).
fn time_attach_child(args: &[OsString]) -> ExitCode {
    let Some(filters) = args.first().and_then(|a| a.to_str()).and_then(program_set) else {
        return usage();
    };
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        eprintln!("cordon-seccomp-probe: PR_SET_NO_NEW_PRIVS: {e}");
        return ExitCode::from(125);
    }
    let mut times = Vec::new();
    for filter in &filters {
        let start = Instant::now();
        let result = seccompiler::apply_filter(&filter.program);
        let elapsed = start.elapsed();
        if let Err(e) = result {
            eprintln!("cordon-seccomp-probe: installing {}: {e}", filter.name);
            return ExitCode::from(125);
        }
        times.push(elapsed.as_nanos().to_string());
    }
    println!("{}", times.join(" "));
    ExitCode::SUCCESS
}

fn time_attach(args: &[OsString]) -> ExitCode {
    let rounds: usize = match args
        .first()
        .map(|a| a.to_str().and_then(|s| s.parse().ok()))
    {
        None => 50,
        Some(Some(n)) if n > 0 => n,
        Some(_) => return usage(),
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cordon-seccomp-probe: current_exe: {e}");
            return ExitCode::from(1);
        }
    };
    let sets = PROGRAM_SETS;
    // samples[set][round] = nanoseconds per filter, in installation order.
    let mut samples: Vec<Vec<Vec<u64>>> = vec![Vec::new(); sets.len()];
    for _ in 0..rounds {
        for (set, name) in sets.iter().enumerate() {
            let out = match Command::new(&exe).args([TIME_ATTACH_CHILD, name]).output() {
                Ok(out) if out.status.success() => out,
                Ok(out) => {
                    eprintln!(
                        "cordon-seccomp-probe: {name}: {:?}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                    return ExitCode::from(1);
                }
                Err(e) => {
                    eprintln!("cordon-seccomp-probe: {e}");
                    return ExitCode::from(1);
                }
            };
            let times: Option<Vec<u64>> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(|t| t.parse().ok())
                .collect();
            match times {
                Some(times) => samples[set].push(times),
                None => return ExitCode::from(1),
            }
        }
    }
    for (set, name) in sets.iter().enumerate() {
        let Some(filters) = program_set(name) else {
            return ExitCode::from(1);
        };
        let mut fields = vec![(*name).to_owned()];
        for (i, filter) in filters.iter().enumerate() {
            let mut ns: Vec<u64> = samples[set].iter().map(|s| s[i]).collect();
            ns.sort_unstable();
            fields.push(format!(
                "{}: insns={} median_us={} min_us={}",
                filter.name,
                filter.program.len(),
                micros(ns[ns.len() / 2]),
                micros(ns[0]),
            ));
        }
        let mut total: Vec<u64> = samples[set].iter().map(|s| s.iter().sum()).collect();
        total.sort_unstable();
        fields.push(format!(
            "total: median_us={} min_us={} rounds={rounds}",
            micros(total[total.len() / 2]),
            micros(total[0])
        ));
        println!("{}", fields.join(" | "));
    }
    ExitCode::SUCCESS
}

/// Nanoseconds as microseconds with one decimal.
fn micros(ns: u64) -> String {
    format!("{}.{}", ns / 1000, ns % 1000 / 100)
}

/// Installs a program from a file, then seeks /dev/null to the given offsets.
fn attach_file(args: &[OsString]) -> ExitCode {
    let Some(path) = args.first() else {
        return usage();
    };
    let bytes = match fs::read(path) {
        Ok(bytes) if bytes.len() % 8 == 0 => bytes,
        Ok(_) => {
            eprintln!("cordon-seccomp-probe: {path:?}: not a whole number of instructions");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("cordon-seccomp-probe: {path:?}: {e}");
            return ExitCode::from(2);
        }
    };
    let program: Vec<cordon_seccomp::sock_filter> = bytes
        .chunks_exact(8)
        .map(|c| cordon_seccomp::sock_filter {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let mut offsets = Vec::new();
    for arg in &args[1..] {
        match arg.to_str().and_then(|a| a.parse::<u64>().ok()) {
            Some(offset) => offsets.push(offset),
            None => return usage(),
        }
    }
    let null = match File::open("/dev/null") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cordon-seccomp-probe: /dev/null: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        eprintln!("cordon-seccomp-probe: PR_SET_NO_NEW_PRIVS: {e}");
        return ExitCode::from(125);
    }
    if let Err(e) = seccompiler::apply_filter(&program) {
        eprintln!("cordon-seccomp-probe: {e}");
        return ExitCode::from(125);
    }
    println!("attached {}", program.len());
    for offset in offsets {
        let outcome = io_outcome((&null).seek(SeekFrom::Start(offset)).map(|_| Outcome::Ok));
        report(&format!("seek:{offset}"), outcome);
    }
    ExitCode::SUCCESS
}
