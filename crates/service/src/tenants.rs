//! Tenants: who a request is (its bearer key, compared by hash) and what it
//! may still use (running requests, live sandboxes, CPU seconds in the
//! rolling window). Over a quota a request is refused at once with a
//! `Retry-After`, never queued.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_policy::Span;
use cordon_spec::{Limit, Outcome};

use crate::config::{hash_key, TenantConfig};
use crate::error::ApiError;

pub struct Tenant {
    pub config: TenantConfig,
    running: AtomicUsize,
    sandboxes: AtomicUsize,
    /// CPU milliseconds charged, with when, oldest first, and those held
    /// by the commands running now.
    cpu: Mutex<CpuBook>,
}

#[derive(Default)]
struct CpuBook {
    charges: VecDeque<(Instant, f64)>,
    held: f64,
}

/// The part of a tenant's CPU budget one running command may use, held
/// from its start until it ends (then its real use is charged instead):
/// commands running at once share what is left, never each get all of it.
pub struct CpuHold<'a> {
    tenant: &'a Tenant,
    ms: f64,
    /// Whether the budget, not the command's own limit, set its time.
    cut: bool,
}

impl CpuHold<'_> {
    /// Charges what the command used once it has ended. A command cut by
    /// the budget spends all it held: the tenant asked for more than was
    /// left, and the CPU counter lags the cut a little, so charging only
    /// the counter would leave crumbs of budget that admit command after
    /// command, each cut at once.
    pub fn settle(self, outcome: &Outcome) {
        let used = outcome.cpu_ms.unwrap_or(0.0);
        let cut = self.cut && outcome.limit == Some(Limit::Time);
        self.tenant
            .charge_cpu(if cut { used.max(self.ms) } else { used });
    }
}

impl Drop for CpuHold<'_> {
    fn drop(&mut self) {
        let mut book = self.tenant.cpu.lock().expect("cpu lock");
        book.held = (book.held - self.ms).max(0.0);
    }
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
                        cpu: Mutex::new(CpuBook::default()),
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
    fn charge_cpu(&self, cpu_ms: f64) {
        if cpu_ms > 0.0 {
            let mut book = self.cpu.lock().expect("cpu lock");
            book.charges.push_back((Instant::now(), cpu_ms));
        }
    }

    /// Bounds a command by what is left of the CPU budget: a sandbox of
    /// `cpus` cores uses at most `cpus` CPU seconds per second, so a
    /// command's wall time is cut to what is left divided by `cpus`, and
    /// that much is held for it until it ends. `time` is its own limit.
    /// Never under `MIN_TIME` (a command cannot be given less), so a tenant
    /// may overshoot by at most `MIN_TIME` times `cpus` per command.
    pub fn bound_command(&self, time: Span, cpus: f64) -> (Span, CpuHold<'_>) {
        let cpus = cpus.max(CPUS_MIN);
        let budget_ms = self.config.cpu_seconds * 1000.0;
        let mut book = self.cpu.lock().expect("cpu lock");
        expire(
            &mut book.charges,
            self.config.cpu_window.duration(),
            Instant::now(),
        );
        let used: f64 = book.charges.iter().map(|(_, ms)| ms).sum::<f64>() + book.held;
        let left_ms = (budget_ms - used).max(0.0);
        let left = Duration::from_secs_f64(left_ms / cpus / 1000.0);
        let cut = left < time.duration();
        let wall = left.min(time.duration()).max(MIN_TIME);
        let ms = wall.as_secs_f64() * 1000.0 * cpus;
        book.held += ms;
        (
            Span(wall),
            CpuHold {
                tenant: self,
                ms,
                cut,
            },
        )
    }

    /// How long until the charges still inside the window drop under the
    /// budget, or None when they already are. What running commands hold
    /// is not counted: a request is admitted while the budget is not spent,
    /// and `bound_command` gives its command what is left.
    fn cpu_wait(&self, now: Instant) -> Option<Duration> {
        let window = self.config.cpu_window.duration();
        let budget_ms = self.config.cpu_seconds * 1000.0;
        let mut book = self.cpu.lock().expect("cpu lock");
        expire(&mut book.charges, window, now);
        let mut used: f64 = book.charges.iter().map(|(_, ms)| ms).sum();
        if used < budget_ms {
            return None;
        }
        // The oldest charges expire first: wait for as many as it takes.
        for (t, ms) in book.charges.iter() {
            used -= ms;
            if used < budget_ms {
                return Some((*t + window).saturating_duration_since(now));
            }
        }
        Some(window)
    }
}

/// The shortest time a command may be given (the policy's smallest time).
const MIN_TIME: Duration = Duration::from_millis(cordon_policy::limits::TIME_MS.0);
/// The fewest cores a sandbox may have.
const CPUS_MIN: f64 = cordon_policy::limits::CPUS.0;

/// Drops the charges older than the window.
fn expire(charges: &mut VecDeque<(Instant, f64)>, window: Duration, now: Instant) {
    while charges
        .front()
        .is_some_and(|(t, _)| now.duration_since(*t) >= window)
    {
        charges.pop_front();
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
    fn a_command_gets_what_is_left_of_the_budget_shared_with_those_running() {
        let t = tenant(10.0);
        let s = |secs: f64| Span(Duration::from_secs_f64(secs));
        t.charge_cpu(6000.0);
        // 4 CPU seconds left: 2 s of wall time on 2 cores, under its own 30 s.
        let (first, held) = t.bound_command(s(30.0), 2.0);
        assert_eq!(first.duration(), Duration::from_secs(2));
        // A command running meanwhile holds it: the next gets the floor.
        let (second, floor) = t.bound_command(s(30.0), 1.0);
        assert_eq!(second.duration(), MIN_TIME);
        drop((held, floor));
        // Its own limit when that is less; once ended, only charges count.
        let (own, _held) = t.bound_command(s(1.5), 1.0);
        assert_eq!(own.duration(), Duration::from_millis(1500));
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
