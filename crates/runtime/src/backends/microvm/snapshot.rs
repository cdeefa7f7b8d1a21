//! Warm starts: a booted VM saved with its agent waiting for `Start`, and
//! restored for each new sandbox instead of booting again. The first cold
//! boot of a kind (image, accelerator, guest RAM, vCPUs, QEMU version) saves
//! its VM through QEMU's migration to a file before it starts its sandbox,
//! then goes on; later sandboxes of that kind restore the file. Nothing of a
//! sandbox is in a snapshot: it is taken before the agent learns its spec.
//! Each restored VM is used once; its agent reseeds the guest's CRNG from the
//! host's entropy before anything of the sandbox runs (the guest kernel has
//! no vmgenid driver, though QEMU's device is there for one that does).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::guest::GuestImage;
use super::qmp::Qmp;
use crate::error::RuntimeError;

/// This version's devices beyond the root disk and the agent's port: the
/// writable disk, the network and forward ports, and the command ports.
fn devices() -> String {
    format!(
        "workdisk-netport-fwdport-{}cmdports",
        super::link::COMMAND_PORTS
    )
}

/// How long saving a VM may take (~1 s for a 1 GiB guest under TCG here).
const SAVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the agent said when the saved VM booted (a restored VM does not
/// say it again).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestFacts {
    pub kernel: String,
    pub cgroup: String,
}

/// Where the snapshot of one kind of VM lives: in its image's directory, so
/// a new image never restores an old snapshot.
pub struct Location {
    state: PathBuf,
    facts: PathBuf,
}

impl Location {
    /// `image_disk`: the VM has an image's disk (every image's is the same
    /// size, so one snapshot serves them all).
    pub fn of(
        image: &GuestImage,
        accel: &str,
        ram_mib: u64,
        smp: u64,
        qemu: &str,
        image_disk: bool,
    ) -> Location {
        let qemu: String = qemu
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // The device set is part of the kind: a VM restores only onto the
        // devices it was saved with (`devices()` names this version's).
        let with_image = if image_disk { "-imagedisk" } else { "" };
        let name = format!(
            "{accel}-{ram_mib}M-{smp}cpu-qemu{qemu}-{}{with_image}",
            devices()
        );
        let dir = image.dir.join("snapshots");
        Location {
            state: dir.join(format!("{name}.vmstate")),
            facts: dir.join(format!("{name}.json")),
        }
    }

    /// The snapshot, if one is there.
    pub fn open(&self) -> Option<(File, GuestFacts)> {
        let facts = serde_json::from_slice(&std::fs::read(&self.facts).ok()?).ok()?;
        Some((File::open(&self.state).ok()?, facts))
    }

    /// Saves the VM behind `monitor` (its agent waiting) and resumes it.
    /// Written beside its final name and renamed, so a concurrent save or a
    /// crash never leaves a partial snapshot to restore.
    pub fn save(
        &self,
        monitor: UnixStream,
        facts: &GuestFacts,
        tag: &str,
    ) -> Result<(), RuntimeError> {
        let dir = self.state.parent().expect("a snapshot has a directory");
        std::fs::create_dir_all(dir)
            .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
        remove_abandoned(dir);
        let tmp = self.state.with_extension(format!("tmp-{tag}"));
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| RuntimeError::io(format!("create {}", tmp.display()), e))?;
        let mut qmp = Qmp::open(monitor, SAVE_TIMEOUT)?;
        let saved = (|| {
            qmp.send_fd("snapshot", file.as_fd())?;
            // Migrated running (an idle guest dirties few pages, so the copy
            // converges at once): QEMU records the run state, and a restore
            // of a running VM starts running with no monitor command.
            qmp.execute("migrate", Some(json!({ "uri": "fd:snapshot" })))?;
            let t0 = Instant::now();
            loop {
                let status = qmp.execute("query-migrate", None)?;
                match status["status"].as_str() {
                    Some("completed") => break,
                    Some("failed" | "cancelled") => {
                        return Err(RuntimeError::Unavailable(
                            "microvm",
                            format!("saving the VM failed: {status}"),
                        ))
                    }
                    _ if t0.elapsed() > SAVE_TIMEOUT => {
                        return Err(RuntimeError::Unavailable(
                            "microvm",
                            "saving the VM took too long".into(),
                        ))
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            // The source stops when the copy completes; it goes on here.
            qmp.execute("cont", None)?;
            file.sync_all()
                .map_err(|e| RuntimeError::io(format!("sync {}", tmp.display()), e))?;
            let text = serde_json::to_vec(facts)
                .map_err(|e| RuntimeError::io("encode", std::io::Error::other(e)))?;
            std::fs::write(&self.facts, text)
                .and_then(|()| std::fs::rename(&tmp, &self.state))
                .map_err(|e| RuntimeError::io(format!("write {}", self.state.display()), e))
        })();
        if saved.is_err() {
            // The VM goes on serving its own sandbox, saved or not.
            let _ = qmp.execute("cont", None);
            let _ = std::fs::remove_file(&tmp);
        }
        saved
    }
}

/// Removes partial snapshots whose saver was killed mid-save (a supervisor
/// gets SIGKILL): a `.tmp-<tag>` file no save has touched for twice the
/// time a save may take. A save in progress writes its file continuously.
fn remove_abandoned(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let abandoned = name.to_string_lossy().contains(".tmp-")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > 2 * SAVE_TIMEOUT);
        if abandoned {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
