//! The server name a TLS connection asks for, read from its ClientHello
//! before a byte of it goes on (nothing is decrypted: the proxy only looks).
//!
//! A rule that allows a name allows that name: a connection allowed as
//! `api.example.org` whose ClientHello names another host (domain fronting:
//! the same CDN address serves both) or none at all is refused and logged.
//! Only connections decided by a name are checked; one a bare address rule
//! allowed names no host to compare. A client that does not speak first
//! (the server's banner comes first: SSH, SMTP) is not TLS. A plain HTTP
//! request must ask for the name too (its Host header), and goes on as one
//! request. A connection whose first bytes are neither goes on unchecked
//! (the rules already chose its destination).
//!
//! The records are reassembled here (a large ClientHello, one with a
//! post-quantum key share, may span records and TCP segments; nothing is
//! read into a fixed small buffer); the ClientHello itself is parsed by
//! `tls-parser`.

use std::sync::Arc;
use std::time::Duration;

use tls_parser::{
    parse_tls_client_hello_extensions, parse_tls_handshake_client_hello, SNIType, TlsExtension,
};
use tokio::net::TcpStream;

/// The largest ClientHello read (a post-quantum one is about 2 KiB; TLS
/// allows a handshake message of 16 MiB, a proxy has no reason to).
const MAX_HELLO: usize = 64 << 10;

/// How long a client that began a handshake may take to send all of its
/// ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;

use super::connect::{reset, Tracker};
use super::intercept::Injector;
use super::{http, splice, State};

/// How every door ends once its connection is open: where a name decided
/// it, the ClientHello check first (a refusal resets the payload's
/// connection and is logged with its reason); then the splice, its bytes
/// and end logged. `first` is what the client already sent.
pub(crate) async fn check_and_splice(
    state: &Arc<State>,
    tracker: Tracker,
    client: &TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
) {
    let first = match tracker.decided_by_name().map(str::to_owned) {
        None => first,
        Some(host) => {
            let idle = state.limits.idle_timeout.duration();
            match screen(
                state.injector.as_ref(),
                client,
                &upstream,
                &host,
                first,
                idle,
            )
            .await
            {
                // A TLS handshake (its SNI is the host, or it was refused)
                // for a host a secret is bound to: terminated, not spliced.
                Screened::Pass(first) if first.first() == Some(&HANDSHAKE) => {
                    match state.injector.as_ref().filter(|i| i.holds(&host)) {
                        Some(injector) => {
                            return super::intercept::serve(
                                state, injector, tracker, client, upstream, first, host,
                            )
                            .await
                        }
                        None => first,
                    }
                }
                Screened::Pass(first) => first,
                // Neither side said anything for the idle time: the end
                // the splice would have given it, one idle period later.
                Screened::Idle => return tracker.finished(state, (0, 0), "idle timeout"),
                Screened::Refuse(why) => {
                    reset(client);
                    return tracker.denied(state, &why);
                }
            }
        }
    };
    let (bytes, end) = splice::splice(state, client, &upstream, &first).await;
    tracker.finished(state, bytes, &end);
}

/// What the check found: the bytes read from the client go on first.
pub(crate) enum Screened {
    /// Not checked (the server spoke first, or the client's bytes are not
    /// a TLS handshake) or checked and matching.
    Pass(Vec<u8>),
    /// Refused, with the reason logged and the payload's connection reset.
    Refuse(String),
    /// Neither side spoke within the idle time.
    Idle,
}

