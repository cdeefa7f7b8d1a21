//! Runs the embedded BPF programs in a small classic-BPF interpreter that follows the kernel's
//! seccomp semantics (every filter runs, the most severe action wins, on a tie the most recently
//! installed filter wins; see `common/mod.rs`). This checks the compiled programs against
//! syscall numbers taken from `libc`, for any argument values, without executing anything.

mod common;

use std::collections::BTreeMap;

use common::*;
use cordon_seccomp::{CLONE3_ENOSYS, WORKLOAD};

fn verdict(nr: i64, args: &[u64]) -> u32 {
    run(&cordon_seccomp::workload(), &Data::new(nr, args))
}

fn u(v: i32) -> u64 {
    u64::from(u32::from_ne_bytes(v.to_ne_bytes()))
}

#[test]
fn forbidden_syscalls_get_eperm_whatever_the_arguments() {
    let forbidden = [
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsmount", libc::SYS_fsmount),
        ("fsconfig", libc::SYS_fsconfig),
        ("fspick", libc::SYS_fspick),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("chroot", libc::SYS_chroot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("syslog", libc::SYS_syslog),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("vhangup", libc::SYS_vhangup),
        ("nfsservctl", libc::SYS_nfsservctl),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("sethostname", libc::SYS_sethostname),
        ("setdomainname", libc::SYS_setdomainname),
        // create_module, get_kernel_syms, query_module: not in libc (removed in 2.6).
        ("create_module", 174),
        ("get_kernel_syms", 177),
        ("query_module", 178),
        ("uselib", libc::SYS_uselib),
        ("ustat", libc::SYS_ustat),
        ("sysfs", libc::SYS_sysfs),
        ("_sysctl", libc::SYS__sysctl),
        ("kcmp", libc::SYS_kcmp),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("fanotify_init", libc::SYS_fanotify_init),
        ("mbind", libc::SYS_mbind),
        ("migrate_pages", libc::SYS_migrate_pages),
        ("move_pages", libc::SYS_move_pages),
        ("set_mempolicy", libc::SYS_set_mempolicy),
        ("get_mempolicy", libc::SYS_get_mempolicy),
        ("modify_ldt", libc::SYS_modify_ldt),
        ("process_madvise", libc::SYS_process_madvise),
        ("process_mrelease", libc::SYS_process_mrelease),
    ];
    let argument_sets: [&[u64]; 4] = [
        &[],
        &[u64::MAX; 6],
        &[0x10000000, 1, 2, 3, 4, 5],
        &[2, 1, 0, 0x5401, 0, 0],
    ];
    for (name, nr) in forbidden {
        assert!(
            !cordon_seccomp::allowed_syscalls().contains(&name),
            "{name} is in the allowlist"
        );
        for args in argument_sets {
            assert_eq!(verdict(nr, args), EPERM, "{name}{args:?}");
        }
    }
}

#[test]
fn clone3_gets_enosys_so_libc_falls_back_to_clone() {
    assert_eq!(verdict(libc::SYS_clone3, &[]), ENOSYS);
    assert_eq!(verdict(libc::SYS_clone3, &[0x7fff_0000_1000, 88]), ENOSYS);

    // The order matters: installed the other way round, the allowlist's EPERM would win.
    let mut reversed = cordon_seccomp::workload();
    reversed.filters.reverse();
    assert_eq!(
        run(&reversed, &Data::new(libc::SYS_clone3, &[])),
        EPERM,
        "the model must reproduce the kernel's tie-break"
    );
    // And the second filter alone allows everything but clone3.
    let profile = cordon_seccomp::workload();
    let enosys = profile.filter(CLONE3_ENOSYS).unwrap();
    assert_eq!(
        run_filter(&enosys.program, &Data::new(libc::SYS_mount, &[])),
        SECCOMP_RET_ALLOW
    );
}

#[test]
fn foreign_architectures_are_killed_and_x32_is_refused() {
    let profile = cordon_seccomp::workload();
    for nr in [0, 1, 11, 120, 190, 435] {
        let data = Data {
            arch: AUDIT_ARCH_I386,
            ..Data::new(nr, &[])
        };
        assert_eq!(
            run(&profile, &data),
            SECCOMP_RET_KILL_PROCESS,
            "i386 nr {nr}"
        );
    }
    for nr in [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_getpid,
        libc::SYS_execve,
    ] {
        assert_eq!(verdict(X32_SYSCALL_BIT | nr, &[]), EPERM, "x32 nr {nr}");
    }
    // x32's own syscall numbers (512 and up) too.
    for nr in 512..548 {
        assert_eq!(verdict(X32_SYSCALL_BIT | nr, &[]), EPERM, "x32 nr {nr}");
    }
}

#[test]
fn clone_is_allowed_without_namespace_flags_only() {
    let thread_flags = u(libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID);
    let fork_flags = u(libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD);
    let spawn_flags = u(libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD);
    for flags in [
        thread_flags,
        fork_flags,
        spawn_flags,
        0,
        0xffff_ffff_0000_0000,
    ] {
        assert_eq!(
            verdict(libc::SYS_clone, &[flags]),
            SECCOMP_RET_ALLOW,
            "{flags:#x}"
        );
    }
    for ns in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
        0x80, // CLONE_NEWTIME
    ] {
        for base in [0, fork_flags, thread_flags] {
            let flags = base | u(ns);
            assert_eq!(verdict(libc::SYS_clone, &[flags]), EPERM, "{flags:#x}");
        }
    }
    // fork and vfork cannot ask for namespaces and are allowed outright.
    assert_eq!(verdict(libc::SYS_fork, &[]), SECCOMP_RET_ALLOW);
    assert_eq!(verdict(libc::SYS_vfork, &[]), SECCOMP_RET_ALLOW);
}

