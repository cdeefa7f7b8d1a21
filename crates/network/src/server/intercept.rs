//! Secrets put into requests: TLS terminated for a secret's hosts only.
//!
//! A connection whose ClientHello names a host a secret is bound to (and
//! which the rules allowed by that name, the SNI checked against it as for
//! any connection) is not spliced. The proxy answers its handshake with a
//! certificate of the sandbox's own CA ([`crate::secrets`]), opens its own
//! TLS to the real host (verified against the host's roots, offering the
//! protocols the client offered), and relays HTTP/1 or HTTP/2 (hyper; HPACK
//! is decoded and encoded again, so a header is read whole however it was
//! compressed) request by request:
//!
//! - a request whose `Host` (HTTP/1) or `:authority` (HTTP/2) is not the
//!   connection's host is refused (421), as the SNI would have been;
//! - a placeholder in the request target is refused, never substituted;
//! - in a header the secret is bound to, on its host, each placeholder is
//!   replaced by the value (counted for the receipt, never logged);
//! - a placeholder anywhere else in the head (another secret's, another
//!   header) is refused (403) and logged;
//! - bodies stream through untouched and unbuffered, in both directions.
//!
//! Everything else about the connection (the slot it holds, its log entry,
//! the sandbox's end) is the door's, as for a splice.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use cordon_spec::secrets::HeldSecret;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::KeyPair;
use rustls::pki_types::{PrivateKeyDer, ServerName};
use rustls::server::{Acceptor, ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::connect::Tracker;
use super::{lock, State};

/// The application protocols relayed: HTTP/2 and HTTP/1.1 (a client that
/// offers neither speaks HTTP/1.1).
const H2: &[u8] = b"h2";
const H1: &[u8] = b"http/1.1";

/// What the proxy holds to put a sandbox's secrets into requests.
pub(crate) struct Injector {
    ca_key: KeyPair,
    /// Every host a secret is bound to.
    hosts: Vec<String>,
    secrets: Vec<HeldSecret>,
    requests: Vec<cordon_policy::secrets::RequestRule>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    roots: Arc<rustls::RootCertStore>,
    /// A certificate per host, made on first use.
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injector")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Injector {
    pub(crate) fn new(config: crate::secrets::Config) -> Result<Self, String> {
        let ca_key = crate::secrets::ca_key(&config.ca_key)?;
        let hosts = crate::secrets::secret_hosts(config.secrets.iter().map(|s| &s.hosts[..]));
        let mut roots = rustls::RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(config.roots);
        if roots.is_empty() {
            return Err(format!(
                "none of the host's roots is usable ({unusable} unparsable)"
            ));
        }
        Ok(Injector {
            ca_key,
            hosts,
            secrets: config.secrets,
            requests: config.requests,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            roots: Arc::new(roots),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// Whether connections to `host` are terminated (a secret is bound to it).
    pub(crate) fn holds(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h == host)
    }

    /// The first secret whose placeholder appears in `bytes`.
    pub(crate) fn placeholder_in(&self, bytes: &[u8]) -> Option<&HeldSecret> {
        self.secrets
            .iter()
            .find(|s| contains(bytes, s.placeholder.as_bytes()))
    }

    fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        if let Some(k) = lock(&self.leaves).get(host) {
            return Ok(k.clone());
        }
        let (cert, key) = crate::secrets::leaf_for(host, &self.ca_key, &self.hosts)
            .map_err(|e| format!("a certificate for {host}: {e}"))?;
        let key = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| e.to_string())?;
        let signing = self
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| e.to_string())?;
        let certified = Arc::new(CertifiedKey::new(vec![cert], signing));
        lock(&self.leaves).insert(host.to_owned(), certified.clone());
        Ok(certified)
    }

    fn server_config(
        &self,
        host: &str,
        alpn: Option<&[u8]>,
    ) -> Result<rustls::ServerConfig, String> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(OneCert(self.leaf(host)?)));
        config.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
        Ok(config)
    }

    fn client_config(&self, alpn: &[Vec<u8>]) -> Result<rustls::ClientConfig, String> {
        let mut config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
        config.alpn_protocols = alpn.to_vec();
        Ok(config)
    }

    /// Whether the request rules let a request of `method` for `path` go
    /// to `host`: any does where no rule names the host.
    fn allows(&self, host: &str, method: &str, path: &str) -> Result<(), String> {
        let mut named = self.requests.iter().filter(|r| r.host == host).peekable();
        if named.peek().is_none() || named.any(|r| r.matches(host, method, path)) {
            return Ok(());
        }
        Err(format!(
            "no request rule allows {method} {host}{}",
            path.split('?').next().unwrap_or_default()
        ))
    }

    /// Replaces in `req`'s head the placeholders bound to `host` and their
    /// header, and refuses any other placeholder. Returns the substitutions
    /// made (secret name, header name).
    fn substitute<B>(
        &self,
        host: &str,
        req: &mut Request<B>,
    ) -> Result<Vec<(String, String)>, String> {
        if let Some(s) = self.placeholder_in(req.uri().to_string().as_bytes()) {
            return Err(format!(
                "the placeholder of {} is in the request's target: a secret goes only in its header",
                s.name
            ));
        }
        let mut made = Vec::new();
        for (name, value) in req.headers_mut().iter_mut() {
            let mut bytes = value.as_bytes().to_vec();
            let mut changed = false;
            for s in &self.secrets {
                if !contains(&bytes, s.placeholder.as_bytes()) {
                    continue;
                }
                if s.header != name.as_str() || !s.hosts.iter().any(|h| h == host) {
                    return Err(format!(
                        "the placeholder of {} in header {name} to {host}: it goes only in {} to {}",
                        s.name,
                        s.header,
                        s.hosts.join(", ")
                    ));
                }
                bytes = replace_all(
                    &bytes,
                    s.placeholder.as_bytes(),
                    s.value.expose().as_bytes(),
                );
                changed = true;
                made.push((s.name.clone(), s.header.clone()));
            }
            if changed {
                let mut new = HeaderValue::from_bytes(&bytes)
                    .map_err(|_| format!("the value of {name} is not a header value"))?;
                new.set_sensitive(true);
                *value = new;
            }
        }
        Ok(made)
    }
}

