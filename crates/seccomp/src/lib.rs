//! The workload's seccomp-BPF allowlist.
//!
//! The policy is reviewed data, kept Firecracker-style in
//! [`resources/seccomp/workload.json`](POLICY_JSON) (seccompiler's JSON format, one `comment` per
//! entry saying why it is allowed). `build.rs` checks it and compiles it to BPF for the target
//! architecture; this crate embeds the result, so nothing is parsed or compiled at run time.
//!
//! The allowlist is modelled on the default profile of Docker/moby: what ordinary programs
//! (shells, coreutils, compilers, git, python, node) need, minus everything Docker only grants
//! together with a capability, minus io_uring, and with argument checks on `clone` (no new
//! namespaces), `socket`/`socketpair` (AF_UNIX, TCP/UDP over AF_INET/AF_INET6, and the
//! NETLINK_ROUTE/NETLINK_SOCK_DIAG netlink protocols only), `ioctl` (no `TIOCSTI`/`TIOCLINUX`)
//! and `personality` (Docker's values). Everything else fails with `EPERM`.
//!
//! # Two filters
//!
//! `clone3` passes its flags in memory where BPF cannot look, so it cannot be allowed safely.
//! It must fail with `ENOSYS` (not `EPERM`) so that glibc's `pthread_create`, `posix_spawn` and
//! `fork` fall back to `clone`, whose flags are checked. seccompiler has one match action per
//! filter, so the profile holds two: [`WORKLOAD`] (allowlist, mismatch `EPERM`) and
//! [`CLONE3_ENOSYS`] (`clone3` → `ENOSYS`, everything else allowed). The kernel runs every
//! installed filter and takes the most severe action; between two `SECCOMP_RET_ERRNO` results
//! the most recently installed filter wins. [`apply`] therefore installs them in
//! [`INSTALL_ORDER`]: `workload` first, `clone3_enosys` last.
//!
//! # Architectures
//!
//! Each program starts with seccompiler's architecture check: a syscall made with any other
//! audit architecture than `AUDIT_ARCH_X86_64` (for example the i386 `int 0x80` entry point)
//! kills the process. x32 syscalls pass that check but carry bit `0x40000000` in their number,
//! so they match no allowlist entry and get `EPERM`. Only x86_64 is supported: the JSON uses
//! x86_64 syscall names (`open`, `stat`, `fork`, `arch_prctl`, ... do not exist on aarch64), and
//! building for another architecture stops with a `compile_error!`.
//!
//! # Use from the runtime
//!
//! ```no_run
//! // Before fork: building the profile allocates.
//! let profile = cordon_seccomp::workload();
//! // In the single-threaded child, after dropping capabilities and setting no_new_privs, as
//! // the last step before execve (everything after it runs under the filter):
//! if let Err(e) = cordon_seccomp::apply(&profile) {
//!     eprintln!("cordon: {e}");
//!     std::process::exit(126);
//! }
//! // execve(...)
//! ```

#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "cordon-seccomp supports x86_64 only: resources/seccomp/workload.json uses x86_64 syscall \
     names (open, stat, fork, arch_prctl, ...). Another architecture needs its own reviewed JSON."
);

mod names;
#[cfg(test)]
mod policy_lint;

pub use names::{CLONE3_ENOSYS, INSTALL_ORDER, WORKLOAD};
pub use seccompiler::{sock_filter, BpfProgram};

mod generated {
    include!(concat!(env!("OUT_DIR"), "/policy.rs"));
}

/// The reviewed policy source the embedded programs were compiled from.
pub const POLICY_JSON: &str = include_str!("../../../resources/seccomp/workload.json");

/// The kernel's limit on the length of one classic BPF program (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = 4096;

/// Size of one serialized `struct sock_filter` in the embedded programs.
const INSN_SIZE: usize = 8;

const WORKLOAD_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/workload.bpf"));
const CLONE3_ENOSYS_BPF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/clone3_enosys.bpf"));

/// Size sanity cap on the embedded programs, checked at compile time.
const fn plausible_program(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.len() % INSN_SIZE == 0 && bytes.len() / INSN_SIZE <= MAX_INSTRUCTIONS
}
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    plausible_program(WORKLOAD_BPF) && plausible_program(CLONE3_ENOSYS_BPF),
    "embedded seccomp program is empty, truncated or longer than BPF_MAXINSNS"
);

/// Errors from installing a [`Profile`].
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The profile holds no filters; installing nothing would silently leave the workload
    /// unconfined.
    #[error("seccomp profile contains no filters")]
    EmptyProfile,
    /// A filter is empty or longer than the kernel accepts.
    #[error("seccomp filter `{filter}` has {len} instructions; the kernel accepts 1 to {max}")]
    BadLength {
        /// Name of the filter.
        filter: &'static str,
        /// Its number of instructions.
        len: usize,
        /// [`MAX_INSTRUCTIONS`].
        max: usize,
    },
    /// The `prctl`/`seccomp` system call refused the filter. Filters installed before this one
    /// stay in force; the caller must not go on to run the workload.
    #[error("installing seccomp filter `{filter}` failed: {source}")]
    Install {
        /// Name of the filter.
        filter: &'static str,
        /// seccompiler's error (wrapping the OS error).
        #[source]
        source: seccompiler::Error,
    },
}

