//! What the server's HTTP tests share: the demo model's path and a plain
//! HTTP/1.1 client over a TcpStream (one request a connection), so each
//! test file speaks to the server the same way.
#![allow(dead_code)] // each test file uses its own subset

use redlite_server::RunningServer;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// The demo model (`REDLITE_DEMO_MODEL`, else the cache path that
/// `scripts/fetch-demo-model.sh` fills). Missing: None with a loud note,
/// except under CI (`CI` set), where the test setup fetched it and a
/// missing file is a failure rather than a silent skip.
pub fn demo_model() -> Option<PathBuf> {
    let p = match std::env::var_os("REDLITE_DEMO_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/redlite/demo-model.gguf"),
    };
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but the demo model is missing"
    );
    eprintln!("\n!!! SKIPPED: the demo model is missing (scripts/fetch-demo-model.sh)\n");
    None
}

/// A connection with the request written: `headers` are extra header
/// lines, each ending in "\r\n".
pub fn send(
    server: &RunningServer,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// One request: the status, the response head (lower-cased) and the body.
pub fn request(
    server: &RunningServer,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut resp = String::new();
    send(server, method, path, headers, body)
        .read_to_string(&mut resp)
        .unwrap();
    let status = resp[9..12].parse().unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The value of the sample `name` (exactly, then a space) in `/metrics`.
pub fn metric(server: &RunningServer, headers: &str, name: &str) -> Option<f64> {
    let (_, _, text) = request(server, "GET", "/metrics", headers, "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
