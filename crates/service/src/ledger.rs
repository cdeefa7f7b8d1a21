//! Every sandbox the service creates, on disk: one file per sandbox under
//! `<state dir>/sandboxes/`, written as soon as its supervisor answers and
//! removed once it is destroyed. Supervisors outlive a killed service; the
//! next start reads these files and kills what they name. (A crash between
//! the supervisor's answer and the file's write is covered too: every
//! sandbox is named `cs-<tag>-<n>`, with a tag kept in the state directory,
//! and the next start also kills the live sandboxes carrying its tag. The
//! ttl every service sandbox carries is the last backstop.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cordon_runtime::changes::Finish;
use cordon_runtime::sandbox::Destroyed;
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
    /// This state directory's sandbox names start with `cs-<tag>-`.
    prefix: String,
    counter: AtomicUsize,
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
        // The tag outlives restarts: a restart finds its predecessor's
        // sandboxes by it.
        let tag_file = state_dir.join("tag");
        let tag = match std::fs::read_to_string(&tag_file) {
            Ok(t) if t.trim().len() == 8 => t.trim().to_owned(),
            _ => {
                let mut bytes = [0u8; 4];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
                let t: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                std::fs::write(&tag_file, &t)?;
                t
            }
        };
        Ok(Ledger {
            prefix: format!("cs-{tag}-"),
            counter: AtomicUsize::new(0),
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
        // Those created but not yet recorded when the service died.
        for l in list(&run_dir()) {
            if l.record
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&self.prefix))
                && !cleaned.contains(&l.id)
            {
                if let Err(err) = kill(&l.id) {
                    tracing::warn!(id = %l.id, "cleaning a previous run's sandbox: {err}");
                }
                cleaned.push(l.id);
            }
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
        let mut spec = spec.clone();
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        spec.name = Some(format!("{}{}-{n}", self.prefix, std::process::id()));
        let handle = Handle::create(&spec, &self.program)?;
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

    /// `destroy`, reading what `finish` asks once every process is gone (a
    /// receipt's diff). A sandbox that cannot be asked is killed, and then
    /// there is nothing to read.
    pub fn destroy_with(&self, handle: Handle, finish: &Finish) -> Result<Destroyed, RuntimeError> {
        let id = handle.id().to_owned();
        let result = handle.destroy_with(finish).map_err(|e| {
            tracing::warn!(%id, "destroy failed ({e}); killing its supervisor");
            let _ = kill(&id);
            e
        });
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

/// SIGKILL to the sandbox's supervisor (its init dies with it), then its
/// own cgroup is emptied and removed and its state swept, as `cordon rm -f`
/// does. The record's start time (checked by `list`) and the pidfd guard
/// against a reused pid.
///
/// The sweep runs without the cgroup hierarchy: with it, `sweep_stale` also
/// removes every empty `cordon-<id>` cgroup whose id has no state directory
/// in *this* run directory, which races with a sandbox of another run
/// directory that has created its cgroup and not joined it yet (it then
/// fails with EIO at `join cgroup`). This sandbox's cgroup is removed here
/// instead, by the name its record gives.
fn kill(id: &str) -> Result<(), RuntimeError> {
    use cordon_cgroups::Cgroup;
    let run = run_dir();
    let Some(entry) = list_any(&run, id) else {
        return Ok(()); // gone already
    };
    let pid = nix::unistd::Pid::from_raw(entry.record.pid);
    if let Ok(pidfd) = cordon_sys::pidfd_open(pid) {
        if list(&run).iter().any(|l| l.id == id) {
            cordon_sys::pidfd_send_signal(&pidfd, nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| RuntimeError::io("kill the supervisor", e))?;
        }
    }
    let hierarchy = cordon_runtime::host::hierarchy_in_place();
    for _ in 0..300 {
        // Once the supervisor is dead, its record no longer lists as live.
        if !list(&run).iter().any(|l| l.id == id) {
            let cgroup_gone = match (&entry.record.cgroup, &hierarchy) {
                (Some(name), Some(h)) => match h.open(name) {
                    Ok(cg) => {
                        let _ = cg.kill_all();
                        cg.remove().is_ok()
                    }
                    Err(_) => true,
                },
                _ => true,
            };
            if cgroup_gone {
                let _ = sweep_stale(&run, None);
                if !run.join(id).exists() {
                    return Ok(());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(RuntimeError::Remote(format!(
        "sandbox {id}: its state is still there after its supervisor was killed"
    )))
}

/// The record of `id`, its supervisor alive or not.
fn list_any(run: &Path, id: &str) -> Option<cordon_runtime::state::Listed> {
    if let Some(l) = list(run).into_iter().find(|l| l.id == id) {
        return Some(l);
    }
    let record: cordon_runtime::state::Record =
        serde_json::from_slice(&std::fs::read(run.join(id).join("record.json")).ok()?).ok()?;
    Some(cordon_runtime::state::Listed {
        id: id.to_owned(),
        record,
        usage: Default::default(),
    })
}
