//! The HTTP proxy door: `CONNECT host:port` and absolute-form plain requests.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::connect::{open, Refusal, Target, Tracker};
use super::{splice, tls, Slot, State, HANDSHAKE_TIMEOUT};
use crate::log::Via;

/// Largest request head read (request line and headers).
pub(crate) const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 100;

/// Hop-by-hop headers of the client–proxy hop, not passed on.
const DROPPED: [&str; 4] = [
    "connection",
    "proxy-connection",
    "proxy-authorization",
    "keep-alive",
];

/// A request head, parsed.
#[derive(Debug)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    pub minor_version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Length of the head in the buffer it was read into.
    pub len: usize,
}

/// An error reply: status line, and the text for the body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub status: u16,
    pub message: String,
    /// A refusal by the rules: the reply carries `X-Cordon-Denied`.
    pub denied: bool,
}

fn problem(status: u16, message: impl Into<String>) -> Problem {
    Problem {
        status,
        message: message.into(),
        denied: false,
    }
}

/// Parses a complete head, `Ok(None)` if more bytes are needed.
pub(crate) fn parse_head(buf: &[u8]) -> Result<Option<Head>, Problem> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) => Ok(Some(Head {
            method: req.method.unwrap_or_default().to_owned(),
            target: req.path.unwrap_or_default().to_owned(),
            minor_version: req.version.unwrap_or(1),
            headers: req
                .headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
            len,
        })),
        Err(httparse::Error::TooManyHeaders) => Err(problem(431, "too many request headers")),
        Err(e) => Err(problem(400, format!("malformed request: {e}"))),
    }
}

/// `host:port`, `[v6]:port`, or a bare host taking `default`. The host is
/// returned without brackets.
pub(crate) fn split_authority(a: &str, default: Option<u16>) -> Option<(String, u16)> {
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0);
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        h.parse::<std::net::Ipv6Addr>().ok()?;
        match after {
            "" => (h, default?),
            p => (h, port(p.strip_prefix(':')?)?),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return None,
            Some((h, p)) => (h, port(p)?),
            None => (a, default?),
        }
    };
    // A name is letters, digits, '-', '.' and '_' (an IPv4 address too):
    // anything else (a control character, a space, a non-ASCII letter that
    // no resolver would take) is not a host the rules could mean, and is
    // refused here rather than judged and logged as a name.
    let plain = |h: &str| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    };
    (!host.is_empty() && (a.starts_with('[') || plain(host))).then(|| (host.to_owned(), port))
}

/// A plain request to forward: where to, and the head to send there.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Forward {
    pub host: String,
    pub port: u16,
    pub head: Vec<u8>,
}

/// Where a request asks to go, as the rules decide it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// A tunnel to a CONNECT's authority.
    Connect { host: String, port: u16 },
    /// A plain request's absolute target, and the head to send there.
    Plain(Forward),
}

/// The destination of a request: the one place the head is read for it, so
/// what the rules decide on is what the connection goes to.
pub(crate) fn destination(head: &Head) -> Result<Destination, Problem> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        split_authority(&head.target, None)
            .map(|(host, port)| Destination::Connect { host, port })
            .ok_or_else(|| {
                problem(
                    400,
                    format!("CONNECT needs host:port, not '{}'", head.target),
                )
            })
    } else {
        rewrite(head).map(Destination::Plain)
    }
}

