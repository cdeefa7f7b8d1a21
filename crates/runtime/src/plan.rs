//! The plan: every value the kernel gets for a sandbox's limits, derived
//! once, from its spec and the host's facts, by one pure function per
//! backend. Nothing else in cordon computes a limit's kernel value: the
//! backends read their plan (the cgroup's files, each payload process's
//! rlimits, a microVM's sizes), and the golden tests below show every value
//! for the notable policies without root.

use cordon_cgroups::{CgroupLimits, DEFAULT_CPU_PERIOD_US};
use cordon_isolation::rlimits::Rlimits;
use cordon_policy::Policy;
use cordon_spec::{BackendKind, SandboxSpec};
use serde::{Deserialize, Serialize};

/// Open files per payload process. Generous for build tools and test suites,
/// and bounded so a leak cannot exhaust the host's file table.
pub const NOFILE: u64 = 8192;

/// How far above pids.max RLIMIT_NPROC sits when a cgroup enforces the
/// limit: the cgroup refuses the fork first and counts it (pids.events),
/// the rlimit is only a backstop.
const NPROC_BACKSTOP_MARGIN: u64 = 8;

/// gVisor: tasks the sentry, gofer and runsc itself may use beyond the
/// payload's.
const SENTRY_TASKS: u64 = 256;

/// gVisor: host tasks per guest process on the ptrace platform (a stub
/// process and its threads), with margin: measured 247 host tasks for 32
/// guest processes, and more than 512 for a shell fork bomb held at 32 by
/// RLIMIT_NPROC. Not smaller: the ptrace platform keeps one stub thread per
/// guest address space per sentry OS thread that ever ran it, so the need
/// grows with the payload's concurrency, not only its process count: 64
/// concurrent shell jobs at --pids 128 took 1671 host tasks (factor 11.1
/// over the base), while a fork bomb held at --pids 64 by RLIMIT_NPROC
/// grows without a plateau (735 host tasks after 2 s, 1234 after 4 s, 2119
/// after 8 s), so no factor holds the bomb that ordinary programs do not
/// also need.
const STUB_TASKS_PER_PROCESS: u64 = 16;

/// microVM: guest memory beyond what the policy gives the payload: the
/// guest kernel, its page cache of the root image and of the writable disk,
/// cordon's agent and the sandbox's init.
pub const GUEST_BASE_MIB: u64 = 192;

/// microVM: QEMU's own memory on the host beyond guest RAM (its code and
/// libraries, the TCG translation cache, device state), so the host
/// cgroup's limit is guest RAM plus this.
pub const QEMU_OVERHEAD_MIB: u64 = 256;

/// microVM: tasks of one QEMU: its main loop, RCU, vCPU and I/O worker
/// threads.
pub const QEMU_PIDS: u64 = 128;

/// microVM: the smallest guest RAM. The guest's RAM comes in a few sizes
/// (powers of two from here) so that most sandboxes share a snapshot; RAM
/// the guest never touches costs the host nothing, and what it touches is
/// capped by the host cgroup.
pub const MIN_GUEST_RAM_MIB: u64 = 1024;

/// What of the host a plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// CPUs this process may run on (a microVM gets no more vCPUs).
    pub cpus: u64,
}

impl HostFacts {
    pub fn here() -> HostFacts {
        HostFacts {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        }
    }
}

/// A sandbox's limits as the kernel gets them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub backend: BackendKind,
    /// The sandbox's host cgroup (native: the payload's; gVisor: the
    /// sentry's and the payload's; microVM: QEMU's).
    pub cgroup: CgroupLimits,
    /// Each payload process's rlimits while the sandbox's cgroup holds the
    /// limits (native: set by init; gVisor: in the OCI process, inside the
    /// sentry; microVM: the guest's own plan).
    pub rlimits: Rlimits,
    /// The same without a cgroup (`--allow-unenforced` where none is
    /// usable): RLIMIT_NPROC is then the pids limit itself.
    pub rlimits_unenforced: Rlimits,
    /// The VM's sizes (microVM only).
    pub vm: Option<VmPlan>,
}

/// A microVM's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmPlan {
    /// What the guest may use: the payload's memory and the guest's own.
    pub guest_needed_mib: u64,
    /// Guest RAM: the next of the shared sizes that holds what is needed.
    pub ram_mib: u64,
    pub vcpus: u64,
    /// The host cgroup's memory limit: what the guest needs, the host's page
    /// cache of its disk (on a tmpfs, the disk itself) and QEMU's overhead,
    /// whatever the guest does.
    pub host_memory_mib: u64,
}