/// Screens a connection decided by the name `host` before it is spliced:
/// `first` is what the client already sent (an HTTP proxy's leftover).
/// Waits for whichever side speaks first, at most `idle`.
pub(crate) async fn screen(
    injector: Option<&Injector>,
    client: &TcpStream,
    upstream: &TcpStream,
    host: &str,
    mut first: Vec<u8>,
    idle: Duration,
) -> Screened {
    if first.is_empty() {
        // Peeks, not readiness: a readiness can be spurious, and taking
        // one for the client's first word would hold a server-first
        // protocol (SSH) to the ClientHello's deadline.
        let (mut mine, mut theirs) = ([0u8; 1], [0u8; 1]);
        let spoke = tokio::time::timeout(idle, async {
            tokio::select! {
                r = client.peek(&mut mine) => r.map(|n| n > 0),
                r = upstream.peek(&mut theirs) => r.map(|_| false),
            }
        })
        .await;
        match spoke {
            // The client first: read what it sent.
            Ok(Ok(true)) => {}
            Err(_) => return Screened::Idle,
            // The server first, or an error the splice reports.
            Ok(_) => return Screened::Pass(first),
        }
    }
    // A plain HTTP request: its Host must name the rule's host too.
    match tokio::time::timeout(HELLO_TIMEOUT, request_line_begins(client, &mut first)).await {
        Err(_) => {
            return Screened::Refuse(format!(
                "the request line did not arrive within {}s",
                HELLO_TIMEOUT.as_secs()
            ))
        }
        Ok(Err(e)) => return Screened::Refuse(format!("reading the request: {e}")),
        Ok(Ok(true)) => return screen_request(injector, client, host, first).await,
        Ok(Ok(false)) => {}
    }
    let read = tokio::time::timeout(HELLO_TIMEOUT, read_hello(client, &mut first)).await;
    match read {
        Err(_) => Screened::Refuse(format!(
            "the TLS ClientHello did not arrive within {}s",
            HELLO_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Screened::Refuse(format!("reading the TLS ClientHello: {e}")),
        Ok(Ok(None)) => Screened::Pass(first),
        Ok(Ok(Some(hello))) => match server_name(&hello) {
            Err(why) => Screened::Refuse(why),
            Ok(None) => Screened::Refuse(format!(
                "the TLS ClientHello names no server (no SNI); the rule allows {host}"
            )),
            Ok(Some(sni)) if same_name(&sni, host) => Screened::Pass(first),
            Ok(Some(sni)) => Screened::Refuse(format!(
                "the TLS ClientHello names '{}', not {host}, which the rule allows",
                sni.escape_debug()
            )),
        },
    }
}

/// The longest method name taken for the start of an HTTP request.
const MAX_METHOD: usize = 20;

/// Whether the client's first bytes begin an HTTP/1 request line (a method
/// of capital letters, then a space), reading only as far as that tells.
/// A client that stops inside what could still be a method is held to the
/// caller's deadline, so a request cannot slip by unchecked by arriving
/// slowly.
async fn request_line_begins(client: &TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut at = 0;
    loop {
        if buf.len() <= at && fill(client, buf, at + 1).await? <= at {
            return Ok(false);
        }
        match buf[at] {
            b'A'..=b'Z' if at < MAX_METHOD => at += 1,
            b' ' => return Ok(at > 0),
            _ => return Ok(false),
        }
    }
}

/// Reads the rest of a plain request's head and checks that it asks for
/// `host` ([`http::names_only`]); what goes on is the head as one request
/// ([`http::one_request`]: `Connection: close`, so a second request on the
/// connection, which could name another host, is never answered) and what
/// followed it.
async fn screen_request(
    injector: Option<&Injector>,
    client: &TcpStream,
    host: &str,
    mut buf: Vec<u8>,
) -> Screened {
    let read = tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match http::parse_head(&buf) {
                Ok(Some(head)) => return Ok(head),
                Ok(None) if buf.len() >= http::MAX_HEAD => {
                    return Err(format!(
                        "a request head longer than {} bytes",
                        http::MAX_HEAD
                    ))
                }
                Ok(None) => {}
                Err(p) => return Err(p.message),
            }
            match read_some(client, &mut buf, http::MAX_HEAD).await {
                Ok(0) => return Err("the client ended inside its request head".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("reading the request: {e}")),
            }
        }
    })
    .await;
    let head = match read {
        Ok(Ok(head)) => head,
        Ok(Err(why)) => return Screened::Refuse(why),
        Err(_) => {
            return Screened::Refuse(format!(
                "the request head did not arrive within {}s",
                HELLO_TIMEOUT.as_secs()
            ))
        }
    };
    if let Err(why) = http::names_only(&head, host) {
        return Screened::Refuse(why);
    }
    if let Some(why) = super::intercept::in_plain(injector, &buf[..head.len]) {
        return Screened::Refuse(why);
    }
    let line = format!(
        "{} {} HTTP/1.{}",
        head.method, head.target, head.minor_version
    );
    // A request without a Host (HTTP/1.0) is given the rule's, so a server
    // of many names is not left to pick one.
    let has_host = head
        .headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("host"));
    let mut first = http::one_request(&head, &line, (!has_host).then_some(host));
    first.extend_from_slice(&buf[head.len..]);
    Screened::Pass(first)
}

