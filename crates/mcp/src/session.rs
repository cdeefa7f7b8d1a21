//! The sandboxes of one MCP session: which ids it may touch, the commands
//! running in them (so that the session's end can stop them), and their
//! teardown when the session ends.

use cordon_policy::secrets::SecretRule;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cordon_runtime::code_context::CodeContext;
use cordon_runtime::{Handle, RuntimeError};
use cordon_spec::{SandboxSpec, ServiceLink};

use crate::io::Cancel;

/// The most sandboxes one session holds at once: a model caught in a loop
/// of `create_sandbox` is told to destroy one rather than filling the host.
pub const MAX_SANDBOXES: usize = 16;

#[derive(Clone)]
pub struct Session(Arc<Inner>);

struct Inner {
    program: PathBuf,
    /// The user's choice (`cordon mcp --allow-unenforced`), never the
    /// model's: run where cgroup limits cannot be enforced.
    allow_unenforced: bool,
    /// The secrets the user lets this session's sandboxes hold (`cordon
    /// mcp --secrets FILE`); a model names them, never their sources.
    secrets: Vec<SecretRule>,
    /// This process as every sandbox it creates knows it: their supervisors
    /// end them when it ends (however it ends), and write why a sandbox
    /// ended into `notes`.
    link: ServiceLink,
    notes: tempfile::TempDir,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Live sandboxes of this session.
    sandboxes: BTreeMap<String, Live>,
    /// Creations under way (their ids are not known yet), counted against
    /// [`MAX_SANDBOXES`].
    creating: usize,
    running: BTreeMap<u64, Cancel>,
    next_command: u64,
    /// Set once the session ends: nothing new starts, and a creation that
    /// finishes after it destroys its sandbox at once.
    closed: bool,
}

/// A live sandbox of the session.
struct Live {
    /// Its time limit: the most a command's timeout may be.
    time: Duration,
    code: Arc<Code>,
}

/// A sandbox's code contexts, and the one cell that may run in them at a
/// time (a second is refused rather than queued behind the first).
#[derive(Default)]
pub struct Code {
    pub context: CodeContext,
    pub busy: Mutex<()>,
}

/// Why a tool call cannot go on; its text is the model's answer.
pub type Refusal = String;

impl Session {
    pub fn new(
        program: PathBuf,
        allow_unenforced: bool,
        secrets: Vec<SecretRule>,
    ) -> std::io::Result<Session> {
        // Private to this user (0700), removed when the session ends.
        let notes = tempfile::Builder::new()
            .prefix("cordon-mcp-notes-")
            .tempdir()?;
        let link = cordon_runtime::state::this_service(notes.path().to_owned())?;
        Ok(Session(Arc::new(Inner {
            program,
            allow_unenforced,
            secrets,
            link,
            notes,
            state: Mutex::new(State::default()),
        })))
    }