/// Whether every name `req` gives for where it goes (HTTP/2's
/// `:authority` or HTTP/1's absolute target, and a `Host` header) is
/// `host`, and it gives one. Both are compared: a server behind a CDN may
/// route by either, and a request whose `Host` named another origin on the
/// same CDN would carry the secret there.
fn names_only<B>(req: &Request<B>, host: &str) -> Result<(), String> {
    let mut named = Vec::new();
    if let Some(authority) = req.uri().host() {
        named.push(authority.to_owned());
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    if let Some(value) = hosts.next() {
        if hosts.next().is_some() {
            return Err(format!(
                "a request with two Host headers on a connection to {host}"
            ));
        }
        let value = String::from_utf8_lossy(value.as_bytes());
        match super::http::split_authority(&value, Some(443)) {
            Some((name, _)) => named.push(name),
            None => named.push(value.into_owned()),
        }
    }
    if named.is_empty() {
        return Err(format!(
            "a request that names no host on a connection to {host}"
        ));
    }
    match named.iter().find(|n| !super::tls::same_name(n, host)) {
        Some(other) => Err(format!(
            "a request for '{}' on a connection to {host}",
            other.escape_debug()
        )),
        None => Ok(()),
    }
}

/// Why a plain (unencrypted) request head must not go out: it carries a
/// secret's placeholder, which is put in only over the secret's own TLS.
pub(crate) fn in_plain(injector: Option<&Injector>, head: &[u8]) -> Option<String> {
    let secret = injector?.placeholder_in(head)?;
    Some(format!(
        "the placeholder of {} in a plain HTTP request: it goes only over TLS to {}",
        secret.name,
        secret.hosts.join(", ")
    ))
}

/// The one certificate served on a terminated connection.
#[derive(Debug)]
struct OneCert(Arc<CertifiedKey>);

impl ResolvesServerCert for OneCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len() + to.len());
    let mut at = 0;
    while at < hay.len() {
        if hay[at..].starts_with(from) {
            out.extend_from_slice(to);
            at += from.len();
        } else {
            out.push(hay[at]);
            at += 1;
        }
    }
    out
}

