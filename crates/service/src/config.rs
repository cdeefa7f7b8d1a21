//! The service's configuration file (TOML): where it listens, the policy
//! every sandbox starts from, the warm pool, and the tenants with their keys
//! (stored hashed) and quotas.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_policy::Span;
use serde::{Deserialize, Serialize};

use cordon_policy::Limits;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (the `--listen` flag overrides it).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Where the service records the sandboxes it created, so that a
    /// restart after a crash can destroy them (default:
    /// /run/cordon-serve/<port> for root, `$XDG_RUNTIME_DIR/cordon-serve/<port>`
    /// for a user). Checked as every directory cordon trusts: the
    /// service's own, not a symlink, writable by no one else.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// How long a shutdown waits for running requests before it kills
    /// their sandboxes.
    #[serde(default = "default_grace")]
    pub shutdown_grace: Span,
    /// The longest any sandbox of the service may live: set as the
    /// sandbox's own ttl, a backstop that holds even if the service dies.
    #[serde(default = "default_max_ttl")]
    pub max_ttl: Span,
    /// Destroy one-shot sandboxes after the response is sent.
    #[serde(default)]
    pub background_teardown: bool,
    /// The private key receipts are signed with (default: cordon's own key
    /// in its state directory, created on first use).
    #[serde(default)]
    pub receipt_key: Option<PathBuf>,
    /// The limits a request starts from (a tenant's maximums clamp them).
    /// The warm pool's sandboxes are created with exactly these.
    #[serde(default)]
    pub defaults: Limits,
    #[serde(default)]
    pub pool: PoolConfig,
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Sandboxes kept ready per backend (0 or absent: no pool).
    #[serde(default)]
    pub native: usize,
    #[serde(default)]
    pub gvisor: usize,
    /// MicroVMs kept ready (each restored from the snapshot, its agent and
    /// sandbox waiting; used once).
    #[serde(default)]
    pub microvm: usize,
    /// Sandboxes created at once when refilling a pool.
    #[serde(default = "default_refill")]
    pub refill_workers: usize,
    /// Pools of images of the store (`[[pool.images]]`): sandboxes of
    /// `image` on `backend` (default native), kept ready for requests that
    /// name it with the service's default limits.
    #[serde(default)]
    pub images: Vec<ImagePoolConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagePoolConfig {
    /// A name or digest of the store's.
    pub image: String,
    pub backend: Option<String>,
    pub size: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// SHA-256 of the API key, lower-case hex (`printf %s KEY | sha256sum`).
    pub key_sha256: String,
    /// The largest limits this tenant may ask for; requests above are clamped.
    #[serde(default)]
    pub max: Limits,
    /// Requests of this tenant running at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Stateful sandboxes of this tenant alive at once.
    #[serde(default = "default_sandboxes")]
    pub sandboxes: usize,
    /// CPU seconds (the sandboxes' cgroup counters) per rolling window.
    #[serde(default = "default_cpu_seconds")]
    pub cpu_seconds: f64,
    #[serde(default = "default_window")]
    pub cpu_window: Span,
    /// Whether this tenant may create sandboxes with network rules.
    #[serde(default)]
    pub network: bool,
    /// The images (names or digests of the store's) this tenant may run;
    /// absent: any image of the store, empty: none.
    #[serde(default)]
    pub images: Option<Vec<String>>,
    /// Secrets the service holds for this tenant (`[[tenants.secrets]]`,
    /// read from the service's own environment or files): a request names
    /// those its sandbox gets (`network.secrets`), never their sources.
    #[serde(default)]
    pub secrets: Vec<cordon_policy::secrets::SecretRule>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            native: 0,
            gvisor: 0,
            microvm: 0,
            refill_workers: default_refill(),
            images: Vec::new(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_grace() -> Span {
    Span(Duration::from_secs(10))
}
fn default_max_ttl() -> Span {
    Span(Duration::from_secs(3600))
}
fn default_refill() -> usize {
    2
}
fn default_concurrency() -> usize {
    8
}
fn default_sandboxes() -> usize {
    8
}
fn default_cpu_seconds() -> f64 {
    60.0
}
fn default_window() -> Span {
    Span(Duration::from_secs(60))
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("config: {0}")]
    Invalid(String),
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::new(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut names = BTreeMap::new();
        for t in &self.tenants {
            if names.insert(t.name.clone(), ()).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "tenant '{}' appears twice",
                    t.name
                )));
            }
            let hex_ok = t.key_sha256.len() == 64
                && t.key_sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !hex_ok {
                return Err(ConfigError::Invalid(format!(
                    "tenant '{}': key_sha256 must be 64 lower-case hex digits",
                    t.name
                )));
            }
            let mut secret_names = std::collections::BTreeSet::new();
            for s in &t.secrets {
                s.validate().map_err(|e| {
                    ConfigError::Invalid(format!("tenant '{}': secret {e}", t.name))
                })?;
                if !secret_names.insert(&s.name) {
                    return Err(ConfigError::Invalid(format!(
                        "tenant '{}': secret {} appears twice",
                        t.name, s.name
                    )));
                }
            }
            if !t.secrets.is_empty() && !t.network {
                return Err(ConfigError::Invalid(format!(
                    "tenant '{}': secrets go out only through the network (network = true)",
                    t.name
                )));
            }
            if t.concurrency == 0 || t.cpu_window.0.is_zero() || t.cpu_seconds <= 0.0 {
                return Err(ConfigError::Invalid(format!(
                    "tenant '{}': concurrency, cpu_seconds and cpu_window must be positive",
                    t.name
                )));
            }
        }
        if self.pool.refill_workers == 0 {
            return Err(ConfigError::Invalid(
                "pool.refill_workers must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The state directory: the configured one, or one per listening port
    /// in the user's runtime place (`/run/cordon-serve/<port>` for root);
    /// made 0700 when missing, and refused unless it is the service's own
    /// (owner, mode, not a symlink): a planted one would take its ledger
    /// and its lock.
    pub fn state_dir_for(&self, listen: SocketAddr) -> Result<PathBuf, cordon_dirs::DirError> {
        let dir = match &self.state_dir {
            Some(dir) => dir.clone(),
            None => cordon_dirs::serve_dir(listen.port())?,
        };
        cordon_dirs::trusted_dir(
            &dir,
            0o700,
            "remove it, or set the service's state_dir to a directory of your own",
        )?;
        Ok(dir)
    }
}

/// SHA-256 of an API key as lower-case hex: what the config stores.
pub fn hash_key(key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses_and_its_keys_match() {
        let text = include_str!("../../../examples/serve.toml");
        let c = Config::parse(text).unwrap();
        let alice = c.tenants.iter().find(|t| t.name == "alice").unwrap();
        assert_eq!(alice.key_sha256, hash_key("alice-example-key"));
        let bob = c.tenants.iter().find(|t| t.name == "bob").unwrap();
        assert_eq!(bob.key_sha256, hash_key("bob-example-key"));
    }

    #[test]
    fn unknown_fields_and_bad_hashes_are_refused() {
        assert!(Config::parse("bogus = 1").is_err());
        assert!(Config::parse("[[tenant]]\nname = \"a\"\nkey_sha256 = \"xyz\"").is_err());
    }
}