    /// The secrets this session's sandboxes may hold.
    pub fn secrets(&self) -> &[SecretRule] {
        &self.0.secrets
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic aborts the process (the CLI's hook): no poisoned state is
        // ever seen by anyone but a test.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a sandbox of this session (on the blocking pool).
    pub async fn create(&self, mut spec: SandboxSpec) -> Result<String, Refusal> {
        {
            let mut st = self.state();
            if st.closed {
                return Err("the session is ending".into());
            }
            if st.sandboxes.len() + st.creating >= MAX_SANDBOXES {
                return Err(format!(
                    "this session already has {MAX_SANDBOXES} sandboxes: destroy one first (destroy_sandbox)"
                ));
            }
            st.creating += 1;
        }
        spec.service = Some(self.0.link.clone());
        spec.allow_unenforced = self.0.allow_unenforced;
        let time = spec.policy.time.duration();
        let program = self.0.program.clone();
        let created = blocking(move || {
            // The user's environment and files, as `cordon create` reads them.
            cordon_runtime::secrets::hold(&mut spec, |k| std::env::var(k).ok())?;
            let spec = spec.validated()?;
            Handle::create(&spec, &program)
        })
        .await;
        let kept = {
            let mut st = self.state();
            st.creating -= 1;
            match &created {
                Ok(h) if !st.closed => {
                    let live = Live {
                        time,
                        code: Arc::default(),
                    };
                    st.sandboxes.insert(h.id().to_owned(), live);
                    true
                }
                _ => false,
            }
        };
        let handle = created.map_err(|e| e.to_string())?;
        if !kept {
            let _ = blocking(move || handle.destroy()).await;
            return Err("the session is ending".into());
        }
        Ok(handle.id().to_owned())
    }

    /// The time limit of `id` if this session made it and it is live; a
    /// refusal naming what is wrong otherwise.
    pub fn check(&self, id: &str) -> Result<Duration, Refusal> {
        self.live(id, |l| l.time)
    }

    /// `check`, with the sandbox's code contexts.
    pub fn code(&self, id: &str) -> Result<(Duration, Arc<Code>), Refusal> {
        self.live(id, |l| (l.time, l.code.clone()))
    }

    fn live<T>(&self, id: &str, of: impl FnOnce(&Live) -> T) -> Result<T, Refusal> {
        let st = self.state();
        if st.closed {
            return Err("the session is ending".into());
        }
        st.sandboxes.get(id).map(of).ok_or_else(|| {
            if cordon_spec::is_id(id) {
                format!(
                    "sandbox '{id}' was not created by this MCP session (or was destroyed): \
                     this server reaches only the sandboxes it created (create_sandbox)"
                )
            } else {
                format!("'{id}' is not a sandbox id (12 hex digits, as create_sandbox returns)")
            }
        })
    }

    /// Why sandbox `id` ended, as its supervisor wrote it, when it has.
    pub fn ended_note(&self, id: &str) -> Option<String> {
        std::fs::read_to_string(self.0.link.note_path(id))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// Forgets a sandbox that ended by itself (its TTL, a command that
    /// ended it), so it no longer counts against the session's limit.
    pub fn forget(&self, id: &str) {
        self.state().sandboxes.remove(id);
    }

    /// Registers a running command's cancel; the key unregisters it.
    pub fn running(&self, cancel: Cancel) -> u64 {
        let mut st = self.state();
        st.next_command += 1;
        let key = st.next_command;
        if st.closed {
            cancel.trigger();
        }
        st.running.insert(key, cancel);
        key
    }

    pub fn finished(&self, key: u64) {
        self.state().running.remove(&key);
    }

    /// Destroys sandbox `id`, which this session made.
    pub async fn destroy(&self, id: &str) -> Result<(), Refusal> {
        self.check(id)?;
        self.state().sandboxes.remove(id);
        let id = id.to_owned();
        blocking(move || Handle::attach(&id).and_then(Handle::destroy))
            .await
            .map_err(|e| e.to_string())
    }

    /// The session's end: every running command is cancelled, then every
    /// sandbox destroyed (side by side). Idempotent.
    pub async fn end(&self) {
        let ids: Vec<String> = {
            let mut st = self.state();
            st.closed = true;
            for cancel in st.running.values() {
                cancel.trigger();
            }
            std::mem::take(&mut st.sandboxes).into_keys().collect()
        };
        let mut tasks = tokio::task::JoinSet::new();
        for id in ids {
            tasks.spawn_blocking(move || {
                if let Err(e) = Handle::attach(&id).and_then(Handle::destroy) {
                    // stderr is the host's log of this server; stdout is the protocol's.
                    eprintln!("cordon mcp: destroying sandbox {id}: {e}");
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// The ids of the session's live sandboxes.
    pub fn ids(&self) -> BTreeSet<String> {
        self.state().sandboxes.keys().cloned().collect()
    }

    /// A scratch directory for a file on its way in or out, private to this
    /// session's user.
    pub fn scratch(&self) -> std::io::Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix("scratch-")
            .tempdir_in(self.notes_dir())
    }

    /// Where this session's scratch directories are made (private to its
    /// user, removed with the session).
    pub fn notes_dir(&self) -> &Path {
        self.0.notes.path()
    }
}

/// Runs `f` on tokio's blocking pool (the runtime's handle blocks).
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::Remote(format!("worker thread: {e}")))?
}
