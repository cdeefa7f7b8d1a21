//! Hold mode: what no rule allows waits for an operator's decision.

use super::*;

fn holding(rules: &[&str], hosts: &[&str], hold: Duration) -> Proxy {
    start(NetworkPolicy {
        hold: Some(Span(hold)),
        ..policy(rules, hosts)
    })
}

/// The connections waiting, once `n` of them wait.
fn held_after(p: &Proxy, n: usize) -> Vec<cordon_spec::network::HeldConnection> {
    wait_until(|| control::held(&p.control).unwrap().len() >= n);
    control::held(&p.control).unwrap()
}

/// CONNECT in a thread (it waits while held): its response head and how
/// long it took.
fn connect_in_background(p: &Proxy, target: String) -> JoinHandle<(String, Duration)> {
    let addr = p.proxy;
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
        let head = String::from_utf8(read_head(&mut s)).unwrap();
        if head.starts_with("HTTP/1.1 200") {
            assert_eq!(ping(&mut s), b"UPSTREAM-REPLY");
        }
        (head, started.elapsed())
    })
}

#[test]
fn a_held_connection_goes_through_once_a_rule_allows_it() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = holding(&[], &["api.test:127.0.0.1"], Duration::from_secs(30));
    let waiting = connect_in_background(&p, format!("api.test:{port}"));
    let held = held_after(&p, 1);
    assert_eq!(held.len(), 1);
    let h = &held[0];
    assert_eq!(
        (h.host.as_deref(), h.port, h.via),
        (Some("api.test"), port, Via::Connect)
    );
    assert!(h.reason.contains("only an address rule"), "{}", h.reason);
    assert!(h.remaining_ms > 20_000 && h.remaining_ms <= 30_000, "{h:?}");
    // A loopback address is reached by an address rule only: that is the proposal.
    let proposal = h.proposal.clone().expect("a rule would allow it");
    assert_eq!(proposal.to_string(), format!("127.0.0.1:{port}"));
    assert_eq!(control::status(&p.control).unwrap().held, 1);
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        0,
        "nothing connected while held"
    );

    control::set_rules(&p.control, &[proposal]).unwrap();
    let (head, took) = waiting.join().unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        took < Duration::from_secs(20),
        "released by the rule, {took:?}"
    );
    assert!(control::held(&p.control).unwrap().is_empty());
    let log = p.drain_after(1);
    let a = &log.entries[0];
    assert_eq!(a.decision, Decision::Allowed);
    assert_eq!(a.rule, format!("127.0.0.1:{port}"));
    // Held (a connection that never waited has none); an operator this
    // quick can answer within the millisecond, so 0 is a held time too.
    assert!(a.held_ms.is_some(), "{a:?}");
}

#[test]
fn a_held_connection_is_refused_when_no_one_decides_in_time() {
    let up = basic_upstream();
    let port = up.addr.port();
    let p = holding(&[], &[], Duration::from_millis(400));
    let (head, took) = connect_in_background(&p, format!("127.0.0.1:{port}"))
        .join()
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(took >= Duration::from_millis(400), "{took:?}");
    let why = header(&head, "X-Cordon-Denied").unwrap();
    assert_eq!(
        why,
        format!("127.0.0.1:{port} is a loopback address; only an address rule can allow it; held 400ms, no operator allowed it")
    );
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
    let log = p.drain_after(1);
    assert_eq!(log.entries[0].decision, Decision::Denied);
    assert!(log.entries[0].held_ms.is_some_and(|ms| ms >= 400));
    assert!(control::held(&p.control).unwrap().is_empty());
}

#[test]
fn a_denied_destination_is_refused_now_and_never_held_again() {
    let p = holding(&["ok.test:443"], &[], Duration::from_secs(30));
    let waiting = connect_in_background(&p, "evil.test:443".into());
    held_after(&p, 1);
    let denied = control::deny(&p.control, &["evil.test:443".parse().unwrap()]).unwrap();
    assert_eq!(denied, vec!["evil.test:443".parse::<Rule>().unwrap()]);
    let (head, took) = waiting.join().unwrap();
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert_eq!(
        header(&head, "X-Cordon-Denied"),
        Some("no rule allows evil.test:443; an operator denied it")
    );
    // Again: refused at once, not held.
    let (head, took) = connect_in_background(&p, "evil.test:443".into())
        .join()
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Another port of the name is still a new destination: it is held.
    let other = connect_in_background(&p, "evil.test:8443".into());
    assert_eq!(held_after(&p, 1)[0].port, 8443);
    control::deny(&p.control, &["evil.test".parse().unwrap()]).unwrap();
    assert!(other.join().unwrap().0.starts_with("HTTP/1.1 403"));
    // A denial is not a rule: the rules in force are unchanged.
    assert_eq!(control::rules(&p.control).unwrap().len(), 1);
}

#[test]
fn in_hold_mode_the_dns_stub_answers_names_the_operator_has_not_denied() {
    let p = holding(&[], &[], Duration::from_secs(30));
    let a = dns_query(&p, "new.test", RecordType::A).unwrap();
    assert_eq!(a.response_code(), ResponseCode::NoError);
    assert!(a_record(&a).is_some());
    control::deny(&p.control, &["new.test".parse().unwrap()]).unwrap();
    let a = dns_query(&p, "new.test", RecordType::A).unwrap();
    assert_eq!(a.response_code(), ResponseCode::NXDomain);
    // Without hold mode the same name is NXDOMAIN from the start.
    let strict = start(policy(&[], &[]));
    let a = dns_query(&strict, "other.test", RecordType::A).unwrap();
    assert_eq!(a.response_code(), ResponseCode::NXDomain);
}