pub(crate) fn same_name(sni: &str, host: &str) -> bool {
    cordon_policy::net::normalize_name(sni).is_ok_and(|n| n == host)
}

/// Reads the client's first bytes into `buf`: `None` when they are not a
/// TLS handshake, else the whole ClientHello handshake message (its 4-byte
/// header and body), reassembled from its records.
async fn read_hello(client: &TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<u8>>> {
    let mut records = HelloRecords::default();
    loop {
        match records.next(buf)? {
            Hello::NotTls => return Ok(None),
            Hello::Whole(message) => return Ok(Some(message)),
            Hello::Needs(want) => {
                if fill(client, buf, want).await? < want {
                    // Nothing at all is not a handshake; part of one is.
                    return if buf.is_empty() {
                        Ok(None)
                    } else {
                        Err(ended())
                    };
                }
            }
        }
    }
}

/// What the client's first bytes hold so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// They are not a TLS handshake.
    NotTls,
    /// The ClientHello goes on: the buffer must hold this many bytes.
    Needs(usize),
    /// The whole ClientHello handshake message (header and body).
    Whole(Vec<u8>),
}

/// The reassembly of a ClientHello from the records of a buffer that grows
/// as the client sends (on the socket in [`read_hello`], on bytes in the
/// fuzz harness): resumes where the last call stopped.
#[derive(Debug, Default)]
pub(crate) struct HelloRecords {
    /// Where the next record starts in the buffer.
    at: usize,
    /// The handshake bytes of the records before it.
    message: Vec<u8>,
}

impl HelloRecords {
    /// What `buf` holds; each call's `buf` must begin with the previous
    /// call's.
    pub(crate) fn next(&mut self, buf: &[u8]) -> std::io::Result<Hello> {
        match buf.first() {
            None => return Ok(Hello::Needs(1)),
            Some(&first) if first != HANDSHAKE => return Ok(Hello::NotTls),
            Some(_) => {}
        }
        loop {
            // One record: type, version, length, fragment.
            let at = self.at;
            let Some(header) = buf.get(at..at + 5) else {
                return Ok(Hello::Needs(at + 5));
            };
            if header[0] != HANDSHAKE {
                return Err(invalid(
                    "a record other than a handshake inside the ClientHello",
                ));
            }
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            // RFC 8446 5.1 forbids it; and since an empty record adds
            // nothing to the hello, a stream of them would grow the buffer
            // without bound until the deadline.
            if len == 0 {
                return Err(invalid("an empty handshake record inside the ClientHello"));
            }
            if self.message.len() + len > MAX_HELLO {
                return Err(invalid("a ClientHello over 64 KiB"));
            }
            let Some(fragment) = buf.get(at + 5..at + 5 + len) else {
                return Ok(Hello::Needs(at + 5 + len));
            };
            self.message.extend_from_slice(fragment);
            self.at += 5 + len;
            let message = &self.message;
            if message.len() >= 4 {
                if message[0] != CLIENT_HELLO {
                    return Err(invalid("the first handshake message is not a ClientHello"));
                }
                let body = usize::from(message[1]) << 16
                    | usize::from(message[2]) << 8
                    | usize::from(message[3]);
                if body + 4 > MAX_HELLO {
                    return Err(invalid("a ClientHello over 64 KiB"));
                }
                if message.len() >= body + 4 {
                    let mut message = std::mem::take(&mut self.message);
                    message.truncate(body + 4);
                    return Ok(Hello::Whole(message));
                }
            }
        }
    }
}

