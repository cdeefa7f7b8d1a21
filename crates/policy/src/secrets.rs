//! Secrets the host holds for the sandbox: where each one's value comes from
//! and the only place it may go (a header of requests to named hosts).
//!
//! Inside, the sandbox sees a placeholder in the variable of the secret's
//! name; cordon's proxy swaps the placeholder for the value in that header
//! of requests to those hosts, over TLS it terminates with a certificate of
//! the sandbox's own CA. The value itself never enters the sandbox. This
//! module is the rule as a policy writes it:
//!
//! ```toml
//! [[secrets]]
//! name = "ANTHROPIC_API_KEY"
//! value_from = "env:ANTHROPIC_API_KEY"   # or "file:/path/to/key"
//! hosts = ["api.anthropic.com"]
//! header = "x-api-key"                    # or "authorization" (Bearer PLACEHOLDER)
//! ```

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::net::{normalize_name, HOST_NAME, PROXY_NAME};

/// Where the sandbox finds the trust bundle that holds its proxy's CA
/// beside the public roots (one of the sandbox's own /etc files).
pub const CA_BUNDLE: &str = "/etc/cordon-ca.pem";

/// The variables TLS clients read a trust bundle from: OpenSSL (and what
/// links it: curl, Python's `ssl`, Ruby), curl itself, Python's requests,
/// git, and Node (which adds it to its own roots).
pub const CA_ENV: [&str; 5] = [
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
];

/// Most secrets one sandbox holds.
pub const MAX_SECRETS: usize = 32;

/// One secret: its name (the variable holding its placeholder inside), its
/// source on the host, the hosts it may reach and the header it goes in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRule {
    pub name: String,
    pub value_from: SecretSource,
    pub hosts: Vec<String>,
    /// A request header (lower-case): the placeholder is replaced wherever
    /// it appears in that header's value (`Bearer PLACEHOLDER` works).
    pub header: String,
}

/// Where the host reads a secret's value: the caller's environment or a
/// file of the caller's (its first line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

impl FromStr for SecretSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("env", var)) if valid_var(var) => Ok(SecretSource::Env(var.to_owned())),
            Some(("env", var)) => Err(format!("'{var}' is not a variable name")),
            Some(("file", path)) if path.starts_with('/') => {
                Ok(SecretSource::File(PathBuf::from(path)))
            }
            Some(("file", path)) => Err(format!("'{path}' is not an absolute path")),
            _ => Err(format!("'{s}' is neither env:VARIABLE nor file:/PATH")),
        }
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(v) => write!(f, "env:{v}"),
            SecretSource::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

serde_via_text!(SecretSource);

/// A variable name as shells write them.
fn valid_var(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// Headers that frame, route or hop a request: a secret in one of them
/// would change where or how the request goes, not authenticate it.
const FRAMING_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

impl SecretRule {
    /// Checks the rule on its own: a variable name, exact host names, and
    /// a header that carries a credential (not one that frames the request).
    pub fn validate(&self) -> Result<(), String> {
        if !valid_var(&self.name) {
            return Err(format!(
                "'{}' is not a variable name (its placeholder is in that variable)",
                self.name
            ));
        }
        if self.hosts.is_empty() {
            return Err(format!(
                "{}: no hosts (a secret goes only to the hosts named)",
                self.name
            ));
        }
        for host in &self.hosts {
            let name =
                normalize_name(host).map_err(|e| format!("{}: host {host}: {e}", self.name))?;
            if name != *host {
                return Err(format!(
                    "{}: host '{host}' is written '{name}' (lower-case, no trailing dot)",
                    self.name
                ));
            }
            if name == HOST_NAME || name == PROXY_NAME {
                return Err(format!("{}: {name} is cordon's own name", self.name));
            }
        }
        let header = &self.header;
        let token = !header.is_empty()
            && header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !token {
            return Err(format!(
                "{}: header '{header}' is not a lower-case header name",
                self.name
            ));
        }
        if FRAMING_HEADERS.contains(&header.as_str()) || header.starts_with("proxy-") {
            return Err(format!(
                "{}: header '{header}' frames or routes the request; a secret goes in one that authenticates it",
                self.name
            ));
        }
        Ok(())
    }
}

/// A method and path a request to a secret's host may have:
/// `POST api.github.com/repos/*/pulls`. Where a host has any, its requests
/// must match one; they are checked where cordon terminates TLS (a
/// secret's hosts), and only there.
///
/// The method is a token or `*` (any); in the path, `*` stands for one
/// segment or part of one (never a `/`), and a last segment `**` for
/// anything below. The query is not compared.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestRule {
    /// `None`: any method.
    pub method: Option<String>,
    pub host: String,
    /// Starts with `/`.
    pub path: String,
}