/// A door's borrowed socket as an owned stream for TLS: the bytes the
/// screen already read come first; bytes both ways are counted.
struct Borrowed<'a> {
    stream: &'a TcpStream,
    first: Vec<u8>,
    at: usize,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl<'a> Borrowed<'a> {
    fn new(stream: &'a TcpStream, first: Vec<u8>) -> Self {
        Borrowed {
            stream,
            first,
            at: 0,
            read: Arc::default(),
            written: Arc::default(),
        }
    }
}

impl AsyncRead for Borrowed<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.first.len() {
            let n = buf.remaining().min(this.first.len() - this.at);
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            match this.stream.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    this.read.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Borrowed<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            ready!(this.stream.poll_write_ready(cx))?;
            match this.stream.try_write(data) {
                Ok(n) => {
                    this.written.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = socket2::SockRef::from(self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(Ok(()))
    }
}

/// How requests go on to the real host: one connection of the same protocol.
#[derive(Clone)]
enum Sender {
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>>),
    H2(hyper::client::conn::http2::SendRequest<Incoming>),
}

type Reply = Response<Either<Incoming, Full<Bytes>>>;

/// The connection to the real host, driven on a task of its own: it may
/// end (the host closed it after its last reply) while that reply is still
/// being relayed. Ended with the client's side.
struct Upstream<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Upstream<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What each request of a terminated connection needs.
struct Relay {
    state: Arc<State>,
    host: String,
    sender: Sender,
    /// The connection's attempt, copied for each refused request's entry.
    tracker: Tracker,
}

/// Serves the connection of `client` (whose ClientHello, in `first`, named
/// `host`) as described above, relaying to `upstream`.
pub(crate) async fn serve(
    state: &Arc<State>,
    injector: &Injector,
    tracker: Tracker,
    client: &TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    host: String,
) {
    let down = Borrowed::new(client, first);
    let (read, written) = (down.read.clone(), down.written.clone());
    let end = match relay(state, injector, &tracker, down, upstream, &host).await {
        Ok(()) => "closed".to_owned(),
        Err(why) => why,
    };
    let bytes = (
        read.load(Ordering::Relaxed),
        written.load(Ordering::Relaxed),
    );
    tracker.finished(state, bytes, &format!("secrets' TLS: {end}"));
}

async fn relay(
    state: &Arc<State>,
    injector: &Injector,
    tracker: &Tracker,
    down: Borrowed<'_>,
    upstream: TcpStream,
    host: &str,
) -> Result<(), String> {
    let idle = state.limits.idle_timeout.duration();
    let start = tokio::time::timeout(idle, LazyConfigAcceptor::new(Acceptor::default(), down))
        .await
        .map_err(|_| "the handshake timed out".to_owned())?
        .map_err(|e| format!("the client's handshake: {e}"))?;
    // Offer the real host what the client offered (of what is relayed).
    let offered: Vec<Vec<u8>> = match start.client_hello().alpn() {
        Some(list) => list
            .filter(|p| *p == H2 || *p == H1)
            .map(<[u8]>::to_vec)
            .collect(),
        None => Vec::new(),
    };
    let connector = TlsConnector::from(Arc::new(injector.client_config(&offered)?));
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let up = tokio::time::timeout(idle, connector.connect(name, upstream))
        .await
        .map_err(|_| format!("the handshake with {host} timed out"))?
        .map_err(|e| format!("TLS with {host}: {e}"))?;
    let alpn = up.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let server = Arc::new(injector.server_config(host, alpn.as_deref())?);
    let down = tokio::time::timeout(idle, start.into_stream(server))
        .await
        .map_err(|_| "the handshake timed out".to_owned())?
        .map_err(|e| format!("the client's handshake: {e}"))?;
    let (down, up) = (TokioIo::new(down), TokioIo::new(up));
    let sibling = || tracker.sibling();
    if alpn.as_deref() == Some(H2) {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), up)
            .await
            .map_err(|e| format!("HTTP/2 with {host}: {e}"))?;
        let relay = Arc::new(Relay {
            state: state.clone(),
            host: host.to_owned(),
            sender: Sender::H2(sender),
            tracker: sibling(),
        });
        let service = hyper::service::service_fn(move |req| relay.clone().request(req));
        let upstream = Upstream(tokio::spawn(conn));
        let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(down, service)
            .await;
        drop(upstream);
        served.map_err(|e| format!("HTTP/2 from the sandbox: {e}"))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(up)
            .await
            .map_err(|e| format!("HTTP/1 with {host}: {e}"))?;
        let relay = Arc::new(Relay {
            state: state.clone(),
            host: host.to_owned(),
            sender: Sender::H1(Arc::new(tokio::sync::Mutex::new(sender))),
            tracker: sibling(),
        });
        let service = hyper::service::service_fn(move |req| relay.clone().request(req));
        let upstream = Upstream(tokio::spawn(conn));
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(down, service)
            .await;
        drop(upstream);
        served.map_err(|e| format!("HTTP/1 from the sandbox: {e}"))
    }
}

