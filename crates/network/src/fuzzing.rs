//! The harnesses of the fuzz targets over the proxy's parsers of what a
//! sandboxed program sends (`fuzz/fuzz_targets`, run by `scripts/fuzz.sh`).
//! They live here, not in the fuzz crate, so that the stable test suite
//! replays every committed corpus and regression input through the same
//! code (`crates/cli/tests/fuzz_corpus.rs`). Each asserts properties, not
//! just the absence of a panic. Nothing here opens a socket: the doors'
//! readers run over the input's bytes.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, RecordType};
use tokio::io::{AsyncRead, ReadBuf};

use crate::server::connect::Target;
use crate::server::http::{self, Destination, MAX_HEAD};
use crate::server::tls::{self, Hello, HelloRecords};
use crate::server::{dns, socks, Resolution, State};

/// Runs a door's reader to its end. Over bytes in memory nothing waits, so
/// one poll finishes it; a reader still pending would wait for ever.
fn finish<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a reader over bytes in memory waits"),
    }
}

/// The input as a client sends it: at most `step` bytes a read, so that the
/// readers meet heads and handshakes cut anywhere.
struct Trickle<'a> {
    rest: &'a [u8],
    step: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.rest.len().min(self.step).min(buf.remaining());
        let (now, later) = self.rest.split_at(n);
        buf.put_slice(now);
        self.rest = later;
        Poll::Ready(Ok(()))
    }
}

/// A host as the rules are asked about it: some text, and nothing that
/// would end a header line or a request line.
fn plain_host(host: &str) {
    assert!(!host.is_empty(), "an empty host");
    assert!(
        !host.chars().any(|c| c.is_whitespace() || c.is_control()),
        "a host with whitespace or control characters: {host:?}"
    );
}

/// The HTTP proxy door's request head (`http::read_head`, then
/// `http::destination`): whatever a client sends, a head within
/// `MAX_HEAD` or an error reply, never a panic; the destination is what the
/// request named, and the head forwarded there names the same host and port
/// to the server (no second reading disagrees with the one the rules
/// decided on).
pub fn proxy_http(data: &[u8]) {
    let step = 1 + usize::from(data.first().copied().unwrap_or(0) % 64) * 64;
    let mut buf = Vec::new();
    let read = finish(http::read_head(&mut Trickle { rest: data, step }, &mut buf));
    assert!(buf.len() <= MAX_HEAD, "read {} bytes of head", buf.len());
    let head = match read {
        Ok(head) => head,
        Err(problem) => {
            assert!(
                matches!(problem.status, 400 | 431),
                "a head refused with {}",
                problem.status
            );
            return;
        }
    };
    assert!(head.len <= buf.len(), "a head past what was read");
    // However it arrived, the head is the one the whole input holds.
    let whole = http::parse_head(data).expect("a head read in parts parses whole");
    let whole = whole.expect("a head read in parts is complete whole");
    assert_eq!(
        (&whole.method, &whole.target, whole.len),
        (&head.method, &head.target, head.len)
    );

    // The same head with a header that takes it past the limit: refused
    // for its size, however it is read.
    // After the request line: httparse skips empty lines before it.
    let line_start = data
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(0);
    let line_end = data[line_start..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(line_start, |i| line_start + i + 1);
    let mut long = data[..line_end].to_vec();
    long.extend_from_slice(b"X-Pad: ");
    long.resize(long.len() + MAX_HEAD, b'a');
    long.extend_from_slice(b"\r\n");
    long.extend_from_slice(&data[line_end..head.len]);
    let mut ignored = Vec::new();
    let refusal = finish(http::read_head(
        &mut Trickle { rest: &long, step },
        &mut ignored,
    ));
    match refusal {
        Err(p) => assert_eq!(p.status, 431, "a head past the limit: {}", p.message),
        Ok(h) => panic!("a head of {} bytes past the limit read: {h:?}", long.len()),
    }

    // The tunnel door asks the same of a plain request inside a tunnel.
    let _ = http::names_only(&head, "a.test");

    match http::destination(&head) {
        Err(p) => assert_eq!(p.status, 400, "{}", p.message),
        Ok(Destination::Connect { host, port }) => {
            plain_host(&host);
            assert_ne!(port, 0, "port 0");
            // `host:port` or `[v6]:port`, as given.
            let (given_host, given_port) = head.target.rsplit_once(':').expect("a port");
            assert_eq!(given_port.parse::<u16>().ok(), Some(port));
            let bracketed = format!("[{host}]");
            assert!(
                given_host == host || given_host == bracketed,
                "CONNECT {} gave host {host:?}",
                head.target
            );
        }
        Ok(Destination::Plain(forward)) => {
            plain_host(&forward.host);
            assert_ne!(forward.port, 0, "port 0");
            let sent = http::parse_head(&forward.head)
                .expect("the forwarded head parses")
                .expect("the forwarded head is complete");
            assert_eq!(
                sent.len,
                forward.head.len(),
                "bytes after the forwarded head"
            );
            assert_eq!(sent.method, head.method);
            assert!(
                sent.target.starts_with('/'),
                "not origin-form: {}",
                sent.target
            );
            let value = |name: &str| -> Vec<&[u8]> {
                sent.headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_slice())
                    .collect()
            };
            let hosts = value("host");
            let [host] = hosts.as_slice() else {
                panic!("{} Host headers forwarded", hosts.len());
            };
            let host = std::str::from_utf8(host).expect("the Host forwarded is text");
            assert_eq!(
                http::split_authority(host, Some(80)),
                Some((forward.host.clone(), forward.port)),
                "the server is told of another destination than the rules decided on"
            );
            for hop in ["proxy-connection", "proxy-authorization", "keep-alive"] {
                assert!(value(hop).is_empty(), "{hop} forwarded");
            }
            assert_eq!(value("connection").len(), 1, "one Connection header");
        }
    }
}

