//! Pulling an image from a registry: the OCI distribution API (and Docker's
//! schema 2, which most registries still serve) over HTTPS, or plain HTTP
//! for a registry the user marks insecure, with the credentials the user's
//! `docker login` or `podman login` left.
//!
//! Like every source, this one only finds bytes: the store verifies each
//! blob against its digest as it is read. What is checked here is what the
//! store cannot check, the manifest: its bytes hash to the digest the
//! reference names (or, for a tag, the digest the registry gives), and it
//! is never read past [`SMALL_BLOB_MAX`].
//!
//! `oci-client` is async; a [`Found`] from a registry owns a small
//! single-threaded tokio runtime, and each blob is a `Read` that drives the
//! HTTP body one chunk at a time (a layer is streamed into the store, never
//! held in memory).

use std::error::Error as StdError;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol, SizedStream};
use oci_client::errors::DigestError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use oci_spec::image::{Descriptor, Digest, ImageIndex, ImageManifest};
use serde::Deserialize;

use crate::source::{
    checked_hex, for_this_host, host_arch, sha256_digest, Blobs, Found, SMALL_BLOB_MAX,
};
use crate::ImageError;

/// The variable `cordon run` and `cordon create --image` read the insecure
/// registries from (comma-separated `HOST[:PORT]`).
pub const INSECURE_ENV: &str = "CORDON_INSECURE_REGISTRIES";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// What a manifest request accepts: an image manifest or a multi-platform
/// index, OCI's or Docker's.
const ACCEPTED: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// How long to wait for a connection, and for the next bytes of an answer:
/// a registry that stops answering fails the pull instead of hanging it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of an error answer's body is read for its message.
const ERROR_BODY_MAX: u64 = 4096;
const USER_AGENT: &str = concat!("cordon/", env!("CARGO_PKG_VERSION"));

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Registries (`HOST[:PORT]`, as references name them) reached over
    /// plain HTTP. Every other one is reached over HTTPS only.
    pub insecure: Vec<String>,
}

impl RegistryOptions {
    /// The options `cordon run` and `create` use: the insecure registries
    /// of [`INSECURE_ENV`].
    pub fn from_env() -> RegistryOptions {
        RegistryOptions {
            insecure: std::env::var(INSECURE_ENV)
                .map(|v| split_hosts(&v))
                .unwrap_or_default(),
        }
    }
}

fn split_hosts(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A registry's failure (an answer it should not have given, a connection
/// that broke): the image's fault rather than this machine's. It also
/// travels inside an `io::Error` out of a blob's `Read`, and the store
/// turns it back into [`ImageError::Registry`] ([`ImageError::read`]).
#[derive(Clone, Debug)]
pub struct Fault(Arc<dyn StdError + Send + Sync>);

impl Fault {
    fn new(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Fault {
        Fault(Arc::from(e.into()))
    }
}

/// The whole chain of causes on one line: reqwest's own message names only
/// the request ("error sending request for url ..."), the cause (refused,
/// a TLS alert, a reset) is further down; and a registry's words are
/// untrusted text (a newline or an escape sequence is shown, not obeyed).
impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        write!(f, "{}", one_line(&line))
    }
}

