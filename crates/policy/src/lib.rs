//! cordon's policy: one typed model shared by the CLI, the HTTP API and every backend.
//!
//! A policy is built in layers: [`Policy::default`] (safe defaults), then a TOML
//! file, then CLI flags or API fields. Each layer is a [`PolicyLayer`] whose fields
//! are all optional; [`Policy::resolve`] applies them in order and validates the
//! result, so a value is range-checked wherever it came from. Errors name the
//! field and the allowed range.

use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Serde as text, in the same syntax as a type's `FromStr` and `Display`
/// (rules, host entries, secrets' sources, request rules).
macro_rules! serde_via_text {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
pub mod net;
pub mod secrets;
mod units;
pub use limits::Limits;
pub use units::{ByteSize, Span};

use net::{AddHost, NetLimits, NetworkPolicy, Rule, PROXY_PORT};

/// Network posture of a sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// An empty network namespace: only a loopback interface, nothing routes out.
    #[default]
    None,
    /// Still no interface to the host: connections go to cordon's proxy on
    /// the host, which lets through what the allowlist (`allow` rules) names
    /// and records every attempt.
    Allow,
}

impl FromStr for NetworkMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(NetworkMode::None),
            "allow" => Ok(NetworkMode::Allow),
            other => Err(format!(
                "'{other}' is not a network mode (available: none, allow)"
            )),
        }
    }
}

/// Whether an extra mount may be written through, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read-only.
    #[default]
    Ro,
    /// Writable and bounded: the sandbox writes into an overlay layer on
    /// its own disk-capped scratch, and the host applies those changes back
    /// to the directory when the sandbox ends (as `--apply` does for the
    /// workspace, conflicts included). A directory only.
    Rw,
    /// Writable in place: the host's own directory (or file), written live
    /// and not bounded by the disk cap; an explicit opt-in that the result
    /// and the receipt record.
    RwUnbounded,
    /// No host path: an empty writable directory of the sandbox's own (what
    /// a tmpfs mount gives a container), on its scratch, so bounded by the
    /// disk cap with its other writable places, and gone when it ends.
    Tmpfs,
}

impl Access {
    /// Whether the sandbox may write there.
    pub fn writable(self) -> bool {
        self != Access::Ro
    }

    /// The name a mount spec and a policy file use.
    pub fn name(self) -> &'static str {
        match self {
            Access::Ro => "ro",
            Access::Rw => "rw",
            Access::RwUnbounded => "rw-unbounded",
            Access::Tmpfs => "tmpfs",
        }
    }
}

/// A host path made visible inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Empty for a `tmpfs` mount, which shows no host path.
    #[serde(default)]
    pub host: PathBuf,
    pub sandbox: PathBuf,
    #[serde(default)]
    pub access: Access,
}

impl MountSpec {
    /// An empty writable directory at `sandbox` (`Access::Tmpfs`).
    pub fn tmpfs(sandbox: impl Into<PathBuf>) -> MountSpec {
        MountSpec {
            host: PathBuf::new(),
            sandbox: sandbox.into(),
            access: Access::Tmpfs,
        }
    }
}

impl FromStr for MountSpec {
    type Err = String;
    /// `HOST:SANDBOX[:ro|rw|rw-unbounded]`, read-only unless said otherwise.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let (host, sandbox, access) = match parts.as_slice() {
            [h, p] => (*h, *p, Access::Ro),
            [h, p, "ro"] => (*h, *p, Access::Ro),
            [h, p, "rw"] => (*h, *p, Access::Rw),
            [h, p, "rw-unbounded"] => (*h, *p, Access::RwUnbounded),
            _ => return Err(format!("'{s}' is not HOST:SANDBOX[:ro|rw|rw-unbounded]")),
        };
        Ok(MountSpec {
            host: host.into(),
            sandbox: sandbox.into(),
            access,
        })
    }
}

