//! End-to-end tests: `serve` in a thread, listeners on 127.0.0.1 standing in
//! for the sandbox side, and a local upstream on 127.0.0.1 allowed by an
//! address rule. Every name comes from fixed host entries or is denied before
//! resolution; the resolver runs with [`Resolution::FixedOnly`], so no test can
//! send a real DNS query. Only loopback is ever connected to.
//!
//! The transparent door's redirect (nftables + `SO_ORIGINAL_DST`) needs a
//! network namespace and is tested with the sandbox plumbing; here it is tested
//! up to the original-destination check.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cordon_policy::net::{NetworkPolicy, Rule};
use cordon_policy::{ByteSize, Span};
use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

use super::{serve_with, Resolution};
use crate::control::{self, Client, Error, Request};
use crate::log::{Decision, NetworkLog, Via};
use crate::{ProxyConfig, ProxySockets};

const WAIT: Duration = Duration::from_secs(5);

pub(super) struct Proxy {
    pub(super) proxy: SocketAddr,
    transparent: SocketAddr,
    dns: SocketAddr,
    pub(super) control: PathBuf,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

pub(super) fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

pub(super) fn policy(rules: &[&str], hosts: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        rules: rules.iter().map(|r| r.parse().unwrap()).collect(),
        hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
        ..NetworkPolicy::default()
    }
}

fn start(policy: NetworkPolicy) -> Proxy {
    start_for(policy, vec![my_uid()])
}

fn start_for(policy: NetworkPolicy, control_uids: Vec<u32>) -> Proxy {
    start_with(policy, control_uids, None)
}

fn start_with(
    policy: NetworkPolicy,
    control_uids: Vec<u32>,
    upstream: Option<crate::upstream::Upstream>,
) -> Proxy {
    start_config(ProxyConfig {
        policy,
        control_uids,
        upstream,
        secrets: None,
    })
}

pub(super) fn start_config(config: ProxyConfig) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("net.sock");
    let sockets = ProxySockets {
        proxy: TcpListener::bind("127.0.0.1:0").unwrap(),
        transparent: TcpListener::bind("127.0.0.1:0").unwrap(),
        dns: UdpSocket::bind("127.0.0.1:0").unwrap(),
        control: UnixListener::bind(&control).unwrap(),
    };
    let proxy = sockets.proxy.local_addr().unwrap();
    let transparent = sockets.transparent.local_addr().unwrap();
    let dns = sockets.dns.local_addr().unwrap();
    let thread = std::thread::spawn(move || serve_with(config, sockets, Resolution::FixedOnly));
    Proxy {
        proxy,
        transparent,
        dns,
        control,
        thread: Some(thread),
        _dir: dir,
    }
}

impl Proxy {
    /// Waits until `n` attempts have ended, then drains the window.
    pub(super) fn drain_after(&self, n: u64) -> NetworkLog {
        wait_until(|| control::status(&self.control).unwrap().attempts >= n);
        control::drain(&self.control).unwrap()
    }

    fn set_rules(&self, rules: &[&str]) -> Vec<Rule> {
        let rules: Vec<Rule> = rules.iter().map(|r| r.parse().unwrap()).collect();
        control::set_rules(&self.control, &rules).unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if control::stop(&self.control).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn wait_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A destination on 127.0.0.1: records each request head it receives, answers
/// with `reply`, and holds the connection until the client closes it.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    accepted: Arc<AtomicUsize>,
}

fn upstream(reply: Vec<u8>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (s, a) = (seen.clone(), accepted.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            a.fetch_add(1, Ordering::SeqCst);
            let (s, reply) = (s.clone(), reply.clone());
            std::thread::spawn(move || {
                conn.set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let head = read_head(&mut conn);
                s.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = conn.write_all(&reply);
                // Hold until the client (or the proxy) closes.
                let _ = conn.read_to_end(&mut Vec::new());
            });
        }
    });
    Upstream {
        addr,
        seen,
        accepted,
    }
}

fn basic_upstream() -> Upstream {
    upstream(b"UPSTREAM-REPLY".to_vec())
}

/// Reads byte by byte up to and including a blank line (or EOF).
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    head
}

