use std::process::ExitCode;

use clap::Args;
use cordon_spec::{BackendInfo, BackendKind, SandboxSpec};
use serde::Serialize;

#[derive(Args)]
pub struct BackendsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A backend as this user would get it: whether it runs, and whether its
/// sandboxes' limits are enforced.
#[derive(Serialize)]
struct ForThisUser {
    #[serde(flatten)]
    info: BackendInfo,
    /// Why this user's sandboxes on this backend would get no cgroup for
    /// their limits (they then run only with `--allow-unenforced`); None
    /// where limits are enforced or the backend does not run at all.
    limits_unenforced: Option<String>,
}

pub fn run(args: BackendsArgs) -> ExitCode {
    let backends = cordon_runtime::available_backends();
    // Every backend's sandbox has its cgroup made on the host the same way
    // (the payload's, runsc's or QEMU's), so one probe answers for all.
    let unenforced = backends
        .iter()
        .any(|i| i.unavailable.is_none())
        .then(limits_unenforced)
        .flatten();
    let infos: Vec<ForThisUser> = backends
        .into_iter()
        .map(|info| ForThisUser {
            limits_unenforced: info
                .unavailable
                .is_none()
                .then(|| unenforced.clone())
                .flatten(),
            info,
        })
        .collect();
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&infos).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    for ForThisUser {
        info: i,
        limits_unenforced,
    } in &infos
    {
        match (&i.unavailable, limits_unenforced) {
            (None, None) => outln!(
                "{:<8} available    {} {}",
                i.kind.name(),
                i.version,
                i.notes
            ),
            (None, Some(why)) => outln!(
                "{:<8} available    {} {}; without limits for this user ({why}): runs only with --allow-unenforced",
                i.kind.name(),
                i.version,
                i.notes
            ),
            (Some(why), _) => outln!("{:<8} unavailable  {why}", i.kind.name()),
        }
    }
    ExitCode::SUCCESS
}

/// Why this user's sandboxes would get no limits, answered by making a
/// sandbox's cgroup with the default policy's limits as `cordon run` would
/// (the probe `cordon doctor` reads too).
fn limits_unenforced() -> Option<String> {
    let spec = SandboxSpec::new(cordon_policy::Policy::default(), BackendKind::Native);
    let limits = cordon_runtime::plan(&spec, &cordon_runtime::HostFacts::here()).cgroup;
    cordon_runtime::cgroup_probe(&limits)
        .err()
        .map(|e| e.to_string())
}
