//! Speculative decoding through the server on the demo model: an edit turn
//! (a file in the prompt, an instruction to rename a function) answered
//! greedily with `"speculative.type": "lookup"` is the same text as
//! without, `/metrics` counts the drafts proposed and kept, and bad
//! speculative fields are 400s naming the field. Skips loudly without the
//! demo model (fails under `CI`).

mod common;

use redlite_server::{spawn, RunningServer, ServeArgs};
use serde_json::{json, Value};

fn http(server: &RunningServer, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, _, body) = common::request(server, method, path, "", body);
    (status, body)
}

fn metric(server: &RunningServer, name: &str) -> f64 {
    common::metric(server, "", name).unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

const FILE: &str = "def parse_header(data):\n    magic, version = data[:4], data[4]\n    if magic != b\"GGUF\":\n        raise ValueError(\"not a GGUF file\")\n    return version\n\n\ndef read_all(path):\n    with open(path, \"rb\") as f:\n        return parse_header(f.read())\n";

fn answer(server: &RunningServer, extra: Value) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": format!(
            "Rename parse_header to read_header in this file. Reply with the whole file only.\n\n```python\n{FILE}```"
        )}],
        "temperature": 0,
        "max_tokens": 64,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, text) = http(server, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_edit_turn_with_lookup_is_the_same_text_and_counts_its_drafts() {
    let Some(model) = common::demo_model() else {
        return;
    };
    let mut args = ServeArgs::for_model(&model);
    args.port = 0;
    args.ctx_size = 1024;
    args.no_warmup = true;
    // No prompt cache: each answer computes its prompt the same way.
    args.no_prompt_cache = true;
    let server = spawn(args).expect("start the server");
    let plain = answer(&server, json!({}));
    assert!(plain.contains("def "), "{plain}");
    assert_eq!(metric(&server, "redlite_speculative_passes_total"), 0.0);
    let spec = answer(
        &server,
        json!({"speculative.type": "lookup", "speculative.n_max": 8}),
    );
    assert_eq!(spec, plain, "speculation changed the answer");
    let drafted = metric(&server, "redlite_speculative_draft_tokens_total");
    let kept = metric(&server, "redlite_speculative_accepted_tokens_total");
    assert!(
        kept > 10.0 && kept <= drafted,
        "drafted {drafted}, kept {kept}"
    );

    for (field, value, says) in [
        ("speculative.type", json!("eagle"), "speculative.type"),
        ("speculative.n_max", json!(0), "speculative.n_max"),
        ("speculative.n_max", json!(1000), "speculative.n_max"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], field: value});
        let (status, text) = http(&server, "POST", "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 400, "{field}={value}: {text}");
        assert!(text.contains(says), "{text}");
    }
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "speculative.n_min": 9, "speculative.n_max": 4});
    let (status, text) = http(&server, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("speculative.n_min"), "{text}");
}

#[test]
fn serve_spec_lookup_is_the_default_a_request_can_turn_off() {
    let Some(model) = common::demo_model() else {
        return;
    };
    let mut args = ServeArgs::for_model(&model);
    args.port = 0;
    args.ctx_size = 1024;
    args.no_warmup = true;
    args.no_prompt_cache = true;
    args.spec.spec = redlite_spec::SpecMode::Lookup;
    let server = spawn(args).expect("start the server");
    let spec = answer(&server, json!({}));
    let passes = metric(&server, "redlite_speculative_passes_total");
    assert!(passes > 0.0);
    let plain = answer(&server, json!({"speculative.type": "none"}));
    assert_eq!(metric(&server, "redlite_speculative_passes_total"), passes);
    assert_eq!(spec, plain);
}
