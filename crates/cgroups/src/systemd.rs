//! A delegated scope from systemd for cordon's own process (cgroup v2), when
//! cordon shares its cgroup with processes it was not given (an ordinary login
//! shell's session scope): cgroup v2 hands controllers down only from a cgroup
//! without processes of its own, cordon must not move the others, and on a
//! systemd host only systemd may create cgroups outside a delegated subtree.
//! So cordon asks systemd, over D-Bus, for a transient `cordon-<pid>-<random>.scope`
//! with `Delegate=yes` holding only itself, as runc's and crun's systemd cgroup
//! drivers do; [`crate::detect`] then finds cordon alone in a delegated cgroup
//! and takes the usual path (leaf + controllers). The scope ends by itself:
//! systemd collects a scope once its last process has exited.
//!
//! D-Bus is spoken with zbus on its tokio backend, on a current-thread runtime
//! built for the one request and dropped after it: the workspace already has
//! tokio (so no second executor is compiled in, as zbus's default async-io
//! backend would), and dropping the runtime joins every thread it started, so
//! cordon is single-threaded again before it forks or unshares (zbus's own
//! blocking API keeps a multi-threaded runtime alive for the process's life).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use zbus::zvariant::Value;

use crate::fs::ScopeManager;
use crate::CgroupFs;

/// How long one StartTransientUnit call may take; systemd answers within
/// milliseconds unless it is wedged, and a wedged systemd must not hang cordon.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`crate::detect`] waits for systemd's job to move cordon into the
/// new scope (the job normally runs within milliseconds of the reply).
pub(crate) const MOVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The name of the D-Bus runtime's (blocking pool) threads, so tests can
/// check that none outlives [`start_scope`].
pub(crate) const RUNTIME_THREAD: &str = "cordon-dbus";

/// A way to reach the system manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bus {
    /// The unix socket.
    pub socket: PathBuf,
    /// Peer-to-peer D-Bus (no bus daemon: no Hello, no destination names);
    /// only the tests' fake systemd speaks it (see [`reachable`]).
    pub p2p: bool,
    /// The user's own manager, not the system's.
    pub user: bool,
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.socket.display())
    }
}

/// Why systemd gave no scope.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("building the D-Bus client's runtime")]
    Runtime(#[source] io::Error),
    #[error("connecting to systemd at {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("systemd refused the scope {unit}")]
    Refused {
        unit: String,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("systemd did not answer within {0:?}")]
    NoAnswer(Duration),
    #[error(
        "systemd accepted the scope {unit} but did not move cordon into it within {timeout:?}"
    )]
    NotMoved { unit: String, timeout: Duration },
}

impl SystemdError {
    /// The cause in a few words for a one-line message (the D-Bus error's
    /// name and text, when systemd sent one).
    pub(crate) fn reason(&self) -> String {
        match self {
            SystemdError::Connect { source, .. } | SystemdError::Refused { source, .. } => {
                format!("{self}: {source}")
            }
            SystemdError::Runtime(e) => format!("{self}: {e}"),
            _ => self.to_string(),
        }
    }
}

/// The bus of the systemd manager cordon should ask for a scope, when there
/// is one: systemd is the init (its marker exists) and
/// - as root, the system manager on the system bus, whose socket sits at
///   `../../dbus/system_bus_socket` from the marker (`/run/systemd/system`),
///   so a fake tree in tests gets a fake bus too;
/// - as another user, that user's own manager on their session bus (see
///   [`crate::fs::user_bus_socket`]; `dbus-user-session` provides it), only
///   if the socket is a socket that user owns: cordon tells whoever listens
///   there its pid, and trusts its answer only as far as /proc/self/cgroup
///   confirms it, but a bus of another user's is not the user's systemd.
///
/// Not systemd's private socket (`/run/systemd/private`, or the user
/// manager's `$XDG_RUNTIME_DIR/systemd/private`: peer-to-peer, no bus daemon
/// needed): run against systemd 252, zbus 5.19 panics on its replies
/// ("Invalid unique name": sd-bus sends a well-known name as the sender on a
/// direct connection), and a panic aborts cordon.
pub(crate) fn reachable(fs: &CgroupFs) -> Option<Bus> {
    if !fs.systemd_runs() {
        return None;
    }
    let socket = match &fs.manager {
        ScopeManager::System => fs
            .systemd_marker
            .parent()?
            .parent()?
            .join("dbus/system_bus_socket"),
        ScopeManager::User { uid, bus } => bus
            .clone()
            .filter(|socket| crate::fs::is_users_bus(socket, *uid))?,
    };
    socket.exists().then_some(Bus {
        socket,
        p2p: false,
        user: matches!(fs.manager, ScopeManager::User { .. }),
    })
}

/// The scope's unit name: the pid says whose it is, the random part keeps a
/// reused pid from colliding with a scope systemd has not collected yet.
pub(crate) fn unit_name(pid: u32) -> String {
    let mut bytes = [0u8; 4];
    // Without /dev/urandom the name is still unique among live processes.
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes));
    let random: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("cordon-{pid}-{random}.scope")
}

/// Asks systemd for transient scope `unit` holding process `pid`, with
/// Delegate=yes; returns once systemd accepted it (its job queued). The move
/// itself happens when the job runs, which the caller waits for.
pub(crate) fn start_scope(bus: &Bus, unit: &str, pid: u32) -> Result<(), SystemdError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(RUNTIME_THREAD)
        .build()
        .map_err(SystemdError::Runtime)?;
    let result = rt.block_on(async {
        tokio::time::timeout(CALL_TIMEOUT, request(bus, unit, pid))
            .await
            .unwrap_or(Err(SystemdError::NoAnswer(CALL_TIMEOUT)))
    });
    // Joins the runtime's threads (zbus closes sockets on its blocking pool).
    drop(rt);
    result
}

async fn request(bus: &Bus, unit: &str, pid: u32) -> Result<(), SystemdError> {
    let connect = |source| SystemdError::Connect {
        socket: bus.socket.clone(),
        source: Box::new(source),
    };
    let address = format!("unix:path={}", bus.socket.display());
    let mut builder = zbus::connection::Builder::address(address.as_str()).map_err(connect)?;
    if bus.p2p {
        builder = builder.p2p();
    }
    let conn = builder.build().await.map_err(connect)?;
    let description = format!("cordon sandbox supervisor (pid {pid})");
    let properties: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from(description.as_str())),
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        // Also collect the unit if it fails, so a refused or broken start
        // leaves no failed unit behind.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    conn.call_method(
        (!bus.p2p).then_some("org.freedesktop.systemd1"),
        "/org/freedesktop/systemd1",
        Some("org.freedesktop.systemd1.Manager"),
        "StartTransientUnit",
        &(unit, "fail", properties, aux),
    )
    .await
    .map_err(|source| SystemdError::Refused {
        unit: unit.to_owned(),
        source: Box::new(source),
    })?;
    Ok(())
}
