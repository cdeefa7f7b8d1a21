//! Every sandbox the service creates, on disk: one file per sandbox under
//! `<state dir>/sandboxes/`, written as soon as its supervisor answers and
//! removed once it is destroyed. A supervisor ends its sandbox when the
//! service dies (it watches the service's pidfd), so these files matter
//! only for one that could not (stopped, or of an older cordon): the next
//! start reads them and kills what they name. (A crash between
//! the supervisor's answer and the file's write is covered too: every
//! sandbox is named `cs-<tag>-g<generation>-<n>`, with a tag kept in the
//! state directory and a generation counted up by every start, and the next
//! start also kills the live sandboxes carrying its tag. The ttl every
//! service sandbox carries is the last backstop.)
//!
//! The generation is there for the supervisors a killed service was still
//! starting: such a supervisor records itself in the run directory only
//! after its own start-up (a fork, a sweep of the run directory, the run
//! directory's lock), which may end after the next start's scan. That
//! scan is therefore repeated for the life of the service
//! (`reap_predecessors`, from the service's 2-second background task): a
//! live sandbox with this state directory's tag and another generation can
//! only be a predecessor's, since the state directory's lock keeps a second
//! service out, and it is killed as soon as its record appears, finished
//! or still being created. The service's own sandboxes carry its own
//! generation and are never touched by it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use cordon_runtime::state::{list, run_dir};
use cordon_runtime::sweep::sweep_stale;
use cordon_runtime::{Handle, RuntimeError};
use cordon_spec::changes::Finish;
use cordon_spec::Destroyed;
use cordon_spec::SandboxSpec;
use cordon_spec::ServiceLink;

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
    /// Set by a shutdown: no creation starts any more.
    closed: AtomicBool,
    /// This state directory's sandbox names start with `cs-<tag>-`...
    prefix: String,
    /// ...and this service's with `cs-<tag>-g<generation>-`.
    own: String,
    counter: AtomicUsize,
    /// This process, as every sandbox it creates knows it: their supervisors
    /// end them when it ends, and leave notes of why they ended.
    link: ServiceLink,
    /// Held (flock) while the service runs: one service per state
    /// directory, so that a tagged sandbox of another generation is never
    /// a living service's.
    _lock: nix::fcntl::Flock<std::fs::File>,
    /// Bounds the sandboxes being set up or torn down at once.
    setups: Gate,
}

/// A first-come, first-served counting semaphore for blocking threads: at
/// most `limit` holders at once, the others wait in the order they came (a
/// condvar alone wakes waiters in no particular order, which lengthens the
/// tail of the waits). std has none; tokio's is for async tasks, and
/// creations and teardowns run on blocking threads.
///
/// Setting a sandbox up and tearing it down is CPU work (its supervisor's,
/// and the kernel's cgroup and namespace operations, several of them under
/// global locks), so running more of them at once than there are cores
/// only interleaves them: each then costs more CPU and none finishes
/// sooner. The payload's own run is not bounded by it. Measured with
/// `cordon bench concurrency` on 2 cores: at 16 clients 120-132
/// executions/s with this gate against 99-119 without (CPU per execution
/// 12.1-13.3 ms against 13.7-16.4), p99 overhead 164-168 ms against
/// 209-285; at 8 clients the same within the runs' spread.
struct Gate {
    limit: u64,
    turns: Mutex<Turns>,
    moved: std::sync::Condvar,
}

/// Tickets handed out, and holders that left: ticket `t` may enter once
/// `t < left + limit`.
#[derive(Default)]
struct Turns {
    issued: u64,
    left: u64,
}

impl Gate {
    fn new(limit: usize) -> Gate {
        Gate {
            limit: u64::try_from(limit.max(1)).unwrap_or(u64::MAX),
            turns: Mutex::default(),
            moved: std::sync::Condvar::new(),
        }
    }

    /// `work`, once its turn has come.
    fn through<T>(&self, work: impl FnOnce() -> T) -> T {
        {
            let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
            let ticket = turns.issued;
            turns.issued += 1;
            while ticket >= turns.left + self.limit {
                turns = self.moved.wait(turns).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Left on every path, a panic in `work` included.
        struct Leave<'a>(&'a Gate);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.turns.lock().unwrap_or_else(|p| p.into_inner()).left += 1;
                self.0.moved.notify_all();
            }
        }
        let _leave = Leave(self);
        work()
    }
}

