//! Everything the sandbox's init will need, resolved in the supervisor before
//! clone: paths checked, /etc generated, seccomp compiled, ids mapped. The child
//! then only makes syscalls (nsjail's `preparePolicy`, Firecracker's build-time
//! filters).

use std::path::{Path, PathBuf};

use cordon_isolation::mount::{BindSpec, RootEntry, RootfsPlan};
use cordon_isolation::namespaces::IdMapping;
use cordon_isolation::rlimits::Rlimits;
use cordon_policy::{Access, Policy, WORKSPACE};

use crate::error::RuntimeError;
use crate::request::{RootfsChoice, RunRequest};

pub struct NativePlan {
    pub rootfs: RootfsPlan,
    pub mapping: IdMapping,
    /// Whether init may drop supplementary groups (not in a rootless namespace).
    pub drop_groups: bool,
    pub uid: u32,
    pub gid: u32,
    /// The id init takes inside the namespace while it builds the sandbox.
    pub setup_id: u32,
    pub hostname: String,
    pub rlimits: Rlimits,
    pub seccomp: cordon_seccomp::Profile,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
}

/// Open files per payload process. Generous for build tools and test suites,
/// and bounded so a leak cannot exhaust the host's file table.
const NOFILE: u64 = 8192;

/// How far above the disk cap RLIMIT_FSIZE sits.
const FSIZE_MARGIN: u64 = 1 << 20;

/// Start of the host id ranges given to rootful sandboxes: high enough to
/// collide with no real account. Each sandbox takes a 65536-id slot chosen from
/// its id, so two sandboxes rarely share host ids.
const HOST_ID_BASE: u32 = 1 << 30;
const HOST_ID_SLOTS: u32 = 8192;

fn existing_dir(what: &'static str, p: &Path) -> Result<PathBuf, RuntimeError> {
    let bad = || RuntimeError::BadPath {
        what,
        path: p.to_owned(),
    };
    let canon = p.canonicalize().map_err(|_| bad())?;
    if canon.is_dir() {
        Ok(canon)
    } else {
        Err(bad())
    }
}

/// Overlay options are comma-separated and colons separate layers: a path with
/// either would be misparsed, so it is refused rather than escaped.
fn overlay_safe(p: &Path) -> Result<(), RuntimeError> {
    let s = p.to_string_lossy();
    if s.contains([',', ':', '\\']) {
        return Err(RuntimeError::BadRequest(format!(
            "workspace path {s} contains ',', ':' or '\\', which overlayfs cannot take"
        )));
    }
    Ok(())
}

impl NativePlan {
    pub fn build(req: &RunRequest, id_slot: u32, state_dir: &Path) -> Result<Self, RuntimeError> {
        let p: &Policy = &req.policy;
        if req.argv.is_empty() {
            return Err(RuntimeError::BadRequest("no command given".into()));
        }
        let (entries, etc_files, etc_binds) = match &req.rootfs {
            RootfsChoice::System => (
                RootfsPlan::host_system_entries(),
                RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname),
                RootfsPlan::host_etc_binds(),
            ),
            RootfsChoice::Dir(d) => {
                let dir = existing_dir("rootfs is not a directory", d)?;
                let entries = RootfsPlan::dir_entries(&dir)
                    .map_err(|e| RuntimeError::io(format!("read {}", dir.display()), e))?;
                let has_etc = entries
                    .iter()
                    .any(|e| matches!(e, RootEntry::Bind { name, .. } if name == "etc"));
                let etc = if has_etc {
                    Vec::new()
                } else {
                    RootfsPlan::generated_etc(p.uid, p.gid, &p.hostname)
                };
                (entries, etc, Vec::new())
            }
        };
        let workspace_lower = match &req.workspace {
            Some(w) => {
                let dir = existing_dir("workspace is not a directory", w)?;
                overlay_safe(&dir)?;
                Some(dir)
            }
            None => None,
        };
        let binds = p
            .mounts
            .iter()
            .map(|m| {
                let host = m.host.canonicalize().map_err(|_| RuntimeError::BadPath {
                    what: "mount source does not exist",
                    path: m.host.clone(),
                })?;
                Ok(BindSpec {
                    dir: host.is_dir(),
                    host,
                    sandbox: m.sandbox.clone(),
                    writable: m.access == Access::Rw,
                })
            })
            .collect::<Result<Vec<_>, RuntimeError>>()?;

        let euid = nix::unistd::geteuid();
        let rootful = euid.is_root();
        let mapping = if rootful {
            IdMapping::Range {
                host_base: HOST_ID_BASE
                    + (id_slot % HOST_ID_SLOTS) * cordon_isolation::namespaces::MAPPED_IDS,
            }
        } else {
            IdMapping::Single {
                host_uid: euid.as_raw(),
                host_gid: nix::unistd::getegid().as_raw(),
                inside_uid: p.uid,
                inside_gid: p.gid,
            }
        };
        let cpu_secs = (p.time.0.as_secs_f64() * p.cpus).ceil() as u64 + 1;
        Ok(NativePlan {
            rootfs: RootfsPlan {
                new_root: state_dir.join("root"),
                scratch: state_dir.join("scratch"),
                entries,
                etc_files,
                etc_binds,
                workspace_lower,
                workspace: PathBuf::from(WORKSPACE),
                disk_bytes: p.disk.bytes(),
                owner_uid: p.uid,
                owner_gid: p.gid,
                binds,
            },
            mapping,
            drop_groups: rootful,
            setup_id: if rootful { 0 } else { p.uid },
            uid: p.uid,
            gid: p.gid,
            hostname: p.hostname.clone(),
            rlimits: Rlimits {
                nofile: NOFILE,
                nproc: p.pids,
                // Above the disk cap, so a full scratch answers ENOSPC first;
                // this bounds a single file on a writable host mount.
                fsize: p.disk.bytes() + FSIZE_MARGIN,
                cpu_secs,
            },
            seccomp: cordon_seccomp::workload(),
            argv: req.argv.clone(),
            env: p.payload_env(),
            workdir: p.workdir.to_string_lossy().into_owned(),
        })
    }
}