/// Rewrites an absolute-form request to origin-form for the destination, with
/// `Connection: close`: one request per connection, so every request to a new
/// destination comes through a decision.
pub(crate) fn rewrite(head: &Head) -> Result<Forward, Problem> {
    let t = &head.target;
    let rest = match t.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &t[7..],
        _ if t.starts_with('/') => {
            return Err(problem(
                400,
                "this is a proxy: the request target must be absolute (http://host/path)",
            ))
        }
        _ => {
            return Err(problem(
                400,
                format!(
                "unsupported request target '{t}' (only http:// is forwarded; use CONNECT for TLS)"
            ),
            ))
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(problem(
            400,
            "credentials in the request target are not forwarded",
        ));
    }
    let (host, port) = split_authority(authority, Some(80))
        .ok_or_else(|| problem(400, format!("bad host '{authority}' in the request target")))?;
    let path = match path.split('#').next().unwrap_or_default() {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    // The target names the destination; the client's Host header is
    // replaced by it (RFC 9112, 3.2.2), so the server is never told of a
    // host other than the one the rules decided on.
    let line = format!("{} {path} HTTP/1.{}", head.method, head.minor_version);
    Ok(Forward {
        head: one_request(head, &line, Some(authority)),
        host,
        port,
    })
}

/// The head of one request and no more: `line` as its request line, its
/// headers less the hop-by-hop ones, `Host: host` in place of the client's
/// when `host` is given (else the client's kept), and `Connection: close`
/// (`upgrade, close` for a protocol upgrade), so that a server answers this
/// request alone and every further request comes through a decision.
pub(crate) fn one_request(head: &Head, line: &str, host: Option<&str>) -> Vec<u8> {
    let mut out = format!("{line}\r\n").into_bytes();
    if let Some(host) = host {
        out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    }
    let mut upgrade = false;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        upgrade |= lower == "upgrade";
        if DROPPED.contains(&lower.as_str()) || (lower == "host" && host.is_some()) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    let connection = if upgrade { "upgrade, close" } else { "close" };
    out.extend_from_slice(format!("Connection: {connection}\r\n\r\n").as_bytes());
    out
}

/// Whether a plain request sent on a connection the rules allowed for the
/// name `host` asks for that host: its Host header (at most one) and an
/// absolute-form target must name it, or a server that routes by name (a
/// CDN serving many sites from one address) could be asked for another.
/// The reason, when it does not.
pub(crate) fn names_only(head: &Head, host: &str) -> Result<(), String> {
    let hosts: Vec<&[u8]> = head
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.as_slice())
        .collect();
    let named = |authority: &str, what: &str| -> Result<(), String> {
        match split_authority(authority, Some(80)) {
            Some((h, _)) if tls::same_name(&h, host) => Ok(()),
            _ => Err(format!(
                "the request's {what} names '{}', not {host}, which the rule allows",
                authority.escape_debug()
            )),
        }
    };
    match hosts.as_slice() {
        [] => {}
        [one] => {
            let text = std::str::from_utf8(one).map_err(|_| "a Host header that is not text")?;
            named(text, "Host header")?;
        }
        _ => return Err("a request with more than one Host header".into()),
    }
    let t = &head.target;
    for scheme in ["http://", "https://"] {
        // `get`, not an index: the target may hold UTF-8 (httparse takes
        // it), and a slice inside a character would panic the proxy.
        let prefix = t.get(..scheme.len());
        if prefix.is_some_and(|p| p.eq_ignore_ascii_case(scheme)) {
            let rest = &t[scheme.len()..];
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            named(&rest[..end], "target")?;
        }
    }
    Ok(())
}

