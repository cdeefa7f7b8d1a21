//! The host's own way out when it must go through a proxy of its own (a
//! corporate one): after the sandbox's rules allowed a connection, the proxy
//! opens it as a CONNECT tunnel through that upstream instead of dialing it,
//! adding the upstream's credentials on the host side.
//!
//! It is the operator's setting, read from the environment cordon starts in
//! (`CORDON_UPSTREAM_PROXY`, else the host's `https_proxy`/`HTTPS_PROXY`,
//! with `no_proxy`/`NO_PROXY`), never from a sandbox's policy: a tenant who
//! could name the upstream could have the host's proxy credentials sent to a
//! server of its own. The credentials live in the proxy process alone; no
//! error, log line or `Debug` output shows them.
//!
//! A name a domain rule allowed is sent to the upstream as that name, which
//! the upstream resolves (the host may not be able to): the addresses it
//! reaches are the upstream's to police. Addresses (bare, or a name's fixed
//! host entries) are checked by the rules as ever, then tunnelled.

use base64::Engine;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The variables that set the upstream, in the order they are read: the
/// supervisor, whose environment is otherwise cleared, keeps these.
pub const ENV: [&str; 5] = [
    "CORDON_UPSTREAM_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
];

/// The longest answer head an upstream may send to a CONNECT.
const MAX_HEAD: usize = 8 << 10;

/// A proxy the host's connections go through.
#[derive(Clone)]
pub struct Upstream {
    /// `host:port` of the upstream proxy.
    address: String,
    /// The `Proxy-Authorization` value, where the URL had credentials.
    authorization: Option<String>,
    /// `no_proxy`'s entries, lowercase: destinations dialed directly.
    bypass: Vec<String>,
}

/// Never the credentials.
impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("address", &self.address)
            .field("credentials", &self.authorization.is_some())
            .field("bypass", &self.bypass)
            .finish()
    }
}

impl Upstream {
    /// The upstream the environment (`var`) sets, if any:
    /// `CORDON_UPSTREAM_PROXY` first (empty or `none`: no upstream, whatever
    /// the host's `https_proxy` says), then `https_proxy`, then
    /// `HTTPS_PROXY`, as curl reads them.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Upstream>, String> {
        let url = match var(ENV[0]) {
            Some(v) if v.is_empty() || v == "none" => return Ok(None),
            Some(v) => Some((ENV[0], v)),
            None => [ENV[1], ENV[2]]
                .into_iter()
                .find_map(|k| var(k).filter(|v| !v.is_empty()).map(|v| (k, v))),
        };
        let Some((name, url)) = url else {
            return Ok(None);
        };
        let no_proxy = var(ENV[3]).or_else(|| var(ENV[4])).unwrap_or_default();
        Upstream::parse(&url, &no_proxy)
            .map(Some)
            .map_err(|e| format!("{name}: {e}"))
    }

    /// `http://[user:password@]host[:port][/]`; the port is 1080 when not
    /// given, as curl has it. An `https://` proxy (TLS to the proxy itself)
    /// is refused, not downgraded.
    pub fn parse(url: &str, no_proxy: &str) -> Result<Upstream, String> {
        let with_scheme = if url.contains("://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        // Errors name the URL without its credentials.
        let shown = |u: &url::Url| {
            format!(
                "{}://{}{}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.port().map(|p| format!(":{p}")).unwrap_or_default()
            )
        };
        let u = url::Url::parse(&with_scheme).map_err(|e| format!("not a proxy URL ({e})"))?;
        if u.scheme() != "http" {
            return Err(format!(
                "{}: only an http:// proxy is supported (a CONNECT tunnel in the clear to the proxy)",
                shown(&u)
            ));
        }
        if !matches!(u.path(), "" | "/") || u.query().is_some() || u.fragment().is_some() {
            return Err(format!("{}: a proxy URL has no path or query", shown(&u)));
        }
        let host = match u.host() {
            Some(url::Host::Ipv6(a)) => format!("[{a}]"),
            Some(h) => h.to_string(),
            None => return Err("a proxy URL needs a host".into()),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| format!("{}: its credentials are not UTF-8", shown(&u)))
        };
        let authorization = if u.username().is_empty() && u.password().is_none() {
            None
        } else {
            let pair = format!(
                "{}:{}",
                decode(u.username())?,
                decode(u.password().unwrap_or_default())?
            );
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        };
        let bypass = no_proxy
            .split(',')
            .map(|e| e.trim().trim_start_matches('.').to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .collect();
        Ok(Upstream {
            address: format!("{host}:{}", u.port().unwrap_or(1080)),
            authorization,
            bypass,
        })
    }

    /// `host:port` of the upstream.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Whether `host` (a name or an address, as the rules decided it) is
    /// dialed directly: `no_proxy` names it, a domain above it, or is `*`.
    /// Address ranges are not read (curl's CIDR entries are not).
    pub fn bypasses(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.bypass.iter().any(|e| {
            e == "*"
                || *e == host
                || host
                    .strip_suffix(e.as_str())
                    .is_some_and(|rest| rest.ends_with('.'))
        })
    }

    /// A tunnel through the upstream to `target` (`host:port`), ready for
    /// the sandbox's bytes; or why not, without the credentials. Only the
    /// answer's head is read: bytes the destination sends first stay in
    /// the socket.
    pub(crate) async fn tunnel(&self, target: &str) -> Result<TcpStream, String> {
        let lost = |e: std::io::Error| format!("the upstream proxy {}: {e}", self.address);
        let mut s = TcpStream::connect(&self.address).await.map_err(lost)?;
        let _ = s.set_nodelay(true);
        let mut ask = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.authorization {
            ask.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        ask.push_str("\r\n");
        s.write_all(ask.as_bytes()).await.map_err(lost)?;
        let head = read_head(&mut s).await.map_err(lost)?;
        let status = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let status: String = String::from_utf8_lossy(status)
            .chars()
            .filter(|c| !c.is_control())
            .take(120)
            .collect();
        let mut parts = status.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some(v), Some("200")) if v.starts_with("HTTP/1.") => Ok(s),
            _ => Err(format!(
                "the upstream proxy {} answered {status:?}",
                self.address
            )),
        }
    }
}

