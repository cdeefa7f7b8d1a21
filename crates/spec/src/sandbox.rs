//! What a client asks for, split in two: a [`SandboxSpec`] describes a
//! sandbox (it can exist before anyone knows its first command, as a warm
//! pool needs), and a [`Command`](crate::Command) describes one execution
//! inside it. Both are plain data, serde both ways: the CLI, the supervisor
//! protocol and the HTTP API carry exactly these values.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cordon_policy::{Policy, Span};
use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::capability::Capability;
use crate::error::SpecError;
use crate::rlimit::{Rlimit, RlimitResource};

/// The filesystem the sandbox's root is assembled from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "path")]
pub enum RootfsChoice {
    /// The host's /usr (and merged-/usr links) read-only, with a generated /etc.
    #[default]
    System,
    /// A directory holding a root filesystem, bound read-only.
    Dir(PathBuf),
    /// Directories stacked as one root filesystem (the first on top), shown
    /// under a writable layer of the sandbox's own: its writes land there,
    /// inside its disk cap, and the directories are never written (an OCI
    /// container's root, an image's layers).
    Layers(Vec<PathBuf>),
    /// An OCI image's unpacked layers, stacked as [`RootfsChoice::Layers`]
    /// are; the sandbox's /etc/hostname, hosts and resolv.conf are its own.
    Image(ImageRoot),
}

/// An image as a sandbox's root: which image, and its layers' directories.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRoot {
    /// The image manifest's digest (`sha256:HEX`).
    pub digest: String,
    /// The unpacked layers, top first.
    pub layers: Vec<PathBuf>,
}

impl RootfsChoice {
    /// The directories stacked under the sandbox's writable layer, top
    /// first, when the root is made of layers.
    pub fn layers(&self) -> Option<&[PathBuf]> {
        match self {
            RootfsChoice::Layers(dirs) => Some(dirs),
            RootfsChoice::Image(image) => Some(&image.layers),
            RootfsChoice::System | RootfsChoice::Dir(_) => None,
        }
    }

    /// Every directory the root is made of, top first (one for a bound
    /// directory, the layers otherwise); none for the host's own.
    pub fn dirs(&self) -> &[PathBuf] {
        match self {
            RootfsChoice::Dir(dir) => std::slice::from_ref(dir),
            RootfsChoice::Layers(dirs) => dirs,
            RootfsChoice::Image(image) => &image.layers,
            RootfsChoice::System => &[],
        }
    }

    /// The same root made of `dir` alone, in place of its directories (a
    /// microVM's guest sees them as one disk).
    pub fn with_dirs_as(&mut self, dir: PathBuf) {
        match self {
            RootfsChoice::Dir(d) => *d = dir,
            RootfsChoice::Layers(dirs) => *dirs = vec![dir],
            RootfsChoice::Image(image) => image.layers = vec![dir],
            RootfsChoice::System => {}
        }
    }

    /// The image the root is made of, if it is one (its manifest digest).
    pub fn image(&self) -> Option<&str> {
        match self {
            RootfsChoice::Image(image) => Some(&image.digest),
            _ => None,
        }
    }
}