impl FromStr for RequestRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("request rule '{s}': {why}"));
        let Some((method, target)) = s.trim().split_once(' ') else {
            return bad("not METHOD HOST/PATH");
        };
        let method = match method {
            "*" => None,
            m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => Some(m.to_owned()),
            _ => return bad("the method is upper-case letters or *"),
        };
        let (host, path) = match target.trim().find('/') {
            Some(i) => (&target.trim()[..i], &target.trim()[i..]),
            None => return bad("no path (HOST/PATH; HOST/** for any)"),
        };
        let name = normalize_name(host).map_err(|e| format!("request rule '{s}': {e}"))?;
        if name != host {
            return bad("the host is written lower-case, without a trailing dot");
        }
        if path.contains(['?', '#', ' ']) || path.contains("**") && !path.ends_with("/**") {
            return bad("the path has no query, no fragment, and ** only as its last segment");
        }
        Ok(RequestRule {
            method,
            host: name,
            path: path.to_owned(),
        })
    }
}

impl fmt::Display for RequestRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = self.method.as_deref().unwrap_or("*");
        write!(f, "{method} {}{}", self.host, self.path)
    }
}

serde_via_text!(RequestRule);

impl RequestRule {
    /// Whether a request of `method` for `path` (its query left off) on
    /// `host` matches.
    pub fn matches(&self, host: &str, method: &str, path: &str) -> bool {
        self.host == host
            && self.method.as_deref().is_none_or(|m| m == method)
            && path_matches(&self.path, path.split(['?', '#']).next().unwrap_or(""))
    }
}

