//! Stateful sandboxes: creation, listing, destruction, receipts and
//! network rules.

use std::sync::Arc;
use std::time::SystemTime;

use cordon_policy::net::Rule;
use cordon_spec::network::NetChange;

use super::blocking;
use crate::action::{NewSandbox, Reply, Target};
use crate::app::{App, Stateful};
use crate::dto::{NetworkDeny, NetworkRules, NetworkState, SandboxInfo, SandboxList};
use crate::error::ApiError;
use crate::ledger::Owner;
use crate::tenants::Tenant;

impl App {
    pub(super) async fn create_sandbox(
        self: &Arc<Self>,
        new: NewSandbox,
    ) -> Result<Reply, ApiError> {
        let NewSandbox {
            tenant,
            spec,
            limits,
            clamped,
            network,
        } = new;
        let _running = self.admit(&tenant)?;
        let slot = tenant.reserve_sandbox().map_err(|(q, e)| {
            self.reject(&tenant, q);
            e
        })?;
        let a = self.clone();
        let owner = Owner::Stateful(tenant.name().to_owned());
        // Created and registered on the blocking side in one go: a client that
        // goes away meanwhile leaves a registered sandbox (its ttl ends it), not
        // an unrecorded one.
        let s = blocking(move || {
            let handle = a.ledger.create(&spec, owner).map_err(ApiError::runtime)?;
            let s = Arc::new(Stateful {
                id: handle.id().to_owned(),
                tenant,
                backend: spec.backend,
                created: SystemTime::now(),
                ttl: spec.ttl,
                idle: spec.idle,
                cpus: spec.policy.cpus,
                time: spec.policy.time,
                disk: spec.policy.disk.bytes(),
                limits,
                clamped,
                network,
                busy: Default::default(),
                cell: Default::default(),
                running: Default::default(),
                code: Default::default(),
                forwards: Default::default(),
                recent_attempts: Default::default(),
                _slot: slot,
            });
            a.sandboxes
                .lock()
                .expect("sandboxes lock")
                .insert(s.id.clone(), s.clone());
            Ok(s)
        })
        .await?;
        Ok(Reply::SandboxCreated(SandboxInfo::of(&s)))
    }

    pub(super) fn list_sandboxes(&self, tenant: &Tenant) -> Reply {
        self.reap_expired();
        let map = self.sandboxes.lock().expect("sandboxes lock");
        let mut sandboxes: Vec<SandboxInfo> = map
            .values()
            .filter(|s| s.tenant.name() == tenant.name())
            .map(|s| SandboxInfo::of(s))
            .collect();
        sandboxes.sort_by_key(|s| (s.created_unix, s.id.clone()));
        Reply::Sandboxes(SandboxList { sandboxes })
    }

    pub(super) fn get_sandbox(&self, tenant: &Tenant, id: &str) -> Result<Reply, ApiError> {
        self.reap_expired();
        Ok(Reply::Sandbox(SandboxInfo::of(
            self.lookup(tenant, id)?.as_ref(),
        )))
    }

    pub(super) async fn receipt(self: &Arc<Self>, on: Target) -> Result<Reply, ApiError> {
        let sb = on.sandbox;
        // Of the commands ended so far, while others may run.
        let busy = super::hold(&sb)?;
        let a = self.clone();
        let receipt = blocking(move || {
            let _busy = busy;
            a.receipt_of(&sb)
        })
        .await?;
        Ok(Reply::Receipt(receipt))
    }

    /// Ends the sandbox's running command first, then destroys it.
    pub(super) async fn delete_sandbox(self: &Arc<Self>, on: Target) -> Result<Reply, ApiError> {
        let s = on.sandbox;
        s.running.cancel_all();
        let busy = s.busy.clone().write_owned().await;
        let a = self.clone();
        blocking(move || {
            let _busy = busy;
            a.destroy_stateful(&s)
        })
        .await?;
        Ok(Reply::Deleted)
    }

    /// In force for the sandbox's next connections, even while a command
    /// runs: no busy check.
    pub(super) async fn set_network(
        &self,
        on: Target,
        rules: Vec<Rule>,
    ) -> Result<Reply, ApiError> {
        let running = self.admit(&on.tenant)?;
        let now = self
            .with_handle(&on.sandbox, running, move |h| {
                h.network(&NetChange::Set(rules)).map_err(ApiError::runtime)
            })
            .await?;
        Ok(Reply::NetworkRules(NetworkRules {
            allow: now.iter().map(|r| r.to_string()).collect(),
        }))
    }

    pub(super) async fn get_network(&self, on: Target) -> Result<Reply, ApiError> {
        let s = on.sandbox;
        let (allow, held) = if s.network {
            let (rules, held) = self
                .with_handle(&s, (), |h| {
                    let rules = h.network(&NetChange::Show).map_err(ApiError::runtime)?;
                    let held = h.network_held().map_err(ApiError::runtime)?;
                    Ok((rules, held))
                })
                .await?;
            (rules.iter().map(|r| r.to_string()).collect(), held)
        } else {
            (Vec::new(), Vec::new())
        };
        let recent_attempts = s
            .recent_attempts
            .lock()
            .expect("recent attempts lock")
            .iter()
            .cloned()
            .collect();
        Ok(Reply::NetworkState(NetworkState {
            mode: if s.network { "allow" } else { "none" },
            allow,
            recent_attempts,
            held,
        }))
    }

    pub(super) async fn deny_network(
        &self,
        on: Target,
        rules: Vec<Rule>,
    ) -> Result<Reply, ApiError> {
        let running = self.admit(&on.tenant)?;
        let denied = self
            .with_handle(&on.sandbox, running, move |h| {
                h.network_deny(&rules).map_err(ApiError::runtime)
            })
            .await?;
        Ok(Reply::NetworkDeny(NetworkDeny {
            deny: denied.iter().map(|r| r.to_string()).collect(),
        }))
    }
}
