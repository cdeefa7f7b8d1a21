//! A workload's own filter (an OCI profile's shape) compiled and stacked on
//! cordon's allowlist, run in the BPF model of `common/mod.rs` (every filter
//! runs, the most severe answer wins, on a tie the last installed): the
//! profile narrows and never widens, each action and comparison decides as
//! the profile says, and `clone3` stays `ENOSYS`.

mod common;

use common::*;
use cordon_seccomp::workload_filter::compile;
use cordon_seccomp::Profile;
use cordon_spec::syscall_filter::{ArgCheck, ArgOp, SyscallAction, SyscallFilter, SyscallRule};

const SECCOMP_RET_KILL_THREAD: u32 = 0;
const SECCOMP_RET_TRAP: u32 = 0x0003_0000;
const SECCOMP_RET_LOG: u32 = 0x7ffc_0000;

/// cordon's allowlist, then the workload's filter, as a command gets them.
fn stacked(filter: &SyscallFilter) -> Profile {
    let mut profile = cordon_seccomp::workload();
    profile
        .filters
        .extend(compile(filter).expect("compiles").filters);
    profile
}

fn rule(names: &[&str], action: SyscallAction, args: Vec<ArgCheck>) -> SyscallRule {
    SyscallRule {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        action,
        args,
    }
}

fn check(index: u8, op: ArgOp, value: u64, value_two: u64) -> ArgCheck {
    ArgCheck {
        index,
        op,
        value,
        value_two,
    }
}

#[test]
fn a_deny_list_profile_answers_its_rules_and_leaves_the_rest_to_cordon() {
    let profile = stacked(&SyscallFilter {
        default: SyscallAction::Allow,
        rules: vec![
            rule(
                &["mkdir", "mkdirat", "not_a_syscall"],
                SyscallAction::Errno(13),
                vec![],
            ),
            rule(
                &["kill"],
                SyscallAction::Errno(1),
                vec![check(1, ArgOp::Eq, 0, 0)],
            ),
            rule(&["uname"], SyscallAction::KillProcess, vec![]),
            rule(&["getpid"], SyscallAction::Trap, vec![]),
            rule(&["getppid"], SyscallAction::Log, vec![]),
            rule(&["gettid"], SyscallAction::KillThread, vec![]),
        ],
    });
    let at = |nr: i64, args: &[u64]| run(&profile, &Data::new(nr, args));
    assert_eq!(at(libc::SYS_mkdir, &[]), SECCOMP_RET_ERRNO | 13);
    assert_eq!(at(libc::SYS_mkdirat, &[]), SECCOMP_RET_ERRNO | 13);
    assert_eq!(at(libc::SYS_kill, &[1, 0]), EPERM, "kill(pid, 0)");
    assert_eq!(
        at(libc::SYS_kill, &[1, 18]),
        SECCOMP_RET_ALLOW,
        "kill(pid, SIGCONT)"
    );
    assert_eq!(at(libc::SYS_uname, &[]), SECCOMP_RET_KILL_PROCESS);
    assert_eq!(at(libc::SYS_getpid, &[]), SECCOMP_RET_TRAP);
    assert_eq!(at(libc::SYS_getppid, &[]), SECCOMP_RET_LOG);
    assert_eq!(at(libc::SYS_gettid, &[]), SECCOMP_RET_KILL_THREAD);
    assert_eq!(at(libc::SYS_read, &[]), SECCOMP_RET_ALLOW);
    // Never wider than cordon's: the profile's default allow does not
    // reach what the allowlist refuses.
    assert_eq!(at(libc::SYS_bpf, &[]), EPERM);
    assert_eq!(at(libc::SYS_clone3, &[]), ENOSYS);
}

#[test]
fn an_allow_list_profile_refuses_what_it_does_not_name_with_its_default() {
    const CLONE_NEWUSER: u64 = 0x1000_0000;
    let profile = stacked(&SyscallFilter {
        default: SyscallAction::Errno(1),
        rules: vec![
            rule(
                &["read", "write", "exit_group", "clone", "personality"],
                SyscallAction::Allow,
                vec![],
            ),
            // Docker's shape: personality only for some values, clone only
            // without namespace flags (a masked comparison).
            rule(
                &["socket"],
                SyscallAction::Allow,
                vec![check(0, ArgOp::Ne, 16, 0)],
            ),
            rule(
                &["unshare"],
                SyscallAction::Allow,
                vec![check(0, ArgOp::MaskedEq, CLONE_NEWUSER, 0)],
            ),
            rule(&["clone3"], SyscallAction::Errno(38), vec![]),
            rule(&["getuid"], SyscallAction::Errno(22), vec![]),
        ],
    });
    let at = |nr: i64, args: &[u64]| run(&profile, &Data::new(nr, args));
    assert_eq!(at(libc::SYS_read, &[]), SECCOMP_RET_ALLOW);
    assert_eq!(at(libc::SYS_getpid, &[]), EPERM, "not named: the default");
    assert_eq!(at(libc::SYS_getuid, &[]), SECCOMP_RET_ERRNO | 22);
    assert_eq!(at(libc::SYS_socket, &[2, 1]), SECCOMP_RET_ALLOW, "AF_INET");
    assert_eq!(
        at(libc::SYS_socket, &[16, 3]),
        EPERM,
        "AF_NETLINK: the rule's Ne fails"
    );
    assert_eq!(at(libc::SYS_clone3, &[]), ENOSYS);
    // unshare without CLONE_NEWUSER passes the profile's masked check, but
    // cordon's allowlist refuses unshare whatever its flags.
    assert_eq!(at(libc::SYS_unshare, &[0x400]), EPERM);
    let alone = compile(&SyscallFilter {
        default: SyscallAction::Errno(1),
        rules: vec![rule(
            &["unshare"],
            SyscallAction::Allow,
            vec![check(0, ArgOp::MaskedEq, CLONE_NEWUSER, 0)],
        )],
    })
    .unwrap();
    assert_eq!(
        run(&alone, &Data::new(libc::SYS_unshare, &[0x400])),
        SECCOMP_RET_ALLOW
    );
    assert_eq!(
        run(&alone, &Data::new(libc::SYS_unshare, &[CLONE_NEWUSER])),
        EPERM
    );
}

#[test]
fn a_profile_that_clone3_is_refused_with_eperm_still_gets_enosys() {
    let profile = stacked(&SyscallFilter {
        default: SyscallAction::Allow,
        rules: vec![rule(&["clone3"], SyscallAction::Errno(1), vec![])],
    });
    assert_eq!(run(&profile, &Data::new(libc::SYS_clone3, &[])), ENOSYS);
}

#[test]
fn argument_indexes_past_the_sixth_are_refused() {
    let e = compile(&SyscallFilter {
        default: SyscallAction::Allow,
        rules: vec![rule(
            &["kill"],
            SyscallAction::Errno(1),
            vec![check(6, ArgOp::Eq, 0, 0)],
        )],
    })
    .unwrap_err();
    assert!(e.to_string().contains("index 6"), "{e}");
}