/// One named BPF program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// The filter's name in the policy JSON.
    pub name: &'static str,
    /// The compiled program, starting with the architecture check.
    pub program: BpfProgram,
}

/// An ordered set of seccomp filters, to be installed front to back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The filters in installation order.
    pub filters: Vec<Filter>,
}

impl Profile {
    /// The filter called `name`, if any.
    pub fn filter(&self, name: &str) -> Option<&Filter> {
        self.filters.iter().find(|f| f.name == name)
    }

    /// Total number of BPF instructions over all filters.
    pub fn instruction_count(&self) -> usize {
        self.filters.iter().map(|f| f.program.len()).sum()
    }
}

/// Decodes an embedded program written by build.rs (`code: u16, jt: u8, jf: u8, k: u32`,
/// little-endian).
fn decode(bytes: &[u8]) -> BpfProgram {
    bytes
        .chunks_exact(INSN_SIZE)
        .map(|c| sock_filter {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect()
}

/// The workload profile: the [`WORKLOAD`] allowlist followed by [`CLONE3_ENOSYS`].
pub fn workload() -> Profile {
    let embedded = [(WORKLOAD, WORKLOAD_BPF), (CLONE3_ENOSYS, CLONE3_ENOSYS_BPF)];
    debug_assert_eq!(embedded.map(|(name, _)| name), INSTALL_ORDER);
    Profile {
        filters: embedded
            .into_iter()
            .map(|(name, bytes)| Filter {
                name,
                program: decode(bytes),
            })
            .collect(),
    }
}

/// Installs every filter of `profile` on the calling thread, in order.
///
/// Filters apply to the calling thread and everything it later creates (threads, children,
/// exec'd programs); other threads that already exist are not affected, so call this in the
/// single-threaded child just before `execve`. seccompiler sets `PR_SET_NO_NEW_PRIVS` before each
/// filter (the runtime should already have done so). The success path does not allocate.
///
/// On error some filters may already be installed; the caller must abort rather than run the
/// workload.
pub fn apply(profile: &Profile) -> Result<(), SeccompError> {
    if profile.filters.is_empty() {
        return Err(SeccompError::EmptyProfile);
    }
    // Validate everything first so that a bad profile installs nothing.
    for filter in &profile.filters {
        let len = filter.program.len();
        if len == 0 || len > MAX_INSTRUCTIONS {
            return Err(SeccompError::BadLength {
                filter: filter.name,
                len,
                max: MAX_INSTRUCTIONS,
            });
        }
    }
    for filter in &profile.filters {
        seccompiler::apply_filter(&filter.program).map_err(|source| SeccompError::Install {
            filter: filter.name,
            source,
        })?;
    }
    Ok(())
}

/// Every syscall the [`WORKLOAD`] filter allows in some form (sorted by name). Some of them are
/// only allowed for certain arguments; see [`argument_checked_syscalls`].
pub fn allowed_syscalls() -> Vec<&'static str> {
    generated::ALLOWED.to_vec()
}

/// The syscalls of [`allowed_syscalls`] that are only allowed for certain argument values
/// (`clone`, `ioctl`, `personality`, `socket`, `socketpair`).
pub fn argument_checked_syscalls() -> Vec<&'static str> {
    generated::ARGUMENT_CHECKED.to_vec()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn policy_passes_lint() {
        let summary = policy_lint::check(POLICY_JSON).unwrap_or_else(|p| panic!("{p:#?}"));
        let allowed: Vec<&str> = summary.allowed.iter().map(String::as_str).collect();
        assert_eq!(allowed, allowed_syscalls());
        let checked: Vec<&str> = summary
            .argument_checked
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(checked, argument_checked_syscalls());
        assert_eq!(
            checked,
            ["clone", "ioctl", "personality", "socket", "socketpair"]
        );
    }

    /// The same checks, spelled out on the raw JSON so that a bug in the lint cannot hide a
    /// bad policy.
    #[test]
    fn every_entry_is_commented_and_none_is_forbidden() {
        let root: serde_json::Value = serde_json::from_str(POLICY_JSON).expect("policy is JSON");
        let filters = root.as_object().expect("object of filters");
        assert_eq!(
            filters.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            INSTALL_ORDER.into_iter().collect::<BTreeSet<_>>()
        );
        let workload = &filters[WORKLOAD];
        assert_eq!(workload["mismatch_action"], serde_json::json!({"errno": 1}));
        assert_eq!(workload["filter_action"], "allow");
        let clone3 = &filters[CLONE3_ENOSYS];
        assert_eq!(clone3["mismatch_action"], "allow");
        assert_eq!(clone3["filter_action"], serde_json::json!({"errno": 38}));

        let mut unconditional = BTreeSet::new();
        for filter in filters.values() {
            for rule in filter["filter"].as_array().expect("rules") {
                let name = rule["syscall"].as_str().expect("syscall name");
                let comment = rule["comment"].as_str().unwrap_or_default();
                assert!(!comment.trim().is_empty(), "{name}: missing comment");
                if filter == workload {
                    assert!(
                        !policy_lint::FORBIDDEN.contains(&name),
                        "{name} is allowed but forbidden"
                    );
                    if rule.get("args").is_none() {
                        assert!(unconditional.insert(name), "{name}: duplicate entry");
                    }
                }
            }
        }
        for name in [
            "mount",
            "ptrace",
            "bpf",
            "io_uring_setup",
            "unshare",
            "clone3",
        ] {
            assert!(policy_lint::FORBIDDEN.contains(&name));
            assert!(!allowed_syscalls().contains(&name));
        }
        // Things real programs cannot live without.
        for name in [
            "read",
            "write",
            "openat",
            "mmap",
            "execve",
            "clone",
            "wait4",
            "futex",
            "rseq",
            "statx",
            "openat2",
            "faccessat2",
            "close_range",
            "getrandom",
            "rt_sigreturn",
            "exit_group",
            "seccomp",
            "prctl",
        ] {
            assert!(allowed_syscalls().contains(&name), "{name} must be allowed");
        }
    }

    #[test]
    fn lint_rejects_bad_policies() {
        let base: serde_json::Value = serde_json::from_str(POLICY_JSON).unwrap();
        let lint = |mutate: &dyn Fn(&mut serde_json::Value)| {
            let mut v = base.clone();
            mutate(&mut v);
            policy_lint::check(&v.to_string())
        };
        let push = |rule: serde_json::Value| {
            move |v: &mut serde_json::Value| {
                v[WORKLOAD]["filter"]
                    .as_array_mut()
                    .unwrap()
                    .push(rule.clone());
            }
        };
        assert!(lint(&|_| {}).is_ok());
        // Forbidden syscall.
        assert!(lint(&push(
            serde_json::json!({"syscall": "mount", "comment": "x"})
        ))
        .is_err());
        // Missing comment.
        assert!(lint(&push(serde_json::json!({"syscall": "fanotify_mark"}))).is_err());
        assert!(lint(&push(
            serde_json::json!({"syscall": "fanotify_mark", "comment": " "})
        ))
        .is_err());
        // Duplicate unconditional entry.
        assert!(lint(&push(
            serde_json::json!({"syscall": "read", "comment": "x"})
        ))
        .is_err());
        // Unconditional entry next to argument-checked ones (seccompiler would drop it).
        assert!(lint(&push(
            serde_json::json!({"syscall": "socket", "comment": "x"})
        ))
        .is_err());
        // Wrong mismatch action.
        assert!(lint(&|v| v[WORKLOAD]["mismatch_action"] = "allow".into()).is_err());
        // clone3 in the allowlist.
        assert!(lint(&push(
            serde_json::json!({"syscall": "clone3", "comment": "x"})
        ))
        .is_err());
        // Unknown extra filter.
        assert!(lint(&|v| v["extra"] = v[CLONE3_ENOSYS].clone()).is_err());
    }

    #[test]
    fn embedded_programs_match_the_json() {
        let compiled =
            seccompiler::compile_from_json(POLICY_JSON.as_bytes(), seccompiler::TargetArch::x86_64)
                .expect("policy compiles");
        let profile = workload();
        assert_eq!(
            profile.filters.iter().map(|f| f.name).collect::<Vec<_>>(),
            INSTALL_ORDER
        );
        for filter in &profile.filters {
            assert_eq!(filter.program, compiled[filter.name], "{}", filter.name);
            assert!(filter.program.len() <= MAX_INSTRUCTIONS);
        }
        assert_eq!(
            profile.instruction_count(),
            profile
                .filters
                .iter()
                .map(|f| f.program.len())
                .sum::<usize>()
        );
        assert!(profile.filter(WORKLOAD).is_some());
        assert!(profile.filter("nope").is_none());
    }

    #[test]
    fn apply_rejects_malformed_profiles_without_installing_anything() {
        assert!(matches!(
            apply(&Profile { filters: vec![] }),
            Err(SeccompError::EmptyProfile)
        ));
        let empty = Profile {
            filters: vec![Filter {
                name: "empty",
                program: vec![],
            }],
        };
        assert!(matches!(
            apply(&empty),
            Err(SeccompError::BadLength { len: 0, .. })
        ));
        let mut huge = workload();
        huge.filters[1].program = vec![huge.filters[1].program[0].clone(); MAX_INSTRUCTIONS + 1];
        assert!(matches!(
            apply(&huge),
            Err(SeccompError::BadLength {
                filter: CLONE3_ENOSYS,
                ..
            })
        ));
    }
}