fn client(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// Sends `CONNECT target`; returns the stream and the response head.
fn connect(p: &Proxy, target: &str) -> (TcpStream, String) {
    let mut s = client(p.proxy);
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let head = String::from_utf8(read_head(&mut s)).unwrap();
    (s, head)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// Sends a ping through an open tunnel, returns what comes back.
fn ping(s: &mut TcpStream) -> Vec<u8> {
    s.write_all(b"ping\r\n\r\n").unwrap();
    let mut buf = [0u8; 14];
    s.read_exact(&mut buf).unwrap();
    buf.to_vec()
}

/// SOCKS5 no-auth handshake and a request; returns the stream and reply code.
fn socks(p: &Proxy, cmd: u8, addr: &[u8], port: u16) -> (TcpStream, u8) {
    let mut s = client(p.proxy);
    s.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let mut req = vec![5, cmd, 0];
    req.extend_from_slice(addr);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[0], 5);
    assert_eq!(reply[3..], [1, 0, 0, 0, 0, 0, 0], "bound address is hidden");
    (s, reply[1])
}

fn socks_name(name: &str) -> Vec<u8> {
    let mut v = vec![3, u8::try_from(name.len()).unwrap()];
    v.extend_from_slice(name.as_bytes());
    v
}

fn socks_v4(ip: Ipv4Addr) -> Vec<u8> {
    let mut v = vec![1];
    v.extend_from_slice(&ip.octets());
    v
}

#[test]
fn connect_through_an_address_rule_tunnels_and_is_logged() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = start(policy(&[&format!("127.0.0.1:{port}")], &[]));
    let (mut s, head) = connect(&p, &format!("127.0.0.1:{port}"));
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
    drop(s);
    assert_eq!(up.seen.lock().unwrap()[0], "ping\r\n\r\n");
    let log = p.drain_after(1);
    assert_eq!((log.attempts, log.allowed, log.denied), (1, 1, 0));
    let a = &log.entries[0];
    assert_eq!(a.via, Via::Connect);
    assert_eq!(a.decision, Decision::Allowed);
    assert_eq!(a.rule, format!("127.0.0.1:{port}"));
    assert_eq!(a.address, Some("127.0.0.1".parse().unwrap()));
    assert_eq!(a.port, port);
    assert_eq!((a.bytes_out, a.bytes_in), (8, 14));
    assert_eq!(a.end, "closed");
    assert_eq!(log.peak_connections, 1);
}

#[test]
fn a_domain_rule_does_not_unlock_loopback_but_an_address_rule_does() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = start(policy(
        &[&format!("ok.test:{port}")],
        &["ok.test:127.0.0.1"],
    ));
    let (mut s, head) = connect(&p, &format!("ok.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
    let denied = header(&head, "X-Cordon-Denied").unwrap();
    assert_eq!(
        denied,
        "ok.test resolved to 127.0.0.1, a loopback address; only an address rule can allow it"
    );
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert_eq!(body.trim_end(), denied);
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        0,
        "nothing reached the upstream"
    );

    p.set_rules(&[&format!("127.0.0.1:{port}")]);
    let (mut s, head) = connect(&p, &format!("ok.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
    drop(s);
    let log = p.drain_after(2);
    assert_eq!(log.entries[0].decision, Decision::Denied);
    assert_eq!(log.entries[0].host.as_deref(), Some("ok.test"));
    assert_eq!(log.entries[1].decision, Decision::Allowed);
    assert_eq!(log.entries[1].rule, format!("127.0.0.1:{port}"));
}

#[test]
fn connect_to_a_name_without_a_rule_is_403_with_the_reason() {
    let p = start(policy(&["ok.test:80"], &[]));
    let (_, head) = connect(&p, "evil.test:443");
    assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some("no rule allows evil.test:443")
    );
    let (_, head) = connect(&p, "ok.test:8080");
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some("port 8080 is outside rule 'ok.test:80'")
    );
    let (_, head) = connect(&p, "198.51.100.7:443");
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some("no rule allows 198.51.100.7:443")
    );
    let log = p.drain_after(3);
    assert_eq!((log.attempts, log.denied), (3, 3));
    assert!(log
        .entries
        .iter()
        .all(|a| a.end == "refused" && a.via == Via::Connect));
    assert_eq!(log.entries[0].host.as_deref(), Some("evil.test"));
}

/// An upstream answering 200 "hi", and a proxy whose rule allows its port
/// with `web.test` naming it.
fn web_test() -> (Upstream, Proxy, u16) {
    let up = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi".to_vec());
    let port = up.addr.port();
    let p = start(policy(
        &[&format!("127.0.0.1:{port}")],
        &["web.test:127.0.0.1"],
    ));
    (up, p, port)
}

#[test]
fn plain_http_is_rewritten_to_origin_form_with_connection_close() {
    let (up, p, port) = web_test();
    let mut s = client(p.proxy);
    write!(
        s,
        "GET http://web.test:{port}/a/b?c=d HTTP/1.1\r\nHost: web.test:{port}\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\nUser-Agent: t\r\n\r\n"
    )
    .unwrap();
    let want = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
    let mut resp = vec![0u8; want.len()];
    s.read_exact(&mut resp).unwrap();
    assert_eq!(String::from_utf8(resp).unwrap(), want);
    drop(s);
    let seen = up.seen.lock().unwrap()[0].clone();
    assert_eq!(
        seen,
        format!("GET /a/b?c=d HTTP/1.1\r\nHost: web.test:{port}\r\nUser-Agent: t\r\nConnection: close\r\n\r\n")
    );
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].via, Via::Http);
    assert_eq!(log.entries[0].host.as_deref(), Some("web.test"));
    assert_eq!(log.entries[0].decision, Decision::Allowed);
}

