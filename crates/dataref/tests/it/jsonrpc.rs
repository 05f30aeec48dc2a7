//! The real binary over stdio, spoken to byte by byte: every line that is not a JSON-RPC
//! message gets a JSON-RPC error (with its `id` when it can be read), and the server goes
//! on serving the next request.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::BIN;

/// Long enough for a debug build on a loaded machine; only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
}

impl Server {
    fn start(home: &std::path::Path) -> Self {
        let mut child = Command::new(BIN)
            .arg("serve")
            .arg("--home")
            .arg(home)
            .args(["--rows", "100"])
            .env("DATAREF_PRINCIPAL", "alice")
            .env_remove("DATAREF_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dataref serve");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // Every line the server writes is one JSON value.
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON from the server ({e}): {line}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
    }

    fn next(&self) -> Value {
        self.lines
            .recv_timeout(HANG)
            .expect("the server answered nothing")
    }

    /// The next message that is a response or error (skipping notifications).
    fn answer(&self) -> Value {
        loop {
            let v = self.next();
            if v.get("method").is_none() {
                return v;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn every_bad_line_is_answered_and_the_server_keeps_serving() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut s = Server::start(home.path());
    s.send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}})
        .to_string()
        .as_bytes(),
    );
    let init = s.answer();
    assert_eq!(init["id"], 1, "{init}");
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    s.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{{"name":"describe_data","arguments":{{"x":{}{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (deep.into_bytes(), -32700, json!(10)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"tools/call\",\"params\":{\"name\":\"\xff\xfe\x80\"}}"
                .to_vec(),
            -32700,
            json!(11),
        ),
        (
            br#"{"jsonrpc":"2.0","id":"twelve","method":"tools/call","params":{"name":"\ud800"}}"#
                .to_vec(),
            -32700,
            json!("twelve"),
        ),
        (b"[1, 2, 3]".to_vec(), -32600, Value::Null),
        (b"\"hello\"".to_vec(), -32600, Value::Null),
        (b"42".to_vec(), -32600, Value::Null),
        (b"{not json".to_vec(), -32700, Value::Null),
        (
            br#"{"jsonrpc":"2.0","id":13,"method":["tools/call"]}"#.to_vec(),
            -32600,
            json!(13),
        ),
        (
            br#"{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"x"}"#.to_vec(),
            -32700,
            json!(14),
        ),
    ];
    for (n, (line, code, id)) in cases.into_iter().enumerate() {
        s.send(&line);
        let e = s.answer();
        let shown = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
        assert_eq!(e["jsonrpc"], "2.0", "{shown}: {e}");
        assert_eq!(e["error"]["code"], code, "{shown}: {e}");
        assert_eq!(e["id"], id, "{shown}: {e}");
        assert!(e["error"]["data"]["hint"].is_string(), "{shown}: {e}");
        // And the next request is served.
        let ping = 100 + n as i64;
        s.send(
            json!({"jsonrpc": "2.0", "id": ping, "method": "ping"})
                .to_string()
                .as_bytes(),
        );
        let pong = s.answer();
        assert_eq!(pong["id"], ping, "after {shown}: {pong}");
        assert!(pong["result"].is_object(), "after {shown}: {pong}");
    }
    // A real call still works after all that.
    s.send(br#"{"jsonrpc":"2.0","id":200,"method":"tools/list"}"#);
    let tools = s.answer();
    assert_eq!(tools["id"], 200);
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{tools}"
    );
}
