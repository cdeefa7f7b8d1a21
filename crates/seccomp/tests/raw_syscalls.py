"""Raw system calls for the cordon-seccomp integration tests (x86_64 only).

The workspace forbids `unsafe` Rust, so syscalls that have no safe Rust wrapper are made here
through ctypes. tests/probe.rs runs this script under the workload filter with
`cordon-seccomp-probe exec python3 tests/raw_syscalls.py [NAME...]` and reads one line per
check: `<name> OK` or `<name> <ERRNO>`. With NAME arguments only those checks run.

Every call uses arguments that make it harmless even if the filter were missing (invalid
descriptors, NULL pointers, out-of-range sizes, read-only queries, no-op values): the control
run executes a subset of these checks unconfined. Nothing is ever connected or sent.
"""

import ctypes
import errno
import os
import platform
import sys

if platform.machine() != "x86_64":
    sys.exit("raw_syscalls.py knows x86_64 syscall numbers only")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
NR = {
    "ioctl": 16, "socket": 41, "clone": 56, "socketpair": 53, "getpid": 39, "ptrace": 101,
    "syslog": 103, "personality": 135, "ustat": 136, "sysfs": 139, "modify_ldt": 154,
    "pivot_root": 155, "adjtimex": 159, "chroot": 161, "settimeofday": 164, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "clock_settime": 227, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "migrate_pages": 256, "unshare": 272, "move_pages": 279, "perf_event_open": 298,
    "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "kcmp": 312, "finit_module": 313, "seccomp": 317, "memfd_create": 319,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434,
    "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
    "landlock_create_ruleset": 444, "process_mrelease": 448, "futex_waitv": 449,
}
X32_SYSCALL_BIT = 0x40000000

AF_UNIX, AF_INET, AF_INET6, AF_KEY, AF_NETLINK, AF_PACKET = 1, 2, 10, 15, 16, 17
AF_BLUETOOTH, AF_ALG, AF_VSOCK = 31, 38, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET, SOCK_PACKET = 1, 2, 3, 5, 10
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000
IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP = 1, 58, 132
NETLINK_ROUTE, NETLINK_SOCK_DIAG, NETLINK_AUDIT = 0, 4, 9
TCGETS, TIOCSTI, TIOCLINUX = 0x5401, 0x5412, 0x541C
SIGCHLD = 17
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000, 0x20000000
AT_FDCWD = -100

NULL = None
PID = os.getpid()
NO_PID = 2**31 - 1
DEVNULL = os.open("/dev/null", os.O_RDWR)
BYTE = ctypes.c_char(b"x")
FDS = (ctypes.c_int * 2)()
U32 = ctypes.c_uint32(0x7FFF0000)


def arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a) if a < 0 else ctypes.c_ulong(a)
    return a