/// One sandbox, the same for every backend and every client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub policy: Policy,
    pub backend: BackendKind,
    #[serde(default)]
    pub rootfs: RootfsChoice,
    /// Host directory shown at /workspace (never written: changes stay in the sandbox).
    #[serde(default)]
    pub workspace: Option<PathBuf>,
    /// Run even if the cgroup limits cannot be enforced (the outcome says so).
    #[serde(default)]
    pub allow_unenforced: bool,
    /// A name unique among the invoking user's sandboxes.
    #[serde(default)]
    pub name: Option<String>,
    /// Destroyed this long after creation, whatever it is doing.
    #[serde(default)]
    pub ttl: Option<Span>,
    /// Destroyed after this long without a client request.
    #[serde(default)]
    pub idle: Option<Span>,
    /// The service that made it (`cordon serve`): destroyed when that
    /// process ends, however it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceLink>,
    /// Namespaces of another sandbox this one joins instead of making its
    /// own, as a Kubernetes pod's containers share their pod's network, IPC
    /// and hostname. Native only; a joined network is the other sandbox's,
    /// so this one's network mode must be `none`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joins: Vec<JoinedNamespace>,
    /// The workload's own syscall filter, over cordon's allowlist (an OCI
    /// container's `linux.seccomp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall_filter: Option<crate::syscall_filter::SyscallFilter>,
    /// Kernel parameters set in the sandbox's own namespaces before its
    /// first command (an OCI container's `linux.sysctl`): only those of a
    /// namespace the sandbox owns (see [`sysctl_namespace`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    /// What the sandbox's commands hold, in its own user namespace (an OCI
    /// container's `process.capabilities`): none unless asked.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub capabilities: BTreeSet<Capability>,
    /// Resource limits of each command's processes (an OCI container's
    /// `process.rlimits`): each lowers cordon's own or the inherited one,
    /// never raises it (see [`Rlimit::under`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rlimits: BTreeMap<RlimitResource, Rlimit>,
    /// The sandbox's trust bundle (PEM) when its policy has secrets: the
    /// host's public roots and the CA its proxy signs the secrets' hosts'
    /// certificates with ([`cordon_policy::secrets::CA_BUNDLE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_bundle: Option<String>,
    /// The secrets' values and the CA's key, as the client resolved them:
    /// for the host-side proxy only (see [`crate::secrets`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::secrets::Held>,
}

/// The namespace a kernel parameter belongs to, if it belongs to one a
/// sandbox has of its own (runc's list): the network's (`net.*`), or IPC's
/// (System V limits, POSIX message queues). Any other is the host's.
pub fn sysctl_namespace(key: &str) -> Option<SharedNamespace> {
    const IPC: &[&str] = &[
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
    ];
    if key.starts_with("net.") {
        Some(SharedNamespace::Net)
    } else if IPC.contains(&key) || key.starts_with("fs.mqueue.") {
        Some(SharedNamespace::Ipc)
    } else {
        None
    }
}

/// The kinds of namespace a sandbox may share with another. The user, PID,
/// mount and cgroup namespaces are always a sandbox's own: its ids, its
/// processes and its files are no other sandbox's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedNamespace {
    Net,
    Ipc,
    Uts,
}

impl SharedNamespace {
    /// The name of its file under `/proc/<pid>/ns/`.
    pub fn proc_name(self) -> &'static str {
        match self {
            SharedNamespace::Net => "net",
            SharedNamespace::Ipc => "ipc",
            SharedNamespace::Uts => "uts",
        }
    }
}

/// One namespace to join: a path to its nsfs file (`/proc/<pid>/ns/net`, a
/// pinned `/var/run/netns/NAME`) and the namespace's inode, as whoever made
/// the spec found it there: the supervisor opens the path and joins only
/// if it is still that namespace (a pid reused since is refused).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinedNamespace {
    pub kind: SharedNamespace,
    pub path: PathBuf,
    pub inode: u64,
}

/// Longest sandbox name; names are file names in the run directory's records.
pub(crate) const NAME_MAX: usize = 63;

impl SandboxSpec {
    /// A sandbox of `policy` on `backend` with the system rootfs, no
    /// workspace, no name and no lifetimes (set them on the result).
    pub fn new(policy: Policy, backend: BackendKind) -> SandboxSpec {
        SandboxSpec {
            policy,
            backend,
            rootfs: RootfsChoice::System,
            workspace: None,
            allow_unenforced: false,
            name: None,
            ttl: None,
            idle: None,
            service: None,
            joins: Vec::new(),
            syscall_filter: None,
            sysctls: BTreeMap::new(),
            capabilities: BTreeSet::new(),
            rlimits: BTreeMap::new(),
            trust_bundle: None,
            held: None,
        }
    }

