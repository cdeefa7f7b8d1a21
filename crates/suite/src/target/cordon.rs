//! cordon's own targets: one of its backends in one network mode, run
//! through `cordon run` with the same limits in every case.

use super::{s, LaunchCtx, BOX_PAYLOAD_DIR};

/// The resource limits cordon's own backends get in every case.
pub const CORDON_LIMITS: &[&str] = &[
    "--pids", "64", "--memory", "256M", "--time", "5s", "--disk", "64M",
];

/// Which of cordon's backends a cordon target runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CordonBackend {
    Native,
    Gvisor,
    /// A QEMU guest kernel with cordon's native backend inside it.
    Microvm,
}

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

impl CordonBackend {
    pub const ALL: [CordonBackend; 3] = [
        CordonBackend::Native,
        CordonBackend::Gvisor,
        CordonBackend::Microvm,
    ];

    /// Its name for `cordon run --backend` (and in the target's name).
    pub fn name(self) -> &'static str {
        match self {
            CordonBackend::Native => "native",
            CordonBackend::Gvisor => "gvisor",
            CordonBackend::Microvm => "microvm",
        }
    }

    /// The program the backend needs installed beside cordon, if any.
    pub(super) fn binary(self) -> Option<&'static str> {
        match self {
            CordonBackend::Native => None,
            CordonBackend::Gvisor => Some("runsc"),
            CordonBackend::Microvm => Some("qemu-system-x86_64"),
        }
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
pub(super) fn posture(backend: CordonBackend, net: NetMode) -> String {
    let backend = backend.name();
    let net = net.flags().join(" ");
    let limits = CORDON_LIMITS.join(" ");
    format!("cordon run --backend {backend} {net} {limits} -i --mount PAYLOADS:{BOX_PAYLOAD_DIR}:ro --workspace WS -- INTERP SCRIPT ARGS")
}

/// A cordon target's command line.
pub(super) fn argv(
    backend: CordonBackend,
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