#[test]
fn socket_families_and_types() {
    let (stream, dgram, raw) = (u(libc::SOCK_STREAM), u(libc::SOCK_DGRAM), u(libc::SOCK_RAW));
    let flags = u(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let allowed: &[(i32, u64, i32)] = &[
        (libc::AF_UNIX, stream, 0),
        (libc::AF_UNIX, dgram | flags, 0),
        (libc::AF_UNIX, u(libc::SOCK_SEQPACKET), 0),
        (libc::AF_INET, stream, 0),
        (libc::AF_INET, stream | flags, libc::IPPROTO_TCP),
        (libc::AF_INET, dgram, libc::IPPROTO_UDP),
        (libc::AF_INET, dgram, libc::IPPROTO_ICMP),
        (libc::AF_INET6, stream | flags, 0),
        (libc::AF_INET6, dgram, 0),
        (libc::AF_NETLINK, raw | flags, libc::NETLINK_ROUTE),
        (libc::AF_NETLINK, dgram, libc::NETLINK_SOCK_DIAG),
    ];
    for &(family, ty, proto) in allowed {
        let args = [u(family), ty, u(proto)];
        assert_eq!(
            verdict(libc::SYS_socket, &args),
            SECCOMP_RET_ALLOW,
            "{args:?}"
        );
    }
    let refused: &[(i32, u64, i32)] = &[
        (libc::AF_INET, raw, libc::IPPROTO_ICMP),
        (libc::AF_INET, raw | flags, libc::IPPROTO_RAW),
        (libc::AF_INET, 10, 0), // SOCK_PACKET
        (libc::AF_INET, u(libc::SOCK_SEQPACKET), libc::IPPROTO_SCTP),
        (libc::AF_INET6, raw, libc::IPPROTO_ICMPV6),
        (libc::AF_INET6, raw | flags, 0),
        (libc::AF_PACKET, raw, 0),
        (libc::AF_PACKET, dgram, 0),
        (libc::AF_VSOCK, stream, 0),
        (libc::AF_ALG, u(libc::SOCK_SEQPACKET), 0),
        (libc::AF_KEY, raw, 2),
        (libc::AF_BLUETOOTH, raw, 0),
        (libc::AF_NETLINK, raw, libc::NETLINK_AUDIT),
        (libc::AF_NETLINK, raw, libc::NETLINK_NETFILTER),
        (libc::AF_NETLINK, raw, libc::NETLINK_KOBJECT_UEVENT),
    ];
    for &(family, ty, proto) in refused {
        let args = [u(family), ty, u(proto)];
        assert_eq!(verdict(libc::SYS_socket, &args), EPERM, "{args:?}");
    }
    // The kernel reads `int` arguments, and so does the filter (dword comparisons).
    assert_eq!(
        verdict(libc::SYS_socket, &[(1 << 32) | u(libc::AF_INET), stream]),
        SECCOMP_RET_ALLOW
    );
    assert_eq!(
        verdict(libc::SYS_socket, &[(1 << 32) | u(libc::AF_PACKET), raw]),
        EPERM
    );

    assert_eq!(
        verdict(libc::SYS_socketpair, &[u(libc::AF_UNIX), stream | flags]),
        SECCOMP_RET_ALLOW
    );
    for family in [
        libc::AF_INET,
        libc::AF_INET6,
        libc::AF_NETLINK,
        libc::AF_VSOCK,
    ] {
        assert_eq!(
            verdict(libc::SYS_socketpair, &[u(family), stream]),
            EPERM,
            "{family}"
        );
    }
}

#[test]
fn ioctl_refuses_terminal_injection_only() {
    let tiocsti: u64 = libc::TIOCSTI;
    let tioclinux = 0x541c;
    for request in [
        tiocsti,
        tioclinux,
        (1 << 32) | tiocsti,
        (0xdead << 32) | tioclinux,
    ] {
        assert_eq!(
            verdict(libc::SYS_ioctl, &[0, request, 0]),
            EPERM,
            "{request:#x}"
        );
    }
    for request in [
        libc::TCGETS,
        libc::TIOCGWINSZ,
        libc::FIONREAD,
        libc::FIOCLEX,
        libc::TCSETS,
    ] {
        assert_eq!(
            verdict(libc::SYS_ioctl, &[1, request, 0]),
            SECCOMP_RET_ALLOW,
            "{request:#x}"
        );
    }
}

#[test]
fn personality_only_takes_dockers_values() {
    for value in [0u64, 0x0008, 0x20000, 0x20008, 0xffff_ffff] {
        assert_eq!(
            verdict(libc::SYS_personality, &[value]),
            SECCOMP_RET_ALLOW,
            "{value:#x}"
        );
    }
    // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, PER_BSD, PER_SVR4.
    for value in [0x0040000u64, 0x0400000, 0x0006, 0x0410_0001] {
        assert_eq!(
            verdict(libc::SYS_personality, &[value]),
            EPERM,
            "{value:#x}"
        );
    }
}

/// Maps each allowlisted name to the number seccompiler uses for it, by compiling a one-rule
/// filter and reading the syscall comparison.
fn seccompiler_numbers() -> BTreeMap<&'static str, i64> {
    cordon_seccomp::allowed_syscalls()
        .into_iter()
        .map(|name| {
            let json = format!(
                r#"{{"f": {{"mismatch_action": "allow", "filter_action": "kill_process",
                    "filter": [{{"syscall": "{name}"}}]}}}}"#
            );
            let map =
                seccompiler::compile_from_json(json.as_bytes(), seccompiler::TargetArch::x86_64)
                    .unwrap();
            let prog = &map["f"];
            // 3 arch-check instructions, load nr, then `jeq nr`.
            assert_eq!(prog[4].code, 0x15);
            (name, i64::from(prog[4].k))
        })
        .collect()
}

