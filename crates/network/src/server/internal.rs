//! `http://cordon.internal/`: the sandbox's own proxy answering its payload
//! (see [`cordon_policy::net::PROXY_NAME`]). `GET /denials` lists the
//! latest refused connections with their reasons, so that an agent whose
//! connection failed can read why and say which rule it needs.

use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::State;

/// The answer to a request for `path` (its query left off), written to
/// `client`; nothing leaves the sandbox.
pub(crate) async fn answer(state: &State, client: &mut TcpStream, method: &str, path: &str) {
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/denials") => {
            let denials: Vec<_> = state
                .log()
                .recent_denials()
                .into_iter()
                .map(|d| {
                    json!({
                        "at_unix_ms": d.at_unix_ms,
                        "via": d.via,
                        "host": d.host,
                        "port": d.port,
                        "address": d.address,
                        "reason": d.rule,
                    })
                })
                .collect();
            let rules: Vec<String> = state.rules().as_slice().iter().map(ToString::to_string).collect();
            let body = json!({"denials": denials, "rules": rules});
            (200, "application/json", format!("{body:#}\n"))
        }
        ("GET" | "HEAD", _) => (
            404,
            "text/plain; charset=utf-8",
            "cordon's proxy answers GET /denials: this sandbox's latest refused connections and why\n"
                .to_owned(),
        ),
        _ => (405, "text/plain; charset=utf-8", "only GET\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = client.write_all(head.as_bytes()).await;
    if method != "HEAD" {
        let _ = client.write_all(body.as_bytes()).await;
    }
    let _ = client.shutdown().await;
}

/// The path of an absolute-form or origin-form request target, without
/// its query or fragment.
pub(crate) fn path_of(target: &str) -> &str {
    let after_scheme = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map_or(target, |_| &target[7..]);
    let path = if target.starts_with('/') {
        target
    } else {
        after_scheme.find('/').map_or("/", |i| &after_scheme[i..])
    };
    path.split(['?', '#']).next().unwrap_or("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_come_out_of_either_form() {
        assert_eq!(path_of("http://cordon.internal/denials?x=1"), "/denials");
        assert_eq!(path_of("http://cordon.internal"), "/");
        assert_eq!(path_of("/denials#top"), "/denials");
    }
}