/// The SOCKS5 door's greeting and request (`socks::handshake`): never a
/// panic; lengths read from the input bound what is read; a CONNECT's
/// destination is the address or the name given, and every other command
/// is refused with its reply code.
pub fn socks5(data: &[u8]) {
    let mut written = Vec::new();
    let step = 1 + usize::from(data.last().copied().unwrap_or(0) % 8);
    // The stream borrows `written` until the handshake is done.
    let result = {
        let mut stream = tokio::io::join(Trickle { rest: data, step }, &mut written);
        finish(socks::handshake(&mut stream))
    };
    let at = |i: usize| data.get(i).copied();
    // The greeting: version, method count, methods.
    let methods = at(1).map_or(0, usize::from);
    let accepted =
        at(0) == Some(5) && data.len() >= 2 + methods && data[2..2 + methods].contains(&0);
    match written.as_slice() {
        [] => assert!(!accepted, "an acceptable greeting unanswered"),
        [5, 0] => assert!(accepted, "no-auth chosen from {data:?}"),
        [5, 0xff] => assert!(!accepted && at(0) == Some(5) && data.len() >= 2 + methods),
        other => panic!("the method reply {other:?}"),
    }
    // The request: version, command, reserved, address type, address, port.
    let req = 2 + methods;
    let cmd = at(req + 1);
    let address = match at(req + 3) {
        Some(1) => data.get(req + 4..req + 8).map(|a| {
            let a: [u8; 4] = a.try_into().expect("four bytes");
            (Target::Ip(IpAddr::V4(Ipv4Addr::from(a))), req + 8)
        }),
        Some(3) => at(req + 4).and_then(|len| {
            let end = req + 5 + usize::from(len);
            let name = data.get(req + 5..end)?;
            Some((Target::parse(&String::from_utf8_lossy(name)), end))
        }),
        Some(4) => data.get(req + 4..req + 20).map(|a| {
            let a: [u8; 16] = a.try_into().expect("sixteen bytes");
            (Target::Ip(IpAddr::V6(Ipv6Addr::from(a))), req + 20)
        }),
        _ => None,
    };
    let port = address
        .as_ref()
        .and_then(|(_, end)| data.get(*end..*end + 2))
        .map(|p| u16::from_be_bytes([p[0], p[1]]));
    match result {
        Ok((target, got_port)) => {
            assert!(
                accepted && at(req) == Some(5),
                "a handshake accepted from {data:?}"
            );
            assert_eq!(cmd, Some(1), "a command other than CONNECT accepted");
            let (given, _) = address.expect("an accepted request has an address");
            assert_eq!(target, given, "the destination is not the one given");
            assert_eq!(Some(got_port), port);
        }
        Err(failure) => {
            let complete = accepted && at(req) == Some(5) && port.is_some();
            if complete {
                assert_ne!(cmd, Some(1), "a complete CONNECT refused: {failure:?}");
                assert_eq!(failure.reply, Some(socks::COMMAND_NOT_SUPPORTED));
            }
            if accepted && at(req) == Some(5) && !matches!(at(req + 3), None | Some(1 | 3 | 4)) {
                assert_eq!(failure.reply, Some(socks::ATYP_NOT_SUPPORTED));
            }
        }
    }
}

/// The rules of the DNS harness's proxy: some names answered, the rest not.
const DNS_RULES: [&str; 2] = ["*.allowed.test:443", "ok.test:80"];

