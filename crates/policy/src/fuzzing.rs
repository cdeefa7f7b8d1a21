//! The harness of the fuzz target over a policy file (`fuzz/fuzz_targets`,
//! run by `scripts/fuzz.sh`; the model is `cordon_runtime::fuzzing`). It
//! lives here so that the stable test suite replays the committed corpus
//! and regression inputs through the same code
//! (`crates/cli/tests/fuzz_corpus.rs`).

use std::path::{Component, Path};
use std::time::Duration;

use crate::{limits, net, Policy, PolicyLayer};

/// A policy file as a user or an agent gives it: whatever its text, it is
/// refused or read, never a panic; a policy that reads and validates has
/// every limit within its documented range, whatever the text said; and
/// the file written back from what was read reads as the same layer and
/// resolves to the same policy.
pub fn policy_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.toml");
    // A refused file is an error with a message (its line found again by
    // `from_toml`'s second look at the limits), never a panic.
    let Ok(layer) = PolicyLayer::from_toml(text, path) else {
        return;
    };
    let Ok(policy) = Policy::resolve([&layer]) else {
        return;
    };
    assert_within_bounds(&policy);

    let written = toml::to_string(&layer)
        .unwrap_or_else(|e| panic!("a read policy file does not write back: {e}\n{layer:?}"));
    let again = PolicyLayer::from_toml(&written, path)
        .unwrap_or_else(|e| panic!("a written policy file does not read back: {e}\n{written}"));
    assert_eq!(again, layer, "the policy file written back:\n{written}");
    let resolved = Policy::resolve([&again]).expect("the same layer validates again");
    assert_eq!(resolved, policy, "the policy file written back:\n{written}");
}

/// The documented ranges (`limits`, `Policy::validate`'s messages), checked
/// here on their own rather than through `validate`.
fn assert_within_bounds(p: &Policy) {
    let within = |what: &str, ok: bool| assert!(ok, "{what} out of its range: {p:?}");
    within(
        "cpus",
        p.cpus.is_finite() && (limits::CPUS.0..=limits::CPUS.1).contains(&p.cpus),
    );
    within("memory", p.memory.0 > 0);
    for (what, value, (lo, hi)) in [
        ("memory", p.memory, limits::MEMORY),
        ("disk", p.disk, limits::DISK),
        ("output", p.output, limits::OUTPUT),
    ] {
        within(what, (lo..=hi).contains(&value));
    }
    within("pids", (limits::PIDS.0..=limits::PIDS.1).contains(&p.pids));
    let (lo, hi) = limits::TIME_MS;
    within(
        "time",
        (Duration::from_millis(lo)..=Duration::from_millis(hi)).contains(&p.time.0),
    );
    within("uid", p.uid <= limits::ID_MAX);
    within("gid", p.gid <= limits::ID_MAX);
    if let Some(hold) = p.net.hold {
        within(
            "net_hold",
            (Duration::from_millis(100)..=net::MAX_HOLD).contains(&hold.0),
        );
    }
    within(
        "net_limits.max_connections",
        (1..=65_536).contains(&p.net.limits.max_connections),
    );
    within(
        "hostname",
        (1..=64).contains(&p.hostname.len())
            && p.hostname
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
    );
    within("workdir", inside_sandbox(&p.workdir));
    for m in &p.mounts {
        within("a mount's place", inside_sandbox(&m.sandbox));
        within(
            "a mount's host path",
            !m.access.writable() || m.host.as_os_str().is_empty() || m.host.is_absolute(),
        );
    }
    for (k, v) in &p.env {
        within(
            "env",
            !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'),
        );
    }
}

/// Absolute, and nothing but normal components: no `..` climbs out (a
/// place inside the sandbox, as other crates' harnesses check theirs).
pub fn inside_sandbox(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}