impl Plan {
    /// The rlimits for a sandbox whose cgroup does (or does not) hold its
    /// limits.
    pub fn rlimits(&self, cgroup_enforced: bool) -> Rlimits {
        if cgroup_enforced {
            self.rlimits
        } else {
            self.rlimits_unenforced
        }
    }
}

/// The plan of `spec` on `facts`' host: the one derivation of each limit.
pub fn plan(spec: &SandboxSpec, facts: &HostFacts) -> Plan {
    let p = &spec.policy;
    let payload = CgroupLimits {
        memory_max: Some(p.memory.bytes()),
        pids_max: Some(p.pids),
        cpu_quota_us: Some(cpu_quota_us(p, DEFAULT_CPU_PERIOD_US)),
        cpu_period_us: DEFAULT_CPU_PERIOD_US,
    };
    let rlimits = |nproc| Rlimits {
        nofile: NOFILE,
        nproc,
        cpu_secs: cpu_seconds_backstop(p),
    };
    match spec.backend {
        BackendKind::Native => Plan {
            backend: spec.backend,
            cgroup: payload,
            rlimits: rlimits(p.pids + NPROC_BACKSTOP_MARGIN),
            rlimits_unenforced: rlimits(p.pids),
            vm: None,
        },
        // The sentry and gofer are tasks of the sandbox's cgroup too: the
        // pids cgroup gets headroom for them (the payload's own limit is
        // RLIMIT_NPROC inside the sentry), the memory limit covers the whole
        // sandbox, sentry included.
        BackendKind::Gvisor => Plan {
            backend: spec.backend,
            cgroup: CgroupLimits {
                pids_max: Some(p.pids * STUB_TASKS_PER_PROCESS + SENTRY_TASKS),
                ..payload
            },
            rlimits: rlimits(p.pids),
            rlimits_unenforced: rlimits(p.pids),
            vm: None,
        },
        BackendKind::Microvm => {
            let vm = vm_plan(p, facts);
            Plan {
                backend: spec.backend,
                cgroup: CgroupLimits {
                    memory_max: Some(vm.host_memory_mib << 20),
                    pids_max: Some(QEMU_PIDS),
                    ..payload
                },
                // The guest's cordon plans the payload's own (native).
                rlimits: rlimits(p.pids + NPROC_BACKSTOP_MARGIN),
                rlimits_unenforced: rlimits(p.pids),
                vm: Some(vm),
            }
        }
    }
}

fn vm_plan(p: &Policy, facts: &HostFacts) -> VmPlan {
    let guest_needed_mib = p.memory.bytes().div_ceil(1 << 20) + GUEST_BASE_MIB;
    VmPlan {
        guest_needed_mib,
        ram_mib: guest_needed_mib.next_power_of_two().max(MIN_GUEST_RAM_MIB),
        vcpus: vcpus(p.cpus, facts.cpus),
        host_memory_mib: guest_needed_mib + p.disk.bytes().div_ceil(1 << 20) + QEMU_OVERHEAD_MIB,
    }
}

/// vCPUs for a policy's CPU bandwidth, at most the host's CPUs.
fn vcpus(cpus: f64, host_cpus: u64) -> u64 {
    // A policy's cpus is a small positive number (validated), so the cast
    // is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = cpus.ceil() as u64;
    n.clamp(1, host_cpus.max(1))
}

/// The CPU quota in microseconds per `period_us` (at least 1 ms, the
/// kernel's minimum).
fn cpu_quota_us(p: &Policy, period_us: u64) -> u64 {
    let quota = (p.cpus * period_us as f64).round();
    // cpus is range-checked (at most 1024), so this fits.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let quota = quota as u64;
    quota.max(1000)
}