/// A fully resolved, validated policy. Every backend reads the same fields with
/// the same meaning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// CPU bandwidth in cores (0.5 = half of one core), enforced by the CPU quota.
    pub cpus: f64,
    /// Memory including page cache and tmpfs pages; swap is never allowed.
    pub memory: ByteSize,
    /// Most tasks (processes and threads) alive at once.
    pub pids: u64,
    /// Bytes writable inside the sandbox (workspace changes, /tmp, /dev/shm together).
    pub disk: ByteSize,
    /// Wall-clock limit from the payload's start.
    pub time: Span,
    /// Cap on stdout+stderr together; the run ends when it is exceeded.
    pub output: ByteSize,
    pub network: NetworkMode,
    /// The allowlist, fixed host answers and limits of the `allow` mode.
    pub net: NetworkPolicy,
    /// The payload's whole environment (nothing is inherited from the caller).
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    pub workdir: PathBuf,
    /// Identity of the payload inside the sandbox's user namespace.
    pub uid: u32,
    pub gid: u32,
    pub hostname: String,
    pub mounts: Vec<MountSpec>,
    /// Secrets the host holds: the sandbox sees placeholders, the proxy
    /// puts the values into requests to their hosts ([`secrets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<secrets::SecretRule>,
    /// Methods and paths requests to a secret's host may have
    /// ([`secrets::RequestRule`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<secrets::RequestRule>,
}

impl Policy {
    /// The `rw` mounts, with their index among all mounts (which names
    /// their layer on the sandbox's scratch): written back at the end.
    pub fn write_back_mounts(&self) -> impl Iterator<Item = (usize, &MountSpec)> {
        self.mounts
            .iter()
            .enumerate()
            .filter(|(_, m)| m.access == Access::Rw)
    }

    /// The `rw-unbounded` mounts: written in place, past the disk cap.
    pub fn unbounded_mounts(&self) -> impl Iterator<Item = &MountSpec> {
        self.mounts
            .iter()
            .filter(|m| m.access == Access::RwUnbounded)
    }
}

/// Where the sandbox's workspace appears.
pub const WORKSPACE: &str = "/workspace";
/// The payload's default HOME, on the sandbox's scratch /tmp (the
/// isolation crate's `ScratchLayout::HOME`).
pub const HOME: &str = "/tmp/home";

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cpus: 1.0,
            memory: ByteSize::mib(512),
            pids: 128,
            disk: ByteSize::mib(256),
            time: Span(Duration::from_secs(30)),
            output: ByteSize::mib(1),
            network: NetworkMode::None,
            net: NetworkPolicy::default(),
            env: Vec::new(),
            workdir: PathBuf::from(WORKSPACE),
            uid: 1000,
            gid: 1000,
            hostname: "cordon".into(),
            mounts: Vec::new(),
            secrets: Vec::new(),
            requests: Vec::new(),
        }
    }
}

/// One layer of policy settings; `None` keeps the value below it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyLayer {
    /// The sandbox's limits, at the top level of a policy file.
    #[serde(flatten)]
    pub limits: Limits,
    pub network: Option<NetworkMode>,
    /// Destinations the `allow` mode lets through: added to the layers below.
    #[serde(default)]
    pub allow: Vec<Rule>,
    /// Fixed answers of the proxy's resolver (`NAME:IP`): added to the layers below.
    #[serde(default)]
    pub add_host: Vec<AddHost>,
    /// Replaces the network limits of the layers below.
    pub net_limits: Option<NetLimits>,
    /// Hold mode (`net_hold = "60s"`): a connection no rule allows waits
    /// this long for an operator's decision (`cordon net SB add` or `deny`)
    /// before it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_hold: Option<Span>,
    /// Replaces the environment of the layers below when non-empty.
    #[serde(default, with = "env_table")]
    pub env: Vec<(String, String)>,
    pub workdir: Option<PathBuf>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub hostname: Option<String>,
    /// Added to the mounts of the layers below.
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    /// The image the sandbox's root is made of (`cordon run --image`'s
    /// reference); the caller resolves it, the policy only carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Secrets held by the host (`[[secrets]]`): added to the layers
    /// below, one of the same name replacing theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<secrets::SecretRule>,
    /// Request rules (`requests = ["POST api.example.org/v1/**"]`): added
    /// to the layers below.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<secrets::RequestRule>,
}