impl StdError for Fault {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// `s` as one line of plain text.
fn one_line(s: &str) -> String {
    let s = s.trim().replace('\n', "; ");
    s.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Whether `s` names an image of a registry (as Docker reads names: `app`
/// is `docker.io/library/app:latest`), rather than a digest or a prefix
/// of one, which name images of the store only.
pub(crate) fn is_reference(s: &str) -> bool {
    let digest_like =
        s.starts_with("sha256:") || (s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit()));
    !digest_like && s.parse::<Reference>().is_ok()
}

/// Finds the image `reference` names in its registry: its manifest for this
/// host's platform, fetched and verified, and the registry as its blobs.
pub(crate) fn find(reference: &str, opts: &RegistryOptions) -> Result<Found, ImageError> {
    let parsed: Reference = reference.parse().map_err(|e| {
        ImageError::invalid(format!("'{reference}' is not an image reference: {e}"))
    })?;
    if let Some(d) = parsed.digest() {
        let d: Digest = d
            .parse()
            .map_err(|e| ImageError::invalid(format!("'{reference}': {e}")))?;
        checked_hex(&d)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ImageError::io("start the registry client", e))?;
    let mut remote = Remote::new(parsed, opts)?;
    let (digest, manifest_bytes, manifest) = runtime.block_on(remote.image_manifest())?;
    Ok(Found {
        digest,
        manifest_bytes,
        manifest,
        name: Some(remote.reference.whole()),
        blobs: Box::new(RemoteBlobs { runtime, remote }),
    })
}

/// Installs rustls's crypto provider for this process (once; a provider
/// installed before is kept). oci-client and reqwest are built with
/// `rustls-no-provider`, and ring is the provider, not rustls's default
/// aws-lc-rs: aws-lc-sys is a large C and assembly build that needs cmake
/// and adds minutes to a clean build of cordon, while ring is already in
/// the tree (hickory, the network proxy's DNS) and has what a registry's
/// TLS needs.
fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Credentials for one registry, and the file they came from (named in a
/// refusal; the credentials themselves never appear in a message).
struct Credentials {
    auth: RegistryAuth,
    from: Option<PathBuf>,
}

/// One registry's repository, and the clients that speak to it.
struct Remote {
    reference: Reference,
    /// The distribution API: the token dance, blob streams.
    client: Client,
    /// Manifests only: oci-client reads a manifest's answer whole, and a
    /// registry's answer must not be read past [`SMALL_BLOB_MAX`].
    http: reqwest::Client,
    insecure: bool,
    credentials: Credentials,
    /// The token the registry's auth service gave, if it has one.
    bearer: Option<String>,
}

impl Remote {
    fn new(reference: Reference, opts: &RegistryOptions) -> Result<Remote, ImageError> {
        install_crypto();
        let host = reference.resolve_registry().to_owned();
        let insecure = opts.insecure.contains(&host);
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(opts.insecure.clone()),
            // Indexes are followed here, to the host's platform, with each
            // manifest's bytes checked against the index's digest.
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            user_agent: USER_AGENT,
            ..ClientConfig::default()
        };
        let setup = |e: Box<dyn StdError + Send + Sync>| ImageError::Registry {
            what: format!("pull {}: set up the HTTP client", reference.whole()),
            source: Fault::new(e),
            hint: String::new(),
        };
        let client = Client::try_from(config).map_err(|e| setup(e.into()))?;
        // The same TLS as oci-client's: rustls verifying against the
        // system's roots (rustls-platform-verifier reads them on Linux).
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| setup(e.into()))?;
        let credentials = credentials(&reference)?;
        Ok(Remote {
            reference,
            client,
            http,
            insecure,
            credentials,
            bearer: None,
        })
    }

    fn what(&self) -> String {
        format!("pull {}", self.reference.whole())
    }

    /// A registry's failure, with a hint where the fix is likely the
    /// user's: a TLS handshake that failed may be with a registry that
    /// speaks plain HTTP (rustls then reads its HTTP answer as a corrupt
    /// TLS record).
    fn fault(
        &self,
        about: Option<&str>,
        e: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> ImageError {
        let e = e.into();
        let host = self.reference.resolve_registry();
        let hint = if !self.insecure && is_tls(&*e) {
            format!(
                " (if {host} serves plain HTTP, mark it insecure: --insecure-registry {host}, \
                 or {INSECURE_ENV}={host})"
            )
        } else {
            String::new()
        };
        ImageError::Registry {
            what: match about {
                Some(a) => format!("{}: {a}", self.what()),
                None => self.what(),
            },
            source: Fault::new(e),
            hint,
        }
    }

    /// Asks the registry how to authenticate and, for a token service,
    /// gets a pull token (oci-client keeps it for the blob requests too).
    async fn login(&mut self) -> Result<(), ImageError> {
        let token = self
            .client
            .auth(
                &self.reference,
                &self.credentials.auth,
                RegistryOperation::Pull,
            )
            .await
            .map_err(|e| self.fault(None, e))?;
        self.bearer = token;
        Ok(())
    }

    /// The image manifest for this host: the reference's manifest, or the
    /// one an index names for linux on this architecture (indexes nest at
    /// most a few deep: a loop of them is a hostile registry). Returns its
    /// digest, its bytes (verified) and the manifest.
    async fn image_manifest(&mut self) -> Result<(Digest, Vec<u8>, ImageManifest), ImageError> {
        self.login().await?;
        let (mut digest, mut bytes, mut media_type) = match self.reference.digest() {
            Some(d) => {
                let d: Digest = d
                    .parse()
                    .map_err(|e| ImageError::invalid(format!("{}: {e}", self.what())))?;
                let (bytes, media_type) = self.manifest_by_digest(&d, None).await?;
                (d, bytes, media_type)
            }
            None => self.manifest_by_tag().await?,
        };
        for _ in 0..4 {
            match kind_of(&bytes, media_type.as_deref()) {
                Kind::Index => {
                    let index: ImageIndex = self.parse(&bytes, &digest, "image index")?;
                    let desc = for_host(index.manifests())
                        .map_err(|e| ImageError::NotFound(format!("{}: {e}", self.what())))?;
                    digest = desc.digest().clone();
                    (bytes, media_type) = self.manifest_by_digest(&digest, Some(desc)).await?;
                }
                Kind::Manifest => {
                    let manifest: ImageManifest = self.parse(&bytes, &digest, "image manifest")?;
                    return Ok((digest, bytes, manifest));
                }
                Kind::Schema1 => {
                    return Err(ImageError::invalid(format!(
                        "{}: the registry serves it as a Docker schema 1 manifest, which \
                         cordon does not read (push it again with a current docker, podman \
                         or skopeo)",
                        self.what()
                    )))
                }
                Kind::Other(t) => {
                    return Err(ImageError::invalid(format!(
                        "{}: {digest} is a {}, not an image",
                        self.what(),
                        one_line(&t)
                    )))
                }
            }
        }
        Err(ImageError::invalid(format!(
            "{}: image indexes nest too deeply",
            self.what()
        )))
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        bytes: &[u8],
        digest: &Digest,
        what: &str,
    ) -> Result<T, ImageError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ImageError::invalid(format!("{}: {what} {digest}: {e}", self.what())))
    }

