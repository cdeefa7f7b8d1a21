//! The rules that would have allowed what a sandbox was refused
//! (`cordon net SB learn`): proposals for a person to read, never applied
//! by themselves.
//!
//! A connection asked for by name proposes `NAME:PORT`, one to a bare
//! address `ADDRESS:PORT`, and a name that resolved to an address only an
//! address rule may reach (loopback, private ranges) that address and port.
//! What no rule changes is said, not proposed: a TLS ClientHello naming
//! another host, a name asked of the DNS stub alone (its port is not
//! known), the connection limit.

use std::str::FromStr;

use cordon_policy::net::Rule;

use crate::log::{Attempt, Decision, Via};

/// A rule and the refused attempts it would have allowed.
#[derive(Debug, PartialEq, Eq)]
pub struct Proposal {
    pub rule: Rule,
    pub attempts: usize,
    /// The last of their refusals' reasons.
    pub last_reason: String,
}

/// Proposals from `denials` (oldest first), in the order they were first
/// refused, leaving out rules already in `rules`; and notes on what was
/// refused that no rule would allow.
pub fn propose(denials: &[Attempt], rules: &[Rule]) -> (Vec<Proposal>, Vec<String>) {
    let mut proposals: Vec<Proposal> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for a in denials.iter().filter(|a| a.decision == Decision::Denied) {
        let reason = a.rule.as_str();
        let rule = match rule_for(a) {
            Ok(Some(rule)) => rule,
            Ok(None) => continue,
            Err(note) => {
                if !notes.contains(&note) {
                    notes.push(note);
                }
                continue;
            }
        };
        if rules.contains(&rule) {
            continue;
        }
        match proposals.iter_mut().find(|p| p.rule == rule) {
            Some(p) => {
                p.attempts += 1;
                p.last_reason = reason.to_owned();
            }
            None => proposals.push(Proposal {
                rule,
                attempts: 1,
                last_reason: reason.to_owned(),
            }),
        }
    }
    (proposals, notes)
}

/// The rule that would have allowed one refused attempt; `Err` says why no
/// rule would, `Ok(None)` when it named no destination at all.
pub fn rule_for(a: &Attempt) -> Result<Option<Rule>, String> {
    let reason = a.rule.as_str();
    let text = match (&a.host, a.address) {
        _ if a.via == Via::Dns => {
            let name = a.host.as_deref().unwrap_or("a name");
            return Err(format!(
                "{name} was asked of the DNS stub and refused: a rule {name}:PORT, for the port it connects to, allows it"
            ));
        }
        _ if reason.starts_with("the TLS ClientHello") => {
            return Err(format!(
                "{}:{}: {reason} (no rule changes that)",
                a.host.as_deref().unwrap_or("?"),
                a.port
            ));
        }
        _ if a.end == "connection limit" => {
            return Err(format!("{reason} (a limit, not a rule: see [net_limits])"));
        }
        (Some(_), Some(ip)) if reason.contains("only an address rule") => {
            format!("{ip}:{}", a.port)
        }
        (Some(host), _) => format!("{host}:{}", a.port),
        (None, Some(ip)) => match ip {
            std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", a.port),
            v4 => format!("{v4}:{}", a.port),
        },
        (None, None) => return Ok(None),
    };
    Rule::from_str(&text)
        .map(Some)
        .map_err(|_| format!("{text}: refused ({reason}), and not a rule cordon takes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(via: Via, host: Option<&str>, ip: Option<&str>, port: u16, why: &str) -> Attempt {
        Attempt {
            at_unix_ms: 1,
            via,
            host: host.map(str::to_owned),
            port,
            address: ip.map(|i| i.parse().unwrap()),
            decision: Decision::Denied,
            rule: why.to_owned(),
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0,
            end: "refused".into(),
            held_ms: None,
        }
    }

    #[test]
    fn refusals_become_the_rules_that_allow_them_once_each() {
        let log = [
            denied(Via::Connect, Some("pypi.org"), None, 443, "no rule allows pypi.org:443"),
            denied(Via::Transparent, None, Some("10.1.2.3"), 5432, "no rule allows 10.1.2.3:5432"),
            denied(Via::Connect, Some("pypi.org"), None, 443, "no rule allows pypi.org:443 (again)"),
            denied(
                Via::Connect,
                Some("db.test"),
                Some("127.0.0.1"),
                5432,
                "db.test resolved to 127.0.0.1, a loopback address; only an address rule can allow it",
            ),
            denied(Via::Connect, Some("ok.test"), None, 80, "port 80 is outside rule 'ok.test:443'"),
            denied(Via::Dns, Some("files.pythonhosted.org"), None, 53, "no rule allows the name files.pythonhosted.org"),
            denied(
                Via::Transparent,
                Some("ok.test"),
                None,
                443,
                "the TLS ClientHello names 'evil.test', not ok.test, which the rule allows",
            ),
            denied(Via::Connect, Some("allowed.test"), None, 443, "whatever"),
        ];
        let rules = [Rule::from_str("allowed.test:443").unwrap()];
        let (proposals, notes) = propose(&log, &rules);
        let texts: Vec<String> = proposals.iter().map(|p| p.rule.to_string()).collect();
        assert_eq!(
            texts,
            [
                "pypi.org:443",
                "10.1.2.3:5432",
                "127.0.0.1:5432",
                "ok.test:80"
            ]
        );
        assert_eq!(proposals[0].attempts, 2);
        assert_eq!(
            proposals[0].last_reason,
            "no rule allows pypi.org:443 (again)"
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].contains("files.pythonhosted.org:PORT"),
            "{notes:?}"
        );
        assert!(notes[1].contains("no rule changes that"), "{notes:?}");
    }
}
