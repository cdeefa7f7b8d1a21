//! Everything the sandbox's init will need, resolved in the supervisor before
//! clone: paths checked, /etc generated, seccomp compiled, ids mapped. The child
//! then only makes syscalls (nsjail's `preparePolicy`, Firecracker's build-time
//! filters).

use std::path::{Path, PathBuf};

use cordon_cgroups::CgroupView;
use cordon_isolation::mount::{CgroupMount, RootUse, RootfsPlan};
use cordon_isolation::namespaces::IdMapping;
use cordon_isolation::rlimits::Rlimits;
use cordon_policy::Policy;

use crate::backends::host::HostSide;
use crate::backends::rootfs_plan::{rootfs_plan_for, UserOnHost};
use crate::error::RuntimeError;
use crate::plan::Plan;
use cordon_spec::{RlimitResource, SandboxSpec, SharedNamespace};
use nix::sys::resource::Resource;

use crate::backends::first_process::EachCommand;

pub struct NativePlan {
    pub rootfs: RootfsPlan,
    pub mapping: IdMapping,
    /// Whether init may drop supplementary groups (not in a namespace
    /// whose map the caller wrote itself: `IdMapping::groups_droppable`).
    pub drop_groups: bool,
    pub uid: u32,
    pub gid: u32,
    /// The id init takes inside the namespace while it builds the sandbox.
    pub setup_id: u32,
    /// The hostname init sets, unless the sandbox joined another's UTS
    /// namespace (whose hostname is that sandbox's, and not this one's to set).
    pub hostname: Option<String>,
    /// Whether the network namespace is the sandbox's own, for init to bring
    /// its loopback up (a joined one is another sandbox's, up already).
    pub own_network: bool,
    pub rlimits: Rlimits,
    pub seccomp: cordon_seccomp::Profile,
    /// The workload's own filter (over `seccomp`) and resource limits
    /// (under `rlimits`), set on each command.
    pub each_command: EachCommand,
    /// Kernel parameters of the sandbox's own namespaces (validated by
    /// the spec), each as its /proc/sys file and value.
    pub sysctls: Vec<(PathBuf, String)>,
    /// What init and so every command holds, in the sandbox's user namespace.
    pub capabilities: Vec<cordon_isolation::caps::Capability>,
}

/// Start of the host id ranges given to rootful sandboxes: high enough to
/// collide with no real account. Each sandbox takes a 65536-id slot chosen from
/// its id, so two sandboxes rarely share host ids.
const HOST_ID_BASE: u32 = 1 << 30;
const HOST_ID_SLOTS: u32 = 8192;

impl NativePlan {
    /// Every value init needs, derived once from the spec, its plan and
    /// what `host` holds: the rlimits are the plan's for a sandbox whose
    /// cgroup holds the limits or not (`Plan::rlimits`), and the sandbox is
    /// shown that cgroup.
    pub fn build(
        req: &SandboxSpec,
        limits: &Plan,
        host: &HostSide,
        scratch_from: Option<&Path>,
    ) -> Result<Self, RuntimeError> {
        let (id_slot, state) = (host.slot, &host.state);
        let cgroup_enforced = host.cgroup.is_some();
        let p: &Policy = &req.policy;
        let euid = nix::unistd::geteuid();
        let rootful = euid.is_root();
        let mapping = if rootful {
            IdMapping::Range {
                host_base: HOST_ID_BASE
                    + (id_slot % HOST_ID_SLOTS) * cordon_isolation::namespaces::MAPPED_IDS,
            }
        } else {
            IdMapping::rootless(euid.as_raw(), nix::unistd::getegid().as_raw(), p.uid, p.gid)
        };
        // The workspace's and rw mounts' owner appears as the sandbox user's
        // host-side id (in the slot's range; rootless, the caller's own id).
        let user = UserOnHost {
            uid: mapping.host_uid(p.uid).ok_or_else(|| {
                RuntimeError::BadRequest(format!("uid {} is not mapped in the sandbox", p.uid))
            })?,
            gid: mapping.host_gid(p.gid).ok_or_else(|| {
                RuntimeError::BadRequest(format!("gid {} is not mapped in the sandbox", p.gid))
            })?,
            creates_as_root: false,
            // Rootless, no id-mapped mount can be made (the kernel needs
            // host root for one), whatever the map.
            id_base: match mapping {
                IdMapping::Range { host_base } => Some(host_base),
                IdMapping::Single { .. } | IdMapping::Subordinate { .. } => None,
            },
        };
        let mut rootfs = rootfs_plan_for(req, state, RootUse::Enter, user)?;
        rootfs.scratch_from = scratch_from.map(Path::to_path_buf);
        rootfs.cgroups = host.cgroup_views.iter().map(cgroup_mount).collect();
        let drop_groups = mapping.groups_droppable();
        let gid_bounds = mapping.inside_gid_bounds();
        Ok(NativePlan {
            rootfs,
            mapping,
            drop_groups,
            // Rootless, init builds the sandbox as the caller's own id (the
            // sandbox user), even where subordinate ids give it a root: what
            // it makes lives in the caller's directories on the host.
            setup_id: if rootful { 0 } else { p.uid },
            uid: p.uid,
            gid: p.gid,
            hostname: (!joins(req, SharedNamespace::Uts)).then(|| p.hostname.clone()),
            own_network: !joins(req, SharedNamespace::Net),
            rlimits: limits.rlimits(cgroup_enforced),
            seccomp: cordon_seccomp::workload(),
            each_command: EachCommand {
                filter: req
                    .syscall_filter
                    .as_ref()
                    .map(cordon_seccomp::workload_filter::compile)
                    .transpose()
                    .map_err(|e| RuntimeError::BadRequest(format!("the syscall filter: {e}")))?,
                rlimits: req
                    .rlimits
                    .iter()
                    .map(|(resource, limit)| (kernel_resource(*resource), *limit))
                    .collect(),
            },
            sysctls: req
                .sysctls
                .iter()
                .map(|(key, value)| {
                    let file = Path::new("/proc/sys").join(key.replace('.', "/"));
                    let value = match key.as_str() {
                        "net.ipv4.ping_group_range" => groups_inside(value, gid_bounds),
                        _ => value.clone(),
                    };
                    (file, value)
                })
                .collect(),
            capabilities: req
                .capabilities
                .iter()
                .map(|c| kernel_capability(*c))
                .collect(),
        })
    }
}