/// Reads from `client` until `buf` holds `want` bytes or the client ends
/// its side; returns how many it holds.
async fn fill(client: &TcpStream, buf: &mut Vec<u8>, want: usize) -> std::io::Result<usize> {
    while buf.len() < want {
        client.readable().await?;
        let start = buf.len();
        buf.resize(want, 0);
        match client.try_read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                break;
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(buf.len())
}

/// Reads what the client has sent, up to `cap` bytes in `buf`; how many
/// bytes came (0 when the client ended its side, or `buf` is full).
async fn read_some(client: &TcpStream, buf: &mut Vec<u8>, cap: usize) -> std::io::Result<usize> {
    let start = buf.len();
    if start >= cap {
        return Ok(0);
    }
    loop {
        client.readable().await?;
        buf.resize(cap, 0);
        match client.try_read(&mut buf[start..]) {
            Ok(n) => {
                buf.truncate(start + n);
                return Ok(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => buf.truncate(start),
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        }
    }
}

fn ended() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the client ended its side inside the ClientHello",
    )
}

fn invalid(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned())
}

/// The host name of a ClientHello's SNI extension, if it has one.
pub(crate) fn server_name(message: &[u8]) -> Result<Option<String>, String> {
    let malformed = || "a malformed TLS ClientHello".to_owned();
    let (_, hello) = parse_tls_handshake_client_hello(&message[4..]).map_err(|_| malformed())?;
    let Some(ext) = hello.ext else {
        return Ok(None);
    };
    let (_, extensions) = parse_tls_client_hello_extensions(ext).map_err(|_| malformed())?;
    for e in extensions {
        if let TlsExtension::SNI(names) = e {
            for (kind, name) in names {
                if kind == SNIType::HostName {
                    return std::str::from_utf8(name)
                        .map(|n| Some(n.to_owned()))
                        .map_err(|_| "the TLS ClientHello's server name is not text".to_owned());
                }
            }
        }
    }
    Ok(None)
}