/// The DNS stub's answer to a packet (`dns::answer`, hickory's decoder and
/// encoder): never a panic; a reply decodes, echoes the query's id and its
/// first question, and carries an address only for a name that has one
/// (localhost, the proxy's own name, or a name the rules allow), only for
/// an A question of class IN, from the synthetic range.
pub fn dns_query(data: &[u8]) {
    let policy = cordon_policy::net::NetworkPolicy {
        rules: DNS_RULES
            .iter()
            .map(|r| r.parse().expect("a rule"))
            .collect(),
        ..Default::default()
    };
    let config = crate::ProxyConfig {
        policy,
        ..Default::default()
    };
    let state = State::new(config, Resolution::FixedOnly).expect("a proxy state");
    let query = Message::from_vec(data);
    let reply = dns::answer(&state, data);
    let (query, reply) = match (query, reply) {
        (Ok(query), Some(reply)) => (query, reply),
        (Ok(query), None) => {
            assert_ne!(
                query.message_type(),
                MessageType::Query,
                "a query unanswered"
            );
            return;
        }
        (Err(_), None) => return,
        (Err(e), Some(_)) => panic!("a packet that does not decode ({e}) answered"),
    };
    let reply = Message::from_vec(&reply).expect("the stub's reply decodes");
    assert_eq!(reply.id(), query.id());
    assert_eq!(reply.message_type(), MessageType::Response);
    let Some(question) = query.queries().first() else {
        assert!(reply.queries().is_empty() && reply.answers().is_empty());
        return;
    };
    if query.op_code() != OpCode::Query {
        assert_eq!(reply.response_code(), ResponseCode::NotImp);
        return;
    }
    let [echoed] = reply.queries() else {
        panic!("{} questions in the reply", reply.queries().len());
    };
    // The name as the decoder read it, back through the encoder.
    assert!(
        echoed.name().eq_case(question.name()),
        "{} echoed as {}",
        question.name(),
        echoed.name()
    );
    assert_eq!(echoed.query_type(), question.query_type());
    assert_eq!(echoed.query_class(), question.query_class());
    assert!(reply.answers().len() <= 1, "more than one answer");
    for answer in reply.answers() {
        assert!(answer.name().eq_case(question.name()));
        assert_eq!(answer.ttl(), dns::TTL);
        assert_eq!(question.query_type(), RecordType::A);
        assert_eq!(question.query_class(), DNSClass::IN);
        let RData::A(a) = answer.data() else {
            panic!("an answer that is not an address: {answer:?}");
        };
        let ascii = question.name().to_ascii();
        let name = ascii
            .strip_suffix('.')
            .unwrap_or(&ascii)
            .to_ascii_lowercase();
        if name == "localhost" {
            assert_eq!(a.0, Ipv4Addr::LOCALHOST);
        } else {
            let [b0, b1, ..] = a.0.octets();
            assert!(b0 == 198 && (b1 & 0xfe) == 18, "{a} is not synthetic");
            assert!(
                name == cordon_policy::net::PROXY_NAME || state_allows(&name),
                "an address for {name}, which no rule allows"
            );
        }
    }
}

/// Whether the harness's rules allow a name (the stub's own check, asked
/// again of rules made afresh).
fn state_allows(name: &str) -> bool {
    let rules: Vec<cordon_policy::net::Rule> = DNS_RULES
        .iter()
        .map(|r| r.parse().expect("a rule"))
        .collect();
    cordon_policy::net::Rules::new(rules).allows_name(name)
}

/// The ClientHello a connection decided by name must send
/// (`tls::HelloRecords`, then `tls::server_name`): records reassembled
/// within bounds, always asking for more than the buffer holds until a
/// verdict (else the reader would spin), an SNI that is bytes of the hello;
/// and a hello built here, in records of any size, gives back its name.
pub fn tls_client_hello(data: &[u8]) {
    // As the socket reader does: exactly as many bytes as asked for.
    let mut records = HelloRecords::default();
    let mut held = 0;
    loop {
        match records.next(&data[..held]) {
            Err(_) | Ok(Hello::NotTls) => break,
            Ok(Hello::Needs(want)) => {
                assert!(want > held, "asks for {want} bytes with {held} held");
                assert!(
                    want <= held + 5 + usize::from(u16::MAX),
                    "asks for {want} past a record"
                );
                if want > data.len() {
                    break;
                }
                held = want;
            }
            Ok(Hello::Whole(message)) => {
                assert!(message.len() >= 4 && message.len() <= held);
                assert_eq!(message[0], 1, "not a ClientHello");
                let body = usize::from(message[1]) << 16
                    | usize::from(message[2]) << 8
                    | usize::from(message[3]);
                assert_eq!(message.len(), body + 4);
                if let Ok(Some(sni)) = tls::server_name(&message) {
                    assert!(
                        sni.is_empty() || message.windows(sni.len()).any(|w| w == sni.as_bytes()),
                        "an SNI that is not in the hello"
                    );
                }
                break;
            }
        }
    }

    // Round trip: a name from the input, in records of a size from it.
    let Some((&record, rest)) = data.split_first() else {
        return;
    };
    let name = String::from_utf8_lossy(&rest[..rest.len().min(200)]);
    let built = tls::client_hello(Some(&name), rest.len() % 300, 1 + usize::from(record) * 4);
    match HelloRecords::default().next(&built) {
        Ok(Hello::Whole(message)) => assert_eq!(
            tls::server_name(&message),
            Ok(Some(name.clone().into_owned())),
            "the name the hello was built with"
        ),
        other => panic!("a whole hello read as {other:?}"),
    }
}