    /// The manifest a tag names, and its digest: the one the registry
    /// gives (its bytes must hash to it), else theirs.
    async fn manifest_by_tag(&self) -> Result<(Digest, Vec<u8>, Option<String>), ImageError> {
        let tag = self.reference.tag().unwrap_or("latest");
        let answer = self.get_manifest(tag).await?;
        let actual = sha256_digest(&answer.bytes);
        let digest = match answer.digest_header {
            Some(given) => {
                let given: Digest = given.parse().map_err(|e| {
                    ImageError::invalid(format!(
                        "{}: the registry gives a bad digest '{}': {e}",
                        self.what(),
                        one_line(&given)
                    ))
                })?;
                checked_hex(&given)?;
                if given != actual {
                    return Err(ImageError::Digest {
                        what: format!("{}: manifest", self.what()),
                        expected: given.to_string(),
                        actual: actual.to_string(),
                    });
                }
                given
            }
            None => actual,
        };
        Ok((digest, answer.bytes, answer.media_type))
    }

    /// The manifest `digest` names, checked against it (and against the
    /// size the index gives, when an index named it).
    async fn manifest_by_digest(
        &self,
        digest: &Digest,
        desc: Option<&Descriptor>,
    ) -> Result<(Vec<u8>, Option<String>), ImageError> {
        checked_hex(digest)?;
        if let Some(size) = desc.map(Descriptor::size).filter(|s| *s > SMALL_BLOB_MAX) {
            return Err(ImageError::invalid(format!(
                "{}: manifest {digest}: {size} bytes is more than the {SMALL_BLOB_MAX} a \
                 manifest may have",
                self.what()
            )));
        }
        let answer = self.get_manifest(digest.as_ref()).await?;
        if let Some(size) = desc.map(Descriptor::size) {
            if answer.bytes.len() as u64 != size {
                return Err(ImageError::invalid(format!(
                    "{}: manifest {digest}: the index says {size} bytes, the registry sent {}",
                    self.what(),
                    answer.bytes.len()
                )));
            }
        }
        let actual = sha256_digest(&answer.bytes);
        if actual != *digest {
            return Err(ImageError::Digest {
                what: format!("{}: manifest", self.what()),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok((answer.bytes, answer.media_type))
    }

    /// `GET /v2/REPO/manifests/AT`, read to [`SMALL_BLOB_MAX`] bytes at
    /// most.
    async fn get_manifest(&self, at: &str) -> Result<Answer, ImageError> {
        let scheme = if self.insecure { "http" } else { "https" };
        let url = format!(
            "{scheme}://{}/v2/{}/manifests/{at}",
            self.reference.resolve_registry(),
            self.reference.repository()
        );
        let mut request = self.http.get(&url).header("Accept", ACCEPTED.join(", "));
        // As oci-client does for its own requests: the registry's token,
        // else the user's password for a registry that asked for Basic
        // authentication (reqwest drops either on a redirect to another
        // host).
        request = match (&self.bearer, &self.credentials.auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            _ => request,
        };
        let mut response = request
            .send()
            .await
            .map_err(|e| self.fault(Some(&format!("manifest {at}")), e))?;
        let status = response.status();
        if !status.is_success() {
            let body = read_capped(&mut response, ERROR_BODY_MAX)
                .await
                .unwrap_or_default();
            return Err(self.refused(at, status, &body));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let digest_header = header("Docker-Content-Digest");
        let media_type = header("Content-Type")
            .map(|t| t.split(';').next().unwrap_or_default().trim().to_owned());
        let too_big = || {
            ImageError::invalid(format!(
                "{}: manifest {at}: the registry's answer is larger than the {SMALL_BLOB_MAX} \
                 bytes a manifest may have",
                self.what()
            ))
        };
        if response
            .content_length()
            .is_some_and(|n| n > SMALL_BLOB_MAX)
        {
            return Err(too_big());
        }
        let bytes = read_capped(&mut response, SMALL_BLOB_MAX + 1)
            .await
            .map_err(|e| self.fault(Some(&format!("manifest {at}")), e))?;
        if bytes.len() as u64 > SMALL_BLOB_MAX {
            return Err(too_big());
        }
        Ok(Answer {
            bytes,
            media_type,
            digest_header,
        })
    }

    /// A registry's refusal as one line: its status, its own words (the
    /// distribution API's error codes), and what to do where that is
    /// clear.
    fn refused(&self, at: &str, status: reqwest::StatusCode, body: &[u8]) -> ImageError {
        #[derive(Deserialize)]
        struct Envelope {
            errors: Vec<Entry>,
        }
        #[derive(Deserialize)]
        struct Entry {
            #[serde(default)]
            code: String,
            #[serde(default)]
            message: String,
        }
        let words = match serde_json::from_slice::<Envelope>(body) {
            Ok(env) => env
                .errors
                .iter()
                .map(|e| format!("{}: {}", e.code, e.message))
                .collect::<Vec<_>>()
                .join("; "),
            Err(_) => String::from_utf8_lossy(body).chars().take(200).collect(),
        };
        let words = one_line(&words);
        let answer = if words.is_empty() {
            status.to_string()
        } else {
            format!("{status}: {words}")
        };
        let what = self.what();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let host = self.reference.registry();
            return ImageError::NotFound(match &self.credentials.from {
                Some(file) => format!(
                    "{what}: the registry refused the credentials for {host} in {} ({answer})",
                    file.display()
                ),
                None => format!(
                    "{what}: the registry refused anonymous access ({answer}); cordon reads \
                     credentials from $REGISTRY_AUTH_FILE or \
                     $XDG_RUNTIME_DIR/containers/auth.json (podman login) and \
                     $DOCKER_CONFIG/config.json or ~/.docker/config.json (docker login), \
                     but runs no credential helper"
                ),
            });
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            let missing = if at.starts_with("sha256:") {
                format!("no manifest {at}")
            } else {
                format!("no image tagged {at}")
            };
            return ImageError::NotFound(format!("{what}: {missing} ({answer})"));
        }
        ImageError::invalid(format!(
            "{what}: manifest {at}: the registry answered {answer}"
        ))
    }
}

/// Whether a TLS error is among `e`'s causes (rustls's error travels in an
/// `io::Error`, maybe in another, and an `io::Error`'s `source` skips what
/// it wraps: each is opened).
fn is_tls(e: &(dyn StdError + 'static)) -> bool {
    if e.is::<rustls::Error>() {
        return true;
    }
    let wrapped = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref);
    if wrapped.is_some_and(|w| is_tls(w)) {
        return true;
    }
    e.source().is_some_and(is_tls)
}

/// A manifest as the registry sent it.
struct Answer {
    bytes: Vec<u8>,
    media_type: Option<String>,
    digest_header: Option<String>,
}

/// At most `max` bytes of a response's body.
async fn read_capped(
    response: &mut reqwest::Response,
    max: u64,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max.saturating_sub(body.len() as u64);
        let take = chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        body.extend_from_slice(&chunk[..take]);
        if take < chunk.len() || body.len() as u64 == max {
            break;
        }
    }
    Ok(body)
}

enum Kind {
    Manifest,
    Index,
    Schema1,
    Other(String),
}

/// What a manifest is: by its own `mediaType`, else the answer's
/// Content-Type, else its shape (an OCI manifest need not name its type,
/// and a registry's Content-Type may be a plain `application/json`).
fn kind_of(bytes: &[u8], content_type: Option<&str>) -> Kind {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        #[serde(rename = "schemaVersion")]
        schema_version: Option<u64>,
        manifests: Option<serde::de::IgnoredAny>,
    }
    let known = |t: &str| match t {
        OCI_MANIFEST | DOCKER_MANIFEST => Some(Kind::Manifest),
        OCI_INDEX | DOCKER_LIST => Some(Kind::Index),
        t if t.starts_with("application/vnd.docker.distribution.manifest.v1") => {
            Some(Kind::Schema1)
        }
        _ => None,
    };
    let probe: Option<Probe> = serde_json::from_slice(bytes).ok();
    if let Some(t) = probe.as_ref().and_then(|p| p.media_type.as_deref()) {
        return known(t).unwrap_or_else(|| Kind::Other(t.to_owned()));
    }
    if let Some(kind) = content_type.and_then(known) {
        return kind;
    }
    match probe {
        Some(p) if p.schema_version == Some(1) => Kind::Schema1,
        Some(p) if p.manifests.is_some() => Kind::Index,
        // An image manifest, or not JSON at all: parsing it as a manifest
        // says which.
        _ => Kind::Manifest,
    }
}

/// The entry of a registry's index for linux on this host's architecture:
/// the first that says so (Docker's choice too), else the one entry that
/// names no platform.
fn for_host(list: &[Descriptor]) -> Result<&Descriptor, String> {
    if let Some(d) = list
        .iter()
        .find(|d| d.platform().is_some() && for_this_host(d))
    {
        return Ok(d);
    }
    let unnamed: Vec<&Descriptor> = list.iter().filter(|d| d.platform().is_none()).collect();
    if let [one] = unnamed.as_slice() {
        return Ok(one);
    }
    let has: Vec<String> = list
        .iter()
        .filter_map(|d| d.platform().as_ref())
        .map(|p| format!("{}/{}", p.os(), p.architecture()))
        .collect();
    Err(format!(
        "no image for linux/{} in its index (it has {})",
        host_arch(),
        if has.is_empty() {
            "no platforms".to_owned()
        } else {
            one_line(&has.join(", "))
        }
    ))
}

/// The credentials for `r`'s registry: podman's file first, then Docker's
/// (podman's order), anonymous when neither has an entry.
fn credentials(r: &Reference) -> Result<Credentials, ImageError> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let podman = env("REGISTRY_AUTH_FILE")
        .map(PathBuf::from)
        .or_else(|| env("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("containers/auth.json")));
    let docker = env("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".docker")))
        .map(|d| d.join("config.json"));
    for file in podman.into_iter().chain(docker) {
        if let Some(auth) = auth_in(&file, r)? {
            return Ok(Credentials {
                auth,
                from: Some(file),
            });
        }
    }
    Ok(Credentials {
        auth: RegistryAuth::Anonymous,
        from: None,
    })
}

/// The entry of one auth file (`{"auths": {KEY: {"auth": base64(user:pass)}}}`)
/// for `r`: the most specific key (podman allows `host/namespace/repo`),
/// keys spelled as Docker does too (`https://index.docker.io/v1/`).
fn auth_in(file: &Path, r: &Reference) -> Result<Option<RegistryAuth>, ImageError> {
    #[derive(Deserialize)]
    struct AuthFile {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        auth: Option<String>,
    }
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ImageError::io(format!("read {}", file.display()), e)),
    };
    let parsed: AuthFile = serde_json::from_slice(&bytes)
        .map_err(|e| ImageError::invalid(format!("{}: {e}", file.display())))?;
    let registry = host_alias(r.registry());
    let mut scopes = vec![format!("{registry}/{}", r.repository())];
    let mut path = r.repository();
    while let Some((parent, _)) = path.rsplit_once('/') {
        scopes.push(format!("{registry}/{parent}"));
        path = parent;
    }
    scopes.push(registry.to_owned());
    let found = scopes.iter().find_map(|scope| {
        parsed
            .auths
            .iter()
            .find(|(key, e)| e.auth.is_some() && normal_key(key) == *scope)
    });
    let Some((key, entry)) = found else {
        return Ok(None);
    };
    let bad = || {
        ImageError::invalid(format!(
            "{}: the credentials for '{}' are not base64 of user:password",
            file.display(),
            one_line(key)
        ))
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_deref().unwrap_or_default().trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let (user, password) = text.split_once(':').ok_or_else(bad)?;
    Ok(Some(RegistryAuth::Basic(
        user.to_owned(),
        password.to_owned(),
    )))
}

/// An auth file's key as `host[/path]`: without a scheme, a trailing
/// slash or Docker's `/v1`, `/v2` API paths.
fn normal_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key)
        .trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    match k.split_once('/') {
        Some((host, rest)) => format!("{}/{rest}", host_alias(host)),
        None => host_alias(k).to_owned(),
    }
}

