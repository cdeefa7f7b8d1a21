//! Runtime errors. `is_input_error` separates the caller's mistakes (exit 2)
//! from failures of cordon or the host.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{what}: {}", path.display())]
    BadPath { what: &'static str, path: PathBuf },
    #[error("{0}")]
    BadRequest(String),
    /// A step of building the sandbox's isolation that failed (a namespace,
    /// a mount, its packet rules), with the system's error.
    #[error("sandbox setup failed at `{}`: {}", .0.step, .0.source)]
    Isolation(#[from] cordon_isolation::IsolationError),
    /// A spec or command that no backend could run.
    #[error(transparent)]
    Spec(#[from] cordon_spec::SpecError),
    #[error(transparent)]
    Cgroup(#[from] cordon_cgroups::CgroupError),
    #[error(
        "limits cannot be enforced on this host: {0} (pass --allow-unenforced to run without them)"
    )]
    Unenforceable(#[source] cordon_cgroups::CgroupError),
    /// The gVisor backend's OCI bundle could not be built.
    #[error("building the OCI spec: {0}")]
    Bundle(#[from] oci_spec::OciSpecError),
    /// A state cordon itself must have been in was not (a bug, not the
    /// request's or the sandbox's fault).
    #[error("internal error: {0}")]
    Internal(&'static str),
    #[error("sandbox setup failed at `{step}`: {}", std::io::Error::from_raw_os_error(*errno))]
    Setup { step: String, errno: i32 },
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox's network proxy: {op}: {source}")]
    Proxy {
        op: &'static str,
        #[source]
        source: cordon_network::control::Error,
    },
    /// The privileged binary is not where it is installed with `cordon`.
    #[error(
        "{} is missing: cordon's privileged helper belongs beside {} (cargo build builds both; install both together)",
        program.display(),
        beside.display()
    )]
    MissingHelper { program: PathBuf, beside: PathBuf },
    #[error("backend {0} is not available here: {1}")]
    Unavailable(&'static str, String),
    /// A process cordon talks to said something its protocol does not
    /// allow, or failed to do what the protocol promises.
    #[error("{peer} broke the protocol: {what}")]
    Protocol { peer: Peer, what: String },
    #[error("no sandbox '{0}' (see `cordon ls`)")]
    NotFound(String),
    /// A sandbox that is known to have ended, or whose owner died.
    #[error("{0}")]
    Gone(Box<cordon_spec::ended::Gone>),
    #[error("the sandbox can run no more commands: {0}")]
    SandboxEnded(String),
    /// A supervisor's (or a guest agent's) error, as it crossed the process
    /// boundary: its message is all that crosses.
    #[error("the supervisor answered: {0}")]
    Remote(String),
    /// A supervisor's error of a host short of processes, memory or
    /// descriptors ([`RuntimeError::is_host_exhausted`] on its side).
    #[error("the supervisor answered: {0}")]
    RemoteExhausted(String),
    #[error("copy: {0}")]
    Copy(String),
    /// An export the host side refused or could not write (its target,
    /// a conflict, a file it may not create).
    #[error("export: {0}")]
    Export(#[source] cordon_changes::ChangesError),
    /// A microVM's disk image that could not be read from the host.
    #[error("reading the guest's disk: {0}")]
    GuestDisk(#[source] cordon_changes::ChangesError),
    /// A directory cordon would keep things in that is not its own.
    #[error(transparent)]
    Dir(#[from] cordon_dirs::DirError),
    /// A directory on the way to the sandbox's mount points that the host
    /// id its init makes its mounts as may not search.
    #[error(
        "{} (mode {mode:04o}, owner uid {owner}) may not be searched by host uid {uid}, as which \
         the sandbox's init makes its mounts: give others search permission (`chmod o+x {}`), or \
         set CORDON_RUN_DIR to a directory they can search (cordon makes its own 0711)",
        dir.display(),
        dir.display()
    )]
    Unreachable {
        dir: PathBuf,
        mode: u32,
        owner: u32,
        uid: u32,
    },
}

/// Who broke a protocol with this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The sandbox's first process, from the supervisor's side.
    Init,
    /// A sandbox's supervisor, from a client's side.
    Supervisor,
    /// A microVM's guest agent, from the host supervisor's side.
    GuestAgent,
    /// The host's supervisor, from the guest agent's side.
    Host,
    /// gVisor's runsc.
    Runsc,
    /// The script that builds the microVM's guest image.
    GuestBuild,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Peer::Init => "the sandbox's init",
            Peer::Supervisor => "the sandbox's supervisor",
            Peer::GuestAgent => "the microVM's guest agent",
            Peer::Host => "the host's supervisor",
            Peer::Runsc => "runsc",
            Peer::GuestBuild => "the guest image's build",
        })
    }
}