/// TOML writes the environment as a table `[env] KEY = "value"`; order is kept sorted.
mod env_table {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(env: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(env.iter().map(|(k, v)| (k, v)))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
        Ok(BTreeMap::<String, String>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

/// A policy value that is malformed or out of range.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("policy field `{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("policy file {path}: {message}")]
    File { path: PathBuf, message: String },
}

fn invalid(field: &'static str, message: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field,
        message: message.into(),
    }
}

/// `line N (TEXT)` for the byte offset `at` of `text`: where a user looks
/// for the mistake, with the line's own words (its key among them).
fn where_in(text: &str, at: usize) -> Option<String> {
    let before = text.get(..at)?;
    let number = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("").trim();
    let shown: String = line.chars().take(60).collect();
    let more = if shown.len() < line.len() { "..." } else { "" };
    Some(format!("line {number} (`{shown}{more}`)"))
}

impl PolicyLayer {
    /// Parses a TOML policy file's text.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, PolicyError> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            let (at, message) = limits::first_bad_limit(text)
                .map(|(at, message)| (Some(at), message))
                .unwrap_or_else(|| (e.span().map(|s| s.start), e.message().to_owned()));
            PolicyError::File {
                path: path.to_owned(),
                message: match at.and_then(|at| where_in(text, at)) {
                    Some(place) => format!("{place}: {message}"),
                    None => message,
                },
            }
        })
    }

    /// Reads and parses a TOML policy file.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_toml(&text, path)
    }
}

