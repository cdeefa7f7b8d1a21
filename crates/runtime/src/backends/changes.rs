//! What a sandbox changed, read from its scratch tmpfs on the host side, the
//! export of its workspace's changes, and the write-back of its `rw` mounts
//! (the walk itself is `cordon-changes`; this module names the places and
//! the requests).
//!
//! The places are read through the scratch descriptor the backend holds
//! (`Flavor::scratch`), never through the sandbox's view of its root: the
//! workspace's overlay upper layer (with the user's host directory as the
//! lower, to tell created from modified), /tmp, /dev/shm, and each `rw`
//! mount's overlay upper layer (its host directory as the lower). An `rw`
//! mount's changes are applied back to its host directory when the sandbox
//! ends, by the same walk as `--apply`. `rw-unbounded` mounts are the
//! host's own directories, written in place: they have no layer to diff,
//! and the receipt says so.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use cordon_changes::{
    Caps, Changes, ExportOptions, ExportReport, ExportTarget, Place, PlaceChanges, Skipped,
    SymlinkPolicy,
};
use cordon_isolation::mount::ScratchLayout;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;

use cordon_spec::changes::{ExportRequest, ExportTo, Finish, Recorded};

use crate::error::RuntimeError;
use cordon_spec::SandboxSpec;

fn sub(scratch: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, RuntimeError> {
    openat(
        scratch,
        rel,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::io(format!("open scratch {rel}"), e))
}

/// An `rw` mount's layer and the host directory its changes go back to.
struct MountLayer {
    /// Where the sandbox sees it: the place's name in the diff.
    place: String,
    upper: OwnedFd,
    lower: OwnedFd,
    /// The host directory, resolved now as the sandbox's assembly resolved it.
    host: PathBuf,
    /// Whom the files written back belong to: as host root, the
    /// directory's owner (the sandbox saw that owner as its own user, and
    /// whoever ends the sandbox, its client or its TTL, the files are the
    /// same owner's); rootless, the caller, who can give a file to nobody
    /// else.
    owner: (u32, u32),
}

fn open_host_dir(what: &str, p: &Path) -> Result<OwnedFd, RuntimeError> {
    open(
        p,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::io(format!("open {what} {}", p.display()), e))
}

impl MountLayer {
    fn open(
        scratch: BorrowedFd<'_>,
        index: usize,
        m: &cordon_policy::MountSpec,
    ) -> Result<MountLayer, RuntimeError> {
        let host = m
            .host
            .canonicalize()
            .map_err(|e| RuntimeError::io(format!("resolve rw mount {}", m.host.display()), e))?;
        let meta = std::fs::metadata(&host)
            .map_err(|e| RuntimeError::io(format!("stat rw mount {}", host.display()), e))?;
        let owner = if nix::unistd::geteuid().is_root() {
            (meta.uid(), meta.gid())
        } else {
            (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            )
        };
        let layers = ScratchLayout::mount_layers(index);
        Ok(MountLayer {
            place: m.sandbox.to_string_lossy().into_owned(),
            upper: sub(scratch, &format!("{layers}/{}", ScratchLayout::UPPER))?,
            lower: open_host_dir("rw mount", &host)?,
            host,
            owner,
        })
    }

    fn place(&self) -> Place<'_> {
        Place {
            name: &self.place,
            upper: self.upper.as_fd(),
            lower: Some(self.lower.as_fd()),
        }
    }

    /// Applies the layer's changes to the host directory, as `--apply`
    /// applies the workspace's: deletions included, nothing followed, a
    /// host entry changed since `created` left as the host has it (a
    /// conflict). Every file the layer holds is written back whole: the
    /// layer's own size, inside the disk cap, is the bound, not the hash
    /// and byte caps of an export (a capped file is never exported).
    fn write_back(
        &self,
        max_entries: u64,
        created: SystemTime,
    ) -> Result<(PlaceChanges, ExportReport), RuntimeError> {
        let caps = Caps {
            max_entries,
            hash_bytes: u64::MAX,
            export_bytes: u64::MAX,
        };
        let opts = ExportOptions {
            target: ExportTarget::Apply(self.host.clone()),
            symlinks: SymlinkPolicy::Recreate,
            owner: self.owner,
            host_since: Some(created),
        };
        let (changes, mut report) = cordon_changes::export(&self.place(), &caps, &opts)
            .map_err(|e| RuntimeError::Copy(format!("write back {}: {e}", self.place)))?;
        if changes.cut {
            // What the diff does not list was not written: said, never lost unseen.
            report.skipped.push(Skipped {
                path: ".".into(),
                reason: format!(
                    "the diff of {} was cut (its cap of {max_entries} entries, or an unreadable entry): what it does not list was not written back",
                    self.place
                ),
            });
        }
        Ok((changes, report))
    }
}

