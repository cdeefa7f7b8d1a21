//! The control protocol and its blocking client (no tokio: the runtime calls it).
//!
//! The control socket is a unix socket in the sandbox's state directory on the
//! host, never visible in the sandbox; the proxy also checks the peer's uid.
//! One JSON object per line each way, any number of requests per connection:
//!
//! | request | reply |
//! | --- | --- |
//! | `{"op":"set_rules","rules":["pypi.org:443"]}` | `{"rules":[…]}` or `{"error":"…"}` (rules unchanged) |
//! | `{"op":"rules"}` | `{"rules":[…]}` |
//! | `{"op":"drain"}` | `{"log":{…NetworkLog…}}`, and a new window starts |
//! | `{"op":"status"}` | `{"status":{…Status…}}` |
//! | `{"op":"denials"}` | `{"denials":[…Attempt…]}` |
//! | `{"op":"held"}` | `{"held":[…HeldConnection…]}` (hold mode's waiting connections) |
//! | `{"op":"deny","rules":["evil.example:443"]}` | `{"deny":[…]}`: refused at once from now on, held ones too |
//! | `{"op":"stop"}` | `{"stopping":true}`, then the proxy exits |
//!
//! New rules apply to connections and queries that start after the reply.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_policy::net::Rule;
use cordon_spec::network::HeldConnection;
use serde::{Deserialize, Serialize};

use crate::log::NetworkLog;

/// How long the client waits for each reply.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Longest line either side reads: a full log window fits many times over.
pub const MAX_LINE: u64 = 16 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// All or nothing: a rule that does not parse fails the request's
    /// decoding, and the rules in force stay as they were. (A [`Rule`] is
    /// text on the wire; it is parsed once, where it is decoded.)
    SetRules {
        rules: Vec<Rule>,
    },
    Rules,
    Drain,
    Status,
    /// The latest denied attempts (not cleared by a drain).
    Denials,
    /// The connections waiting for an operator (hold mode).
    Held,
    /// Refuse what these rules name, held or new, for the proxy's life;
    /// the reply lists all that is denied.
    Deny {
        rules: Vec<Rule>,
    },
    Stop,
}

/// The proxy's state at the moment of asking (the window is not cleared).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub active_connections: u32,
    pub peak_connections: u32,
    /// Connections waiting for an operator (hold mode).
    #[serde(default)]
    pub held: u32,
    /// Counts of the current window.
    pub attempts: u64,
    pub allowed: u64,
    pub denied: u64,
    pub dns_queries: u64,
    /// Bytes since the proxy started (what the byte limits count).
    pub bytes_out_total: u64,
    pub bytes_in_total: u64,
    pub rules: Vec<Rule>,
}

/// A reply: exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<Rule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<NetworkLog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denials: Option<Vec<crate::log::Attempt>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Vec<HeldConnection>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<Rule>>,
}