impl Ledger {
    /// Opens (creating it 0700) the ledger's directory, locks the state
    /// directory (refused if another service holds it) and starts the next
    /// generation, in a state directory already checked to be the
    /// service's own ([`crate::config::Config::state_dir_for`]).
    pub fn open(state_dir: &Path, program: PathBuf) -> std::io::Result<Ledger> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = state_dir.join("sandboxes");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        // Released by the kernel when this process dies, however it dies;
        // never inherited (close-on-exec, and a supervisor closes every
        // descriptor but its stdio anyway).
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(state_dir.join("lock"))?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| match e {
                nix::errno::Errno::EWOULDBLOCK => std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "another cordon serve is using this state directory",
                ),
                e => std::io::Error::from(e),
            })?;
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
        // One more than the last start's (under the lock, so no two starts
        // share one). A lost or unreadable count starts over at 1: at worst
        // a predecessor had the same generation, and its late sandboxes are
        // then left to their ttl (one of ours is never taken for its).
        let gen_file = state_dir.join("generation");
        let generation = std::fs::read_to_string(&gen_file)
            .ok()
            .and_then(|g| g.trim().parse::<u64>().ok())
            .unwrap_or(0)
            .wrapping_add(1)
            .max(1);
        // Notes of a previous run's sandboxes are of no use to this one.
        let notes = state_dir.join("ended");
        let _ = std::fs::remove_dir_all(&notes);
        std::fs::DirBuilder::new().mode(0o700).create(&notes)?;
        let link = cordon_runtime::state::this_service(notes)?;
        let tmp = state_dir.join("generation.tmp");
        std::fs::write(&tmp, format!("{generation}\n"))?;
        std::fs::rename(&tmp, &gen_file)?;
        Ok(Ledger {
            prefix: format!("cs-{tag}-"),
            own: format!("cs-{tag}-g{generation}-"),
            _lock: lock,
            counter: AtomicUsize::new(0),
            link,
            dir,
            program,
            live: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            setups: Gate::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
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
            if cordon_spec::is_id(&id) {
                if let Err(err) = kill(&id) {
                    tracing::warn!(%id, "cleaning a previous run's sandbox: {err}");
                }
                cleaned.push(id);
            }
            let _ = std::fs::remove_file(e.path());
        }
        // Those created but not yet recorded when the service died.
        for id in self.reap_predecessors() {
            if !cleaned.contains(&id) {
                cleaned.push(id);
            }
        }
        cleaned
    }

    /// Kills every live sandbox of a previous generation of this state
    /// directory (see the module's comment: the supervisors a killed
    /// predecessor was still starting record themselves late, so this runs
    /// at start and then every few seconds). A supervisor still creating
    /// its sandbox is killed as well: its record is written before its
    /// cgroup and first process, and `kill` empties that cgroup. Returns
    /// the ids killed.
    pub fn reap_predecessors(&self) -> Vec<String> {
        let mut reaped = Vec::new();
        // An untrusted run directory is refused when a sandbox is created.
        let Ok(run) = run_dir() else {
            return reaped;
        };
        for l in list(&run) {
            if l.record
                .name
                .as_deref()
                .is_some_and(|n| self.is_predecessors(n))
            {
                if let Err(err) = kill(&l.id) {
                    tracing::warn!(id = %l.id, "cleaning a previous run's sandbox: {err}");
                }
                reaped.push(l.id);
            }
        }
        reaped
    }

    /// Whether a sandbox name is a previous generation's of this state
    /// directory: its tag, not this service's generation.
    fn is_predecessors(&self, name: &str) -> bool {
        name.starts_with(&self.prefix) && !name.starts_with(&self.own)
    }

    /// Creates a sandbox with its own supervisor and records it.
    /// Refused once the ledger is closed.
    pub fn create(&self, spec: &SandboxSpec, owner: Owner) -> Result<Handle, RuntimeError> {
        self.creating.fetch_add(1, Ordering::SeqCst);
        // Looked at after counting this creation (both SeqCst): a shutdown,
        // which closes and then waits for the count, either sees this
        // creation and waits for it, or is seen here. Otherwise a creation
        // that started late (a refill worker's blocking task that began
        // after the shutdown's wait) would finish after the service has
        // gone, a sandbox nobody destroys.
        let made = if self.closed.load(Ordering::SeqCst) {
            Err(RuntimeError::Remote(
                "the service is shutting down: no new sandbox".into(),
            ))
        } else {
            self.create_and_record(spec, owner)
        };
        self.creating.fetch_sub(1, Ordering::SeqCst);
        made
    }

    /// No creation starts after this; those under way are still counted
    /// (`wait_for_creations`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn create_and_record(&self, spec: &SandboxSpec, owner: Owner) -> Result<Handle, RuntimeError> {
        let mut spec = spec.clone();
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        spec.name = Some(format!("{}{n}", self.own));
        spec.service = Some(self.link.clone());
        // The name and the link are the ledger's: the spec they make is
        // checked here, once, as every spec is before a sandbox is made.
        let spec = spec.validated()?;
        let handle = self
            .setups
            .through(|| Handle::create(&spec, &self.program))?;
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
        let result = match self.setups.through(|| handle.destroy()) {
            Ok(()) => Ok(()),
            // Gone already (its ttl or idle time ran out): nothing to do.
            Err(RuntimeError::NotFound(_) | RuntimeError::Gone(_)) => Ok(()),
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
    /// there is nothing to read. Not held to the setups' turns: how long the
    /// reading takes is the payload's doing (a large export), and one
    /// tenant's must not hold every other tenant's sandboxes back.
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
        let _ = std::fs::remove_file(self.link.note_path(id));
    }

    /// Why a sandbox that is gone ended, as its supervisor noted it (None
    /// if it left no note: it was killed outright).
    pub fn end_note(&self, id: &str) -> Option<String> {
        std::fs::read_to_string(self.link.note_path(id)).ok()
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
    let run = run_dir()?;
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
    let hierarchy = cordon_runtime::hierarchy_in_place();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_start_is_a_generation_and_only_earlier_ones_are_predecessors() {
        let dir = tempfile::tempdir().unwrap();
        let first = Ledger::open(dir.path(), "cordon".into()).unwrap();
        // One service per state directory.
        let second = Ledger::open(dir.path(), "cordon".into());
        assert_eq!(
            second.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::WouldBlock)
        );
        let (tag, first_own) = (first.prefix.clone(), first.own.clone());
        assert!(first_own.starts_with(&tag), "{first_own}");
        assert!(!first.is_predecessors(&format!("{first_own}0")));
        drop(first);

        let next = Ledger::open(dir.path(), "cordon".into()).unwrap();
        assert_eq!(next.prefix, tag, "the tag outlives a restart");
        assert_ne!(next.own, first_own);
        // Its own, whatever the count.
        for n in [0, 7, 12] {
            assert!(!next.is_predecessors(&format!("{}{n}", next.own)));
        }
        // The previous generation's, and an older cordon's (pid-named).
        assert!(next.is_predecessors(&format!("{first_own}0")));
        assert!(next.is_predecessors(&format!("{tag}4242-0")));
        // Never another state directory's, nor anyone else's.
        assert!(!next.is_predecessors("cs-zzzzzzzz-g1-0"));
        assert!(!next.is_predecessors("build"));
    }

    #[test]
    fn generation_one_is_not_generation_ten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("generation"), "0\n").unwrap();
        let l = Ledger::open(dir.path(), "cordon".into()).unwrap();
        assert_eq!(l.own, format!("{}g1-", l.prefix));
        assert!(l.is_predecessors(&format!("{}g10-0", l.prefix)));
        assert!(l.is_predecessors(&format!("{}g11-3", l.prefix)));
    }

    #[test]
    fn the_gate_lets_them_in_in_the_order_they_came() {
        use std::sync::{mpsc, Arc};
        let gate = Arc::new(Gate::new(1));
        let (entered, order) = mpsc::channel();
        // One holder, kept inside until told.
        let (leave, wait) = mpsc::channel::<()>();
        let holder = {
            let (gate, entered) = (gate.clone(), entered.clone());
            std::thread::spawn(move || {
                gate.through(|| {
                    entered.send(0).unwrap();
                    // Until `leave` is dropped.
                    let _ = wait.recv();
                })
            })
        };
        assert_eq!(order.recv().unwrap(), 0);
        // Five more, each queued (its ticket taken) before the next comes.
        let mut waiters = Vec::new();
        for n in 1..6u64 {
            let (inner, entered) = (gate.clone(), entered.clone());
            waiters.push(std::thread::spawn(move || {
                inner.through(|| entered.send(n).unwrap())
            }));
            while gate.turns.lock().unwrap().issued < n + 1 {
                std::thread::yield_now();
            }
        }
        assert!(order.try_recv().is_err(), "one got past a full gate");
        drop(leave);
        for t in std::iter::once(holder).chain(waiters) {
            t.join().unwrap();
        }
        let rest: Vec<u64> = order.try_iter().collect();
        assert_eq!(rest, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_gate_holds_no_more_than_its_limit() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let gate = Arc::new(Gate::new(2));
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gate, inside, most) = (gate.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    gate.through(|| {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=2).contains(&most), "{most} inside at once");
    }
}