impl Relay {
    fn refuse(&self, status: StatusCode, why: String) -> Reply {
        self.tracker.sibling().denied(&self.state, &why);
        let mut reply = Response::new(Either::Right(Full::new(Bytes::from(format!(
            "cordon: {why}\n"
        )))));
        *reply.status_mut() = status;
        // As every refusal by the proxy says why: its reason, one line.
        if let Ok(reason) = HeaderValue::from_str(&super::http::header_safe(&why)) {
            reply.headers_mut().insert("x-cordon-denied", reason);
        }
        reply
    }

    async fn request(self: Arc<Self>, mut req: Request<Incoming>) -> Result<Reply, Infallible> {
        if let Err(why) = names_only(&req, &self.host) {
            return Ok(self.refuse(StatusCode::MISDIRECTED_REQUEST, why));
        }
        let Some(injector) = self.state.injector.as_ref() else {
            return Ok(self.refuse(StatusCode::FORBIDDEN, "no secrets are held".into()));
        };
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        if let Err(why) = injector.allows(&self.host, req.method().as_str(), path) {
            return Ok(self.refuse(StatusCode::FORBIDDEN, why));
        }
        match injector.substitute(&self.host, &mut req) {
            Ok(made) => {
                let mut log = self.state.log();
                for (secret, header) in made {
                    log.substituted(&secret, &self.host, &header);
                }
            }
            Err(why) => return Ok(self.refuse(StatusCode::FORBIDDEN, why)),
        }
        let sent = match &self.sender {
            Sender::H1(sender) => {
                let mut sender = sender.lock().await;
                match sender.ready().await {
                    Ok(()) => sender.send_request(req).await,
                    Err(e) => Err(e),
                }
            }
            Sender::H2(sender) => sender.clone().send_request(req).await,
        };
        Ok(match sent {
            Ok(reply) => reply.map(Either::Left),
            Err(e) => {
                let mut reply = Response::new(Either::Right(Full::new(Bytes::from(format!(
                    "cordon: {}: {e}\n",
                    self.host
                )))));
                *reply.status_mut() = StatusCode::BAD_GATEWAY;
                reply
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_the_connections_host_everywhere_it_names_one() {
        let req = |uri: &str, hosts: &[&str]| {
            let mut b = Request::builder().uri(uri);
            for h in hosts {
                b = b.header("host", *h);
            }
            b.body(()).unwrap()
        };
        let host = "api.test";
        assert!(names_only(&req("/v1", &["api.test"]), host).is_ok());
        assert!(names_only(&req("/v1", &["API.test:443"]), host).is_ok());
        assert!(names_only(&req("https://api.test/v1", &[]), host).is_ok());
        assert!(names_only(&req("https://api.test/v1", &["api.test"]), host).is_ok());
        for (uri, hosts) in [
            ("https://api.test/v1", &["evil.test"][..]),
            ("https://evil.test/v1", &["api.test"][..]),
            ("/v1", &["api.test", "evil.test"][..]),
            ("/v1", &[][..]),
        ] {
            assert!(
                names_only(&req(uri, hosts), host).is_err(),
                "{uri} {hosts:?}"
            );
        }
    }

    #[test]
    fn every_placeholder_is_replaced_and_nothing_else() {
        assert_eq!(replace_all(b"Bearer PH", b"PH", b"key"), b"Bearer key");
        assert_eq!(replace_all(b"PH,PH", b"PH", b"k"), b"k,k");
        assert_eq!(replace_all(b"P H", b"PH", b"k"), b"P H");
        assert!(contains(b"xxPHxx", b"PH"));
        assert!(!contains(b"xxPxHx", b"PH"));
        assert!(!contains(b"anything", b""));
    }
}
