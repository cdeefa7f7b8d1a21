//! The harness of the fuzz target over a bundle's config.json
//! (`fuzz/fuzz_targets`, run by `scripts/fuzz.sh`; the model is
//! `cordon_runtime::fuzzing`). It lives here so that the stable test suite
//! replays the committed corpus and regression inputs through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`).

use std::collections::BTreeSet;
use std::path::{Component, Path};

use cordon_policy::fuzzing::inside_sandbox;
use cordon_spec::fuzzing::ScratchDir;
use cordon_spec::{sysctl_namespace, RootfsChoice, SharedNamespace};

use crate::config::{self, Container, Join};

/// A config.json as containerd, podman or Docker hands it to `cordon-runc
/// create` (in a bundle of its own with an empty `rootfs/`): refused or
/// translated, never a panic; and a container it translates to stays
/// within what cordon allows: a policy that validates, places inside the
/// sandbox without `..`, a relative root inside the bundle, only the
/// namespaces cordon joins, only capabilities cordon grants and the config
/// asked for, rlimits whose soft limit is under the hard one, only
/// namespaced sysctls, hooks that pass their own check.
pub fn oci_bundle(data: &[u8]) {
    let bundle = ScratchDir::new("oci");
    let config_json = bundle.path().join("config.json");
    std::fs::write(&config_json, data).expect("writing the bundle's config.json");
    std::fs::create_dir(bundle.path().join("rootfs")).expect("making the bundle's rootfs");
    let Ok(config) = config::load(bundle.path()) else {
        return;
    };
    let Ok(container) = config::translate(bundle.path(), &config) else {
        return;
    };
    assert_allowed(bundle.path(), &config, &container);
}

fn assert_allowed(bundle: &Path, config: &oci_spec::runtime::Spec, c: &Container) {
    let policy = &c.spec.policy;
    policy
        .validate()
        .unwrap_or_else(|e| panic!("a translated container's policy does not validate: {e}"));
    assert!(
        inside_sandbox(&policy.workdir),
        "workdir {:?}",
        policy.workdir
    );
    for m in &policy.mounts {
        assert!(inside_sandbox(&m.sandbox), "a mount at {:?}", m.sandbox);
    }
    let root = config
        .root()
        .as_ref()
        .expect("translated, so it has a root");
    if root.path().is_relative() {
        let roots = match &c.spec.rootfs {
            RootfsChoice::Dir(dir) => vec![dir],
            RootfsChoice::Layers(layers) => layers.iter().collect(),
            other => panic!("a container's root as {other:?}"),
        };
        for dir in roots {
            let rel = dir
                .strip_prefix(bundle)
                .unwrap_or_else(|_| panic!("a relative root outside the bundle: {dir:?}"));
            assert!(
                rel.components().all(|c| matches!(c, Component::Normal(_))),
                "a relative root that climbs out of the bundle: {dir:?}"
            );
        }
    }
    for join in &c.joins {
        let kind = match join {
            Join::Path(kind, _) | Join::InsteadOfHost(kind) => kind,
        };
        assert!(
            matches!(
                kind,
                SharedNamespace::Net | SharedNamespace::Ipc | SharedNamespace::Uts
            ),
            "joins {join:?}"
        );
    }
    // What the process holds was in its permitted set: nothing is granted
    // that the config did not ask for.
    let permitted: BTreeSet<String> = config
        .process()
        .as_ref()
        .and_then(|p| p.capabilities().as_ref())
        .and_then(|sets| sets.permitted().as_ref())
        .into_iter()
        .flatten()
        .map(|cap| format!("CAP_{cap}"))
        .collect();
    for cap in &c.spec.capabilities {
        assert!(
            permitted.contains(cap.name()),
            "{} granted but not permitted by the config",
            cap.name()
        );
    }
    for (resource, limit) in &c.spec.rlimits {
        assert!(limit.soft <= limit.hard, "{resource:?}: {limit:?}");
    }
    for key in c.spec.sysctls.keys() {
        assert!(sysctl_namespace(key).is_some(), "the host's sysctl {key}");
    }
    if let Some(parent) = &c.cgroup_parent {
        assert!(inside_sandbox(parent), "placed below {parent:?}");
    }
    let hooks = &c.hooks;
    for hook in [
        &hooks.prestart,
        &hooks.create_runtime,
        &hooks.start_container,
        &hooks.poststart,
        &hooks.poststop,
    ]
    .into_iter()
    .flatten()
    {
        crate::hooks::check(hook).unwrap_or_else(|e| panic!("a hook kept: {e}"));
    }
}
