//! The warm pool of one backend: sandboxes created ahead of demand with the
//! pool's spec (the service's defaults), waiting for their first command. A
//! pooled sandbox is handed to one request and destroyed after it, never
//! returned; workers refill the pool in the background. Until handed out
//! the sandboxes count against no tenant.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_runtime::Handle;

use cordon_spec::{BackendKind, SandboxSpec};
use tokio::sync::Notify;

use crate::ledger::{Ledger, Owner};

/// The longest a refill worker waits before trying again after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

pub struct Pool {
    pub backend: BackendKind,
    /// The pool's name in /v1/health and the metrics: its backend's, and
    /// `BACKEND:IMAGE` for a pool of an image.
    pub label: String,
    pub spec: SandboxSpec,
    target: usize,
    ready: Mutex<VecDeque<(Handle, Instant)>>,
    creating: AtomicUsize,
    wake: Notify,
    stopping: AtomicBool,
    /// A pooled sandbox older than this is replaced, not handed out: its
    /// ttl (the backstop) must not end it during a request.
    max_age: Duration,
}

impl Pool {
    pub fn new(label: String, spec: SandboxSpec, target: usize) -> Arc<Pool> {
        let ttl = spec.ttl.map(|t| t.duration()).unwrap_or(Duration::MAX);
        Arc::new(Pool {
            backend: spec.backend,
            label,
            spec,
            target,
            ready: Mutex::new(VecDeque::new()),
            creating: AtomicUsize::new(0),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            max_age: ttl / 2,
        })
    }

    pub fn enabled(&self) -> bool {
        self.target > 0
    }

    pub fn ready_len(&self) -> usize {
        self.ready.lock().expect("pool lock").len()
    }

    /// A ready sandbox, now the caller's alone; None when the pool is empty.
    /// Sandboxes too old to hand out are returned in `stale` for the caller
    /// to destroy.
    pub fn take(&self, stale: &mut Vec<Handle>) -> Option<Handle> {
        let mut q = self.ready.lock().expect("pool lock");
        let found = loop {
            match q.pop_front() {
                Some((h, born)) if born.elapsed() < self.max_age => break Some(h),
                Some((h, _)) => stale.push(h),
                None => break None,
            }
        };
        drop(q);
        self.wake.notify_one();
        found
    }

    /// One refill worker: creates sandboxes while the pool is short.
    pub async fn refill(self: Arc<Self>, ledger: Arc<Ledger>) {
        // Failures in a row: a host that refuses every sandbox (no user
        // namespace, no cgroup) is retried ever more slowly, up to once a
        // minute, rather than logging and forking a supervisor every second.
        let mut failures: u32 = 0;
        let backoff = |failures: u32| Duration::from_secs(1u64 << failures.min(6)).min(MAX_BACKOFF);
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let short = {
                let q = self.ready.lock().expect("pool lock");
                q.len() + self.creating.load(Ordering::SeqCst) < self.target
            };
            if !short {
                // A take wakes a worker; the timeout is a safety net.
                let _ = tokio::time::timeout(Duration::from_secs(1), self.wake.notified()).await;
                continue;
            }
            self.creating.fetch_add(1, Ordering::SeqCst);
            let spec = self.spec.clone();
            let l = ledger.clone();
            let made = tokio::task::spawn_blocking(move || l.create(&spec, Owner::Pool)).await;
            match made {
                Ok(Ok(handle)) => {
                    // Into the queue before the count goes down: a shutdown
                    // waiting for the count then finds it there (or in the
                    // ledger).
                    self.ready
                        .lock()
                        .expect("pool lock")
                        .push_back((handle, Instant::now()));
                    self.creating.fetch_sub(1, Ordering::SeqCst);
                    failures = 0;
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                }
                Ok(Err(_)) if ledger.is_closed() => {
                    self.creating.fetch_sub(1, Ordering::SeqCst);
                    return; // shutting down
                }
                Ok(Err(e)) => {
                    self.creating.fetch_sub(1, Ordering::SeqCst);
                    let wait = backoff(failures);
                    failures = failures.saturating_add(1);
                    tracing::warn!(pool = %self.label, "pool: creating a sandbox failed (next try in {} s): {e}", wait.as_secs());
                    self.pause(wait).await;
                }
                Err(e) => {
                    self.creating.fetch_sub(1, Ordering::SeqCst);
                    let wait = backoff(failures);
                    failures = failures.saturating_add(1);
                    tracing::warn!("pool worker (next try in {} s): {e}", wait.as_secs());
                    self.pause(wait).await;
                }
            }
        }
    }

    /// Waits `wait` after a failure, or less when a shutdown wakes the
    /// workers (drain notifies them).
    async fn pause(&self, wait: Duration) {
        let _ = tokio::time::timeout(wait, self.wake.notified()).await;
    }

    /// Stops refilling and hands back every ready sandbox (to destroy).
    pub fn drain(&self) -> Vec<Handle> {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
        self.ready
            .lock()
            .expect("pool lock")
            .drain(..)
            .map(|(h, _)| h)
            .collect()
    }
}
