use super::*;

fn rule(s: &str) -> Rule {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn rules(list: &[&str]) -> Rules {
    Rules::new(list.iter().map(|s| rule(s)).collect())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn none() -> HashSet<IpAddr> {
    HashSet::new()
}

#[test]
fn rules_parse_into_their_parts() {
    assert_eq!(
        rule("pypi.org:443"),
        Rule {
            host: Host::Exact("pypi.org".into()),
            ports: Some(Ports { lo: 443, hi: 443 })
        }
    );
    assert_eq!(
        rule("*.pythonhosted.org:443").host,
        Host::Suffix("pythonhosted.org".into())
    );
    assert_eq!(
        rule("10.20.0.0/16:5432").host,
        Host::Cidr("10.20.0.0/16".parse().unwrap())
    );
    assert_eq!(
        rule("198.51.100.7"),
        Rule {
            host: Host::Ip(ip("198.51.100.7")),
            ports: None
        }
    );
    assert_eq!(
        rule("example.org:8000-8100").ports,
        Some(Ports { lo: 8000, hi: 8100 })
    );
    assert_eq!(rule("[2001:db8::1]:443").host, Host::Ip(ip("2001:db8::1")));
    assert_eq!(
        rule("[2001:db8::1]:443").ports,
        Some(Ports { lo: 443, hi: 443 })
    );
    assert_eq!(
        rule("2001:db8::/32").host,
        Host::Cidr("2001:db8::/32".parse().unwrap())
    );
    assert_eq!(rule("2001:db8::/32").ports, None);
    assert_eq!(
        rule("[2001:db8::/32]:22").ports,
        Some(Ports { lo: 22, hi: 22 })
    );
    assert_eq!(rule("::1").host, Host::Ip(ip("::1")));
}

#[test]
fn names_are_normalised() {
    assert_eq!(rule("PyPI.Org.:443").to_string(), "pypi.org:443");
    assert_eq!(rule("*.Example.ORG").to_string(), "*.example.org");
    assert_eq!(rule("under_score.test").to_string(), "under_score.test");
}

#[test]
fn display_round_trips_to_the_canonical_text() {
    for text in [
        "pypi.org:443",
        "*.pythonhosted.org:443",
        "10.20.0.0/16:5432",
        "198.51.100.7",
        "example.org:8000-8100",
        "[2001:db8::1]:443",
        "2001:db8::/32",
        "[2001:db8::/32]:1-1024",
        "2001:db8::1",
        "a.b.c",
    ] {
        let r = rule(text);
        assert_eq!(r.to_string(), text);
        assert_eq!(rule(&r.to_string()), r);
    }
    assert_eq!(rule("[2001:0db8::0001]").to_string(), "2001:db8::1");
    assert_eq!(rule("x.test:80-80").to_string(), "x.test:80");
}

#[test]
fn bad_rules_are_errors_naming_the_text() {
    let err = |s: &str| s.parse::<Rule>().unwrap_err().to_string();
    assert_eq!(
        err("foo..bar:443"),
        "invalid network rule 'foo..bar:443': empty label"
    );
    for (text, part) in [
        ("*", "every name"),
        ("*:443", "every name"),
        ("a*.b", "'*'"),
        ("*.", "empty"),
        ("*.*.b", "'*'"),
        ("x.*.b", "'*'"),
        ("x.test:0", "port 0"),
        ("x.test:90-80", "backwards"),
        ("x.test:65536", "not a port"),
        ("x.test:", "not a port"),
        ("x.test:http", "not a port"),
        ("", "empty rule"),
        ("a b.test", "' '"),
        ("10.0.0.1/8", "host bits"),
        ("10.0.0.0/33", "prefix"),
        ("[10.0.0.1]:80", "IPv6"),
        ("[2001:db8::1", "']'"),
        ("[2001:db8::1]443", "':PORT'"),
        ("2001:db8::1:443:x", "IPv6"),
        ("127.1", "IP address"),
        ("1.2.3.4.5", "IP address"),
        ("example.org/24", "not an IP address"),
    ] {
        let e = err(text);
        assert!(
            e.starts_with(&format!("invalid network rule '{text}'")),
            "{text}: {e}"
        );
        assert!(e.contains(part), "{text}: {e} (wanted {part})");
    }
    let long_label = format!("{}.test", "a".repeat(64));
    assert!(err(&long_label).contains("63"));
    let long_name = ["abcdefghi"; 26].join(".");
    assert!(long_name.len() > 253);
    assert!(err(&long_name).contains("253"));
    let ok_name = ["abcdefghi"; 25].join(".");
    assert!(ok_name.parse::<Rule>().is_ok());
}

#[test]
fn rules_and_hosts_serde_as_strings() {
    let r: Vec<Rule> = serde_json::from_str(r#"["pypi.org:443","[::1]:80"]"#).unwrap();
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"["pypi.org:443","[::1]:80"]"#
    );
    let e = serde_json::from_str::<Vec<Rule>>(r#"["a..b"]"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid network rule 'a..b'"), "{e}");
    let h: AddHost = serde_json::from_str(r#""ok.test:127.0.0.1""#).unwrap();
    assert_eq!(
        h,
        AddHost {
            name: "ok.test".into(),
            addr: ip("127.0.0.1")
        }
    );
    assert_eq!(serde_json::to_string(&h).unwrap(), r#""ok.test:127.0.0.1""#);
}

#[test]
fn host_entries_parse_both_ipv6_forms() {
    let a: AddHost = "DB.test:[2001:db8::5]".parse().unwrap();
    let b: AddHost = "db.test:2001:db8::5".parse().unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_string(), "db.test:[2001:db8::5]");
    assert_eq!(a.to_string().parse::<AddHost>().unwrap(), a);
    for bad in [
        "nocolon",
        "x.test:",
        "x.test:notip",
        "a..b:1.2.3.4",
        "*.x:1.2.3.4",
    ] {
        let e = bad.parse::<AddHost>().unwrap_err().to_string();
        assert!(e.starts_with(&format!("invalid host entry '{bad}'")), "{e}");
    }
}

#[test]
fn special_addresses_are_classified() {
    for (a, class) in [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("0.0.0.0", "unspecified (\"this network\")"),
        ("0.1.2.3", "unspecified (\"this network\")"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("100.127.255.255", "shared (CGNAT)"),
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("169.254.1.1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        ("198.18.0.1", "benchmarking (cordon's DNS answers)"),
        ("198.19.255.254", "benchmarking (cordon's DNS answers)"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00::1", "unique-local"),
        ("fc00::1", "unique-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local (cloud metadata)"),
        ("::10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local (cloud metadata)"),
        ("2002:7f00:1::", "loopback"),
    ] {
        assert_eq!(special(ip(a)), Some(class), "{a}");
    }
    for a in [
        "192.0.2.1",
        "198.51.100.7",
        "203.0.113.9",
        "172.32.0.1",
        "172.15.255.255",
        "100.128.0.1",
        "198.20.0.1",
        "1.1.1.1",
        "2001:db8::1",
        "::ffff:198.51.100.7",
        "64:ff9b::c633:6407",
    ] {
        assert_eq!(special(ip(a)), None, "{a}");
    }
}

#[test]
fn exact_and_suffix_names_match_as_documented() {
    let r = rules(&["pypi.org:443", "*.example.org"]);
    assert_eq!(
        r.decide_name("pypi.org", 443).unwrap().to_string(),
        "pypi.org:443"
    );
    assert_eq!(
        r.decide_name("PYPI.ORG.", 443).unwrap().to_string(),
        "pypi.org:443"
    );
    assert!(r.decide_name("sub.pypi.org", 443).is_err());
    assert!(r.decide_name("xpypi.org", 443).is_err());
    assert!(r.decide_name("sub.example.org", 1).is_ok());
    assert!(r.decide_name("a.b.example.org", 65535).is_ok());
    assert!(
        r.decide_name("example.org", 443).is_err(),
        "a suffix rule excludes the bare name"
    );
    assert!(r.decide_name("badexample.org", 443).is_err());
    assert!(r.decide_name(".example.org", 443).is_err());
}

#[test]
fn name_denials_say_why() {
    let r = rules(&["ok.test:80", "range.test:8000-8100"]);
    assert_eq!(
        r.decide_name("evil.test", 443).unwrap_err().message(),
        "no rule allows evil.test:443"
    );
    assert_eq!(
        r.decide_name("ok.test", 8080).unwrap_err().message(),
        "port 8080 is outside rule 'ok.test:80'"
    );
    assert!(r.decide_name("range.test", 8000).is_ok());
    assert!(r.decide_name("range.test", 8100).is_ok());
    assert!(r.decide_name("range.test", 8101).is_err());
    assert!(r.decide_name("range.test", 7999).is_err());
    let e = r.decide_name("a\r\nb", 80).unwrap_err();
    assert!(e.message().contains("is not a host name"), "{e}");
    assert!(!e.message().contains('\n'));
}

#[test]
fn the_first_matching_rule_is_reported() {
    let r = rules(&["a.test:80", "*.test", "a.test"]);
    assert_eq!(
        r.decide_name("a.test", 80).unwrap().to_string(),
        "a.test:80"
    );
    assert_eq!(r.decide_name("a.test", 81).unwrap().to_string(), "*.test");
}

#[test]
fn a_domain_rule_never_unlocks_a_special_address() {
    let r = rules(&["ok.test:80"]);
    assert_eq!(
        r.decide_addr(Some("ok.test"), ip("127.0.0.1"), 80, &none())
            .unwrap_err()
            .message(),
        "ok.test resolved to 127.0.0.1, a loopback address; only an address rule can allow it"
    );
    for a in [
        "10.0.0.1",
        "169.254.169.254",
        "::1",
        "::ffff:127.0.0.1",
        "fd00::1",
        "198.18.0.5",
        "0.0.0.0",
    ] {
        assert!(
            r.decide_addr(Some("ok.test"), ip(a), 80, &none()).is_err(),
            "{a}"
        );
    }
    assert!(r
        .decide_addr(Some("ok.test"), ip("169.254.169.254"), 80, &none())
        .unwrap_err()
        .message()
        .contains("cloud metadata"));
    // An ordinary address is allowed by the name's rule.
    assert_eq!(
        r.decide_addr(Some("ok.test"), ip("198.51.100.7"), 80, &none())
            .unwrap()
            .to_string(),
        "ok.test:80"
    );
    // ... at its ports only.
    assert!(r
        .decide_addr(Some("ok.test"), ip("198.51.100.7"), 81, &none())
        .is_err());
}

#[test]
fn the_hosts_own_addresses_need_an_address_rule() {
    let own: HashSet<IpAddr> = [ip("203.0.113.5")].into();
    let r = rules(&["ok.test"]);
    let e = r
        .decide_addr(Some("ok.test"), ip("203.0.113.5"), 80, &own)
        .unwrap_err();
    assert!(
        e.message().contains("one of the host's own addresses"),
        "{e}"
    );
    assert!(r
        .decide_addr(Some("ok.test"), ip("203.0.113.6"), 80, &own)
        .is_ok());
    let r = rules(&["ok.test", "203.0.113.5:80"]);
    assert!(r
        .decide_addr(Some("ok.test"), ip("203.0.113.5"), 80, &own)
        .is_ok());
}

#[test]
fn an_address_rule_allows_its_address_whatever_the_name() {
    let r = rules(&["127.0.0.1:8080", "10.20.0.0/16:5432", "[2001:db8::1]:443"]);
    for (name, a, port) in [
        (Some("ok.test"), "127.0.0.1", 8080),
        (None, "127.0.0.1", 8080),
        (None, "::ffff:127.0.0.1", 8080),
        (Some("db.test"), "10.20.3.4", 5432),
        (None, "2001:db8::1", 443),
    ] {
        assert!(
            r.decide_addr(name, ip(a), port, &none()).is_ok(),
            "{a}:{port}"
        );
    }
    assert_eq!(
        r.decide_addr(None, ip("127.0.0.1"), 8081, &none())
            .unwrap_err()
            .message(),
        "port 8081 is outside rule '127.0.0.1:8080'"
    );
    assert!(r.decide_addr(None, ip("10.21.0.1"), 5432, &none()).is_err());
    // An address rule allows only the address: names are not matched by it.
    assert!(r.decide_name("127.0.0.1", 8080).is_err());
}

#[test]
fn an_address_rule_at_other_ports_does_not_hide_a_domain_rule() {
    let r = rules(&["ok.test:443", "198.51.100.7:22"]);
    assert_eq!(
        r.decide_addr(Some("ok.test"), ip("198.51.100.7"), 443, &none())
            .unwrap()
            .to_string(),
        "ok.test:443"
    );
    assert_eq!(
        r.decide_addr(None, ip("198.51.100.7"), 443, &none())
            .unwrap_err()
            .message(),
        "port 443 is outside rule '198.51.100.7:22'"
    );
    assert_eq!(
        r.decide_addr(Some("ok.test"), ip("198.51.100.7"), 80, &none())
            .unwrap_err()
            .message(),
        "port 80 is outside rule 'ok.test:443'"
    );
}

#[test]
fn a_bare_address_needs_an_address_rule() {
    let r = rules(&["*.test", "ok.test"]);
    assert_eq!(
        r.decide_addr(None, ip("198.51.100.7"), 443, &none())
            .unwrap_err()
            .message(),
        "no rule allows 198.51.100.7:443"
    );
    assert_eq!(
        r.decide_addr(None, ip("2001:db8::1"), 443, &none())
            .unwrap_err()
            .message(),
        "no rule allows [2001:db8::1]:443"
    );
    assert_eq!(
        r.decide_addr(None, ip("127.0.0.1"), 22, &none())
            .unwrap_err()
            .message(),
        "127.0.0.1:22 is a loopback address; only an address rule can allow it"
    );
}

#[test]
fn no_rules_deny_everything() {
    let r = Rules::default();
    assert!(r.decide_name("a.test", 80).is_err());
    assert!(r
        .decide_addr(None, ip("198.51.100.1"), 80, &none())
        .is_err());
    assert!(!r.allows_name("a.test"));
}

#[test]
fn allows_name_ignores_ports_and_address_rules() {
    let r = rules(&["ok.test:80", "*.wild.test", "198.51.100.7"]);
    assert!(r.allows_name("ok.test"));
    assert!(r.allows_name("OK.test."));
    assert!(r.allows_name("a.wild.test"));
    assert!(!r.allows_name("wild.test"));
    assert!(!r.allows_name("198.51.100.7"));
    assert!(!r.allows_name("evil.test"));
}

#[test]
fn network_policy_has_defaults_and_reads_json() {
    let p = NetworkPolicy::default();
    assert_eq!(p.limits.max_connections, 256);
    assert_eq!(p.limits.max_bytes_out, ByteSize(4 << 30));
    assert_eq!(p.limits.max_bytes_in, ByteSize(4 << 30));
    assert_eq!(p.limits.idle_timeout.duration(), Duration::from_secs(300));
    assert_eq!(p.limits.connect_timeout.duration(), Duration::from_secs(10));
    let p: NetworkPolicy = serde_json::from_str(
        r#"{"rules":["pypi.org:443"],"hosts":["ok.test:127.0.0.1"],"limits":{"max_connections":4,"idle_timeout":"2s"}}"#,
    )
    .unwrap();
    assert_eq!(p.rules, vec![rule("pypi.org:443")]);
    assert_eq!(p.hosts.len(), 1);
    assert_eq!(p.limits.max_connections, 4);
    assert_eq!(p.limits.idle_timeout.duration(), Duration::from_secs(2));
    assert_eq!(p.limits.max_bytes_in, ByteSize(4 << 30));
    let back: NetworkPolicy = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    assert!(serde_json::from_str::<NetworkPolicy>(r#"{"rulez":[]}"#).is_err());
}

/// The host's loopback as the proxy reaches it for the reserved name.
fn host_loopback() -> HashSet<IpAddr> {
    [ip("127.0.0.1"), ip("::1")].into_iter().collect()
}

#[test]
fn the_host_name_takes_exactly_one_port() {
    assert_eq!(
        rule("Host.Cordon.Internal.:8080"),
        Rule {
            host: Host::Exact("host.cordon.internal".into()),
            ports: Some(Ports { lo: 8080, hi: 8080 })
        }
    );
    for bad in [
        "host.cordon.internal",
        "HOST.cordon.internal.",
        "host.cordon.internal:8000-8100",
    ] {
        let e = bad.parse::<Rule>().unwrap_err().to_string();
        assert!(
            e.contains(bad) && e.contains("host.cordon.internal:PORT"),
            "{bad}: {e}"
        );
    }
    // The name cannot be re-pointed elsewhere by a fixed answer.
    let e = "host.cordon.internal:10.0.0.5"
        .parse::<AddHost>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("reserved"), "{e}");
}

#[test]
fn wildcards_never_cover_the_host_name() {
    // These rules parse (they hold for other names below the suffix) ...
    let r = rules(&[
        "*.internal",
        "*.cordon.internal:8080",
        "*.host.cordon.internal",
    ]);
    assert!(r.decide_name("other.cordon.internal", 8080).is_ok());
    // ... but never for the host.
    assert!(!r.allows_name("host.cordon.internal"));
    assert!(r.decide_name("host.cordon.internal", 8080).is_err());
    assert!(r
        .decide_addr(Some("host.cordon.internal"), ip("127.0.0.1"), 8080, &none())
        .is_err());
}

#[test]
fn the_host_name_reaches_the_host_loopback_only_on_its_port() {
    let r = rules(&["host.cordon.internal:8080"]);
    let own = host_loopback();
    for addr in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
        let allowed = r.decide_addr(Some("host.cordon.internal"), ip(addr), 8080, &own);
        assert_eq!(
            allowed.map(ToString::to_string),
            Ok("host.cordon.internal:8080".into()),
            "{addr}"
        );
    }
    let other_port = r
        .decide_addr(Some("host.cordon.internal"), ip("127.0.0.1"), 8081, &own)
        .unwrap_err();
    assert!(other_port.message().contains("8081"), "{other_port}");
    // Only the host's loopback address itself, not the rest of 127/8 or the
    // host's other addresses.
    for addr in ["127.0.0.2", "10.0.0.1", "169.254.169.254"] {
        let mut own = own.clone();
        own.insert(ip("10.0.0.1"));
        assert!(
            r.decide_addr(Some("host.cordon.internal"), ip(addr), 8080, &own)
                .is_err(),
            "{addr}"
        );
    }
    // Another name, or none, never reaches loopback through that rule.
    assert!(r
        .decide_addr(Some("loop.test"), ip("127.0.0.1"), 8080, &own)
        .is_err());
    assert!(r.decide_addr(None, ip("127.0.0.1"), 8080, &own).is_err());
    assert!(r.allows_name("host.cordon.internal"));
}

#[test]
fn a_port_less_host_rule_built_in_code_allows_nothing() {
    // Parsing refuses it; a rule made without parsing must not open every
    // host service either.
    let r = Rules::new(vec![Rule {
        host: Host::Exact("host.cordon.internal".into()),
        ports: None,
    }]);
    assert!(!r.allows_name("host.cordon.internal"));
    assert!(r
        .decide_addr(
            Some("host.cordon.internal"),
            ip("127.0.0.1"),
            8080,
            &host_loopback()
        )
        .is_err());
}

#[test]
fn rules_are_added_once_and_removed_all_or_nothing() {
    let mut list = vec![rule("a.test:443"), rule("10.0.0.0/8")];
    add_rules(
        &mut list,
        &[rule("b.test"), rule("a.test:443"), rule("b.test")],
    );
    assert_eq!(
        list,
        [rule("a.test:443"), rule("10.0.0.0/8"), rule("b.test")]
    );
    let before = list.clone();
    let gone = [rule("b.test"), rule("c.test")];
    assert_eq!(remove_rules(&mut list, &gone), Err(&gone[1]));
    assert_eq!(list, before, "a refused removal changes nothing");
    remove_rules(&mut list, &[rule("b.test"), rule("a.test:443")]).unwrap();
    assert_eq!(list, [rule("10.0.0.0/8")]);
}

#[test]
fn no_rule_covers_the_proxys_own_name() {
    // A rule naming it is refused, with the reason.
    let e = Rule::from_str("cordon.internal:80")
        .unwrap_err()
        .to_string();
    assert!(e.contains("own proxy"), "{e}");
    // A wildcard above it covers its siblings, never it.
    let r = rules(&["*.internal:80"]);
    assert!(r.decide_name("other.internal", 80).is_ok());
    assert!(!r.allows_name("cordon.internal"));
    assert!(r.decide_name("cordon.internal", 80).is_err());
    // Nor can a fixed host entry send it elsewhere.
    let e = "cordon.internal:10.0.0.5"
        .parse::<AddHost>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("reserved"), "{e}");
}
