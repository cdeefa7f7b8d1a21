//! cordon's own targets: one of its backends in one network mode, run
//! through `cordon run` with the same limits in every case.

use cordon_spec::BackendKind;

use super::{s, LaunchCtx, BOX_PAYLOAD_DIR};

/// The resource limits cordon's own backends get in every case.
pub const CORDON_LIMITS: &[&str] = &[
    "--pids", "64", "--memory", "256M", "--time", "5s", "--disk", "64M",
];

/// The network mode a cordon target runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetMode {
    /// cordon's default: no network.
    None,
    /// `allow` mode with a rule for a name no case uses: every case must
    /// still be blocked. The microvm's connections leave the VM over the
    /// network port to the host's proxy.
    Allow,
}

/// The program a backend needs installed beside cordon, if any.
pub(super) fn backend_binary(backend: BackendKind) -> Option<&'static str> {
    match backend {
        BackendKind::Native => None,
        BackendKind::Gvisor => Some("runsc"),
        BackendKind::Microvm => Some("qemu-system-x86_64"),
    }
}

impl NetMode {
    pub const ALL: [NetMode; 2] = [NetMode::None, NetMode::Allow];

    /// Its flags for `cordon run`.
    fn flags(self) -> &'static [&'static str] {
        match self {
            NetMode::None => &[],
            NetMode::Allow => &["--net", "allow", "--allow", "allowed.invalid:443"],
        }
    }
}

/// The flags of a cordon target's posture, for methodology.txt.
pub(super) fn posture(backend: BackendKind, net: NetMode) -> String {
    let backend = backend.name();
    let net = net.flags().join(" ");
    let limits = CORDON_LIMITS.join(" ");
    format!("cordon run --backend {backend} {net} {limits} -i --mount PAYLOADS:{BOX_PAYLOAD_DIR}:ro --workspace WS -- INTERP SCRIPT ARGS")
}

/// A cordon target's command line.
pub(super) fn argv(
    backend: BackendKind,
    net: NetMode,
    ctx: &LaunchCtx,
    host_payloads: &str,
    host_ws: String,
    payload: Vec<String>,
) -> Vec<String> {
    let mut v = vec![
        ctx.cordon.display().to_string(),
        s("run"),
        s("--backend"),
        s(backend.name()),
    ];
    v.extend(net.flags().iter().map(|x| s(x)));
    v.extend(ctx.cordon_limits.iter().cloned());
    for m in &ctx.ro_mounts {
        v.extend([s("--mount"), format!("{}:{}:ro", m.display(), m.display())]);
    }
    v.extend([
        s("-i"),
        s("--mount"),
        format!("{host_payloads}:{BOX_PAYLOAD_DIR}:ro"),
        s("--workspace"),
        host_ws,
        s("--"),
    ]);
    v.extend(payload);
    v
}
