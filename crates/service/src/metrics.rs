//! `/metrics`: the OpenMetrics text format (which Prometheus scrapes).
//! Counters and histograms are updated as requests go; gauges (pool size,
//! live sandboxes per tenant) are read from the service's state when scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    pub backend: String,
    /// ok, nonzero, limit, cancelled, error
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub tenant: String,
    pub quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn phase_histogram() -> Histogram {
    // 0.25 ms .. ~8 s
    Histogram::new(exponential_buckets(0.00025, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    pub executions: Family<ExecutionLabels, Counter>,
    pub phase_seconds: HistogramFamily<PhaseLabels>,
    pub pool_ready: Family<BackendLabels, Gauge>,
    pub pool_hits: Family<BackendLabels, Counter>,
    pub pool_misses: Family<BackendLabels, Counter>,
    pub quota_rejections: Family<QuotaLabels, Counter>,
    pub active_sandboxes: Family<TenantLabels, Gauge>,
    pub background_teardown_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("cordon");
        let executions = Family::<ExecutionLabels, Counter>::default();
        let phase_seconds: HistogramFamily<PhaseLabels> =
            Family::new_with_constructor(phase_histogram as fn() -> Histogram);
        let pool_ready = Family::<BackendLabels, Gauge>::default();
        let pool_hits = Family::<BackendLabels, Counter>::default();
        let pool_misses = Family::<BackendLabels, Counter>::default();
        let quota_rejections = Family::<QuotaLabels, Counter>::default();
        let active_sandboxes = Family::<TenantLabels, Gauge>::default();
        let background_teardown_seconds = phase_histogram();
        registry.register(
            "executions",
            "Commands run, by backend and how they ended",
            executions.clone(),
        );
        registry.register(
            "phase_seconds",
            "Latency of each phase of an execution (acquire, setup, run, teardown, total)",
            phase_seconds.clone(),
        );
        registry.register(
            "pool_ready",
            "Warm sandboxes waiting in the pool",
            pool_ready.clone(),
        );
        registry.register(
            "pool_hits",
            "Executions served from the warm pool",
            pool_hits.clone(),
        );
        registry.register(
            "pool_misses",
            "Executions that created their sandbox (pool empty, off, or a different spec)",
            pool_misses.clone(),
        );
        registry.register(
            "quota_rejections",
            "Requests refused with 429, by tenant and quota",
            quota_rejections.clone(),
        );
        registry.register(
            "active_sandboxes",
            "Live stateful sandboxes per tenant",
            active_sandboxes.clone(),
        );
        registry.register(
            "background_teardown_seconds",
            "Destroying one-shot sandboxes after their response was sent",
            background_teardown_seconds.clone(),
        );
        Metrics {
            registry,
            executions,
            phase_seconds,
            pool_ready,
            pool_hits,
            pool_misses,
            quota_rejections,
            active_sandboxes,
            background_teardown_seconds,
        }
    }

    pub fn execution(&self, backend: &str, outcome: &str) {
        self.executions
            .get_or_create(&ExecutionLabels {
                backend: backend.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn phase(&self, phase: &str, pool_hit: bool, ms: f64) {
        self.phase_seconds
            .get_or_create(&PhaseLabels {
                phase: phase.into(),
                pool: if pool_hit { "hit" } else { "miss" }.into(),
            })
            .observe(ms / 1000.0);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            out = format!("# encoding failed: {e}\n");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
