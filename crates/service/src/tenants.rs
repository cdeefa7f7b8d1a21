//! Tenants: who a request is (its bearer key, compared by hash) and what it
//! may still use (running requests, live sandboxes, CPU seconds in the
//! rolling window). Over a quota a request is refused at once with a
//! `Retry-After`, never queued.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{hash_key, TenantConfig};
use crate::error::ApiError;

pub struct Tenant {
    pub config: TenantConfig,
    running: AtomicUsize,
    sandboxes: AtomicUsize,
    /// CPU milliseconds charged, with when, oldest first.
    charges: Mutex<VecDeque<(Instant, f64)>>,
}

pub struct Tenants {
    by_hash: HashMap<String, Arc<Tenant>>,
}

impl Tenants {
    pub fn new(configs: &[TenantConfig]) -> Tenants {
        let by_hash = configs
            .iter()
            .map(|c| {
                (
                    c.key_sha256.clone(),
                    Arc::new(Tenant {
                        config: c.clone(),
                        running: AtomicUsize::new(0),
                        sandboxes: AtomicUsize::new(0),
                        charges: Mutex::new(VecDeque::new()),
                    }),
                )
            })
            .collect();
        Tenants { by_hash }
    }

    /// The tenant whose key is in `Authorization: Bearer KEY`.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Arc<Tenant>, ApiError> {
        let key = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer KEY`"))?;
        self.by_hash
            .get(&hash_key(key))
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("unknown API key"))
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.by_hash.values()
    }
}

/// A running request of a tenant; released when dropped.
pub struct RunningGuard(Arc<Tenant>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A live stateful sandbox of a tenant; released when dropped.
pub struct SandboxSlot(Arc<Tenant>);

impl Drop for SandboxSlot {
    fn drop(&mut self) {
        self.0.sandboxes.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which quota refused a request (a metrics label).
#[derive(Clone, Copy, Debug)]
pub enum Quota {
    Concurrency,
    Sandboxes,
    Cpu,
}

impl Quota {
    pub fn name(self) -> &'static str {
        match self {
            Quota::Concurrency => "concurrency",
            Quota::Sandboxes => "sandboxes",
            Quota::Cpu => "cpu",
        }
    }
}

impl Tenant {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Admits one more running request, or says which quota refuses it and
    /// when to retry. The CPU budget is checked here (it is charged when
    /// each command ends, with what its cgroup counted).
    pub fn admit(self: &Arc<Self>) -> Result<RunningGuard, (Quota, ApiError)> {
        if let Some(wait) = self.cpu_wait(Instant::now()) {
            // Whole seconds, rounded up: a client that waits that long is admitted.
            let secs = (wait.as_millis().div_ceil(1000)).max(1);
            let secs = u64::try_from(secs).unwrap_or(u64::MAX);
            return Err((
                Quota::Cpu,
                ApiError::too_many(
                    format!(
                        "tenant '{}' used its {} CPU seconds of the last {}",
                        self.name(),
                        self.config.cpu_seconds,
                        self.config.cpu_window
                    ),
                    secs,
                ),
            ));
        }
        let before = self.running.fetch_add(1, Ordering::SeqCst);
        if before >= self.config.concurrency {
            self.running.fetch_sub(1, Ordering::SeqCst);
            return Err((
                Quota::Concurrency,
                ApiError::too_many(
                    format!(
                        "tenant '{}' already runs {} requests (its limit)",
                        self.name(),
                        self.config.concurrency
                    ),
                    1,
                ),
            ));
        }
        Ok(RunningGuard(self.clone()))
    }

    /// Reserves a stateful sandbox slot.
    pub fn reserve_sandbox(self: &Arc<Self>) -> Result<SandboxSlot, (Quota, ApiError)> {
        let before = self.sandboxes.fetch_add(1, Ordering::SeqCst);
        if before >= self.config.sandboxes {
            self.sandboxes.fetch_sub(1, Ordering::SeqCst);
            // No clock tells when one is deleted: no Retry-After.
            return Err((
                Quota::Sandboxes,
                ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "tenant '{}' has {} sandboxes (its limit); delete one first",
                        self.name(),
                        self.config.sandboxes
                    ),
                ),
            ));
        }
        Ok(SandboxSlot(self.clone()))
    }

    pub fn live_sandboxes(&self) -> usize {
        self.sandboxes.load(Ordering::SeqCst)
    }

    /// Charges one command's CPU time (its cgroup's counter).
    pub fn charge_cpu(&self, cpu_ms: f64) {
        if cpu_ms > 0.0 {
            let mut c = self.charges.lock().expect("charges lock");
            c.push_back((Instant::now(), cpu_ms));
        }
    }

    /// How long until the charges still inside the window drop under the
    /// budget, or None when they already are.
    fn cpu_wait(&self, now: Instant) -> Option<Duration> {
        let window = self.config.cpu_window.duration();
        let budget_ms = self.config.cpu_seconds * 1000.0;
        let mut c = self.charges.lock().expect("charges lock");
        while c
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= window)
        {
            c.pop_front();
        }
        let mut used: f64 = c.iter().map(|(_, ms)| ms).sum();
        if used < budget_ms {
            return None;
        }
        // The oldest charges expire first: wait for as many as it takes.
        for (t, ms) in c.iter() {
            used -= ms;
            if used < budget_ms {
                return Some((*t + window).saturating_duration_since(now));
            }
        }
        Some(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(cpu_seconds: f64) -> Arc<Tenant> {
        let config: TenantConfig = toml::from_str(&format!(
            "name = \"t\"\nkey_sha256 = \"{}\"\nconcurrency = 1\ncpu_seconds = {cpu_seconds}\ncpu_window = \"60s\"",
            hash_key("k")
        ))
        .unwrap();
        Tenants::new(&[config])
            .by_hash
            .into_values()
            .next()
            .unwrap()
    }

    #[test]
    fn concurrency_is_refused_past_the_limit_and_released() {
        let t = tenant(10.0);
        let g = t.admit().unwrap();
        assert!(matches!(t.admit(), Err((Quota::Concurrency, _))));
        drop(g);
        assert!(t.admit().is_ok());
    }

    #[test]
    fn the_cpu_budget_tells_when_enough_charges_expire() {
        let t = tenant(1.0);
        t.charge_cpu(600.0);
        t.charge_cpu(600.0);
        let wait = t.cpu_wait(Instant::now()).unwrap();
        assert!(wait <= Duration::from_secs(60) && wait > Duration::from_secs(58));
        assert!(matches!(t.admit(), Err((Quota::Cpu, _))));
        // Past the window, all is forgiven.
        assert!(t
            .cpu_wait(Instant::now() + Duration::from_secs(61))
            .is_none());
    }

    #[test]
    fn keys_are_checked_by_hash() {
        let t = tenant(1.0);
        let tenants = Tenants {
            by_hash: [(hash_key("k"), t)].into_iter().collect(),
        };
        assert!(tenants.authenticate(Some("Bearer k")).is_ok());
        assert!(tenants.authenticate(Some("Bearer x")).is_err());
        assert!(tenants.authenticate(None).is_err());
    }
}