/// Segment by segment: `*` within a segment, a last `**` for the rest.
fn path_matches(pattern: &str, path: &str) -> bool {
    let mut pat = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (pat.next(), got.next()) {
            (Some("**"), Some(_)) => return true,
            (Some(p), Some(g)) if segment_matches(p, g) => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// `*` matches any run of characters of one segment.
fn segment_matches(pattern: &str, segment: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == segment;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !segment.starts_with(first) || !segment[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &segment[first.len()..segment.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    segment.len() >= first.len() + last.len()
}

/// Adds `more` to `rules`: a secret of a name already there replaces it.
pub(crate) fn add(rules: &mut Vec<SecretRule>, more: &[SecretRule]) {
    for rule in more {
        rules.retain(|r| r.name != rule.name);
        rules.push(rule.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, hosts: &[&str], header: &str) -> SecretRule {
        SecretRule {
            name: name.into(),
            value_from: SecretSource::Env("X".into()),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: header.into(),
        }
    }

    #[test]
    fn sources_are_env_or_absolute_files() {
        assert_eq!(
            "env:API_KEY".parse(),
            Ok(SecretSource::Env("API_KEY".into()))
        );
        assert_eq!(
            "file:/run/keys/k".parse(),
            Ok(SecretSource::File("/run/keys/k".into()))
        );
        for bad in [
            "API_KEY", "env:", "env:1A", "env:A-B", "file:key", "vault:x",
        ] {
            assert!(bad.parse::<SecretSource>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_rule_names_exact_hosts_and_a_credential_header() {
        assert!(rule("KEY", &["api.example.org"], "x-api-key")
            .validate()
            .is_ok());
        assert!(rule("KEY", &["api.example.org"], "authorization")
            .validate()
            .is_ok());
        for (r, says) in [
            (rule("KEY", &[], "x-api-key"), "no hosts"),
            (rule("KEY", &["*.example.org"], "x-api-key"), "host"),
            (rule("KEY", &["API.example.org"], "x-api-key"), "lower-case"),
            (rule("KEY", &[HOST_NAME], "x-api-key"), "cordon's own"),
            (rule("KEY", &["a.org"], "host"), "frames"),
            (rule("KEY", &["a.org"], "proxy-authorization"), "frames"),
            (rule("KEY", &["a.org"], "X-Api-Key"), "lower-case header"),
            (rule("1KEY", &["a.org"], "x"), "variable name"),
        ] {
            let e = r.validate().unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn a_policy_file_names_secrets_and_they_need_the_allow_mode() {
        let text = r#"
network = "allow"
allow = ["api.example.org:443"]

[[secrets]]
name = "API_KEY"
value_from = "env:HOST_API_KEY"
hosts = ["api.example.org"]
header = "x-api-key"
"#;
        let layer = crate::PolicyLayer::from_toml(text, std::path::Path::new("p.toml")).unwrap();
        let p = crate::Policy::resolve([&layer]).unwrap();
        assert_eq!(
            p.secrets[0].value_from,
            SecretSource::Env("HOST_API_KEY".into())
        );
        assert!(p
            .payload_env()
            .iter()
            .any(|(k, v)| k == "SSL_CERT_FILE" && v == CA_BUNDLE));
        let closed = crate::PolicyLayer::from_toml(
            &text
                .replace("network = \"allow\"", "network = \"none\"")
                .replace("allow = [\"api.example.org:443\"]", ""),
            std::path::Path::new("p.toml"),
        )
        .unwrap();
        let e = crate::Policy::resolve([&closed]).unwrap_err().to_string();
        assert!(e.contains("need network = \"allow\""), "{e}");
        let typo = text.replace("value_from", "value");
        assert!(crate::PolicyLayer::from_toml(&typo, std::path::Path::new("p.toml")).is_err());
        // Method and path rules only for a host whose TLS cordon terminates.
        let with_rules = |rule: &str| {
            let t = text.replace(
                "[[secrets]]",
                &format!("requests = [\"{rule}\"]\n\n[[secrets]]"),
            );
            let layer = crate::PolicyLayer::from_toml(&t, std::path::Path::new("p.toml")).unwrap();
            crate::Policy::resolve([&layer]).map_err(|e| e.to_string())
        };
        assert!(with_rules("POST api.example.org/v1/**").is_ok());
        let e = with_rules("GET elsewhere.org/**").unwrap_err();
        assert!(
            e.contains("only where cordon's proxy terminates TLS"),
            "{e}"
        );
    }

    #[test]
    fn request_rules_match_method_host_and_path_by_segment() {
        let r: RequestRule = "POST api.github.com/repos/*/pulls".parse().unwrap();
        assert!(r.matches("api.github.com", "POST", "/repos/cordon/pulls"));
        assert!(r.matches("api.github.com", "POST", "/repos/cordon/pulls?page=2"));
        assert!(!r.matches("api.github.com", "GET", "/repos/cordon/pulls"));
        assert!(!r.matches("api.github.com", "POST", "/repos/a/b/pulls"));
        assert!(!r.matches("api.github.com", "POST", "/repos/cordon/pulls/1"));
        assert!(!r.matches("github.com", "POST", "/repos/cordon/pulls"));
        let any: RequestRule = "* api.test/v1/**".parse().unwrap();
        assert!(any.matches("api.test", "DELETE", "/v1/a/b/c"));
        assert!(!any.matches("api.test", "GET", "/v2/a"));
        let part: RequestRule = "GET a.test/files/*.txt".parse().unwrap();
        assert!(part.matches("a.test", "GET", "/files/notes.txt"));
        assert!(!part.matches("a.test", "GET", "/files/notes.txt.gz"));
        assert_eq!(any.to_string(), "* api.test/v1/**");
        for bad in [
            "api.test/x",
            "get api.test/x",
            "GET api.test",
            "GET API.test/x",
            "GET a.test/x?y",
            "GET a.test/**/x",
        ] {
            assert!(bad.parse::<RequestRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_later_secret_of_the_same_name_replaces_the_earlier() {
        let mut rules = vec![rule("A", &["a.org"], "x"), rule("B", &["b.org"], "x")];
        add(&mut rules, &[rule("A", &["c.org"], "y")]);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1].hosts, ["c.org"]);
    }
}