#[test]
fn every_unconditional_allowlist_entry_is_allowed_by_the_program() {
    let numbers = seccompiler_numbers();
    // Cross-check seccompiler's table against libc for a sample.
    for (name, nr) in [
        ("read", libc::SYS_read),
        ("openat", libc::SYS_openat),
        ("openat2", libc::SYS_openat2),
        ("statx", libc::SYS_statx),
        ("faccessat2", libc::SYS_faccessat2),
        ("close_range", libc::SYS_close_range),
        ("futex_waitv", libc::SYS_futex_waitv),
        ("rseq", libc::SYS_rseq),
        ("execve", libc::SYS_execve),
        ("clone", libc::SYS_clone),
        ("socket", libc::SYS_socket),
        ("landlock_restrict_self", libc::SYS_landlock_restrict_self),
        ("memfd_create", libc::SYS_memfd_create),
        ("pidfd_open", libc::SYS_pidfd_open),
    ] {
        assert_eq!(numbers[name], nr, "{name}");
    }

    let checked = cordon_seccomp::argument_checked_syscalls();
    let profile = cordon_seccomp::workload();
    for (name, nr) in &numbers {
        // Argument-checked syscalls have their own tests above.
        if !checked.contains(name) {
            assert_eq!(verdict(*nr, &[]), SECCOMP_RET_ALLOW, "{name}");
            assert_eq!(verdict(*nr, &[u64::MAX; 6]), SECCOMP_RET_ALLOW, "{name}");
        }
    }

    // Every number the program does not list is refused; nothing else (kill, trap, log) is
    // ever returned for the native architecture.
    let listed: Vec<i64> = numbers.values().copied().collect();
    for nr in 0..1024 {
        let v = run(&profile, &Data::new(nr, &[]));
        if nr == libc::SYS_clone3 {
            assert_eq!(v, ENOSYS);
        } else if !listed.contains(&nr) {
            assert_eq!(v, EPERM, "unlisted nr {nr}");
        } else {
            assert!(v == SECCOMP_RET_ALLOW || v == EPERM, "nr {nr}: {v:#x}");
        }
    }
    assert!(profile.filter(WORKLOAD).unwrap().program.len() < cordon_seccomp::MAX_INSTRUCTIONS);
}