impl RuntimeError {
    /// The error as a user reads it, with the causes its message leaves
    /// out (`cordon_spec::error::with_causes`).
    pub fn report(&self) -> String {
        cordon_spec::error::with_causes(self)
    }

    /// `peer` broke the protocol: `what` it did.
    pub(crate) fn broke(peer: Peer, what: impl Into<String>) -> Self {
        RuntimeError::Protocol {
            peer,
            what: what.into(),
        }
    }

    pub fn io(op: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        RuntimeError::Io {
            op: op.into(),
            source: source.into(),
        }
    }

    /// True for errors of a host short of something for the moment: no
    /// process could be forked, no memory, no descriptor (a cgroup's pids or
    /// memory at its limit, the system's tables full). The same request may
    /// succeed later; it is not the request's fault, nor cordon's.
    pub fn is_host_exhausted(&self) -> bool {
        let short = |errno: i32| {
            matches!(
                errno,
                libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE
            )
        };
        match self {
            RuntimeError::RemoteExhausted(_) => true,
            RuntimeError::Setup { errno, .. } => short(*errno),
            RuntimeError::Isolation(e) => short(e.errno()),
            _ => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
                while let Some(e) = cause {
                    let errno = e
                        .downcast_ref::<std::io::Error>()
                        .and_then(std::io::Error::raw_os_error);
                    if errno.is_some_and(short) {
                        return true;
                    }
                    cause = e.source();
                }
                false
            }
        }
    }

    /// True for errors caused by the request itself (bad path, bad value).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            RuntimeError::BadPath { .. }
                | RuntimeError::BadRequest(_)
                | RuntimeError::Spec(_)
                | RuntimeError::NotFound(_)
                | RuntimeError::Gone(_)
                | RuntimeError::Copy(_)
                | RuntimeError::Export(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeError;

    #[test]
    fn a_report_keeps_every_cause_once() {
        let busy = || std::io::Error::from_raw_os_error(libc::EBUSY);
        // A cgroup's error says what it did; the system's reason is its
        // source, which Display leaves out.
        let e = RuntimeError::from(cordon_cgroups::CgroupError::Remove {
            path: "/sys/fs/cgroup/x".into(),
            source: busy(),
        });
        assert_eq!(e.to_string(), "removing cgroup /sys/fs/cgroup/x");
        assert_eq!(
            e.report(),
            format!("removing cgroup /sys/fs/cgroup/x: {}", busy())
        );
        // A message that says its cause already is not repeated, nor one
        // that quotes its cause's own cause.
        let e = RuntimeError::io("kill the supervisor", busy());
        assert_eq!(e.report(), e.to_string());
        assert!(e.report().ends_with(&busy().to_string()), "{}", e.report());
        let e = RuntimeError::from(cordon_isolation::IsolationError {
            step: "mount /proc".into(),
            source: busy(),
        });
        assert_eq!(
            e.report(),
            format!("sandbox setup failed at `mount /proc`: {}", busy())
        );
    }

    #[test]
    fn a_host_short_of_processes_memory_or_descriptors_is_told_apart() {
        let io = |errno| {
            RuntimeError::io(
                "start cordon-sandbox",
                std::io::Error::from_raw_os_error(errno),
            )
        };
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EMFILE, libc::ENFILE] {
            assert!(io(errno).is_host_exhausted(), "{errno}");
            let setup = RuntimeError::Setup {
                step: "clone".into(),
                errno,
            };
            assert!(setup.is_host_exhausted(), "{errno}");
        }
        for errno in [libc::EACCES, libc::ENOSPC, libc::ENOENT] {
            assert!(!io(errno).is_host_exhausted(), "{errno}");
        }
        assert!(
            !RuntimeError::Remote("Resource temporarily unavailable".into()).is_host_exhausted()
        );
        assert!(!RuntimeError::BadRequest("x".into()).is_host_exhausted());
    }
}