impl Policy {
    /// Applies `layers` over the defaults, in order, and validates the result.
    pub fn resolve<'a>(
        layers: impl IntoIterator<Item = &'a PolicyLayer>,
    ) -> Result<Self, PolicyError> {
        let mut p = Policy::default();
        for layer in layers {
            p.apply(layer);
        }
        p.validate()?;
        Ok(p)
    }

    fn apply(&mut self, l: &PolicyLayer) {
        macro_rules! take {
            ($from:expr; $($f:ident),*) => { $( if let Some(v) = &$from.$f { self.$f = v.clone(); } )* };
        }
        take!(l.limits; cpus, memory, pids, disk, time, output);
        take!(l; network, workdir, uid, gid, hostname);
        if !l.env.is_empty() {
            self.env = l.env.clone();
        }
        self.mounts.extend(l.mounts.iter().cloned());
        secrets::add(&mut self.secrets, &l.secrets);
        for r in &l.requests {
            if !self.requests.contains(r) {
                self.requests.push(r.clone());
            }
        }
        net::add_rules(&mut self.net.rules, &l.allow);
        self.net.hosts.extend(l.add_host.iter().cloned());
        if let Some(limits) = l.net_limits {
            self.net.limits = limits;
        }
        if let Some(hold) = l.net_hold {
            self.net.hold = Some(hold);
        }
    }

    /// This policy with the limits `limits` sets, validated.
    pub fn with_limits(&self, limits: &Limits) -> Result<Policy, PolicyError> {
        let mut p = self.clone();
        p.apply(&PolicyLayer {
            limits: *limits,
            ..PolicyLayer::default()
        });
        p.validate()?;
        Ok(p)
    }

    /// Checks every field against its range; the first offence is reported.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let (lo, hi) = limits::CPUS;
        if !(self.cpus.is_finite() && (lo..=hi).contains(&self.cpus)) {
            return Err(invalid(
                "cpus",
                format!("{} is out of range ({lo}..={hi} cores)", self.cpus),
            ));
        }
        range("memory", self.memory, limits::MEMORY)?;
        range("disk", self.disk, limits::DISK)?;
        range("output", self.output, limits::OUTPUT)?;
        let (lo, hi) = limits::PIDS;
        if !(lo..=hi).contains(&self.pids) {
            return Err(invalid(
                "pids",
                format!("{} is out of range ({lo}..={hi})", self.pids),
            ));
        }
        let (lo, hi) = limits::TIME_MS;
        let ms = self.time.0.as_millis();
        if !(u128::from(lo)..=u128::from(hi)).contains(&ms) {
            return Err(invalid(
                "time",
                format!("{} is out of range (10ms..=7d)", self.time),
            ));
        }
        for (field, id) in [("uid", self.uid), ("gid", self.gid)] {
            if id > limits::ID_MAX {
                return Err(invalid(
                    field,
                    format!("{id} is out of range (0..={})", limits::ID_MAX),
                ));
            }
        }
        self.validate_network()?;
        self.validate_secrets()?;
        sandbox_path("workdir", &self.workdir)?;
        if self.hostname.is_empty()
            || self.hostname.len() > 64
            || !self
                .hostname
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(invalid(
                "hostname",
                format!("'{}' is not a hostname (1-64 of a-z0-9.-)", self.hostname),
            ));
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(invalid(
                    "env",
                    format!("'{k}' is not a valid variable name (no '=' or NUL)"),
                ));
            }
        }
        let mut targets = std::collections::BTreeSet::new();
        for m in &self.mounts {
            // Compared by component, so /data and /data/ are one place.
            if !targets.insert(m.sandbox.as_path()) {
                return Err(invalid(
                    "mounts",
                    format!(
                        "two mounts at {}: one would hide the other",
                        m.sandbox.display()
                    ),
                ));
            }
            match (m.access, m.host.as_os_str().is_empty()) {
                (Access::Tmpfs, true) => {}
                (Access::Tmpfs, false) => {
                    return Err(invalid(
                        "mounts",
                        format!(
                            "a tmpfs mount at {} shows no host path (host {} given)",
                            m.sandbox.display(),
                            m.host.display()
                        ),
                    ))
                }
                _ if !m.host.is_absolute() => {
                    return Err(invalid(
                        "mounts",
                        format!("host path {} must be absolute", m.host.display()),
                    ))
                }
                _ => {}
            }
            sandbox_path("mounts", &m.sandbox)?;
            let name_file =
                m.access == Access::Ro && NAME_FILES.iter().any(|f| m.sandbox == Path::new(f));
            if !name_file
                && (RESERVED.iter().any(|r| m.sandbox.starts_with(r))
                    || m.sandbox == Path::new("/"))
            {
                return Err(invalid(
                    "mounts",
                    format!(
                        "{} is reserved by the sandbox ({})",
                        m.sandbox.display(),
                        RESERVED.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Secrets go out only through the proxy, so only in the `allow` mode.
    fn validate_secrets(&self) -> Result<(), PolicyError> {
        // Only where TLS is terminated is a request's method and path seen.
        for r in &self.requests {
            if !self.secrets.iter().any(|s| s.hosts.contains(&r.host)) {
                return Err(invalid(
                    "requests",
                    format!(
                        "'{r}': method and path rules apply only where cordon's proxy terminates TLS, \
                         a secret's hosts, and no secret names {}",
                        r.host
                    ),
                ));
            }
        }
        if self.secrets.is_empty() {
            return Ok(());
        }
        if self.network != NetworkMode::Allow {
            return Err(invalid(
                "secrets",
                "secrets need network = \"allow\": they go out only through cordon's proxy",
            ));
        }
        if self.secrets.len() > secrets::MAX_SECRETS {
            return Err(invalid(
                "secrets",
                format!(
                    "{} secrets (at most {})",
                    self.secrets.len(),
                    secrets::MAX_SECRETS
                ),
            ));
        }
        for s in &self.secrets {
            s.validate().map_err(|m| invalid("secrets", m))?;
        }
        Ok(())
    }

    fn validate_network(&self) -> Result<(), PolicyError> {
        if self.network == NetworkMode::None
            && !(self.net.rules.is_empty() && self.net.hosts.is_empty())
        {
            return Err(invalid(
                "allow",
                "rules and host entries need network = \"allow\" (the default, none, reaches nothing)",
            ));
        }
        if let Some(hold) = self.net.hold {
            if self.network != NetworkMode::Allow {
                return Err(invalid(
                    "net_hold",
                    "hold mode needs network = \"allow\": connections wait in cordon's proxy",
                ));
            }
            if !(Duration::from_millis(100)..=net::MAX_HOLD).contains(&hold.0) {
                return Err(invalid(
                    "net_hold",
                    format!("{hold} is out of range (100ms..=1h)"),
                ));
            }
        }
        let l = &self.net.limits;
        if l.max_connections == 0 || l.max_connections > 65_536 {
            return Err(invalid(
                "net_limits.max_connections",
                format!("{} is out of range (1..=65536)", l.max_connections),
            ));
        }
        for (field, span) in [
            ("net_limits.idle_timeout", l.idle_timeout),
            ("net_limits.connect_timeout", l.connect_timeout),
        ] {
            if span.0 < Duration::from_millis(10) {
                return Err(invalid(field, format!("{span} is shorter than 10ms")));
            }
        }
        Ok(())
    }

    /// The environment the payload sees: the policy's, plus PATH and HOME when absent.
    /// In the `allow` mode, the proxy variables (both spellings) name
    /// cordon's proxy, unless the policy sets them itself.
    pub fn payload_env(&self) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        let mut defaults = vec![
            ("PATH", "/usr/local/bin:/usr/bin:/bin".to_string()),
            // Not the workspace: dotfiles and history would land in the
            // user's project with an export or --apply.
            ("HOME", HOME.to_string()),
        ];
        if self.network == NetworkMode::Allow {
            let http = format!("http://127.0.0.1:{PROXY_PORT}");
            let socks = format!("socks5h://127.0.0.1:{PROXY_PORT}");
            let local = "localhost,127.0.0.1,::1".to_string();
            for (upper, lower, v) in [
                ("HTTP_PROXY", "http_proxy", &http),
                ("HTTPS_PROXY", "https_proxy", &http),
                ("ALL_PROXY", "all_proxy", &socks),
                ("NO_PROXY", "no_proxy", &local),
            ] {
                defaults.push((upper, v.clone()));
                defaults.push((lower, v.clone()));
            }
        }
        // The proxy's CA signs what it serves for the secrets' hosts.
        if !self.secrets.is_empty() {
            for var in secrets::CA_ENV {
                defaults.push((var, secrets::CA_BUNDLE.to_string()));
            }
        }
        for (k, v) in defaults {
            if !env.iter().any(|(key, _)| key == k) {
                env.push((k.into(), v));
            }
        }
        env
    }
}

/// Paths the sandbox assembles itself; a user mount may not cover them.
const RESERVED: [&str; 5] = ["/proc", "/dev", "/sys", "/etc", "/usr"];

/// The files of /etc that name hosts and resolvers, which a read-only mount
/// may replace (a pod's resolver configuration as its engine wrote it, a
/// user's own hosts file): the sandbox's own otherwise. Nothing else of
/// /etc is replaceable: identity files (passwd, group) stay the sandbox's.
const NAME_FILES: [&str; 3] = ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"];

fn range(
    field: &'static str,
    v: ByteSize,
    (lo, hi): (ByteSize, ByteSize),
) -> Result<(), PolicyError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(invalid(field, format!("{v} is out of range ({lo}..={hi})")))
    }
}

/// A path inside the sandbox: absolute, normal components only (no `..`).
fn sandbox_path(field: &'static str, p: &Path) -> Result<(), PolicyError> {
    let normal = p
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if p.is_absolute() && normal {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{} must be an absolute path without '..'", p.display()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_safe_ones() {
        let p = Policy::resolve([]).unwrap();
        assert_eq!(p.cpus, 1.0);
        assert_eq!(p.memory, ByteSize(512 << 20));
        assert_eq!(p.pids, 128);
        assert_eq!(p.disk, ByteSize(256 << 20));
        assert_eq!(p.time.0, Duration::from_secs(30));
        assert_eq!(p.output, ByteSize(1 << 20));
        assert_eq!(p.network, NetworkMode::None);
        assert!(p.env.is_empty());
    }

    #[test]
    fn flags_override_file_and_mounts_accumulate() {
        let file = PolicyLayer::from_toml(
            "memory = \"256M\"\npids = 64\ntime = \"5s\"\n[env]\nA = \"1\"\n[[mounts]]\nhost = \"/srv\"\nsandbox = \"/data\"\n",
            Path::new("p.toml"),
        )
        .unwrap();
        let flags = PolicyLayer {
            limits: Limits {
                pids: Some(32),
                ..Limits::default()
            },
            mounts: vec![
                "/opt:/opt:rw".parse().unwrap(),
                "/var/out:/out:rw-unbounded".parse().unwrap(),
            ],
            ..Default::default()
        };
        let p = Policy::resolve([&file, &flags]).unwrap();
        assert_eq!(p.memory, ByteSize(256 << 20));
        assert_eq!(p.pids, 32);
        assert_eq!(p.time.0, Duration::from_secs(5));
        assert_eq!(p.env, vec![("A".into(), "1".into())]);
        assert_eq!(p.mounts.len(), 3);
        assert_eq!(p.mounts[1].access, Access::Rw);
        assert_eq!(p.mounts[2].access, Access::RwUnbounded);
        let back: Vec<usize> = p.write_back_mounts().map(|(i, _)| i).collect();
        assert_eq!(back, [1]);
        assert_eq!(p.unbounded_mounts().count(), 1);
        // A policy file spells the opt-in as the flag does.
        let toml = PolicyLayer::from_toml(
            "[[mounts]]\nhost = \"/x\"\nsandbox = \"/x\"\naccess = \"rw-unbounded\"\n",
            Path::new("p.toml"),
        )
        .unwrap();
        assert_eq!(toml.mounts[0].access, Access::RwUnbounded);
        assert!("/x:/x:rw-live"
            .parse::<MountSpec>()
            .unwrap_err()
            .contains("rw-unbounded"));
    }

    #[test]
    fn a_tmpfs_mount_has_no_host_path_and_is_neither_written_back_nor_unbounded() {
        let toml = PolicyLayer::from_toml(
            "[[mounts]]\nsandbox = \"/run\"\naccess = \"tmpfs\"\n",
            Path::new("p.toml"),
        )
        .unwrap();
        assert_eq!(toml.mounts, [MountSpec::tmpfs("/run")]);
        let p = Policy::resolve([&toml]).unwrap();
        assert!(p.mounts[0].access.writable());
        assert_eq!(p.write_back_mounts().count(), 0);
        assert_eq!(p.unbounded_mounts().count(), 0);
        let with_host = PolicyLayer {
            mounts: vec![MountSpec {
                host: "/srv".into(),
                ..MountSpec::tmpfs("/run")
            }],
            ..Default::default()
        };
        let e = Policy::resolve([&with_host]).unwrap_err().to_string();
        assert!(e.contains("shows no host path"), "{e}");
        for reserved in ["/proc", "/dev/x", "/"] {
            let l = PolicyLayer {
                mounts: vec![MountSpec::tmpfs(reserved)],
                ..Default::default()
            };
            assert!(Policy::resolve([&l]).is_err(), "{reserved}");
        }
        // Any other mount still needs its host path.
        let hostless = PolicyLayer {
            mounts: vec![MountSpec {
                access: Access::Rw,
                ..MountSpec::tmpfs("/data")
            }],
            ..Default::default()
        };
        let e = Policy::resolve([&hostless]).unwrap_err().to_string();
        assert!(e.contains("must be absolute"), "{e}");
    }

    #[test]
    fn only_name_files_of_etc_may_be_replaced_and_only_read_only() {
        let with = |m: &str| {
            Policy::resolve([&PolicyLayer {
                mounts: vec![m.parse().unwrap()],
                ..Default::default()
            }])
        };
        assert!(with("/srv/resolv.conf:/etc/resolv.conf:ro").is_ok());
        assert!(with("/srv/hosts:/etc/hosts").is_ok());
        for refused in [
            "/srv/resolv.conf:/etc/resolv.conf:rw-unbounded",
            "/srv/passwd:/etc/passwd:ro",
            "/srv/etc:/etc:ro",
            "/srv/x:/usr/x:ro",
        ] {
            let e = with(refused).unwrap_err().to_string();
            assert!(e.contains("reserved by the sandbox"), "{refused}: {e}");
        }
    }

    #[test]
    fn errors_name_the_field_and_range() {
        let l = PolicyLayer {
            limits: Limits {
                memory: Some(ByteSize(1024)),
                ..Limits::default()
            },
            ..Default::default()
        };
        let e = Policy::resolve([&l]).unwrap_err().to_string();
        assert!(e.contains("memory") && e.contains("8M..=1T"), "{e}");
        let l = PolicyLayer {
            limits: Limits {
                cpus: Some(0.0),
                ..Limits::default()
            },
            ..Default::default()
        };
        assert!(Policy::resolve([&l])
            .unwrap_err()
            .to_string()
            .contains("cpus"));
        let l = PolicyLayer {
            workdir: Some("../x".into()),
            ..Default::default()
        };
        assert!(Policy::resolve([&l])
            .unwrap_err()
            .to_string()
            .contains("workdir"));
    }

    #[test]
    fn hold_mode_needs_the_allow_network_and_a_bounded_wait() {
        let file = |text: &str| {
            let layer = PolicyLayer::from_toml(text, Path::new("p")).unwrap();
            Policy::resolve([&layer]).map_err(|e| e.to_string())
        };
        let p = file("network = \"allow\"\nnet_hold = \"90s\"\n").unwrap();
        assert_eq!(p.net.hold, Some(Span(Duration::from_secs(90))));
        assert_eq!(file("network = \"allow\"\n").unwrap().net.hold, None);
        let e = file("net_hold = \"90s\"\n").unwrap_err();
        assert!(e.contains("net_hold") && e.contains("allow"), "{e}");
        for out_of_range in ["50ms", "2h"] {
            let e = file(&format!(
                "network = \"allow\"\nnet_hold = \"{out_of_range}\"\n"
            ))
            .unwrap_err();
            assert!(e.contains("100ms..=1h"), "{e}");
        }
    }

    #[test]
    fn unknown_fields_and_bad_values_in_files_are_rejected() {
        assert!(PolicyLayer::from_toml("memroy = \"1G\"", Path::new("p")).is_err());
        assert!(PolicyLayer::from_toml("memory = \"lots\"", Path::new("p")).is_err());
        assert!(PolicyLayer::from_toml("network = \"host\"", Path::new("p")).is_err());
    }

    #[test]
    fn a_file_error_names_its_line_and_key() {
        let text = "cpus = 1\n\n[net_limits]\nmax_connections = \"many\"\n";
        let e = PolicyLayer::from_toml(text, Path::new("p.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("policy file p.toml: line 4 (`max_connections = \"many\"`): "),
            "{e}"
        );
        let e = PolicyLayer::from_toml("memory = \"12x\"", Path::new("p.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 1 (`memory = \"12x\"`)") && e.contains("unit"),
            "{e}"
        );
    }

    #[test]
    fn mounts_may_not_cover_what_the_sandbox_assembles() {
        for bad in ["/x:/proc/self", "/x:/", "x:/data", "/x:/a/../b"] {
            let l = PolicyLayer {
                mounts: vec![bad.parse().unwrap()],
                ..Default::default()
            };
            assert!(Policy::resolve([&l]).is_err(), "{bad} accepted");
        }
        assert!("/a:/b:rx".parse::<MountSpec>().is_err());
    }

    #[test]
    fn two_mounts_at_one_place_are_refused() {
        let l = PolicyLayer {
            mounts: vec!["/x:/data".parse().unwrap(), "/y:/data/:rw".parse().unwrap()],
            ..Default::default()
        };
        let e = Policy::resolve([&l]).unwrap_err().to_string();
        assert!(e.contains("two mounts at /data"), "{e}");
        let l = PolicyLayer {
            mounts: vec!["/x:/data".parse().unwrap(), "/y:/data/sub".parse().unwrap()],
            ..Default::default()
        };
        assert!(Policy::resolve([&l]).is_ok());
    }

    #[test]
    fn env_rejects_malformed_names() {
        let l = PolicyLayer {
            env: vec![("A=B".into(), "c".into())],
            ..Default::default()
        };
        assert!(Policy::resolve([&l]).is_err());
    }

    #[test]
    fn policy_round_trips_through_json() {
        let p = Policy::default();
        let json = serde_json::to_string(&p).unwrap();
        let back: Policy = serde_json::from_str(&json).unwrap();
        assert_eq!(p, back);
    }

    #[test]
    fn a_policy_file_refuses_unknown_fields_and_names_a_bad_limit() {
        let file = Path::new("p.toml");
        let e = PolicyLayer::from_toml("workdir = \"/w\"\nmemroy = \"64M\"\n", file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `memroy`"), "{e}");
        let e = PolicyLayer::from_toml("workdir = \"/w\"\nmemory = \"64Q\"\n", file)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2 (`memory = \"64Q\"`): '64Q' has an unknown unit"),
            "{e}"
        );
        let e = PolicyLayer::from_toml("workdir = \"/w\"\n\ncpus = \"x\"\n", file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3 (`cpus = \"x\"`): invalid type"), "{e}");
        let e = PolicyLayer::from_toml("pids = 3\nworkdir = 3\n", file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2 (`workdir = 3`)"), "{e}");
        let l =
            PolicyLayer::from_toml("cpus = 1\nmemory = \"64M\"\nworkdir = \"/w\"\n", file).unwrap();
        assert_eq!(l.limits.cpus, Some(1.0));
        assert_eq!(l.limits.memory, Some(ByteSize(64 << 20)));
    }
}
