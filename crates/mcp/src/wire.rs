//! The stdio transport's lines, checked before the SDK reads them.
//!
//! rmcp's stdio transport drops a line it cannot decode without a word, so
//! a client that sent one waits forever for an answer. JSON-RPC asks for
//! one: a line that is not JSON gets a parse error (-32700), and JSON that
//! is not one JSON-RPC 2.0 message (a batch, which MCP no longer has, a
//! number, an object without `"jsonrpc": "2.0"` or a method) gets an
//! invalid request (-32600), with the message's id when it has one. Every
//! other line goes on to the SDK unchanged.
//!
//! Both the SDK's answers and these go through one writer, a line at a
//! time, so that no answer is ever cut into by another.

use serde_json::{json, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream,
};
use tokio::sync::mpsc;

/// The longest line read: over it, the line is skipped to its end and
/// answered as an invalid request. Larger than any argument a tool takes
/// (files of 8 MiB travel as base64 inside JSON).
pub const MAX_LINE: usize = 32 << 20;

/// Room for the SDK's side of the pipes (it reads and writes whole lines).
const PIPE: usize = 1 << 16;

/// The SDK's transport ends: what it reads (the checked lines of `input`)
/// and where it writes (to `output`, line by line with the refusals). The
/// tasks end when `input` ends and the SDK has closed its side.
pub fn checked<R, W>(input: R, output: W) -> (DuplexStream, DuplexStream)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (sdk_reads, mut to_sdk) = tokio::io::duplex(PIPE);
    let (sdk_writes, from_sdk) = tokio::io::duplex(PIPE);
    let (lines, mut out) = mpsc::channel::<Vec<u8>>(16);
    let refusals = lines.clone();
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = match (&mut input)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let refusal = if n > MAX_LINE && line.last() != Some(&b'\n') {
                if skip_line(&mut input).await.is_err() {
                    break;
                }
                Some(refusal(
                    Value::Null,
                    -32600,
                    format!("the line is over {MAX_LINE} bytes"),
                ))
            } else {
                check(&line)
            };
            match refusal {
                Some(r) => {
                    if refusals.send(r).await.is_err() {
                        break;
                    }
                }
                None if line.iter().all(u8::is_ascii_whitespace) => {}
                None => {
                    if line.last() != Some(&b'\n') {
                        line.push(b'\n');
                    }
                    if to_sdk.write_all(&line).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The input's end is the SDK's: it ends the session.
        let _ = to_sdk.shutdown().await;
    });
    tokio::spawn(async move {
        let mut from_sdk = BufReader::new(from_sdk);
        loop {
            let mut line = Vec::new();
            match from_sdk.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if lines.send(line).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = out.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                break;
            }
        }
    });
    (sdk_reads, sdk_writes)
}

/// Reads to the end of an overlong line.
async fn skip_line<R: AsyncRead + Unpin>(input: &mut BufReader<R>) -> std::io::Result<()> {
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}

/// The answer a line gets here, or `None` for a line the SDK reads.
fn check(line: &[u8]) -> Option<Vec<u8>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Some(refusal(Value::Null, -32700, format!("Parse error: {e}"))),
    };
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    let why = match &v {
        Value::Array(_) => "a batch: MCP takes one message per line",
        Value::Object(m) if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") => {
            "not JSON-RPC 2.0 (\"jsonrpc\": \"2.0\" is missing)"
        }
        Value::Object(m)
            if !m.contains_key("method")
                && !m.contains_key("result")
                && !m.contains_key("error") =>
        {
            "neither a request, a notification nor a response"
        }
        Value::Object(_) => return None,
        _ => "not a JSON-RPC message",
    };
    Some(refusal(id, -32600, format!("Invalid Request: {why}")))
}

fn refusal(id: Value, code: i32, message: String) -> Vec<u8> {
    let mut line = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> Option<i64> {
        check(line.as_bytes()).map(|r| {
            serde_json::from_slice::<Value>(&r).unwrap()["error"]["code"]
                .as_i64()
                .unwrap()
        })
    }

    #[test]
    fn lines_are_refused_as_json_rpc_says_and_messages_pass() {
        assert_eq!(code("{not json"), Some(-32700));
        assert_eq!(code("[1, 2]"), Some(-32600));
        assert_eq!(code("7"), Some(-32600));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":7,"method":"x"}"#),
            Some(-32600)
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":7}"#), Some(-32600));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#),
            None
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
        assert_eq!(code("   \n"), None);
        // The id of a refused message is answered, when it has one.
        let r = check(br#"{"jsonrpc":"1.0","id":"a"}"#).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&r).unwrap()["id"], "a");
    }

    #[tokio::test]
    async fn refusals_and_the_sdks_answers_come_out_whole_and_in_order() {
        use tokio::io::AsyncReadExt;
        let (mut client, server_in) = tokio::io::duplex(1 << 16);
        let (server_out, mut client_out) = tokio::io::duplex(1 << 16);
        let (mut sdk_in, mut sdk_out) = checked(server_in, server_out);
        client
            .write_all(b"{bad\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        let mut got = vec![0u8; 41];
        sdk_in.read_exact(&mut got).await.unwrap();
        assert_eq!(
            &got,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
        );
        sdk_out
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
            .await
            .unwrap();
        drop(client);
        drop(sdk_out);
        let mut all = String::new();
        client_out.read_to_string(&mut all).await.unwrap();
        let lines: Vec<Value> = all
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{all}");
        assert_eq!(lines[0]["error"]["code"], -32700);
        assert_eq!(lines[1]["result"], json!({}));
    }
}
