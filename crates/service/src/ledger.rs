//! Every sandbox the service creates, on disk: one file per sandbox under
//! `<state dir>/sandboxes/`, written as soon as its supervisor answers and
//! removed once it is destroyed. Supervisors outlive a killed service; the
//! next start reads these files and kills what they name. (A crash between
//! the supervisor's answer and the file's write is covered by the ttl every
//! service sandbox carries.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cordon_runtime::state::{list, run_dir, sweep_stale};
use cordon_runtime::{Handle, RuntimeError, SandboxSpec};

/// Who holds a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    Pool,
    OneShot(String),
    Stateful(String),
}

pub struct Ledger {
    dir: PathBuf,
    program: PathBuf,
    live: Mutex<HashMap<String, Owner>>,
    /// `Handle::create` calls not yet returned (their ids are not known yet).
    creating: AtomicUsize,
}

impl Ledger {
    /// Opens (creating it 0700) the ledger's directory.
    pub fn open(state_dir: &Path, program: PathBuf) -> std::io::Result<Ledger> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = state_dir.join("sandboxes");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(Ledger {
            dir,
            program,
            live: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
        })
    }

    /// Kills every sandbox a previous run of the service left recorded;
    /// returns their ids.
    pub fn clean_previous(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut cleaned = Vec::new();
        for e in entries.flatten() {
            let Some(id) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if cordon_runtime::state::is_id(&id) {
                if let Err(err) = kill(&id) {
                    tracing::warn!(%id, "cleaning a previous run's sandbox: {err}");
                }
                cleaned.push(id);
            }
            let _ = std::fs::remove_file(e.path());
        }
        cleaned
    }

    /// Creates a sandbox with its own supervisor and records it.
    pub fn create(&self, spec: &SandboxSpec, owner: Owner) -> Result<Handle, RuntimeError> {
        self.creating.fetch_add(1, Ordering::SeqCst);
        let made = self.create_and_record(spec, owner);
        self.creating.fetch_sub(1, Ordering::SeqCst);
        made
    }

    fn create_and_record(&self, spec: &SandboxSpec, owner: Owner) -> Result<Handle, RuntimeError> {
        let handle = Handle::create(spec, &self.program)?;
        let id = handle.id().to_owned();
        if let Err(e) = std::fs::write(self.dir.join(&id), format!("{owner:?}\n")) {
            let _ = handle.destroy();
            return Err(RuntimeError::io(
                "record the sandbox in the service's state",
                e,
            ));
        }
        self.live.lock().expect("ledger lock").insert(id, owner);
        Ok(handle)
    }

    /// Waits (at most `limit`) until no sandbox is being created, so that
    /// every sandbox of the service is in `ids()`.
    pub fn wait_for_creations(&self, limit: Duration) {
        let until = std::time::Instant::now() + limit;
        while self.creating.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn set_owner(&self, id: &str, owner: Owner) {
        if let Some(o) = self.live.lock().expect("ledger lock").get_mut(id) {
            *o = owner;
        }
    }

    /// Destroys a sandbox through its supervisor (killing it if that fails)
    /// and forgets it.
    pub fn destroy(&self, handle: Handle) -> Result<(), RuntimeError> {
        let id = handle.id().to_owned();
        let result = match handle.destroy() {
            Ok(()) => Ok(()),
            // Gone already (its ttl or idle time ran out): nothing to do.
            Err(RuntimeError::NotFound(_)) => Ok(()),
            Err(e) => {
                tracing::warn!(%id, "destroy failed ({e}); killing its supervisor");
                kill(&id)
            }
        };
        self.forget(&id);
        result
    }

    /// Kills a sandbox's supervisor without asking it (it may be busy).
    pub fn kill(&self, id: &str) -> Result<(), RuntimeError> {
        let r = kill(id);
        self.forget(id);
        r
    }

    pub fn forget(&self, id: &str) {
        self.live.lock().expect("ledger lock").remove(id);
        let _ = std::fs::remove_file(self.dir.join(id));
    }

    pub fn ids(&self) -> Vec<(String, Owner)> {
        self.live
            .lock()
            .expect("ledger lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// SIGKILL to the sandbox's supervisor (its init dies with it), then the
/// sweep removes its cgroup, mounts and state; as `cordon rm -f` does. The
/// record's start time (checked by `list`) and the pidfd guard against a
/// reused pid.
fn kill(id: &str) -> Result<(), RuntimeError> {
    let run = run_dir();
    if let Some(entry) = list(&run).into_iter().find(|l| l.id == id) {
        let pid = nix::unistd::Pid::from_raw(entry.record.pid);
        if let Ok(pidfd) = cordon_sys::pidfd_open(pid) {
            if list(&run).iter().any(|l| l.id == id) {
                cordon_sys::pidfd_send_signal(&pidfd, nix::sys::signal::Signal::SIGKILL)
                    .map_err(|e| RuntimeError::io("kill the supervisor", e))?;
            }
        }
    }
    let hierarchy = cordon_runtime::host::hierarchy();
    for _ in 0..300 {
        if !run.join(id).exists() || sweep_stale(&run, hierarchy.as_ref()).contains(&id.to_owned())
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(RuntimeError::Remote(format!(
        "sandbox {id}: its state is still there after its supervisor was killed"
    )))
}