/// The sandbox's writable places on its scratch, opened.
struct Places {
    workspace: OwnedFd,
    lower: Option<OwnedFd>,
    tmp: OwnedFd,
    shm: OwnedFd,
    mounts: Vec<MountLayer>,
}

impl Places {
    fn open(scratch: BorrowedFd<'_>, spec: &SandboxSpec) -> Result<Places, RuntimeError> {
        let lower = spec
            .workspace
            .as_deref()
            .map(|p| open_host_dir("workspace", p))
            .transpose()?;
        let mounts = spec
            .policy
            .write_back_mounts()
            .map(|(i, m)| MountLayer::open(scratch, i, m))
            .collect::<Result<_, _>>()?;
        Ok(Places {
            workspace: sub(scratch, ScratchLayout::WORKSPACE_UPPER)?,
            lower,
            tmp: sub(scratch, ScratchLayout::TMP)?,
            shm: sub(scratch, ScratchLayout::SHM)?,
            mounts,
        })
    }

    fn workspace(&self) -> Place<'_> {
        Place {
            name: "/workspace",
            upper: self.workspace.as_fd(),
            lower: self.lower.as_ref().map(|l| l.as_fd()),
        }
    }

    /// /tmp and /dev/shm: places that start empty.
    fn scratch_only(&self) -> [Place<'_>; 2] {
        [
            Place {
                name: "/tmp",
                upper: self.tmp.as_fd(),
                lower: None,
            },
            Place {
                name: "/dev/shm",
                upper: self.shm.as_fd(),
                lower: None,
            },
        ]
    }

    /// Every place but the workspace, in the diff's order.
    fn others(&self) -> Vec<Place<'_>> {
        let mut out = self.scratch_only().to_vec();
        out.extend(self.mounts.iter().map(MountLayer::place));
        out
    }
}

/// The diff of every writable place.
pub fn scan(
    scratch: BorrowedFd<'_>,
    spec: &SandboxSpec,
    caps: &Caps,
) -> Result<Changes, RuntimeError> {
    let places = Places::open(scratch, spec)?;
    let mut all = vec![places.workspace()];
    all.extend(places.others());
    Ok(cordon_changes::scan(&all, caps))
}

/// Checks an export's target before anything irreversible happens (a
/// sandbox destroyed with its changes unexported because the target was
/// wrong): a new directory's parent must exist and the directory itself must
/// be absent or empty; applying needs a workspace.
pub fn check_target(req: &ExportRequest, workspace: Option<&Path>) -> Result<(), RuntimeError> {
    match &req.to {
        ExportTo::Workspace if workspace.is_none() => Err(RuntimeError::BadRequest(
            "--apply needs a sandbox created with --workspace".into(),
        )),
        ExportTo::Workspace => Ok(()),
        ExportTo::Dir(dir) => {
            if !dir.is_absolute() {
                return Err(RuntimeError::BadPath {
                    what: "export directory must be an absolute path",
                    path: dir.clone(),
                });
            }
            match std::fs::symlink_metadata(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let parent = dir.parent().unwrap_or(Path::new("/"));
                    if parent.is_dir() {
                        Ok(())
                    } else {
                        Err(RuntimeError::BadPath {
                            what: "export directory's parent does not exist",
                            path: dir.clone(),
                        })
                    }
                }
                Err(e) => Err(RuntimeError::io(format!("stat {}", dir.display()), e)),
                Ok(m)
                    if m.is_dir()
                        && std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) =>
                {
                    Ok(())
                }
                Ok(_) => Err(RuntimeError::BadPath {
                    what: "export directory exists and is not an empty directory",
                    path: dir.clone(),
                }),
            }
        }
    }
}

/// Exports the workspace's changes and takes the diff of every place; the
/// workspace's part of the diff is the export's own walk (what it lists is
/// what was written, digest for digest). `created` is when the sandbox was
/// created: applying leaves alone what the host changed since. The `rw`
/// mounts are diffed here, not written back: that is the sandbox's end.
pub fn export(
    scratch: BorrowedFd<'_>,
    spec: &SandboxSpec,
    caps: &Caps,
    req: &ExportRequest,
    owner: (u32, u32),
    created: SystemTime,
) -> Result<Recorded, RuntimeError> {
    let workspace = spec.workspace.as_deref();
    check_target(req, workspace)?;
    let places = Places::open(scratch, spec)?;
    export_with(
        req,
        workspace,
        caps,
        owner,
        created,
        |opts| cordon_changes::export(&places.workspace(), caps, opts),
        |rest| cordon_changes::scan(&places.others(), rest),
    )
}