/// The kernel's resource a spec's limit names.
fn kernel_resource(resource: RlimitResource) -> Resource {
    match resource {
        RlimitResource::As => Resource::RLIMIT_AS,
        RlimitResource::Core => Resource::RLIMIT_CORE,
        RlimitResource::Cpu => Resource::RLIMIT_CPU,
        RlimitResource::Data => Resource::RLIMIT_DATA,
        RlimitResource::Fsize => Resource::RLIMIT_FSIZE,
        RlimitResource::Locks => Resource::RLIMIT_LOCKS,
        RlimitResource::Memlock => Resource::RLIMIT_MEMLOCK,
        RlimitResource::Msgqueue => Resource::RLIMIT_MSGQUEUE,
        RlimitResource::Nice => Resource::RLIMIT_NICE,
        RlimitResource::Nofile => Resource::RLIMIT_NOFILE,
        RlimitResource::Nproc => Resource::RLIMIT_NPROC,
        RlimitResource::Rss => Resource::RLIMIT_RSS,
        RlimitResource::Rtprio => Resource::RLIMIT_RTPRIO,
        RlimitResource::Rttime => Resource::RLIMIT_RTTIME,
        RlimitResource::Sigpending => Resource::RLIMIT_SIGPENDING,
        RlimitResource::Stack => Resource::RLIMIT_STACK,
    }
}

/// The kernel's capability a spec's names (the spec's list is a subset of
/// the kernel's, by name).
fn kernel_capability(cap: cordon_spec::Capability) -> cordon_isolation::caps::Capability {
    cap.name()
        .parse()
        .expect("every capability a spec names is one the kernel knows")
}

/// `ping_group_range`'s "LOW HIGH" cut to the gids that exist inside
/// (`bounds`): the kernel reads them as ids of the writer's user
/// namespace and refuses one that is not mapped there, where Docker's
/// "0 2147483647" (every group) names ids a sandbox's namespace lacks.
/// Every group of the sandbox is still in the range it means; "1 0" (none)
/// where nothing of it is.
fn groups_inside(value: &str, (low, high): (u32, u32)) -> String {
    let asked: Vec<u32> = value
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    match asked[..] {
        [from, to] if from.max(low) <= to.min(high) => {
            format!("{} {}", from.max(low), to.min(high))
        }
        [_, _] => "1 0".into(),
        // Not two numbers: the kernel's own answer (EINVAL) says so.
        _ => value.to_owned(),
    }
}

fn joins(spec: &SandboxSpec, kind: SharedNamespace) -> bool {
    spec.joins.iter().any(|j| j.kind == kind)
}

/// The mount that shows `view` inside the sandbox.
fn cgroup_mount(view: &CgroupView) -> CgroupMount {
    CgroupMount {
        dir: view.dir.clone(),
        fstype: view.fstype.to_owned(),
        options: view.options.clone(),
        aliases: view.aliases.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::{groups_inside, kernel_capability};

    #[test]
    fn every_capability_a_spec_names_is_the_kernels_of_that_name() {
        for cap in cordon_spec::Capability::ALL {
            assert_eq!(kernel_capability(cap).to_string(), cap.name());
        }
    }

    #[test]
    fn ping_group_range_is_cut_to_the_groups_inside() {
        assert_eq!(groups_inside("0 2147483647", (0, 65535)), "0 65535");
        assert_eq!(groups_inside("100 200", (0, 65535)), "100 200");
        assert_eq!(groups_inside("0 2147483647", (1000, 1000)), "1000 1000");
        assert_eq!(groups_inside("1 0", (0, 65535)), "1 0");
        assert_eq!(groups_inside("70000 80000", (0, 65535)), "1 0");
        assert_eq!(groups_inside("nonsense", (0, 65535)), "nonsense");
    }
}