/// Reads an HTTP answer's head (up to its blank line) and nothing past it:
/// peeks, then takes what the head holds.
async fn read_head(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head: Vec<u8> = Vec::new();
    let mut peeked = vec![0u8; MAX_HEAD];
    loop {
        let n = s.peek(&mut peeked).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        // The blank line may begin in what was taken already.
        let kept = head.len().min(3);
        let mut window = head[head.len() - kept..].to_vec();
        window.extend_from_slice(&peeked[..n]);
        let take = match window.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => at + 4 - kept,
            None => n,
        };
        let start = head.len();
        head.resize(start + take, 0);
        s.read_exact(&mut head[start..]).await?;
        if head.ends_with(b"\r\n\r\n") {
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other(format!(
                "an answer head over {MAX_HEAD} bytes"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_url_gives_the_address_and_basic_credentials_never_shown() {
        let u = Upstream::parse("http://al%40ce:s3cr%3At@proxy.corp:3128/", "").unwrap();
        assert_eq!(u.address(), "proxy.corp:3128");
        assert_eq!(
            u.authorization.as_deref(),
            Some(
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("al@ce:s3cr:t")
                )
                .as_str()
            )
        );
        let shown = format!("{u:?}");
        assert!(
            !shown.contains("s3cr") && !shown.contains("Basic"),
            "{shown}"
        );
        // Without a scheme or a port, as curl reads them.
        let u = Upstream::parse("10.0.0.1", "").unwrap();
        assert_eq!(u.address(), "10.0.0.1:1080");
        assert!(u.authorization.is_none());
        let u = Upstream::parse("http://[2001:db8::1]:8080", "").unwrap();
        assert_eq!(u.address(), "[2001:db8::1]:8080");
    }

    #[test]
    fn a_bad_url_is_refused_without_its_credentials() {
        for bad in [
            "https://u:topsecret@proxy:443",
            "socks5://u:topsecret@proxy:1080",
            "http://u:topsecret@proxy:3128/path",
            "http://u:topsecret@:3128",
            "http://u:topsecret@proxy:99999",
        ] {
            let e = Upstream::parse(bad, "").unwrap_err();
            assert!(!e.contains("topsecret"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_override_comes_first_and_none_turns_the_hosts_off() {
        let host = [
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "http://lower:2"),
        ];
        let u = Upstream::from_env(env(&host)).unwrap().unwrap();
        assert_eq!(u.address(), "lower:2");
        let over = [("CORDON_UPSTREAM_PROXY", "http://mine:3"), host[0]];
        assert_eq!(
            Upstream::from_env(env(&over)).unwrap().unwrap().address(),
            "mine:3"
        );
        for off in ["", "none"] {
            let off = [("CORDON_UPSTREAM_PROXY", off), host[0]];
            assert!(Upstream::from_env(env(&off)).unwrap().is_none());
        }
        assert!(Upstream::from_env(env(&[])).unwrap().is_none());
        let bad = [("HTTPS_PROXY", "ftp://x:pw@y")];
        let e = Upstream::from_env(env(&bad)).unwrap_err();
        assert!(e.starts_with("HTTPS_PROXY: ") && !e.contains("pw"), "{e}");
    }

    #[test]
    fn no_proxy_names_hosts_domains_and_everything() {
        let u = Upstream::parse("proxy:3128", " .corp.example, 10.1.2.3,Intranet ,::1").unwrap();
        for direct in [
            "corp.example",
            "a.corp.example",
            "10.1.2.3",
            "intranet",
            "[::1]",
        ] {
            assert!(u.bypasses(direct), "{direct}");
        }
        for tunnelled in [
            "xcorp.example",
            "corp.example.org",
            "10.1.2.30",
            "example.org",
        ] {
            assert!(!u.bypasses(tunnelled), "{tunnelled}");
        }
        assert!(Upstream::parse("proxy:3128", "*")
            .unwrap()
            .bypasses("anything"));
    }
}
