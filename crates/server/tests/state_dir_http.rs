//! `serve --state-dir` over real HTTP on the demo model: a conversation's
//! state saved at the end of a turn survives a restart of the server (a
//! new server, with empty memory, on the same directory), and the next
//! request that extends it restores it instead of computing the prefix
//! (`usage.prompt_tokens_details.cached_tokens` and the `/metrics`
//! counter), answering exactly as a server that never restarted. Skips
//! loudly without the demo model (fails under `CI`).

mod common;

use redlite_server::{spawn, RunningServer, ServeArgs};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn start(model: &Path, state_dir: Option<&Path>, limit: u64) -> RunningServer {
    let mut args = ServeArgs::for_model(model);
    args.port = 0;
    args.ctx_size = 512;
    args.no_warmup = true;
    args.state_dir = state_dir.map(Path::to_path_buf);
    args.state_dir_limit = limit;
    spawn(args).expect("start the server")
}

/// (text, prompt tokens, cached prompt tokens) of a greedy chat answer.
fn http(server: &RunningServer, method: &str, path: &str, body: &str) -> String {
    let (status, _, body) = common::request(server, method, path, "", body);
    assert_eq!(status, 200, "{body}");
    body
}

fn metric(server: &RunningServer, name: &str) -> f64 {
    common::metric(server, "", name).unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn chat(server: &RunningServer, messages: &Value) -> (String, u64, u64) {
    let body = serde_json::json!({
        "model": "demo",
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0,
    });
    let v: Value = serde_json::from_str(&http(
        server,
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    ))
    .unwrap();
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

fn turn_one() -> Value {
    serde_json::json!([{"role": "user", "content": "Name one prime number, in one word."}])
}

fn turn_two(answer: &str) -> Value {
    serde_json::json!([
        {"role": "user", "content": "Name one prime number, in one word."},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And another one?"},
    ])
}

/// The state files once `n` are there: the engine thread writes a turn's
/// state after sending the answer, so it may still be writing.
fn wait_for(dir: &Path, n: usize) -> Vec<(PathBuf, u64)> {
    for _ in 0..600 {
        let f = state_files(dir);
        if f.len() == n {
            return f;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    state_files(dir)
}

fn state_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "state"))
        .map(|p| {
            let n = std::fs::metadata(&p).unwrap().len();
            (p, n)
        })
        .collect()
}

#[test]
fn a_conversation_survives_a_restart_and_answers_as_without_one() {
    let Some(model) = common::demo_model() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("redlite-state-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The server that never restarts: both turns in one process.
    let steady = start(&model, None, 0);
    let (t1, _, _) = chat(&steady, &turn_one());
    let (want, want_prompt, want_cached) = chat(&steady, &turn_two(&t1));
    drop(steady);
    assert!(
        want_cached > 0,
        "the steady server did not reuse the first turn"
    );

    // Turn one, then the server goes away.
    let a = start(&model, Some(&dir), 16 << 30);
    let (t1_a, _, _) = chat(&a, &turn_one());
    assert_eq!(t1_a, t1);
    drop(a);
    let files = wait_for(&dir, 1);
    assert_eq!(files.len(), 1, "{files:?}");

    // A new server on the same directory: the second turn restores the
    // saved state instead of computing it.
    let b = start(&model, Some(&dir), 16 << 30);
    assert_eq!(metric(&b, "redlite_prompt_tokens_cached_total"), 0.0);
    let (got, got_prompt, got_cached) = chat(&b, &turn_two(&t1));
    assert_eq!(got_prompt, want_prompt);
    assert_eq!(got_cached, want_cached, "restored tokens");
    assert_eq!(
        metric(&b, "redlite_prompt_tokens_cached_total"),
        want_cached as f64
    );
    assert_eq!(got, want, "the answer after the restart differs");
    drop(b);
    let both = wait_for(&dir, 2);
    assert_eq!(both.len(), 2, "{both:?}");
    let largest = both.iter().map(|f| f.1).max().unwrap();

    // The size limit: room for one file of about these sizes (each file
    // holds ~600 KB of logits and 24 KB a position), not two: only the
    // newest stays.
    let c = start(&model, Some(&dir), largest + 300_000);
    let (_, _, cached) = chat(
        &c,
        &serde_json::json!([{"role": "user", "content": "Say hi."}]),
    );
    assert_eq!(cached, 0);
    drop(c);
    assert_eq!(
        state_files(&dir).len(),
        1,
        "the older states were not evicted"
    );
    // Cleanup only: a server's engine thread may still be finishing its
    // last end-of-turn write after the server was dropped, so the directory
    // can gain a file while it is being removed; retry a little.
    for _ in 0..50 {
        if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