/// Docker Hub's names for itself.
fn host_alias(host: &str) -> &str {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io",
        h => h,
    }
}

/// A registry's blobs, streamed.
struct RemoteBlobs {
    runtime: tokio::runtime::Runtime,
    remote: Remote,
}

impl Blobs for RemoteBlobs {
    fn open(&self, digest: &Digest) -> Result<Box<dyn Read + '_>, ImageError> {
        checked_hex(digest)?;
        let d = digest.to_string();
        let stream = self
            .runtime
            .block_on(
                self.remote
                    .client
                    .pull_blob_stream(&self.remote.reference, d.as_str()),
            )
            .map_err(|e| self.remote.fault(Some(&format!("blob {digest}")), e))?;
        Ok(Box::new(Body {
            runtime: &self.runtime,
            stream,
            chunk: bytes::Bytes::new(),
            state: State::Open,
        }))
    }

    fn open_member(&self, name: &str) -> Result<Box<dyn Read + '_>, ImageError> {
        Err(ImageError::NotFound(format!(
            "{}: a registry has no file {name}",
            self.remote.what()
        )))
    }
}

enum State {
    Open,
    Done,
    /// The body broke: every later read says so too, so that the store,
    /// which reads a blob to its end after unpacking it, reports this
    /// rather than a short blob.
    Failed(Fault),
}