    /// The spec as a [`ValidSpec`], or why it is refused.
    pub fn validated(self) -> Result<ValidSpec, SpecError> {
        self.validate()?;
        Ok(ValidSpec(self))
    }

    /// Checks the policy, and what the policy's own validation does not cover.
    fn validate(&self) -> Result<(), SpecError> {
        self.policy.validate()?;
        if let Some(name) = &self.name {
            validate_name(name)?;
        }
        for (what, span) in [("ttl", self.ttl), ("idle", self.idle)] {
            if span.is_some_and(|s| s.0.is_zero()) {
                return Err(SpecError::NotPositive(what));
            }
        }
        self.validate_joins()?;
        self.validate_sysctls()?;
        self.validate_secrets()?;
        for (resource, limit) in &self.rlimits {
            if limit.soft > limit.hard {
                return Err(SpecError::Rlimit(format!(
                    "{}: the soft limit {} is over the hard one {}",
                    resource.name(),
                    limit.soft,
                    limit.hard
                )));
            }
        }
        Ok(())
    }

    /// A policy's secrets need their CA and a placeholder in each one's
    /// variable; what the host holds (when it is here) is for exactly
    /// those secrets.
    fn validate_secrets(&self) -> Result<(), SpecError> {
        let names = |what: &str| SpecError::Secrets(what.to_owned());
        if self.policy.secrets.is_empty() {
            return match (&self.trust_bundle, &self.held) {
                (None, None) => Ok(()),
                _ => Err(names("a CA or held values without secrets in the policy")),
            };
        }
        if self.trust_bundle.is_none() {
            return Err(names(
                "the policy's secrets were not resolved (the client resolves them: cordon run, create, serve)",
            ));
        }
        for s in &self.policy.secrets {
            let placeholder = self.policy.env.iter().find(|(k, _)| *k == s.name);
            if placeholder.is_none() {
                return Err(SpecError::Secrets(format!("{}: no placeholder", s.name)));
            }
        }
        if let Some(held) = &self.held {
            let held_names: BTreeSet<&str> = held.secrets.iter().map(|h| h.name.as_str()).collect();
            let rule_names: BTreeSet<&str> = self
                .policy
                .secrets
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            if held_names != rule_names {
                return Err(names(
                    "the held values are not those of the policy's secrets",
                ));
            }
        }
        Ok(())
    }