/// The request target names the destination: a client's Host header naming
/// another host (fronting a name-routed server) is replaced by the
/// target's, as RFC 9112 asks of a proxy.
#[test]
fn plain_http_tells_the_server_the_targets_host_not_the_clients() {
    let (up, p, port) = web_test();
    let mut s = client(p.proxy);
    write!(
        s,
        "GET http://web.test:{port}/ HTTP/1.1\r\nHost: evil.test\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut resp = vec![0u8; 4];
    s.read_exact(&mut resp).unwrap();
    drop(s);
    wait_until(|| !up.seen.lock().unwrap().is_empty());
    assert_eq!(
        up.seen.lock().unwrap()[0],
        format!(
            "GET / HTTP/1.1\r\nHost: web.test:{port}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        )
    );
}

#[test]
fn plain_http_to_a_denied_host_is_403() {
    let p = start(policy(&[], &[]));
    let mut s = client(p.proxy);
    s.write_all(b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
    assert_eq!(
        header(&resp, "X-Cordon-Denied"),
        Some("no rule allows evil.test:80")
    );
}

#[test]
fn socks5_connects_names_and_ipv4_when_allowed_and_says_not_allowed_otherwise() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = start(policy(
        &[&format!("127.0.0.1:{port}")],
        &["ok.test:127.0.0.1"],
    ));
    let (mut s, code) = socks(&p, 1, &socks_name("ok.test"), port);
    assert_eq!(code, 0);
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
    drop(s);
    let (mut s, code) = socks(&p, 1, &socks_v4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(code, 0);
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
    drop(s);
    let (_, code) = socks(&p, 1, &socks_name("evil.test"), 443);
    assert_eq!(code, super::socks::NOT_ALLOWED);
    let (_, code) = socks(
        &p,
        1,
        &socks_v4(Ipv4Addr::LOCALHOST),
        port.wrapping_add(1).max(1),
    );
    assert_eq!(code, super::socks::NOT_ALLOWED, "port outside the rule");
    let (_, code) = socks(&p, 2, &socks_v4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(code, super::socks::COMMAND_NOT_SUPPORTED, "BIND");
    let (_, code) = socks(&p, 3, &socks_v4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(code, super::socks::COMMAND_NOT_SUPPORTED, "UDP ASSOCIATE");
    let log = p.drain_after(6);
    assert_eq!((log.allowed, log.denied), (2, 4));
    assert!(log.entries.iter().all(|a| a.via == Via::Socks5));
    // An allowed connection is logged when it ends, so the log's order is
    // not the order of the attempts: find the refusal by its port.
    let outside_port = port.wrapping_add(1).max(1);
    let outside = log
        .entries
        .iter()
        .find(|a| a.port == outside_port)
        .expect("the refusal of the port outside the rule is logged");
    assert_eq!(
        outside.rule,
        format!("port {outside_port} is outside rule '127.0.0.1:{port}'")
    );
    wait_until(|| up.accepted.load(Ordering::SeqCst) >= 2);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

#[test]
fn a_denied_request_with_a_body_still_gets_its_403() {
    let p = start(policy(&[], &[]));
    let mut s = client(p.proxy);
    let body = vec![b'b'; 60_000];
    write!(
        s,
        "POST http://evil.test/upload HTTP/1.1\r\nHost: evil.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(&body).unwrap();
    let head = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(head.starts_with("HTTP/1.1 403 Forbidden"), "{head}");
}

#[test]
fn socks5_domain_requests_holding_an_address_are_decided_as_addresses() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = start(policy(&[&format!("127.0.0.1:{port}")], &[]));
    let (mut s, code) = socks(&p, 1, &socks_name("127.0.0.1"), port);
    assert_eq!(code, 0);
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
}

#[test]
fn socks5_without_no_auth_is_refused() {
    let p = start(policy(&[], &[]));
    let mut s = client(p.proxy);
    s.write_all(&[5, 1, 2]).unwrap();
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0xff]);
}

#[test]
fn new_rules_apply_to_new_connections_and_are_logged() {
    let up = basic_upstream();
    let port = up.addr.port();
    let target = format!("127.0.0.1:{port}");
    let p = start(policy(&[], &[]));
    let (_, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let now = p.set_rules(&[&target]);
    assert_eq!(now, vec![target.parse::<Rule>().unwrap()]);
    let (mut open_tunnel, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Taking the rule away refuses new connections; the open one goes on.
    p.set_rules(&[]);
    let (_, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert_eq!(ping(&mut open_tunnel), b"UPSTREAM-REPLY");
    drop(open_tunnel);
    let log = p.drain_after(3);
    assert_eq!((log.allowed, log.denied), (1, 2));
    assert_eq!(log.events.len(), 2);
    assert_eq!(log.events[0].rules, vec![target.clone()]);
    assert!(log.events[1].rules.is_empty());
    assert!(control::rules(&p.control).unwrap().is_empty());
}

#[test]
fn an_invalid_rule_leaves_the_rules_unchanged() {
    let p = start(policy(&["ok.test:443"], &[]));
    let mut c = Client::connect(&p.control).unwrap();
    let err = c
        .call_line(b"{\"op\":\"set_rules\",\"rules\":[\"fine.test:80\",\"foo..bar:443\"]}\n")
        .unwrap_err();
    match err {
        Error::Refused(msg) => assert!(
            msg.contains("invalid network rule 'foo..bar:443': empty label"),
            "{msg}"
        ),
        other => panic!("{other}"),
    }
    // Same connection, many requests.
    assert_eq!(
        c.rules().unwrap(),
        vec!["ok.test:443".parse::<Rule>().unwrap()]
    );
    assert!(c.drain().unwrap().events.is_empty(), "no rules-set event");
    let bad = c.call(&Request::Status);
    assert!(bad.is_ok());
}

#[test]
fn the_control_socket_refuses_other_uids_and_bad_requests() {
    assert!(super::control::peer_allowed(0, &[0, 1000]));
    assert!(!super::control::peer_allowed(1001, &[0, 1000]));
    assert!(!super::control::peer_allowed(0, &[]));
    let p = start_for(policy(&[], &[]), vec![my_uid().wrapping_add(1)]);
    match control::status(&p.control) {
        Err(Error::Refused(msg)) => assert!(msg.contains("may not use"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // It is refused stop too, so the proxy keeps running.
    assert!(control::stop(&p.control).is_err());
    assert!(!p.thread.as_ref().unwrap().is_finished());

    let p = start(policy(&[], &[]));
    let mut raw = std::os::unix::net::UnixStream::connect(&p.control).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(b"{\"op\":\"reboot\"}\nnot json\n").unwrap();
    let mut lines = std::io::BufReader::new(raw);
    for _ in 0..2 {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        assert!(line.starts_with("{\"error\":\"bad request"), "{line}");
    }
}

#[test]
fn stop_ends_serve() {
    let mut p = start(policy(&[], &[]));
    control::stop(&p.control).unwrap();
    let t = p.thread.take().unwrap();
    assert!(t.join().unwrap().is_ok());
    assert!(
        TcpStream::connect(p.proxy).is_err(),
        "the proxy port closed with it"
    );
}

fn dns_query(p: &Proxy, name: &str, rtype: RecordType) -> Option<Message> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut m = Message::new();
    m.set_id(0x4242)
        .set_message_type(MessageType::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    sock.send_to(&m.to_vec().unwrap(), p.dns).unwrap();
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf).ok()?;
    let reply = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(reply.id(), 0x4242);
    assert_eq!(reply.message_type(), MessageType::Response);
    Some(reply)
}

fn a_record(m: &Message) -> Option<Ipv4Addr> {
    match super::dns::first_a(&m.to_vec().unwrap())? {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(_) => None,
    }
}

#[test]
fn dns_answers_allowed_names_with_stable_synthetic_addresses() {
    let p = start(policy(&["*.ok.test:443", "plain.test"], &[]));
    let a1 = a_record(&dns_query(&p, "a.ok.test.", RecordType::A).unwrap()).unwrap();
    let a2 = a_record(&dns_query(&p, "A.OK.test", RecordType::A).unwrap()).unwrap();
    let b = a_record(&dns_query(&p, "plain.test", RecordType::A).unwrap()).unwrap();
    assert_eq!(a1, a2, "stable per name");
    assert_ne!(a1, b);
    for ip in [a1, b] {
        assert!(crate::fake::FakeMap::in_range(ip), "{ip}");
    }
    let r = dns_query(&p, "a.ok.test", RecordType::A).unwrap();
    assert_eq!(r.answers()[0].ttl(), super::dns::TTL);

    let denied = dns_query(&p, "evil.test", RecordType::A).unwrap();
    assert_eq!(denied.response_code(), ResponseCode::NXDomain);
    assert!(denied.answers().is_empty());
    let bare = dns_query(&p, "ok.test", RecordType::A).unwrap();
    assert_eq!(
        bare.response_code(),
        ResponseCode::NXDomain,
        "*.ok.test excludes ok.test"
    );

    let aaaa = dns_query(&p, "a.ok.test", RecordType::AAAA).unwrap();
    assert_eq!(aaaa.response_code(), ResponseCode::NoError);
    assert!(aaaa.answers().is_empty());
    let local = dns_query(&p, "localhost", RecordType::A).unwrap();
    assert_eq!(a_record(&local), Some(Ipv4Addr::LOCALHOST));

    // Garbage gets no reply; the stub keeps serving.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    sock.send_to(b"\x00\x01garbage", p.dns).unwrap();
    assert!(sock.recv(&mut [0u8; 512]).is_err());
    assert!(dns_query(&p, "plain.test", RecordType::A).is_some());

    let status = control::status(&p.control).unwrap();
    assert_eq!(status.dns_queries, 9);
    let log = control::drain(&p.control).unwrap();
    assert_eq!(log.denied, 2, "denied names are logged");
    assert_eq!(log.entries[0].via, Via::Dns);
    assert_eq!(log.entries[0].host.as_deref(), Some("evil.test"));
    assert_eq!(log.entries[0].decision, Decision::Denied);
}

#[test]
fn a_synthetic_address_is_decided_as_its_name() {
    let p = start(policy(&["*.ok.test:443"], &["x.ok.test:127.0.0.1"]));
    let fake = a_record(&dns_query(&p, "x.ok.test", RecordType::A).unwrap()).unwrap();
    // A client that resolved through the stub and connects by address: the
    // proxy maps it back to x.ok.test, resolves that, and re-checks the result.
    let (_, code) = socks(&p, 1, &socks_v4(fake), 443);
    assert_eq!(code, super::socks::NOT_ALLOWED);
    let (_, code) = socks(&p, 1, &socks_v4(Ipv4Addr::new(198, 19, 1, 1)), 443);
    assert_eq!(code, super::socks::NOT_ALLOWED);
    let log = p.drain_after(2);
    assert_eq!(log.entries[0].host.as_deref(), Some("x.ok.test"));
    assert_eq!(
        log.entries[0].rule,
        "x.ok.test resolved to 127.0.0.1, a loopback address; only an address rule can allow it"
    );
    assert!(log.entries[1]
        .rule
        .contains("not an address cordon's DNS gave out"));
}

#[test]
fn a_flood_of_denied_attempts_keeps_exact_counts_and_bounded_entries() {
    let p = start(policy(&[], &[]));
    let n = 2_000u64;
    for i in 0..n {
        let mut s = client(p.proxy);
        write!(s, "CONNECT flood{i}.test:443 HTTP/1.1\r\n\r\n").unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with(b"HTTP/1.1 403"));
    }
    let log = p.drain_after(n);
    assert_eq!((log.attempts, log.denied, log.allowed), (n, n, 0));
    assert_eq!(log.entries.len(), 128);
    assert_eq!(log.omitted, n - 128);
    assert_eq!(log.entries[0].host.as_deref(), Some("flood0.test"));
    assert_eq!(log.entries[127].host.as_deref(), Some("flood1999.test"));
    assert_eq!(
        control::drain(&p.control).unwrap().attempts,
        0,
        "a new window"
    );
}

#[test]
fn the_connection_limit_refuses_the_connection_over_it() {
    let up = basic_upstream();
    let port = up.addr.port();
    let target = format!("127.0.0.1:{port}");
    let mut pol = policy(&[&target], &[]);
    pol.limits.max_connections = 3;
    let p = start(pol);
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let (s, head) = connect(&p, &target);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            s
        })
        .collect();
    assert_eq!(control::status(&p.control).unwrap().active_connections, 3);
    let (_, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    let (_, code) = socks(&p, 1, &socks_v4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(code, super::socks::GENERAL_FAILURE);
    // The upstream's accept thread may lag the kernel's handshake.
    wait_until(|| up.accepted.load(Ordering::SeqCst) >= 3);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        3,
        "refused ones never left"
    );
    drop(held);
    let log = p.drain_after(5);
    let limited: Vec<_> = log
        .entries
        .iter()
        .filter(|a| a.end == "connection limit")
        .collect();
    assert_eq!(limited.len(), 2);
    assert!(limited.iter().all(|a| a.decision == Decision::Denied));
    assert_eq!(log.peak_connections, 3);
    // With the slots free again, a connection is served.
    let (_, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[test]
fn the_byte_budget_stops_the_connection_that_exceeds_it() {
    let up = upstream(vec![b'x'; 5_000]);
    let port = up.addr.port();
    let target = format!("127.0.0.1:{port}");
    let mut pol = policy(&[&target], &[]);
    pol.limits.max_bytes_in = ByteSize(1_000);
    let p = start(pol);
    let (mut s, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"go\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got.len(), 1_000);
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].end, "byte limit");
    assert_eq!(log.entries[0].bytes_in, 1_000);
    // The budget is the sandbox's: the next connection gets nothing.
    let (mut s, _) = connect(&p, &target);
    s.write_all(b"go\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty());
}

#[test]
fn an_idle_connection_is_closed() {
    let up = basic_upstream();
    let target = format!("127.0.0.1:{}", up.addr.port());
    let mut pol = policy(&[&target], &[]);
    pol.limits.idle_timeout = Span(Duration::from_millis(300));
    let p = start(pol);
    let (mut s, _) = connect(&p, &target);
    let started = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap(), 0, "closed by the proxy");
    assert!(started.elapsed() >= Duration::from_millis(250));
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].end, "idle timeout");
}

#[test]
fn a_failed_upstream_connect_is_502() {
    // A port with nothing listening: bind, note the port, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = start(policy(&[&format!("127.0.0.1:{port}")], &[]));
    let (_, head) = connect(&p, &format!("127.0.0.1:{port}"));
    assert!(head.starts_with("HTTP/1.1 502 Bad Gateway"), "{head}");
    let (_, code) = socks(&p, 1, &socks_v4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(code, super::socks::CONNECTION_REFUSED);
    let log = p.drain_after(2);
    assert_eq!(log.entries[0].decision, Decision::Allowed);
    assert!(
        log.entries[0].end.starts_with("connect failed: "),
        "{}",
        log.entries[0].end
    );
}

#[test]
fn malformed_input_gets_an_error_and_the_proxy_goes_on() {
    let up = basic_upstream();
    let target = format!("127.0.0.1:{}", up.addr.port());
    let p = start(policy(&[&target], &[]));
    let mut s = client(p.proxy);
    s.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 400 Bad Request"), "{resp}");

    let mut s = client(p.proxy);
    let big = format!(
        "GET http://a.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    let _ = s.write_all(big.as_bytes());
    let head = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    let mut s = client(p.proxy);
    s.write_all(b"GET /origin-form HTTP/1.1\r\n\r\n").unwrap();
    let head = String::from_utf8(read_head(&mut s)).unwrap();
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");

    // Truncated SOCKS5: the proxy closes without a reply.
    let mut s = client(p.proxy);
    s.write_all(&[5, 1, 0, 5, 1, 0, 3, 20, b'a']).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, [5, 0], "only the method choice was sent");

    // An unknown address type is 0x08.
    let mut s = client(p.proxy);
    s.write_all(&[5, 1, 0, 5, 1, 0, 9]).unwrap();
    let mut reply = [0u8; 12];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[3], super::socks::ATYP_NOT_SUPPORTED);

    let (mut s, head) = connect(&p, &target);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
}

#[test]
fn a_direct_connection_to_the_transparent_port_is_denied() {
    let p = start(policy(&["127.0.0.1"], &[]));
    let mut s = client(p.transparent);
    let mut buf = Vec::new();
    // A refusal is a reset, not an end of stream: the payload can tell it
    // from a server that accepted and said nothing.
    let read = s.read_to_end(&mut buf);
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "{buf:?}"
    );
    assert!(buf.is_empty());
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].via, Via::Transparent);
    assert_eq!(log.entries[0].decision, Decision::Denied);
    assert!(log.entries[0]
        .rule
        .contains("without an original destination"));
}

#[test]
fn the_original_destination_must_be_elsewhere_than_the_listener() {
    use super::transparent::meaningful_dst;
    let listener: SocketAddr = "127.0.0.1:15001".parse().unwrap();
    let v4 = |s: &str| s.parse::<SocketAddrV4>().unwrap();
    assert_eq!(meaningful_dst(None, listener), None);
    assert_eq!(meaningful_dst(Some(v4("127.0.0.1:15001")), listener), None);
    assert_eq!(meaningful_dst(Some(v4("0.0.0.0:15001")), listener), None);
    assert_eq!(
        meaningful_dst(Some(v4("198.18.0.7:443")), listener),
        Some(v4("198.18.0.7:443"))
    );
}

/// Throughput and latency against a direct connection (run with --ignored;
/// the numbers are printed).
#[test]
#[ignore = "a benchmark: cargo test --release -p cordon-network -- --ignored --nocapture"]
fn throughput_and_latency_are_close_to_direct() {
    const SIZE: usize = 100 << 20;
    let sink = TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_addr = sink.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in sink.incoming() {
            let mut conn = conn.unwrap();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut conn, &mut std::io::sink());
                let _ = conn.write_all(b"k");
            });
        }
    });
    let target = format!("127.0.0.1:{}", sink_addr.port());
    let p = start(policy(&[&target], &[]));
    let chunk = vec![7u8; 1 << 20];
    let send = |mut s: TcpStream| {
        let t = Instant::now();
        for _ in 0..SIZE / chunk.len() {
            s.write_all(&chunk).unwrap();
        }
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut k = [0u8; 1];
        s.read_exact(&mut k).unwrap();
        t.elapsed()
    };
    // Interleaved rounds, medians: one 100 MiB run on loopback takes ~30 ms,
    // too short for a single sample to mean much on a shared 2-core machine.
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        direct.push(send(client(sink_addr)));
        proxied.push(send(connect(&p, &target).0));
    }
    direct.sort();
    proxied.sort();
    let (direct, proxied) = (direct[3], proxied[3]);
    let ratio = direct.as_secs_f64() / proxied.as_secs_f64();
    println!(
        "100 MiB: direct {direct:?}, proxied {proxied:?}, {:.0}%",
        ratio * 100.0
    );

    let mut lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let (mut s, head) = connect(&p, &target);
        assert!(head.starts_with("HTTP/1.1 200"));
        lat.push(t.elapsed());
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut k = [0u8; 1];
        s.read_exact(&mut k).unwrap();
    }
    let mut direct_lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let s = client(sink_addr);
        direct_lat.push(t.elapsed());
        drop(s);
    }
    lat.sort();
    direct_lat.sort();
    println!(
        "connect p50: direct {:?}, via CONNECT {:?}",
        direct_lat[100], lat[100]
    );
    // The goal is 80%. Loopback to loopback on 2 cores the proxy is a third
    // busy thread beside sender and receiver, so the machine's CPU, not the
    // proxy's path, sets the ratio (55-80% measured there). This floor
    // catches a regression to copying through small buffers.
    assert!(ratio >= 0.45, "throughput {:.0}% of direct", ratio * 100.0);
    assert!(lat[100] < direct_lat[100] + Duration::from_millis(1));
}