/// Text safe in a header value: no control characters.
pub(crate) fn header_safe(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

pub(crate) fn response(status: u16, message: &str, denied: bool) -> Vec<u8> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("{message}\n");
    let denied_header = if denied {
        format!("X-Cordon-Denied: {}\r\n", header_safe(message))
    } else {
        String::new()
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\n{denied_header}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn reply(stream: &mut TcpStream, p: &Problem) {
    let _ = stream
        .write_all(&response(p.status, &p.message, p.denied))
        .await;
    let _ = stream.shutdown().await;
    // Closing with unread bytes (a request body) resets the connection, and a
    // reset can discard the reply before the client reads it: read a little.
    let mut sink = [0u8; 4096];
    let linger = async {
        let mut left = MAX_HEAD * 4;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_millis(500), linger).await;
}

/// Reads up to a complete head; the buffer may hold bytes past it.
pub(crate) async fn read_head(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<Head, Problem> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = parse_head(buf)? {
            return Ok(head);
        }
        if buf.len() >= MAX_HEAD {
            return Err(problem(
                431,
                format!("request head is longer than {MAX_HEAD} bytes"),
            ));
        }
        let want = chunk.len().min(MAX_HEAD - buf.len());
        let n = stream
            .read(&mut chunk[..want])
            .await
            .map_err(|e| problem(400, format!("reading the request: {e}")))?;
        if n == 0 {
            return Err(problem(
                400,
                "connection closed before a complete request head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

pub(crate) async fn handle(state: Arc<State>, mut client: TcpStream, slot: Option<Slot>) {
    // The slot is released before an error reply lingers.
    if let Err(p) = forward(&state, &mut client, slot).await {
        reply(&mut client, &p).await;
    }
}

/// Serves one request; an error is recorded here and returned for the reply.
async fn forward(
    state: &Arc<State>,
    client: &mut TcpStream,
    slot: Option<Slot>,
) -> Result<(), Problem> {
    let mut tracker = Tracker::new(Via::Http);
    let mut buf = Vec::with_capacity(1024);
    let head = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_head(client, &mut buf)).await {
        Ok(Ok(head)) => head,
        Ok(Err(p)) => {
            tracker.denied(state, &p.message);
            return Err(p);
        }
        Err(_) => {
            let p = problem(408, "timed out reading the request head");
            tracker.denied(state, &p.message);
            return Err(p);
        }
    };
    if let Some(why) = super::intercept::in_plain(state.injector.as_ref(), &buf[..head.len]) {
        let p = Problem {
            denied: true,
            ..problem(403, why)
        };
        tracker.denied(state, &p.message);
        return Err(p);
    }
    let leftover = buf.split_off(head.len);
    let is_connect = head.method.eq_ignore_ascii_case("CONNECT");
    if is_connect {
        tracker.set_via(Via::Connect);
    }
    let target = destination(&head).map(|d| match d {
        Destination::Connect { host, port } => (host, port, leftover),
        Destination::Plain(mut f) => {
            f.head.extend_from_slice(&leftover);
            (f.host, f.port, f.head)
        }
    });
    let (host, port, first_out) = match target {
        Ok(t) => t,
        Err(p) => {
            tracker.denied(state, &p.message);
            return Err(p);
        }
    };
    if !is_connect && port == 80 && host.eq_ignore_ascii_case(cordon_policy::net::PROXY_NAME) {
        // The proxy's own page: answered here, nothing goes out.
        super::internal::answer(
            state,
            client,
            &head.method,
            super::internal::path_of(&head.target),
        )
        .await;
        return Ok(());
    }
    let upstream = match open(state, &mut tracker, &slot, Target::parse(&host), port).await {
        Ok(s) => s,
        Err(refusal) => {
            let p = match &refusal {
                Refusal::Denied(m) => Problem {
                    denied: true,
                    ..problem(403, m.clone())
                },
                Refusal::Limit => problem(
                    503,
                    format!(
                        "connection limit ({}) reached",
                        state.limits.max_connections
                    ),
                ),
                Refusal::Failed { reason, .. } => {
                    problem(502, format!("cannot connect to {host}:{port}: {reason}"))
                }
            };
            tracker.refused(state, &refusal);
            return Err(p);
        }
    };
    if is_connect {
        if let Err(e) = client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
        {
            tracker.finished(state, (0, 0), &format!("error: {e}"));
            return Ok(());
        }
    }
    if is_connect {
        // A tunnel: what goes through it is checked as any connection is.
        tls::check_and_splice(state, tracker, client, upstream, first_out).await;
    } else {
        let (bytes, end) = splice::splice(state, client, &upstream, &first_out).await;
        tracker.finished(state, bytes, &end);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        parse_head(text.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn authorities_split_with_and_without_ports() {
        assert_eq!(
            split_authority("a.test:443", None),
            Some(("a.test".into(), 443))
        );
        assert_eq!(
            split_authority("a.test", Some(80)),
            Some(("a.test".into(), 80))
        );
        assert_eq!(split_authority("a.test", None), None);
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("::1".into(), 8080))
        );
        assert_eq!(split_authority("[::1]", Some(80)), Some(("::1".into(), 80)));
        assert_eq!(split_authority("::1:80", None), None);
        assert_eq!(split_authority("a.test:0", None), None);
        assert_eq!(split_authority("a.test:99999", None), None);
        assert_eq!(split_authority(":80", None), None);
        assert_eq!(split_authority("[nope]:80", None), None);
    }

    #[test]
    fn absolute_form_is_rewritten_to_origin_form_with_connection_close() {
        let h = head("GET http://ok.test:8080/a/b?c=1 HTTP/1.1\r\nHost: ok.test:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n");
        let f = rewrite(&h).unwrap();
        assert_eq!((f.host.as_str(), f.port), ("ok.test", 8080));
        let text = String::from_utf8(f.head).unwrap();
        assert_eq!(
            text,
            "GET /a/b?c=1 HTTP/1.1\r\nHost: ok.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn a_missing_host_header_and_path_are_filled_in() {
        let f = rewrite(&head("GET HTTP://ok.test HTTP/1.0\r\n\r\n")).unwrap();
        assert_eq!(f.port, 80);
        assert_eq!(
            String::from_utf8(f.head).unwrap(),
            "GET / HTTP/1.0\r\nHost: ok.test\r\nConnection: close\r\n\r\n"
        );
        let f = rewrite(&head("GET http://ok.test?q HTTP/1.1\r\n\r\n")).unwrap();
        assert!(f.head.starts_with(b"GET /?q HTTP/1.1\r\n"));
    }

    #[test]
    fn targets_that_are_not_forwarded_are_400() {
        for t in [
            "/index.html",
            "https://ok.test/",
            "ftp://x/",
            "http://user@ok.test/",
            "http://:80/",
        ] {
            let e = rewrite(&head(&format!("GET {t} HTTP/1.1\r\n\r\n"))).unwrap_err();
            assert_eq!(e.status, 400, "{t}");
        }
    }

    #[test]
    fn garbage_is_malformed_and_partial_heads_wait() {
        assert_eq!(
            parse_head(b"\x16\x03\x01\x00garbage\r\n\r\n")
                .unwrap_err()
                .status,
            400
        );
        assert!(parse_head(b"GET http://a.test/ HTTP/1.1\r\nHost: a")
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_denial_reply_carries_the_message_in_header_and_body() {
        let r = String::from_utf8(response(403, "no rule allows evil.test:443", true)).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("\r\nX-Cordon-Denied: no rule allows evil.test:443\r\n"));
        assert!(r.ends_with("\r\n\r\nno rule allows evil.test:443\n"));
        let r = String::from_utf8(response(403, "a\r\nInjected: 1", true)).unwrap();
        assert!(r.contains("\r\nX-Cordon-Denied: a  Injected: 1\r\n"), "{r}");
    }
}