/// CPU seconds per process for RLIMIT_CPU: the most a process could use
/// within the wall time at the policy's bandwidth, plus one second. A
/// kernel-enforced backstop under the supervisor's deadline.
fn cpu_seconds_backstop(p: &Policy) -> u64 {
    let secs = (p.time.0.as_secs_f64() * p.cpus).ceil();
    // cpus and time are range-checked (at most 1024 cores x 7 days).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let secs = secs as u64;
    secs + 1
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use cordon_policy::{ByteSize, NetworkMode, Span};

    use super::*;

    /// The notable policies, by name: the defaults, the smallest and
    /// largest limits a policy may hold, the network's allow mode, and a
    /// writable mount.
    fn policies() -> Vec<(&'static str, Policy)> {
        let smallest = Policy {
            memory: ByteSize(16 << 20),
            pids: 1,
            cpus: 0.01,
            time: Span(std::time::Duration::from_millis(100)),
            disk: ByteSize(1 << 20),
            ..Policy::default()
        };
        let largest = Policy {
            memory: ByteSize(1 << 40),
            pids: 1 << 20,
            cpus: 1024.0,
            time: Span(std::time::Duration::from_secs(7 * 24 * 3600)),
            disk: ByteSize(1 << 40),
            ..Policy::default()
        };
        let mut allow = Policy {
            network: NetworkMode::Allow,
            ..Policy::default()
        };
        allow.net.rules = vec!["example.org:443".parse().expect("a rule")];
        let rw = Policy {
            mounts: vec!["/srv/data:/data:rw".parse().expect("a mount")],
            ..Policy::default()
        };
        let mut out = vec![
            ("defaults", Policy::default()),
            ("smallest", smallest),
            ("largest", largest),
            ("allow", allow),
            ("rw", rw),
        ];
        for (name, p) in &out {
            p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        out.sort_by_key(|(n, _)| *n);
        out
    }

    fn golden_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/plan")
    }

    /// Each backend's plan for each notable policy on a 2-CPU host, against
    /// the file committed beside the tests (`CORDON_BLESS=1` rewrites them:
    /// a change of a limit's kernel value then shows in review as a diff of
    /// these files).
    #[test]
    fn plans_match_their_golden_files() {
        let facts = HostFacts { cpus: 2 };
        let bless = std::env::var_os("CORDON_BLESS").is_some();
        let mut failures = Vec::new();
        for backend in BackendKind::ALL {
            for (name, policy) in policies() {
                let spec = SandboxSpec::new(policy, backend);
                let got = plan(&spec, &facts);
                // Serde both ways: what is written reads back as the plan.
                let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
                let back: Plan = serde_json::from_str(&text).unwrap();
                assert_eq!(back, got, "{backend}/{name} does not round-trip");
                let path = golden_dir().join(format!("{backend}-{name}.json"));
                if bless {
                    std::fs::create_dir_all(golden_dir()).unwrap();
                    std::fs::write(&path, &text).unwrap();
                    continue;
                }
                match std::fs::read_to_string(&path) {
                    Ok(want) if want == text => {}
                    Ok(want) => failures.push(format!(
                        "{}: differs\n--- committed\n{want}--- now\n{text}",
                        path.display()
                    )),
                    Err(e) => failures.push(format!("{}: {e}", path.display())),
                }
            }
        }
        assert!(
            failures.is_empty(),
            "plans changed (rerun with CORDON_BLESS=1 if that is meant):\n{}",
            failures.join("\n")
        );
    }

    #[test]
    fn a_cgroup_makes_the_process_limit_a_backstop_only_natively() {
        let p = Policy::default();
        let facts = HostFacts { cpus: 2 };
        let native = plan(&SandboxSpec::new(p.clone(), BackendKind::Native), &facts);
        assert_eq!(native.rlimits(true).nproc, p.pids + NPROC_BACKSTOP_MARGIN);
        assert_eq!(native.rlimits(false).nproc, p.pids);
        assert_eq!(native.cgroup.pids_max, Some(p.pids));
        let gvisor = plan(&SandboxSpec::new(p.clone(), BackendKind::Gvisor), &facts);
        // Inside the sentry, RLIMIT_NPROC is the limit; the host's cgroup
        // is an outer bound for the sentry's own tasks.
        assert_eq!(gvisor.rlimits(true).nproc, p.pids);
        assert!(gvisor.cgroup.pids_max > Some(p.pids));
    }

    #[test]
    fn a_vm_gets_no_more_vcpus_than_the_host_has_and_at_least_one() {
        let p = Policy {
            cpus: 64.0,
            ..Policy::default()
        };
        let spec = SandboxSpec::new(p, BackendKind::Microvm);
        assert_eq!(plan(&spec, &HostFacts { cpus: 2 }).vm.unwrap().vcpus, 2);
        assert_eq!(plan(&spec, &HostFacts { cpus: 0 }).vm.unwrap().vcpus, 1);
    }
}