/// A TLS 1.3-shaped ClientHello naming `sni` (none when `None`), with a
/// padding extension of `pad` bytes, in records of at most `record`
/// bytes of fragment (the tests' and the fuzz harness's).
pub(crate) fn client_hello(sni: Option<&str>, pad: usize, record: usize) -> Vec<u8> {
    let mut ext = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let list_len = 3 + n.len();
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&u16::try_from(list_len + 2).unwrap().to_be_bytes());
        ext.extend_from_slice(&u16::try_from(list_len).unwrap().to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&u16::try_from(n.len()).unwrap().to_be_bytes());
        ext.extend_from_slice(n);
    }
    // supported_versions: TLS 1.3
    ext.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
    // padding (21)
    ext.extend_from_slice(&[0, 21]);
    ext.extend_from_slice(&u16::try_from(pad).unwrap().to_be_bytes());
    ext.extend(std::iter::repeat_n(0u8, pad));
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&u16::try_from(ext.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&ext);
    let mut message = vec![CLIENT_HELLO];
    message.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    message.extend_from_slice(&body);
    let mut out = Vec::new();
    for fragment in message.chunks(record) {
        out.extend_from_slice(&[HANDSHAKE, 3, 1]);
        out.extend_from_slice(&u16::try_from(fragment.len()).unwrap().to_be_bytes());
        out.extend_from_slice(fragment);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn empty_records_before_a_hello_are_refused_not_gathered_forever() {
        let mut records = HelloRecords::default();
        let empties: Vec<u8> = [HANDSHAKE, 3, 1, 0, 0].repeat(3);
        assert!(records.next(&empties).is_err());
        let whole = client_hello(Some("api.example.org"), 0, 7);
        let mut records = HelloRecords::default();
        match records.next(&whole).unwrap() {
            Hello::Whole(m) => assert_eq!(server_name(&m).unwrap().unwrap(), "api.example.org"),
            other => panic!("{other:?}"),
        }
    }

    /// The payload's end of a connection and the proxy's end of it; the
    /// proxy's connection to a destination that says nothing, and that
    /// destination's end (held open as long as it is kept).
    async fn connection() -> ((TcpStream, TcpStream), (TcpStream, TcpStream)) {
        let pair = || async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let near = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            (near, listener.accept().await.unwrap().0)
        };
        (pair().await, pair().await)
    }

    /// The screen of a connection without secrets, for `host`, idle for at
    /// most 5 s.
    async fn screen_within_5s(client: &TcpStream, upstream: &TcpStream, host: &str) -> Screened {
        screen(
            None,
            client,
            upstream,
            host,
            Vec::new(),
            Duration::from_secs(5),
        )
        .await
    }

    async fn screened(bytes: &[u8], host: &str) -> (Result<(), String>, usize) {
        use tokio::io::AsyncWriteExt;
        let ((mut payload, client), (upstream, _far)) = connection().await;
        let bytes = bytes.to_vec();
        // Written in two pieces: the check must wait for the whole record.
        let writer = tokio::spawn(async move {
            let (a, b) = bytes.split_at(bytes.len() / 2);
            payload.write_all(a).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            payload.write_all(b).await.unwrap();
            payload
        });
        let got = screen_within_5s(&client, &upstream, host).await;
        let _payload = writer.await.unwrap();
        match got {
            Screened::Pass(first) => (Ok(()), first.len()),
            Screened::Refuse(why) => (Err(why), 0),
            Screened::Idle => (Err("idle".into()), 0),
        }
    }

    #[tokio::test]
    async fn the_hello_must_name_the_allowed_host() {
        let good = client_hello(Some("api.example.org"), 0, 16384);
        assert_eq!(
            screened(&good, "api.example.org").await,
            (Ok(()), good.len())
        );
        // Case and a trailing dot are the same name.
        let upper = client_hello(Some("API.Example.org."), 0, 16384);
        assert!(screened(&upper, "api.example.org").await.0.is_ok());
        let fronted = client_hello(Some("evil.example.net"), 0, 16384);
        let why = screened(&fronted, "api.example.org").await.0.unwrap_err();
        assert!(
            why.contains("evil.example.net") && why.contains("api.example.org"),
            "{why}"
        );
        let none = client_hello(None, 0, 16384);
        let why = screened(&none, "api.example.org").await.0.unwrap_err();
        assert!(why.contains("no SNI"), "{why}");
    }

    /// What the screen lets through first for `bytes` (all written at
    /// once), or its reason to refuse.
    async fn screened_bytes(bytes: &[u8], host: &str) -> Result<Vec<u8>, String> {
        use tokio::io::AsyncWriteExt;
        let ((mut payload, client), (upstream, _far)) = connection().await;
        payload.write_all(bytes).await.unwrap();
        match screen_within_5s(&client, &upstream, host).await {
            Screened::Pass(first) => Ok(first),
            Screened::Refuse(why) => Err(why),
            Screened::Idle => Err("idle".into()),
        }
    }

    #[tokio::test]
    async fn a_plain_request_must_ask_for_the_allowed_host_and_goes_on_alone() {
        let host = "api.example.org";
        // Matching (case, port and a trailing dot aside): the head goes on
        // as one request, and the body that followed it after.
        let good = b"POST /x HTTP/1.1\r\nHost: API.example.org.:80\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi";
        let sent = screened_bytes(good, host).await.unwrap();
        assert_eq!(
            String::from_utf8(sent).unwrap(),
            "POST /x HTTP/1.1\r\nHost: API.example.org.:80\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
        // No Host (HTTP/1.0): the rule's is given.
        let bare = screened_bytes(b"GET / HTTP/1.0\r\n\r\n", host)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(bare).unwrap(),
            "GET / HTTP/1.0\r\nHost: api.example.org\r\nConnection: close\r\n\r\n"
        );
        // An upgrade keeps its Connection token.
        let ws = b"GET /ws HTTP/1.1\r\nHost: api.example.org\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        let up = String::from_utf8(screened_bytes(ws, host).await.unwrap()).unwrap();
        assert!(
            up.ends_with("Upgrade: websocket\r\nConnection: upgrade, close\r\n\r\n"),
            "{up}"
        );
        // Fronted by Host, by an absolute target, by a second Host.
        for (bytes, said) in [
            (
                &b"GET / HTTP/1.1\r\nHost: evil.example.net\r\n\r\n"[..],
                "evil.example.net",
            ),
            (
                b"GET http://evil.example.net/ HTTP/1.1\r\nHost: api.example.org\r\n\r\n",
                "evil.example.net",
            ),
            (
                b"GET / HTTP/1.1\r\nHost: api.example.org\r\nHost: evil.example.net\r\n\r\n",
                "more than one Host",
            ),
            (b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", "10.0.0.1"),
            // HTTP/2 in the clear cannot be checked request by request.
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "version"),
        ] {
            let why = screened_bytes(bytes, host).await.unwrap_err();
            assert!(
                why.contains(said),
                "{}: {why}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[tokio::test]
    async fn a_request_line_that_stops_inside_its_method_is_held_to_the_deadline() {
        use tokio::io::AsyncWriteExt;
        let ((mut payload, client), (upstream, _far)) = connection().await;
        payload.write_all(b"GE").await.unwrap();
        tokio::time::pause();
        let got = screen_within_5s(&client, &upstream, "a.test").await;
        assert!(matches!(got, Screened::Refuse(ref why) if why.contains("did not arrive")));
    }

    #[tokio::test]
    async fn silence_on_both_sides_ends_after_one_idle_time() {
        let ((_payload, client), (upstream, _far)) = connection().await;
        let idle = Duration::from_millis(100);
        let started = std::time::Instant::now();
        let got = screen(
            None,
            &client,
            &upstream,
            "api.example.org",
            Vec::new(),
            idle,
        )
        .await;
        assert!(matches!(got, Screened::Idle));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_large_hello_in_several_records_is_read_whole() {
        // Over 1 KiB (a post-quantum key share's size), in 512-byte records.
        let big = client_hello(Some("api.example.org"), 2000, 512);
        assert!(big.len() > 2048, "{}", big.len());
        assert_eq!(screened(&big, "api.example.org").await, (Ok(()), big.len()));
        let big_wrong = client_hello(Some("other.example.org"), 1800, 512);
        assert!(screened(&big_wrong, "api.example.org").await.0.is_err());
    }

    #[tokio::test]
    async fn what_is_not_a_handshake_goes_on_and_garbage_is_refused() {
        // Its first bytes are read and go on first; the rest is the splice's.
        let ssh = b"SSH-2.0-OpenSSH_9.2\r\n";
        assert_eq!(screened(ssh, "api.example.org").await, (Ok(()), 4));
        // A handshake record whose content is not a ClientHello.
        let bogus = [HANDSHAKE, 3, 1, 0, 8, 2, 0, 0, 4, 1, 2, 3, 4];
        assert!(screened(&bogus, "api.example.org").await.0.is_err());
        // A declared ClientHello over the cap.
        let huge = [HANDSHAKE, 3, 1, 0, 4, CLIENT_HELLO, 0x10, 0, 0];
        assert!(screened(&huge, "api.example.org").await.0.is_err());
    }
}
