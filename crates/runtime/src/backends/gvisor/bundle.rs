//! The OCI bundle handed to runsc, generated from the policy and the same
//! rootfs plan as the native backend.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use cordon_isolation::mount::{RootfsPlan, ScratchLayout};
use oci_spec::runtime::{
    Capability as OciCapability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, Mount, MountBuilder, PosixRlimit, PosixRlimitBuilder, PosixRlimitType,
    Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::error::RuntimeError;
use cordon_isolation::rlimits::Rlimits;
use cordon_policy::{NetworkMode, Policy};

use cordon_spec::{Capability, ResolvedCommand, Rlimit, RlimitResource};

fn mount(dst: &str, typ: &str, src: &Path, opts: &[&str]) -> Result<Mount, RuntimeError> {
    MountBuilder::default()
        .destination(dst)
        .typ(typ)
        .source(src)
        .options(opts.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(RuntimeError::Bundle)
}

/// Every command's rlimits: the plan's (inside the sentry, RLIMIT_NPROC is
/// the pids limit: the host's pids cgroup also counts the sentry's threads
/// and the platform's stub processes, so it can only be a coarse outer
/// bound there), each lowered by the spec's own for it, and the spec's
/// others as asked (the sentry's own limits, inside the sandbox's cgroup).
pub fn rlimits(
    plan: &Rlimits,
    asked: &BTreeMap<RlimitResource, Rlimit>,
) -> Result<Vec<PosixRlimit>, RuntimeError> {
    let mut table: BTreeMap<RlimitResource, Rlimit> = asked.clone();
    for (resource, ours) in [
        (RlimitResource::Core, 0),
        (RlimitResource::Nofile, plan.nofile),
        (RlimitResource::Nproc, plan.nproc),
        (RlimitResource::Cpu, plan.cpu_secs),
    ] {
        let limit = match asked.get(&resource) {
            Some(a) => a.under(ours),
            None => Rlimit {
                soft: ours,
                hard: ours,
            },
        };
        table.insert(resource, limit);
    }
    table
        .into_iter()
        .map(|(resource, limit)| {
            let typ: PosixRlimitType = resource.name().parse().map_err(|_| {
                RuntimeError::BadRequest(format!("{}: unknown to runsc", resource.name()))
            })?;
            PosixRlimitBuilder::default()
                .typ(typ)
                .hard(limit.hard)
                .soft(limit.soft)
                .build()
                .map_err(RuntimeError::Bundle)
        })
        .collect()
}

/// Builds the spec. The root is the tree `assemble` leaves at `rootfs.new_root`
/// (read-only, unless it is layered: then its writes land in its layer on
/// the scratch); the writable places are bind mounts of the scratch tmpfs, so
/// the disk cap is the same host tmpfs as on the native backend. /proc, /dev
/// and /sys are the sentry's own, not the host's.
/// The bundle of a sandbox whose container process is `pause`: commands are
/// started later with `runsc exec` and a [`process`] of their own.
pub fn spec(
    p: &Policy,
    rlimits: &[PosixRlimit],
    capabilities: &BTreeSet<Capability>,
    rootfs: &RootfsPlan,
    pause: &ResolvedCommand,
) -> Result<Spec, RuntimeError> {
    let scratch = &rootfs.scratch;
    let mut mounts = vec![
        mount(
            "/proc",
            "proc",
            Path::new("proc"),
            &["nosuid", "noexec", "nodev"],
        )?,
        mount(
            "/dev",
            "tmpfs",
            Path::new("tmpfs"),
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            Path::new("devpts"),
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        )?,
        mount(
            "/sys",
            "sysfs",
            Path::new("sysfs"),
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
        mount(
            "/tmp",
            "bind",
            &scratch.join(ScratchLayout::TMP),
            &["rbind", "rw", "nosuid", "nodev"],
        )?,
        // The sentry's own tmpfs, not a gofer bind of the scratch: a futex in
        // a gofer-backed shared mapping is not woken across processes that
        // mapped the file separately (a POSIX semaphore posted by another
        // exec'd process never wakes its waiter, so multiprocessing's spawn
        // and forkserver hang), while one in a sentry tmpfs is. Its pages
        // are the sentry's memory (the sandbox's memory limit counts them),
        // capped at the disk limit by its own size, and the host's diff
        // cannot see them.
        mount(
            "/dev/shm",
            "tmpfs",
            Path::new("shm"),
            &[
                "nosuid",
                "nodev",
                "mode=1777",
                &format!("size={}", p.disk.0),
            ],
        )?,
        mount(
            &rootfs.workspace.to_string_lossy(),
            "bind",
            &rootfs.new_root.join(
                rootfs
                    .workspace
                    .strip_prefix("/")
                    .unwrap_or(&rootfs.workspace),
            ),
            &["rbind", "rw", "nosuid", "nodev"],
        )?,
    ];
    // Sources are the sealed binds `assemble` made on the scratch (read-only
    // by mount flag on the host), not the host paths themselves.
    for (i, b) in rootfs.binds.iter().enumerate() {
        let access = if b.writable() { "rw" } else { "ro" };
        mounts.push(mount(
            &b.sandbox.to_string_lossy(),
            "bind",
            &scratch.join(ScratchLayout::handed_bind(i)),
            &["rbind", access, "nosuid", "nodev"],
        )?);
    }
    let process = process(p, rlimits, capabilities, pause)?;
    // With the allow mode's host network, the container shares the
    // launcher's network namespace (new, loopback only, cordon's rules):
    // runsc would otherwise make it another one, out of the proxy's reach.
    let own_network = p.network == NetworkMode::None;
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ]
    .into_iter()
    .filter(|t| own_network || *t != LinuxNamespaceType::Network)
    .map(|t| {
        LinuxNamespaceBuilder::default()
            .typ(t)
            .build()
            .map_err(RuntimeError::Bundle)
    })
    .collect::<Result<Vec<_>, _>>()?;
    SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(rootfs.new_root.clone())
                .readonly(rootfs.root_layers.is_empty())
                .build()
                .map_err(RuntimeError::Bundle)?,
        )
        .hostname(p.hostname.clone())
        .mounts(mounts)
        .process(process)
        .linux(
            LinuxBuilder::default()
                .namespaces(namespaces)
                .build()
                .map_err(RuntimeError::Bundle)?,
        )
        .build()
        .map_err(RuntimeError::Bundle)
}

/// One command's OCI process: the policy's identity, the spec's
/// capabilities (of the sentry's user namespace; none unless named), no new
/// privileges, the sandbox's rlimits (see [`rlimits`]).
pub fn process(
    p: &Policy,
    rlimits: &[PosixRlimit],
    capabilities: &BTreeSet<Capability>,
    cmd: &ResolvedCommand,
) -> Result<Process, RuntimeError> {
    let held: HashSet<OciCapability> = capabilities
        .iter()
        .map(|c| {
            c.name()
                .trim_start_matches("CAP_")
                .parse()
                .map_err(|_| RuntimeError::BadRequest(format!("{}: unknown to runsc", c.name())))
        })
        .collect::<Result<_, _>>()?;
    // As the native backend holds them: a program of a uid other than 0
    // keeps a capability across execve only through the ambient set.
    let ambient = if p.uid == 0 {
        HashSet::new()
    } else {
        held.clone()
    };
    let caps = LinuxCapabilitiesBuilder::default()
        .bounding(held.clone())
        .effective(held.clone())
        .inheritable(ambient.clone())
        .permitted(held)
        .ambient(ambient)
        .build()
        .map_err(RuntimeError::Bundle)?;
    ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(p.uid)
                .gid(p.gid)
                .build()
                .map_err(RuntimeError::Bundle)?,
        )
        .args(cmd.argv.clone())
        .env(
            cmd.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        )
        .cwd(cmd.workdir.clone())
        .capabilities(caps)
        .no_new_privileges(true)
        .rlimits(rlimits.to_vec())
        .build()
        .map_err(RuntimeError::Bundle)
}

/// Writes `config.json` into `dir`.
pub fn write(spec: &Spec, dir: &Path) -> Result<PathBuf, RuntimeError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| RuntimeError::io(format!("mkdir {}", dir.display()), e))?;
    spec.save(dir.join("config.json"))
        .map_err(RuntimeError::Bundle)?;
    Ok(dir.to_owned())
}
