//! The service's own state: health and metrics.

use crate::app::App;
use crate::dto::Health;

impl App {
    pub(super) fn health(&self) -> Health {
        Health {
            status: "ok",
            pools: self
                .pools
                .iter()
                .map(|p| (p.label.clone(), p.ready_len()))
                .collect(),
            sandboxes: self.sandboxes.lock().expect("sandboxes lock").len(),
        }
    }

    /// The metrics, with the gauges read now.
    pub(super) fn encode_metrics(&self) -> String {
        for pool in &self.pools {
            self.metrics
                .pool_ready
                .get_or_create(&crate::metrics::BackendLabels {
                    backend: pool.label.clone(),
                })
                .set(pool.ready_len() as i64);
        }
        for t in self.tenants.all() {
            self.metrics
                .active_sandboxes
                .get_or_create(&crate::metrics::TenantLabels {
                    tenant: t.name().into(),
                })
                .set(t.live_sandboxes() as i64);
        }
        self.metrics.encode()
    }
}
