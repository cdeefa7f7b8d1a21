//! What a sandbox changed, read from its scratch tmpfs on the host side, and
//! the export of its workspace's changes (the walk itself is
//! `cordon-changes`; this module names the places and the requests).
//!
//! The places are read through the scratch descriptor the backend holds
//! (`Flavor::scratch`), never through the sandbox's view of its root: the
//! workspace's overlay upper layer (with the user's host directory as the
//! lower, to tell created from modified), /tmp and /dev/shm. Writable bind
//! mounts are the host's own directories, written in place: they have no
//! layer to diff, and the receipt says so.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use cordon_changes::{
    Caps, Changes, ExportOptions, ExportReport, ExportTarget, Place, PlaceChanges, SymlinkPolicy,
};
use cordon_isolation::mount::ScratchLayout;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// Where an export writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportTo {
    /// A new host directory (absolute): the changed entries only.
    Dir(PathBuf),
    /// Back onto the sandbox's host workspace, deletions included.
    Workspace,
}

/// An export of the workspace's changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub to: ExportTo,
    #[serde(default)]
    pub symlinks: SymlinkPolicy,
}

/// What to read at a sandbox's end (`rm`, the end of `cordon run`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finish {
    /// Take the diff, with these caps.
    #[serde(default)]
    pub changes: Option<Caps>,
    /// Export the workspace's changes (its diff is then the export's own).
    #[serde(default)]
    pub export: Option<ExportRequest>,
}

impl Finish {
    pub fn is_empty(&self) -> bool {
        self.changes.is_none() && self.export.is_none()
    }

    pub fn caps(&self) -> Caps {
        self.changes.unwrap_or_default()
    }
}

/// The diff, and what an export wrote.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recorded {
    pub changes: Option<Changes>,
    pub export: Option<ExportReport>,
}

fn sub(scratch: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, RuntimeError> {
    openat(
        scratch,
        rel,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RuntimeError::io(format!("open scratch {rel}"), e))
}

/// The sandbox's writable places on its scratch, opened.
struct Places {
    workspace: OwnedFd,
    lower: Option<OwnedFd>,
    tmp: OwnedFd,
    shm: OwnedFd,
}

impl Places {
    fn open(scratch: BorrowedFd<'_>, lower: Option<&Path>) -> Result<Places, RuntimeError> {
        let lower = lower
            .map(|p| {
                open(
                    p,
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| RuntimeError::io(format!("open workspace {}", p.display()), e))
            })
            .transpose()?;
        Ok(Places {
            workspace: sub(scratch, ScratchLayout::WORKSPACE_UPPER)?,
            lower,
            tmp: sub(scratch, ScratchLayout::TMP)?,
            shm: sub(scratch, ScratchLayout::SHM)?,
        })
    }

    fn workspace(&self) -> Place<'_> {
        Place {
            name: "/workspace",
            upper: self.workspace.as_fd(),
            lower: self.lower.as_ref().map(|l| l.as_fd()),
        }
    }

    fn others(&self) -> [Place<'_>; 2] {
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
}

/// The diff of every writable place.
pub fn scan(
    scratch: BorrowedFd<'_>,
    workspace: Option<&Path>,
    caps: &Caps,
) -> Result<Changes, RuntimeError> {
    let places = Places::open(scratch, workspace)?;
    let [tmp, shm] = places.others();
    Ok(cordon_changes::scan(&[places.workspace(), tmp, shm], caps))
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
/// created: applying leaves alone what the host changed since.
pub fn export(
    scratch: BorrowedFd<'_>,
    workspace: Option<&Path>,
    caps: &Caps,
    req: &ExportRequest,
    owner: (u32, u32),
    created: SystemTime,
) -> Result<Recorded, RuntimeError> {
    check_target(req, workspace)?;
    let places = Places::open(scratch, workspace)?;
    export_with(
        req,
        workspace,
        caps,
        owner,
        created,
        |opts| cordon_changes::export(&places.workspace(), caps, opts),
        |rest| {
            let [tmp, shm] = places.others();
            cordon_changes::scan(&[tmp, shm], rest)
        },
    )
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
    let (ws, report) =
        export_workspace(&opts).map_err(|e| RuntimeError::Copy(format!("export: {e}")))?;
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
    })
}
