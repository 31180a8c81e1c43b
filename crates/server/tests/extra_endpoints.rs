//! End-to-end over HTTP on the tiny Qwen3-Next fixture (no download): the
//! model-by-id, tokenize / detokenize and embeddings routes are registered
//! and answer in their shapes, and `logit_bias` reaches the sampler.

mod common;

use redlite_server::{spawn, RunningServer, ServeArgs};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next")
}

fn start() -> RunningServer {
    let mut args = ServeArgs::for_model(fixture_dir().join("tiny-qwen3next-q8_0.gguf"));
    args.port = 0;
    args.ctx_size = 128;
    args.max_tokens_limit = 16;
    args.alias = Some("tiny".into());
    spawn(args).expect("start the server on the fixture")
}

/// A streamed answer's `data:` events as JSON (without `[DONE]`).
fn http(server: &RunningServer, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, _, body) = common::request(server, method, path, "", body);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn sse_events(server: &RunningServer, path: &str, body: &str) -> Vec<Value> {
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // Chunk sizes are lines of hex digits: the events are the `data:` lines.
    resp.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Token ids from the fixture's Hugging Face `tokenizer.json` (an
/// independent source).
fn hf_id(piece: &str) -> u64 {
    let t: Value =
        serde_json::from_slice(&std::fs::read(fixture_dir().join("tokenizer.json")).unwrap())
            .unwrap();
    t["model"]["vocab"][piece].as_u64().unwrap()
}

#[test]
fn extra_endpoints_over_http() {
    let server = start();

    let (st, v) = http(&server, "GET", "/v1/models/tiny", "");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id"], "tiny");
    assert_eq!(v["object"], "model");
    let (st, v) = http(&server, "GET", "/v1/models/gpt-4o", "");
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let (st, v) = http(
        &server,
        "POST",
        "/tokenize",
        r#"{"content": "token token"}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tokens"], json!([hf_id("token"), hf_id("Ġtoken")]));
    let (st, v) = http(&server, "POST", "/detokenize", &v.to_string());
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "token token");
    let (st, v) = http(
        &server,
        "POST",
        "/detokenize",
        r#"{"tokens": [1, 99999999]}"#,
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "tokens[1]");
    let (st, v) = http(&server, "POST", "/tokenize", r#"{"text": "x"}"#);
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "content");

    let (st, v) = http(
        &server,
        "POST",
        "/v1/embeddings",
        r#"{"model": "tiny", "input": "x"}"#,
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "embeddings_not_supported");

    // A +100 bias makes a token the greedy choice; two different tokens
    // cannot both be the model's own pick.
    for piece in ["token", "vocab"] {
        let id = hf_id(piece);
        let req = json!({"prompt": "a b c", "max_tokens": 1, "temperature": 0,
                         "logit_bias": {id.to_string(): 100}});
        let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], piece, "{v}");
    }
    let req = json!({"prompt": "a", "max_tokens": 1, "logit_bias": {"99999999": 1}});
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "logit_bias.99999999");
    let req = json!({"prompt": "a", "max_tokens": 1, "frequency_penalty": 2.5});
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "frequency_penalty");
    let req = json!({"prompt": "a", "max_tokens": 1, "n": 2});
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "n");

    // logprobs: one entry per generated token; under greedy the chosen
    // token is the most likely one; a +100 bias makes it certain (the
    // log-probabilities are taken after the bias).
    let req = json!({"prompt": "a b c", "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{v}");
    for i in 0..n {
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 2, "{v}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(chosen <= 0.0 && (chosen - best).abs() < 1e-6, "{v}");
    }
    let id = hf_id("token");
    let req = json!({"prompt": "a b c", "max_tokens": 1, "temperature": 0, "logprobs": 0,
                     "logit_bias": {id.to_string(): 100}});
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 200, "{v}");
    let chosen = v["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    assert!(chosen > -1e-3, "{v}");
    // Streamed: the same entries, in a chunk before the one that finishes.
    let req = json!({"prompt": "a b c", "max_tokens": 3, "temperature": 0, "logprobs": 2});
    let (_, whole) = http(&server, "POST", "/v1/completions", &req.to_string());
    let mut req = req;
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let events = sse_events(&server, "/v1/completions", &req.to_string());
    let with_lp: Vec<usize> = (0..events.len())
        .filter(|&i| !events[i]["choices"][0]["logprobs"].is_null())
        .collect();
    assert_eq!(with_lp.len(), 1, "{events:?}");
    let lp = &events[with_lp[0]]["choices"][0]["logprobs"];
    assert_eq!(lp, &whole["choices"][0]["logprobs"], "{events:?}");
    let finish = (0..events.len())
        .find(|&i| !events[i]["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert!(with_lp[0] < finish, "{events:?}");
    assert!(events.last().unwrap()["usage"].is_object(), "{events:?}");
    // Chat logprobs need a chat template: tests/python/test_extra.py.

    // echo: the prompt's text before the completion, whole and streamed.
    let req = json!({"prompt": "a b c", "max_tokens": 2, "temperature": 0});
    let (_, plain) = http(&server, "POST", "/v1/completions", &req.to_string());
    let mut req = req;
    req["echo"] = json!(true);
    let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
    assert_eq!(st, 200, "{v}");
    let plain_text = plain["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["text"], format!("a b c{plain_text}"), "{v}");
    req["stream"] = json!(true);
    let events = sse_events(&server, "/v1/completions", &req.to_string());
    assert_eq!(events[0]["choices"][0]["text"], "a b c", "{events:?}");
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, format!("a b c{plain_text}"), "{events:?}");
    // What cannot be honoured is refused, naming the field: echo with
    // prompt logprobs, echo with suffix, and suffix on a vocabulary
    // without fill-in-the-middle tokens (this fixture's).
    for (req, param) in [
        (json!({"prompt": "a", "echo": true, "logprobs": 1}), "echo"),
        (json!({"prompt": "a", "echo": true, "suffix": "b"}), "echo"),
        (json!({"prompt": "a", "suffix": "b"}), "suffix"),
    ] {
        let (st, v) = http(&server, "POST", "/v1/completions", &req.to_string());
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}