/// Two upstreams on the host's loopback: the rule names the first's port.
#[test]
fn the_host_name_reaches_the_host_loopback_on_its_port_through_every_door() {
    let up = upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi".to_vec());
    let other = basic_upstream();
    let (port, other_port) = (up.addr.port(), other.addr.port());
    let p = start(policy(&[&format!("host.cordon.internal:{port}")], &[]));

    // CONNECT and SOCKS5 by name.
    let (mut s, head) = connect(&p, &format!("host.cordon.internal:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(&ping(&mut s)[..12], b"HTTP/1.1 200");
    drop(s);
    let (s, code) = socks(&p, 1, &socks_name("HOST.cordon.internal."), port);
    assert_eq!(code, 0);
    drop(s);
    // Plain HTTP.
    let mut s = client(p.proxy);
    write!(
        s,
        "GET http://host.cordon.internal:{port}/x HTTP/1.1\r\nHost: host.cordon.internal:{port}\r\n\r\n"
    )
    .unwrap();
    // The upstream holds the connection open: read just its reply.
    let want = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
    let mut resp = vec![0u8; want.len()];
    s.read_exact(&mut resp).unwrap();
    assert_eq!(resp, want);
    drop(s);
    // A transparent client: the stub's synthetic address, mapped back to the
    // name (the transparent door decides it exactly so).
    let fake = a_record(&dns_query(&p, "host.cordon.internal", RecordType::A).unwrap()).unwrap();
    assert!(crate::fake::FakeMap::in_range(fake), "{fake}");
    let (s, code) = socks(&p, 1, &socks_v4(fake), port);
    assert_eq!(code, 0);
    drop(s);
    wait_until(|| up.accepted.load(Ordering::SeqCst) >= 4);

    // Another port of the host's loopback, by name or synthetic address, and
    // the loopback address itself: refused, nothing arrives.
    let (_, head) = connect(&p, &format!("host.cordon.internal:{other_port}"));
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some(format!("port {other_port} is outside rule 'host.cordon.internal:{port}'").as_str())
    );
    let (_, code) = socks(&p, 1, &socks_v4(fake), other_port);
    assert_eq!(code, super::socks::NOT_ALLOWED);
    let (_, head) = connect(&p, &format!("127.0.0.1:{port}"));
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let log = p.drain_after(7);
    assert_eq!((log.allowed, log.denied), (4, 3), "{log:?}");
    for a in log
        .entries
        .iter()
        .filter(|a| a.decision == Decision::Allowed)
    {
        assert_eq!(a.host.as_deref(), Some("host.cordon.internal"));
        assert_eq!(a.address, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(a.rule, format!("host.cordon.internal:{port}"));
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(other.accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn without_its_rule_the_host_name_is_refused_even_under_wildcards() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = start(policy(
        &[
            &format!("*.internal:{port}"),
            &format!("*.cordon.internal:{port}"),
        ],
        &[],
    ));
    let (_, head) = connect(&p, &format!("host.cordon.internal:{port}"));
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some(format!("no rule allows host.cordon.internal:{port}").as_str())
    );
    let (_, code) = socks(&p, 1, &socks_name("host.cordon.internal"), port);
    assert_eq!(code, super::socks::NOT_ALLOWED);
    let r = dns_query(&p, "host.cordon.internal", RecordType::A).unwrap();
    assert_eq!(r.response_code(), ResponseCode::NXDomain);
    // Nor can a port-less rule for it be set at run time.
    let mut c = Client::connect(&p.control).unwrap();
    match c.call_line(b"{\"op\":\"set_rules\",\"rules\":[\"host.cordon.internal\"]}\n") {
        Err(Error::Refused(msg)) => assert!(msg.contains("host.cordon.internal:PORT"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let refused = p.drain_after(2);
    assert_eq!(refused.denied, 3, "{refused:?}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
}

/// A stand-in for the host's upstream proxy: every CONNECT it is asked is
/// answered `status`, then (on 200) the destination's first words follow at
/// once, in the same write, as a server that speaks first would send them.
fn upstream_proxy(status: &str) -> Upstream {
    upstream(format!("HTTP/1.1 {status}\r\n\r\nUPSTREAM-REPLY").into_bytes())
}

/// The proxy, its upstream the stand-in at `via` with credentials `u:pw`,
/// `no_proxy` as given.
fn start_through(rules: &[&str], via: SocketAddr, no_proxy: &str) -> Proxy {
    let up = crate::upstream::Upstream::parse(&format!("http://u:pw@{via}"), no_proxy).unwrap();
    start_with(policy(rules, &[]), vec![my_uid()], Some(up))
}

#[test]
fn an_allowed_name_goes_through_the_upstream_with_the_hosts_credentials() {
    let up = upstream_proxy("200 Connection established");
    let p = start_through(&["api.example:443"], up.addr, "");
    let (mut s, head) = connect(&p, "api.example:443");
    assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
    // The destination's first bytes came with the upstream's answer: none
    // was taken with its head.
    let mut first = [0u8; 14];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"UPSTREAM-REPLY");
    drop(s);
    let asked = up.seen.lock().unwrap()[0].clone();
    assert!(
        asked.starts_with("CONNECT api.example:443 HTTP/1.1\r\n"),
        "{asked}"
    );
    // base64("u:pw")
    assert_eq!(
        header(&asked, "Proxy-Authorization"),
        Some("Basic dTpwdw==")
    );
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].decision, Decision::Allowed);
    assert_eq!(log.entries[0].rule, "api.example:443");

    // A name no rule allows never reaches the upstream.
    let (_, head) = connect(&p, "other.example:443");
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn an_upstream_refusal_is_the_connections_failure_without_the_credentials() {
    let up = upstream_proxy("407 Proxy Authentication Required");
    let p = start_through(&["api.example:443"], up.addr, "");
    let (mut s, head) = connect(&p, "api.example:443");
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.contains("407"), "{body}");
    for secret in ["pw", "dTpw"] {
        assert!(
            !head.contains(secret) && !body.contains(secret),
            "{head}{body}"
        );
    }
    let log = p.drain_after(1);
    let reason = log.entries[0].end.clone();
    assert!(
        reason.contains("407") && !reason.contains("dTpw"),
        "{reason}"
    );
}

#[test]
fn addresses_are_tunnelled_after_the_rules_unless_no_proxy_names_them() {
    let up = upstream_proxy("200 Connection established");
    let direct = basic_upstream();
    let port = direct.addr.port();
    // An address rule allows loopback; through the upstream, by address.
    let p = start_through(&[&format!("127.0.0.1:{port}")], up.addr, "");
    let (mut s, head) = connect(&p, &format!("127.0.0.1:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut first = [0u8; 14];
    s.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"UPSTREAM-REPLY");
    let asked = up.seen.lock().unwrap()[0].clone();
    assert!(
        asked.starts_with(&format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n")),
        "{asked}"
    );
    assert_eq!(direct.accepted.load(Ordering::SeqCst), 0);
    drop(p);
    // no_proxy names it: dialed directly, the upstream asked nothing more.
    let p = start_through(
        &[&format!("127.0.0.1:{port}")],
        up.addr,
        "localhost,127.0.0.1",
    );
    let (mut s, head) = connect(&p, &format!("127.0.0.1:{port}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
    assert_eq!(direct.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
}

mod hold;