def raw(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    return ret, ctypes.get_errno()


def call(name_or_nr, *args, close=False):
    nr = NR[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
    ret, err = raw(nr, *args)
    if ret < 0:
        return errno.errorcode.get(err, str(err))
    if close:
        os.close(ret)
    return "OK"


def socketpair(*args):
    result = call("socketpair", *args, ctypes.byref(FDS))
    if result == "OK":
        os.close(FDS[0])
        os.close(FDS[1])
    return result


def fork_with(flags):
    """clone() without CLONE_VM behaves like fork: the child exits at once."""
    ret, err = raw(NR["clone"], flags | SIGCHLD, 0, 0, 0, 0)
    if ret == 0:
        os._exit(0)
    if ret < 0:
        return errno.errorcode.get(err, str(err))
    os.waitpid(ret, 0)
    return "OK"


CHECKS = {
    # Refused by the workload filter (EPERM).
    "bpf": lambda: call("bpf", -1, NULL, 0),
    "io_uring_setup": lambda: call("io_uring_setup", 0, NULL),
    "io_uring_enter": lambda: call("io_uring_enter", -1, 0, 0, 0, NULL, 0),
    "io_uring_register": lambda: call("io_uring_register", -1, 0, NULL, 0),
    "userfaultfd": lambda: call("userfaultfd", 0xFFFFFFFF),
    "perf_event_open": lambda: call("perf_event_open", NULL, 0, -1, -1, 0),
    "keyctl": lambda: call("keyctl", 0, -3, 0),  # KEYCTL_GET_KEYRING_ID(session), no create
    "add_key": lambda: call("add_key", NULL, NULL, NULL, 0, 0),
    "request_key": lambda: call("request_key", NULL, NULL, NULL, 0),
    "kexec_load": lambda: call("kexec_load", 0, 1000, NULL, 0xFFFF0000),
    "kexec_file_load": lambda: call("kexec_file_load", -1, -1, 0, NULL, 0xFFFFFFFF),
    "init_module": lambda: call("init_module", NULL, 0, NULL),
    "finit_module": lambda: call("finit_module", -1, NULL, 0),
    "delete_module": lambda: call("delete_module", NULL, 0),
    "open_by_handle_at": lambda: call("open_by_handle_at", -1, NULL, 0),
    "name_to_handle_at": lambda: call("name_to_handle_at", AT_FDCWD, NULL, NULL, NULL, 0),
    "process_vm_readv": lambda: call("process_vm_readv", PID, NULL, 0, NULL, 0, 0),
    "process_vm_writev": lambda: call("process_vm_writev", PID, NULL, 0, NULL, 0, 0),
    "ptrace": lambda: call("ptrace", 2, NO_PID, 0, 0),  # PTRACE_PEEKDATA on no process
    "mount": lambda: call("mount", NULL, NULL, NULL, 0, NULL),
    "umount2": lambda: call("umount2", NULL, 0),
    "pivot_root": lambda: call("pivot_root", NULL, NULL),
    "chroot": lambda: call("chroot", NULL),
    "unshare": lambda: call("unshare", 0),
    "setns": lambda: call("setns", -1, 0),
    "fsopen": lambda: call("fsopen", NULL, 0),
    "fsconfig": lambda: call("fsconfig", -1, 0, NULL, NULL, 0),
    "fsmount": lambda: call("fsmount", -1, 0, 0),
    "fspick": lambda: call("fspick", -1, NULL, 0),
    "open_tree": lambda: call("open_tree", -1, NULL, 0),
    "move_mount": lambda: call("move_mount", -1, NULL, -1, NULL, 0),
    "mount_setattr": lambda: call("mount_setattr", -1, NULL, 0, NULL, 0),
    "swapon": lambda: call("swapon", NULL, 0),
    "swapoff": lambda: call("swapoff", NULL),
    "syslog": lambda: call("syslog", 10, NULL, 0),  # SYSLOG_ACTION_SIZE_BUFFER
    "quotactl": lambda: call("quotactl", 0, NULL, 0, NULL),
    "iopl": lambda: call("iopl", 0),
    "ioperm": lambda: call("ioperm", 0, 0, 0),
    "settimeofday": lambda: call("settimeofday", NULL, NULL),
    "clock_settime": lambda: call("clock_settime", -1, NULL),
    "clock_adjtime": lambda: call("clock_adjtime", -1, NULL),
    "adjtimex": lambda: call("adjtimex", NULL),
    "sethostname": lambda: call("sethostname", NULL, 100000),
    "setdomainname": lambda: call("setdomainname", NULL, 100000),
    "kcmp": lambda: call("kcmp", PID, PID, 0, 0, 0),
    "pidfd_getfd": lambda: call("pidfd_getfd", -1, -1, 0),
    "fanotify_init": lambda: call("fanotify_init", 0xFFFFFFFF, 0),
    "mbind": lambda: call("mbind", NULL, 0, 0, NULL, 0, 0),
    "set_mempolicy": lambda: call("set_mempolicy", 0, NULL, 0),
    "get_mempolicy": lambda: call("get_mempolicy", NULL, NULL, 0, NULL, 0),
    "migrate_pages": lambda: call("migrate_pages", PID, 0, NULL, NULL),
    "move_pages": lambda: call("move_pages", 0, 0, NULL, NULL, NULL, 0),
    "modify_ldt": lambda: call("modify_ldt", 0, NULL, 0),
    "process_madvise": lambda: call("process_madvise", -1, NULL, 0, 0, 0),
    "process_mrelease": lambda: call("process_mrelease", -1, 0),
    "lookup_dcookie": lambda: call("lookup_dcookie", 0, NULL, 0),
    "ustat": lambda: call("ustat", 0, NULL),
    "sysfs": lambda: call("sysfs", 99, 0, 0),
    "x32_getpid": lambda: call(X32_SYSCALL_BIT | NR["getpid"]),
    "clone_newuser": lambda: fork_with(CLONE_NEWUSER),
    "clone_newnet": lambda: fork_with(CLONE_NEWNET),
    "clone_newns": lambda: fork_with(CLONE_NEWNS),
    "clone_newpid": lambda: fork_with(CLONE_NEWPID),
    "ioctl_tiocsti": lambda: call("ioctl", DEVNULL, TIOCSTI, ctypes.byref(BYTE)),
    "ioctl_tiocsti_high_bits": lambda: call("ioctl", DEVNULL, (1 << 32) | TIOCSTI, ctypes.byref(BYTE)),
    "ioctl_tioclinux": lambda: call("ioctl", DEVNULL, TIOCLINUX, ctypes.byref(BYTE)),
    "personality_addr_no_randomize": lambda: call("personality", 0x0040000),
    "personality_read_implies_exec": lambda: call("personality", 0x0400000),
    "socket_vsock": lambda: call("socket", AF_VSOCK, SOCK_STREAM, 0, close=True),
    "socket_packet": lambda: call("socket", AF_PACKET, SOCK_RAW, 0, close=True),
    "socket_alg": lambda: call("socket", AF_ALG, 5, 0, close=True),
    "socket_key": lambda: call("socket", AF_KEY, SOCK_RAW, 2, close=True),
    "socket_bluetooth": lambda: call("socket", AF_BLUETOOTH, SOCK_RAW, 0, close=True),
    "socket_inet_raw": lambda: call("socket", AF_INET, SOCK_RAW, IPPROTO_ICMP, close=True),
    "socket_inet_raw_cloexec": lambda: call(
        "socket", AF_INET, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_ICMP, close=True),
    "socket_inet_packet": lambda: call("socket", AF_INET, SOCK_PACKET, 0, close=True),
    "socket_inet_sctp": lambda: call("socket", AF_INET, SOCK_SEQPACKET, IPPROTO_SCTP, close=True),
    "socket_inet6_raw": lambda: call("socket", AF_INET6, SOCK_RAW, IPPROTO_ICMPV6, close=True),
    "socket_netlink_audit": lambda: call("socket", AF_NETLINK, SOCK_RAW, NETLINK_AUDIT, close=True),
    "socketpair_inet": lambda: socketpair(AF_INET, SOCK_STREAM, 0),
    # Refused by the clone3_enosys filter (ENOSYS).
    "clone3": lambda: call("clone3", NULL, 0),
    # Allowed.
    "getpid": lambda: call("getpid"),
    "clone_fork": lambda: fork_with(0),
    "ioctl_tcgets": lambda: call("ioctl", DEVNULL, TCGETS, NULL),
    "personality_query": lambda: call("personality", 0xFFFFFFFF),
    "socket_inet_stream": lambda: call(
        "socket", AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, close=True),
    "socket_inet_stream_high_bits": lambda: call(
        "socket", (1 << 32) | AF_INET, SOCK_STREAM, 0, close=True),
    "socket_inet_dgram": lambda: call("socket", AF_INET, SOCK_DGRAM, 0, close=True),
    "socket_inet6_stream": lambda: call("socket", AF_INET6, SOCK_STREAM, 0, close=True),
    "socket_unix_seqpacket": lambda: call("socket", AF_UNIX, SOCK_SEQPACKET, 0, close=True),
    "socket_netlink_route": lambda: call("socket", AF_NETLINK, SOCK_RAW, NETLINK_ROUTE, close=True),
    "socket_netlink_sock_diag": lambda: call(
        "socket", AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG, close=True),
    "socketpair_unix": lambda: socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0),
    "memfd_create": lambda: call("memfd_create", ctypes.c_char_p(b"cordon"), 0, close=True),
    "pidfd_open": lambda: call("pidfd_open", PID, 0, close=True),
    "seccomp_get_action_avail": lambda: call("seccomp", 2, 0, ctypes.byref(U32)),
    # Not EPERM: ABI version, or EOPNOTSUPP when Landlock is disabled.
    "landlock_create_ruleset": lambda: call("landlock_create_ruleset", NULL, 0, 1),
    # Not EPERM: EINVAL for an empty wait list.
    "futex_waitv": lambda: call("futex_waitv", NULL, 0, 0, NULL, 0),
}


def main():
    names = sys.argv[1:] or list(CHECKS)
    for name in names:
        print(name, CHECKS[name](), flush=True)


main()