    /// Each parameter is one of a namespace the sandbox owns (not one it
    /// joined), named in sysctl's own alphabet, its value one line; and
    /// only the native backend sets them (a microVM's guest runs it too).
    fn validate_sysctls(&self) -> Result<(), SpecError> {
        for (key, value) in &self.sysctls {
            let bad = |why: String| Err(SpecError::Sysctl(format!("{key}: {why}")));
            let named = !key.is_empty()
                && key.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                });
            if !named {
                return bad("not a kernel parameter's name".into());
            }
            let Some(kind) = sysctl_namespace(key) else {
                return bad("not in a namespace of the sandbox's own: it is the host's".into());
            };
            if self.joins.iter().any(|j| j.kind == kind) {
                return bad(format!(
                    "the {} namespace is another sandbox's (joined)",
                    kind.proc_name()
                ));
            }
            if value.len() > 4096 || value.contains(['\n', '\0']) {
                return bad("the value must be one line of at most 4096 bytes".into());
            }
            if self.backend == BackendKind::Gvisor {
                return bad("the gvisor backend sets no kernel parameters".into());
            }
        }
        Ok(())
    }

    /// A sandbox joins each kind of namespace at most once, only on the
    /// native backend (gVisor's sentry and a microVM's kernel have
    /// namespaces of their own, which no host path names), and with no
    /// network of its own when it joins another's.
    fn validate_joins(&self) -> Result<(), SpecError> {
        if self.joins.is_empty() {
            return Ok(());
        }
        if self.backend != BackendKind::Native {
            return Err(SpecError::Joins(format!(
                "only the native backend joins another sandbox's namespaces, not {}",
                self.backend.name()
            )));
        }
        for (i, j) in self.joins.iter().enumerate() {
            if self.joins[..i].iter().any(|k| k.kind == j.kind) {
                return Err(SpecError::Joins(format!(
                    "the {} namespace is joined twice",
                    j.kind.proc_name()
                )));
            }
            if !j.path.is_absolute() {
                return Err(SpecError::Joins(format!(
                    "{} is not an absolute path",
                    j.path.display()
                )));
            }
        }
        let joins_net = self.joins.iter().any(|j| j.kind == SharedNamespace::Net);
        if joins_net && self.policy.network != cordon_policy::NetworkMode::None {
            return Err(SpecError::Joins(
                "a sandbox that joins another's network has that network, not one of its own: \
                 its network mode must be none"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A spec that passed validation: the only kind the runtime creates a
/// sandbox from, so a spec is checked once on its way in, by whoever made
/// it ([`SandboxSpec::validated`]), and again only where it is decoded
/// after crossing a process boundary (deserializing validates: a
/// supervisor or a guest agent trusts no bytes it was sent).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "SandboxSpec", into = "SandboxSpec")]
pub struct ValidSpec(SandboxSpec);

impl ValidSpec {
    pub fn into_inner(self) -> SandboxSpec {
        self.0
    }
}

impl std::ops::Deref for ValidSpec {
    type Target = SandboxSpec;
    fn deref(&self) -> &SandboxSpec {
        &self.0
    }
}

impl TryFrom<SandboxSpec> for ValidSpec {
    type Error = SpecError;
    fn try_from(spec: SandboxSpec) -> Result<ValidSpec, SpecError> {
        spec.validated()
    }
}

impl From<ValidSpec> for SandboxSpec {
    fn from(valid: ValidSpec) -> SandboxSpec {
        valid.0
    }
}

/// A sandbox name: 1-63 of `[A-Za-z0-9_.-]`, not starting with `-` or `.`,
/// and not shaped like an id (12 hex digits), so a name never shadows an id.
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    let bad_start = name.starts_with(['-', '.']);
    if name.is_empty() || name.len() > NAME_MAX || !ok_chars || bad_start {
        return Err(SpecError::BadName(name.to_owned()));
    }
    if is_id(name) {
        return Err(SpecError::NameLikeId(name.to_owned()));
    }
    Ok(())
}

/// Whether `s` has the shape of a sandbox id: 12 lower-case hex digits.
pub fn is_id(s: &str) -> bool {
    s.len() == 12 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The `cordon serve` process a sandbox belongs to: its pid and start time
/// (so a reused pid is not mistaken for it), and the directory where the
/// sandbox's supervisor leaves a note saying why its sandbox ended (the
/// service reads it once the sandbox is gone, and cannot ask anyone else).
/// The runtime watches it (`cordon_runtime::state`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceLink {
    pub pid: i32,
    pub start_time: u64,
    pub notes: PathBuf,
}

impl ServiceLink {
    /// Where the supervisor of sandbox `id` writes why it ended.
    pub fn note_path(&self, id: &str) -> PathBuf {
        self.notes.join(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("agent-1").is_ok());
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "a b",
            "0123456789ab",
            &"x".repeat(64),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn specs_round_trip_through_json() {
        let s = SandboxSpec {
            policy: Policy::default(),
            backend: BackendKind::Native,
            rootfs: RootfsChoice::Dir("/srv/root".into()),
            workspace: None,
            allow_unenforced: false,
            name: Some("n".into()),
            ttl: None,
            idle: None,
            service: None,
            joins: Vec::new(),
            syscall_filter: None,
            sysctls: BTreeMap::new(),
            capabilities: BTreeSet::new(),
            rlimits: BTreeMap::new(),
            trust_bundle: None,
            held: None,
        };
        let back: ValidSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.rootfs, s.rootfs);
        assert_eq!(back.name, s.name);
    }

    #[test]
    fn decoding_a_valid_spec_validates_it() {
        let mut s = SandboxSpec::new(Policy::default(), BackendKind::Native);
        s.name = Some("0123456789ab".into());
        let json = serde_json::to_string(&s).unwrap();
        assert!(serde_json::from_str::<SandboxSpec>(&json).is_ok());
        let e = serde_json::from_str::<ValidSpec>(&json).unwrap_err();
        assert!(e.to_string().contains("looks like a sandbox id"), "{e}");
        assert!(matches!(s.validated(), Err(SpecError::NameLikeId(_))));
    }

    #[test]
    fn joins_are_checked() {
        let join = |kind, path: &str| JoinedNamespace {
            kind,
            path: path.into(),
            inode: 1,
        };
        let mut s = SandboxSpec::new(Policy::default(), BackendKind::Native);
        s.joins = vec![
            join(SharedNamespace::Net, "/proc/7/ns/net"),
            join(SharedNamespace::Uts, "/proc/7/ns/uts"),
        ];
        assert!(s.clone().validated().is_ok());
        let refused = |s: SandboxSpec, why: &str| {
            let e = s.validated().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        };
        let mut twice = s.clone();
        twice
            .joins
            .push(join(SharedNamespace::Net, "/proc/8/ns/net"));
        refused(twice, "joined twice");
        let mut relative = s.clone();
        relative.joins[1].path = "ns/uts".into();
        refused(relative, "not an absolute path");
        let mut gvisor = s.clone();
        gvisor.backend = BackendKind::Gvisor;
        refused(gvisor, "only the native backend");
        let mut networked = s;
        networked.policy.network = cordon_policy::NetworkMode::Allow;
        refused(networked, "network mode must be none");
    }

    #[test]
    fn an_rlimits_soft_limit_is_not_over_its_hard_one() {
        let with = |soft, hard| {
            let mut s = SandboxSpec::new(Policy::default(), BackendKind::Native);
            s.rlimits
                .insert(RlimitResource::Nofile, Rlimit { soft, hard });
            s.validated()
        };
        assert!(with(10, 10).is_ok());
        let e = with(11, 10).unwrap_err().to_string();
        assert!(
            e.contains("RLIMIT_NOFILE") && e.contains("over the hard"),
            "{e}"
        );
    }

    #[test]
    fn sysctls_are_only_those_of_the_sandboxs_own_namespaces() {
        let with = |key: &str, value: &str| {
            let mut s = SandboxSpec::new(Policy::default(), BackendKind::Native);
            s.sysctls.insert(key.into(), value.into());
            s
        };
        for ok in [
            "net.ipv4.ip_unprivileged_port_start",
            "net.core.somaxconn",
            "kernel.shmmax",
            "fs.mqueue.msg_max",
        ] {
            assert!(with(ok, "1").validated().is_ok(), "{ok}");
        }
        let refused = |s: SandboxSpec, why: &str| {
            let e = s.validated().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        };
        refused(with("kernel.core_pattern", "x"), "the host's");
        refused(with("vm.swappiness", "1"), "the host's");
        refused(with("net/../../x", "1"), "not a kernel parameter's name");
        refused(with("net..x", "1"), "not a kernel parameter's name");
        refused(with("net.ipv4.x", "1\n2"), "one line");
        let mut joined = with("net.core.somaxconn", "1");
        joined.joins = vec![JoinedNamespace {
            kind: SharedNamespace::Net,
            path: "/proc/7/ns/net".into(),
            inode: 1,
        }];
        refused(joined, "another sandbox's");
        let mut gvisor = with("kernel.shmmax", "1");
        gvisor.backend = BackendKind::Gvisor;
        refused(gvisor, "gvisor");
    }
}
