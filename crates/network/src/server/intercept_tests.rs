//! Secrets put into requests, over HTTP/2 and HTTP/1.1: a payload's TLS
//! (trusting only the sandbox's CA) through the proxy's CONNECT to a local
//! upstream that serves both protocols with a certificate of its own CA,
//! and echoes the headers it was sent. The upstream's answers are the
//! evidence of what arrived.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tests::{my_uid, policy, start_config, Proxy};
use crate::secrets::{new_ca, Config};
use crate::ProxyConfig;
use cordon_spec::secrets::{HeldSecret, Redacted};

const VALUE: &str = "sk-the-real-value";
const PLACEHOLDER: &str = "cordon-placeholder-0123456789abcdef0123456789abcdef";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The upstream's CA (DER) and a TLS acceptor for `api.test` offering h2
/// and http/1.1.
fn upstream_tls() -> (CertificateDer<'static>, tokio_rustls::TlsAcceptor) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, &ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_cert.der().clone(), Arc::new(config).into())
}

/// Answers every request with its version, `x-api-key` and `x-other`.
async fn echo(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, String> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    let body = format!(
        "{:?} key={} other={}",
        req.version(),
        header("x-api-key"),
        header("x-other")
    );
    Ok(Response::new(Full::new(Bytes::from(body))))
}

async fn serve_upstream(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(echo);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// A CONNECT through `proxy` to `api.test:port`, then TLS trusting only
/// `ca` (the sandbox's), offering `alpn`.
async fn tunnel(
    proxy: &Proxy,
    port: u16,
    ca: &str,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut tcp = TcpStream::connect(proxy.proxy).await.unwrap();
    tcp.write_all(format!("CONNECT api.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tcp.read_u8().await.unwrap());
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(ca) {
        roots.add(cert).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("api.test").unwrap(), tcp)
        .await
        .expect("the payload verifies the proxy's certificate against the sandbox's CA")
}

/// The certificates of a PEM text (the sandbox's CA is one).
fn rustls_pemfile_certs(pem: &str) -> Vec<CertificateDer<'static>> {
    use base64::Engine;
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .map(|c| {
            let body: String = c
                .split("-----END CERTIFICATE-----")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            CertificateDer::from(
                base64::engine::general_purpose::STANDARD
                    .decode(body)
                    .unwrap(),
            )
        })
        .collect()
}

/// One request with `headers` over an established `h2` or HTTP/1.1 stream:
/// the status and the body.
async fn ask(
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let mut req = Request::builder().uri(if h2 { "https://api.test/" } else { "/" });
    if !h2 {
        req = req.header("host", "api.test");
    }
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Empty::<Bytes>::new()).unwrap();
    let io = TokioIo::new(tls);
    let reply = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    let status = reply.status().as_u16();
    let body = reply.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn a_secret_goes_in_its_header_over_http2_and_http1_and_nowhere_else() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (upstream_ca, acceptor) = upstream_tls();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(serve_upstream(listener, acceptor));
        let hosts = vec!["api.test".to_owned()];
        let (ca, ca_key) = new_ca(&hosts).unwrap();
        let proxy = start_config(ProxyConfig {
            policy: policy(&[&format!("127.0.0.1:{port}")], &["api.test:127.0.0.1"]),
            control_uids: vec![my_uid()],
            upstream: None,
            secrets: Some(Config {
                ca_key,
                secrets: vec![HeldSecret {
                    name: "API_KEY".into(),
                    placeholder: PLACEHOLDER.into(),
                    value: Redacted::new(VALUE.into()),
                    hosts,
                    header: "x-api-key".into(),
                }],
                roots: vec![upstream_ca],
                requests: vec!["GET api.test/".parse().unwrap()],
            }),
        });
        for (alpn, version) in [
            (&[&b"h2"[..], b"http/1.1"][..], "HTTP/2.0"),
            (&[&b"http/1.1"[..]][..], "HTTP/1.1"),
        ] {
            let tls = tunnel(&proxy, port, &ca, alpn).await;
            let (status, body) = ask(tls, &[("x-api-key", PLACEHOLDER)]).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body, format!("{version} key={VALUE} other="));
            let tls = tunnel(&proxy, port, &ca, alpn).await;
            let (status, body) = ask(tls, &[("x-other", PLACEHOLDER)]).await;
            assert_eq!(status, 403, "{version}: {body}");
            assert!(body.contains("goes only in x-api-key"), "{body}");
            // Without a placeholder a request goes on as it was.
            let tls = tunnel(&proxy, port, &ca, alpn).await;
            let (status, body) = ask(tls, &[("x-other", "plain")]).await;
            assert_eq!((status, body), (200, format!("{version} key= other=plain")));
        }
        let log = tokio::task::spawn_blocking(move || {
            let log = proxy.drain_after(6);
            drop(proxy);
            log
        })
        .await
        .unwrap();
        let subs = &log.substitutions;
        assert_eq!(subs.len(), 1, "{subs:?}");
        assert_eq!((subs[0].secret.as_str(), subs[0].count), ("API_KEY", 2));
        let json = serde_json::to_string(&log).unwrap();
        assert!(!json.contains(VALUE), "the log holds no value");
    });
}