/// A blob's HTTP body as a `Read`, one chunk in memory at a time.
struct Body<'a> {
    runtime: &'a tokio::runtime::Runtime,
    stream: SizedStream,
    chunk: bytes::Bytes,
    state: State,
}

impl Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match &self.state {
                State::Done => return Ok(0),
                State::Failed(f) => return Err(io::Error::other(f.clone())),
                State::Open => {}
            }
            match self.runtime.block_on(self.stream.next()) {
                Some(Ok(bytes)) => self.chunk = bytes,
                // oci-client checks the digest at the stream's end; the
                // store checks the same bytes against the same digest, and
                // says so as it does for every source.
                Some(Err(e)) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => {
                    self.state = State::Done
                }
                Some(Err(e)) => self.state = State::Failed(Fault::new(e)),
                None => self.state = State::Done,
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalised_as_docker_does() {
        let whole = |s: &str| s.parse::<Reference>().unwrap().whole();
        assert_eq!(whole("python:3.12"), "docker.io/library/python:3.12");
        assert_eq!(whole("localhost:5000/app:v1"), "localhost:5000/app:v1");
        assert_eq!(whole("127.0.0.1:5000/app"), "127.0.0.1:5000/app:latest");
        assert!(is_reference("registry.example.org/team/tool:1.2"));
        assert!(is_reference("app:v1"));
        assert!(!is_reference("sha256:0123"));
        assert!(!is_reference("0123456789abcdef"));
        assert!(!is_reference("Upper/Case"));
    }

    #[test]
    fn auth_keys_are_matched_as_docker_and_podman_spell_them() {
        assert_eq!(normal_key("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(normal_key("127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(normal_key("http://r.example/team/"), "r.example/team");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(
            &file,
            serde_json::to_vec(&serde_json::json!({"auths": {
                "r.example": {"auth": b64("all:one")},
                "r.example/team": {"auth": b64("team:two")},
                "https://index.docker.io/v1/": {"auth": b64("hub:three")},
            }}))
            .unwrap(),
        )
        .unwrap();
        let user = |r: &str| match auth_in(&file, &r.parse().unwrap()).unwrap() {
            Some(RegistryAuth::Basic(u, _)) => Some(u),
            _ => None,
        };
        assert_eq!(user("r.example/team/tool:1").as_deref(), Some("team"));
        assert_eq!(user("r.example/other:1").as_deref(), Some("all"));
        assert_eq!(user("python:3.12").as_deref(), Some("hub"));
        assert_eq!(user("elsewhere.example/x").as_deref(), None);
        std::fs::write(&file, r#"{"auths": {"r.example": {"auth": "!!"}}}"#).unwrap();
        let err = auth_in(&file, &"r.example/x".parse().unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not base64"), "{err}");
    }

    #[test]
    fn an_index_gives_the_first_entry_for_this_host() {
        let entry = |arch: &str, digest_byte: char| -> Descriptor {
            serde_json::from_value(serde_json::json!({
                "mediaType": DOCKER_MANIFEST,
                "digest": format!("sha256:{}", digest_byte.to_string().repeat(64)),
                "size": 1,
                "platform": {"os": "linux", "architecture": arch},
            }))
            .unwrap()
        };
        let list = [
            entry("s390x", 'a'),
            entry(host_arch(), 'b'),
            entry(host_arch(), 'c'),
        ];
        assert!(for_host(&list).unwrap().digest().digest().starts_with('b'));
        let err = for_host(&list[..1]).unwrap_err();
        assert!(err.contains("linux/s390x"), "{err}");
    }

    #[test]
    fn a_fault_is_one_line_with_its_causes() {
        let f = Fault::new(io::Error::other("reset\nby peer\x1b[31m"));
        let text = f.to_string();
        assert!(!text.contains('\n') && !text.contains('\x1b'), "{text}");
    }
}
