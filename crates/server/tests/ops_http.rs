//! Operations over real HTTP on the demo model: CORS (`--cors-origin`),
//! `Retry-After` on a 503, the latency histograms in `/metrics` and the
//! access log. Skips loudly without the demo model (fails under `CI`).

mod common;

use redlite_server::{spawn, RunningServer, ServeArgs};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

fn start(cors: &[&str], parallel_queue: usize) -> Option<RunningServer> {
    let Some(model) = common::demo_model() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set but the demo model is missing");
        }
        eprintln!("\n!!! SKIPPED: the demo model is missing (scripts/fetch-demo-model.sh)\n");
        return None;
    };
    let mut args = ServeArgs::for_model(model);
    args.port = 0;
    args.ctx_size = 512;
    args.no_warmup = true;
    args.parallel_queue = parallel_queue;
    args.cors_origin = cors.iter().map(|s| s.to_string()).collect();
    Some(spawn(args).expect("start the server"))
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

use common::{request as http, send};

#[test]
fn cors_retry_after_histograms_and_access_log() {
    let log = Captured::default();
    let sink = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish(),
    )
    .unwrap();

    // Without --cors-origin: no CORS headers, OPTIONS is not a route.
    {
        let Some(server) = start(&[], 64) else { return };
        let (status, head, _) = http(
            &server,
            "OPTIONS",
            "/v1/models",
            "Origin: http://app.example\r\nAccess-Control-Request-Method: GET\r\n",
            "",
        );
        assert_eq!(status, 405);
        assert!(!head.contains("access-control-allow-origin"), "{head}");
        let (status, head, _) = http(
            &server,
            "GET",
            "/v1/models",
            "Origin: http://app.example\r\n",
            "",
        );
        assert_eq!(status, 200);
        assert!(!head.contains("access-control-allow-origin"), "{head}");
    }

    let Some(server) = start(&["http://app.example"], 1) else {
        return;
    };
    let pre = "Origin: http://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n";
    let (status, head, _) = http(&server, "OPTIONS", "/v1/chat/completions", pre, "");
    assert_eq!(status, 204, "{head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.example"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-methods: get, post, options"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{head}"
    );
    let (status, head, _) = http(
        &server,
        "GET",
        "/v1/models",
        "Origin: http://app.example\r\n",
        "",
    );
    assert_eq!(status, 200);
    assert!(
        head.contains("access-control-allow-origin: http://app.example"),
        "{head}"
    );
    let (_, head, _) = http(
        &server,
        "GET",
        "/v1/models",
        "Origin: http://evil.example\r\n",
        "",
    );
    assert!(!head.contains("access-control-allow-origin"), "{head}");

    // A short completion feeds both histograms.
    let req = r#"{"prompt":"One, two, three,","max_tokens":4,"temperature":0}"#;
    let (status, _, body) = http(&server, "POST", "/v1/completions", "", req);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(generated >= 2, "{body}");
    let (_, _, metrics) = http(&server, "GET", "/metrics", "", "");
    assert!(
        metrics.contains("redlite_time_to_first_token_seconds_count 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("redlite_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"));
    let steps = format!("redlite_token_latency_seconds_count {}\n", generated - 1);
    assert!(metrics.contains(&steps), "{steps} in {metrics}");

    // --parallel-queue 1: while a stream runs, the next request gets 503
    // with Retry-After.
    let long = r#"{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true}"#;
    let mut running = send(&server, "POST", "/v1/completions", "", long);
    let mut first = [0u8; 64];
    let n = running.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let (status, head, body) = http(&server, "POST", "/v1/completions", "", req);
    assert_eq!(status, 503, "{body}");
    assert!(head.contains("retry-after: 1"), "{head}");
    drop(running);
    drop(server);

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line =
        format!("POST /v1/completions 200 prompt={prompt} cached=0 generated={generated} ttft=");
    assert!(text.contains(&line), "{line} not in the log:\n{text}");
    assert!(
        text.contains("OPTIONS /v1/chat/completions 204 total="),
        "{text}"
    );
    assert!(text.contains("POST /v1/completions 503 total="), "{text}");
}