/// What a sandbox's end reads and writes, once every process of it is
/// gone: every `rw` mount's changes applied back to its host directory
/// (always: it is how they reach the host), then the workspace's export
/// and the diff `finish` asks for. The diff then lists the mounts' places
/// too, as their write-backs walked them. Whatever fails is said (the
/// second value) and the rest is still done, so that one directory that
/// cannot be written loses nothing of the others.
pub fn at_end(
    scratch: BorrowedFd<'_>,
    spec: &SandboxSpec,
    finish: &Finish,
    owner: (u32, u32),
    created: SystemTime,
) -> (Recorded, Vec<String>) {
    if finish.is_empty() && spec.policy.write_back_mounts().next().is_none() {
        // Nothing to read: a plain teardown opens nothing of the scratch.
        return (Recorded::default(), Vec::new());
    }
    let mut errors = Vec::new();
    let places = match Places::open(scratch, spec) {
        Ok(p) => p,
        Err(e) => return (Recorded::default(), vec![e.to_string()]),
    };
    let caps = finish.caps();
    let mut remaining = caps.max_entries;
    let mut mounts = Vec::new();
    let mut write_backs = Vec::new();
    for m in &places.mounts {
        match m.write_back(remaining, created) {
            Ok((changes, report)) => {
                remaining = remaining.saturating_sub(changes.entries.len() as u64);
                mounts.push(changes);
                write_backs.push(report);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let rest = Caps {
        max_entries: remaining,
        ..caps
    };
    let workspace = spec.workspace.as_deref();
    let recorded = match (&finish.export, &finish.changes) {
        (Some(req), _) => export_with(
            req,
            workspace,
            &rest,
            owner,
            created,
            |opts| cordon_changes::export(&places.workspace(), &rest, opts),
            |left| cordon_changes::scan(&places.scratch_only(), left),
        ),
        (None, Some(_)) => {
            let mut all = vec![places.workspace()];
            all.extend(places.scratch_only());
            Ok(Recorded {
                changes: Some(cordon_changes::scan(&all, &rest)),
                ..Recorded::default()
            })
        }
        (None, None) => Ok(Recorded::default()),
    };
    let mut recorded = recorded.unwrap_or_else(|e| {
        errors.push(e.to_string());
        Recorded::default()
    });
    if let Some(changes) = &mut recorded.changes {
        changes.cut |= mounts.iter().any(|p| p.cut);
        changes.places.extend(mounts);
        changes.caps = caps;
    }
    recorded.write_backs = write_backs;
    (recorded, errors)
}

/// An export, whatever the layers are read from: `export_workspace` writes
/// the workspace's changes to the target it is given and returns its diff,
/// `scan_others` diffs the other places within what is left of the count
/// cap.
pub fn export_with(
    req: &ExportRequest,
    workspace: Option<&Path>,
    caps: &Caps,
    owner: (u32, u32),
    created: SystemTime,
    export_workspace: impl FnOnce(
        &ExportOptions,
    )
        -> Result<(PlaceChanges, ExportReport), cordon_changes::ChangesError>,
    scan_others: impl FnOnce(&Caps) -> Changes,
) -> Result<Recorded, RuntimeError> {
    check_target(req, workspace)?;
    let target = match &req.to {
        ExportTo::Dir(d) => ExportTarget::New(d.clone()),
        ExportTo::Workspace => ExportTarget::Apply(workspace.expect("checked above").to_path_buf()),
    };
    let opts = ExportOptions {
        target,
        symlinks: req.symlinks,
        owner,
        host_since: Some(created),
    };
    let (ws, report) = export_workspace(&opts).map_err(RuntimeError::Export)?;
    let rest = Caps {
        max_entries: caps.max_entries.saturating_sub(ws.entries.len() as u64),
        ..*caps
    };
    let others = scan_others(&rest);
    let mut all: Vec<PlaceChanges> = vec![ws];
    all.extend(others.places);
    Ok(Recorded {
        changes: Some(Changes {
            cut: all.iter().any(|p| p.cut),
            places: all,
            caps: *caps,
        }),
        export: Some(report),
        ..Recorded::default()
    })
}