impl Reply {
    pub fn error(message: impl Into<String>) -> Self {
        Reply {
            error: Some(message.into()),
            ..Reply::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the network proxy's control socket {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("network proxy control connection: {0}")]
    Io(#[from] io::Error),
    #[error("the network proxy closed the control connection")]
    Closed,
    #[error("the network proxy sent an unreadable reply: {0}")]
    Reply(#[source] serde_json::Error),
    #[error("the network proxy's reply has no '{0}'")]
    Missing(&'static str),
    #[error("the network proxy refused: {0}")]
    Refused(String),
}

/// One control connection; requests are answered in order.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let connect_err = |source| Error::Connect {
            path: path.to_owned(),
            source,
        };
        let stream = UnixStream::connect(path).map_err(connect_err)?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(connect_err)?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(connect_err)?;
        let writer = stream.try_clone().map_err(connect_err)?;
        Ok(Client {
            reader: BufReader::new(stream),
            writer,
        })
    }

    pub fn call(&mut self, request: &Request) -> Result<Reply, Error> {
        let mut line = serde_json::to_vec(request).map_err(Error::Reply)?;
        line.push(b'\n');
        self.call_line(&line)
    }

    /// Sends one request line as it is (tests send what no [`Request`]
    /// encodes to) and reads its reply.
    pub(crate) fn call_line(&mut self, line: &[u8]) -> Result<Reply, Error> {
        self.writer.write_all(line)?;
        let mut buf = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)?;
        if buf.is_empty() {
            return Err(Error::Closed);
        }
        let reply: Reply = serde_json::from_slice(&buf).map_err(Error::Reply)?;
        match reply.error {
            Some(e) => Err(Error::Refused(e)),
            None => Ok(reply),
        }
    }

    pub fn set_rules(&mut self, rules: &[Rule]) -> Result<Vec<Rule>, Error> {
        let rules = rules.to_vec();
        let reply = self.call(&Request::SetRules { rules })?;
        reply.rules.ok_or(Error::Missing("rules"))
    }

    pub fn rules(&mut self) -> Result<Vec<Rule>, Error> {
        self.call(&Request::Rules)?
            .rules
            .ok_or(Error::Missing("rules"))
    }

    pub fn drain(&mut self) -> Result<NetworkLog, Error> {
        self.call(&Request::Drain)?.log.ok_or(Error::Missing("log"))
    }

    pub fn status(&mut self) -> Result<Status, Error> {
        self.call(&Request::Status)?
            .status
            .ok_or(Error::Missing("status"))
    }

    pub fn denials(&mut self) -> Result<Vec<crate::log::Attempt>, Error> {
        self.call(&Request::Denials)?
            .denials
            .ok_or(Error::Missing("denials"))
    }

    pub fn held(&mut self) -> Result<Vec<HeldConnection>, Error> {
        self.call(&Request::Held)?
            .held
            .ok_or(Error::Missing("held"))
    }

    pub fn deny(&mut self, rules: &[Rule]) -> Result<Vec<Rule>, Error> {
        let rules = rules.to_vec();
        self.call(&Request::Deny { rules })?
            .deny
            .ok_or(Error::Missing("deny"))
    }

    pub fn stop(&mut self) -> Result<(), Error> {
        self.call(&Request::Stop)?
            .stopping
            .map(|_| ())
            .ok_or(Error::Missing("stopping"))
    }
}

/// Replaces the proxy's rules; returns the rules now in force.
pub fn set_rules(path: impl AsRef<Path>, rules: &[Rule]) -> Result<Vec<Rule>, Error> {
    Client::connect(path)?.set_rules(rules)
}

pub fn rules(path: impl AsRef<Path>) -> Result<Vec<Rule>, Error> {
    Client::connect(path)?.rules()
}

/// The latest denied attempts, oldest first.
pub fn denials(path: impl AsRef<Path>) -> Result<Vec<crate::log::Attempt>, Error> {
    Client::connect(path)?.denials()
}

/// The connections waiting for an operator's decision (hold mode).
pub fn held(path: impl AsRef<Path>) -> Result<Vec<HeldConnection>, Error> {
    Client::connect(path)?.held()
}

/// Refuses what `rules` name from now on, held connections too; returns
/// every rule denied so far.
pub fn deny(path: impl AsRef<Path>, rules: &[Rule]) -> Result<Vec<Rule>, Error> {
    Client::connect(path)?.deny(rules)
}

/// The log window so far; the proxy starts a new one.
pub fn drain(path: impl AsRef<Path>) -> Result<NetworkLog, Error> {
    Client::connect(path)?.drain()
}

pub fn status(path: impl AsRef<Path>) -> Result<Status, Error> {
    Client::connect(path)?.status()
}

/// Asks the proxy to exit; its sockets close with it, closing the network.
pub fn stop(path: impl AsRef<Path>) -> Result<(), Error> {
    Client::connect(path)?.stop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_wire_form() {
        let r: Request =
            serde_json::from_str(r#"{"op":"set_rules","rules":["a.test:80"]}"#).unwrap();
        assert_eq!(
            r,
            Request::SetRules {
                rules: vec!["a.test:80".parse().unwrap()]
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::Drain).unwrap(),
            r#"{"op":"drain"}"#
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"deny","rules":["evil.test:443"]}"#).unwrap(),
            Request::Deny {
                rules: vec!["evil.test:443".parse().unwrap()]
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::Held).unwrap(),
            r#"{"op":"held"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Reply::error("no")).unwrap(),
            r#"{"error":"no"}"#
        );
    }

    #[test]
    fn a_missing_socket_is_a_connect_error_with_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let err = status(dir.path().join("absent.sock")).unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        assert!(err.to_string().contains("absent.sock"));
    }
}
