//! End-to-end: the server runs in this process on a free loopback port with
//! the demo model; the official `openai` Python client drives it
//! (`tests/python/`), and raw HTTP checks what a client library hides.
//!
//! Needs the demo model (`bash scripts/fetch-demo-model.sh`, or
//! `REDLITE_DEMO_MODEL`) and `REDLITE_PYTHON` with `openai`, `anthropic` and `pytest`
//! (scripts/test.sh sets both up). Without them the tests skip loudly, and
//! fail when `CI` is set.

mod common;

use redlite_server::{spawn, RunningServer, ServeArgs};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One model-loaded server at a time: the machine has few cores.
static SERIAL: Mutex<()> = Mutex::new(());

const KEY: &str = "test-key-123";

fn python() -> Option<String> {
    let py = std::env::var("REDLITE_PYTHON").ok()?;
    let ok = Command::new(&py)
        .args([
            "-c",
            "import openai, anthropic, pytest, jsonschema, prometheus_client",
        ])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py)
}

/// Skip loudly, or fail under CI.
fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but {why}");
    }
    eprintln!("\n{0}\n!!! SKIPPED: {why}\n{0}\n", "!".repeat(72));
}

fn start(api_key: Option<&str>) -> Option<RunningServer> {
    let Some(model) = common::demo_model() else {
        skip("the demo model is missing: run `bash scripts/fetch-demo-model.sh` or set REDLITE_DEMO_MODEL");
        return None;
    };
    let mut args = ServeArgs::for_model(model);
    args.port = 0;
    args.ctx_size = 1024;
    args.max_tokens_limit = 512;
    args.max_body_bytes = 1 << 20;
    args.api_key = api_key.map(String::from);
    Some(spawn(args).expect("start the server"))
}

fn http(
    server: &RunningServer,
    method: &str,
    path: &str,
    body: &str,
    key: Option<&str>,
) -> (u16, String) {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let (status, _, body) = common::request(server, method, path, &auth, body);
    (status, body)
}

fn metric(server: &RunningServer, name: &str) -> f64 {
    let auth = format!("Authorization: Bearer {KEY}\r\n");
    common::metric(server, &auth, name).unwrap_or(0.0)
}

#[test]
fn openai_python_client() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = python() else {
        skip("REDLITE_PYTHON is unset or lacks `openai`/`anthropic`/`pytest`/`jsonschema`/`prometheus_client` (scripts/test.sh installs them)");
        return;
    };
    let Some(server) = start(Some(KEY)) else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let t0 = Instant::now();
    let status = Command::new(py)
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(&dir)
        .env("REDLITE_BASE_URL", server.base_url())
        .env("REDLITE_API_KEY", KEY)
        .env("REDLITE_SERVER_PID", std::process::id().to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The chat page's browser test writes its screenshot here.
        .env("REDLITE_ARTIFACTS", env!("CARGO_TARGET_TMPDIR"))
        .status()
        .expect("run pytest");
    eprintln!("python tests took {:.1} s", t0.elapsed().as_secs_f64());
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat-page.png");
    if shot.is_file() {
        eprintln!("chat page screenshot: {}", shot.display());
    }
    assert!(status.success(), "the openai client tests failed: {status}");
}

#[test]
fn raw_http_without_api_key() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(server) = start(None) else {
        return;
    };
    // Without --api-key, any key (or none) works.
    for key in [None, Some("whatever")] {
        let (status, body) = http(&server, "GET", "/v1/models", "", key);
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["object"], "list");
        assert!(v["data"][0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    }
    // Errors keep OpenAI's shape.
    let (status, body) = http(&server, "GET", "/v1/chat/completions", "", None);
    assert_eq!(status, 405, "{body}");
    let (status, body) = http(&server, "POST", "/v1/chat/completions", "[1]", None);
    assert_eq!(status, 400);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");

    // A greedy answer, whole.
    let req =
        r#"{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":4,"temperature":0}"#;
    let (status, body) = http(&server, "POST", "/v1/chat/completions", req, None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["choices"][0]["message"]["content"].is_string());

    // A stream, raw: `data: {...}` events ending in `data: [DONE]`.
    let req = r#"{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":4,"temperature":0,"stream":true}"#;
    let (status, body) = http(&server, "POST", "/v1/chat/completions", req, None);
    assert_eq!(status, 200);
    let body = dechunk(&body);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body:?}");
    let text: String = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<serde_json::Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // A client that goes away mid-stream: the engine stops, the next
    // request is served at once.
    let before = metric(&server, "redlite_requests_cancelled_total");
    let mut s = TcpStream::connect(server.addr).unwrap();
    let req = r#"{"messages":[{"role":"user","content":"Tell a long story."}],"max_tokens":500,"temperature":0,"stream":true}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{req}",
        req.len()
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = String::new();
    while seen.matches("data: ").count() < 3 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(s);
    let t0 = Instant::now();
    while metric(&server, "redlite_requests_cancelled_total") <= before {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the generation was not cancelled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The same for a whole (non-streamed) answer: the handler's future is
    // dropped when the connection closes.
    let before = metric(&server, "redlite_requests_cancelled_total");
    let mut s = TcpStream::connect(server.addr).unwrap();
    let req = r#"{"messages":[{"role":"user","content":"Tell another long story."}],"max_tokens":500,"temperature":0}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{req}",
        req.len()
    )
    .unwrap();
    let t0 = Instant::now();
    while metric(&server, "redlite_requests_processing") < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the request never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    while metric(&server, "redlite_requests_cancelled_total") <= before {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the whole answer was not cancelled"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let generated = metric(&server, "redlite_generated_tokens_total");
    let req = r#"{"prompt":"One, two,","max_tokens":2,"temperature":0}"#;
    let (status, body) = http(&server, "POST", "/v1/completions", req, None);
    assert_eq!(status, 200, "{body}");
    assert!(metric(&server, "redlite_generated_tokens_total") <= generated + 2.0);
    assert_eq!(metric(&server, "redlite_queue_depth"), 0.0);
}

/// Undo `Transfer-Encoding: chunked`.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}
