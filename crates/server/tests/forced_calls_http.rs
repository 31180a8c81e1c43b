//! Forced tool calls on `/v1/responses` and `/v1/messages` are held by the
//! grammar, as on `/v1/chat/completions`: the tiny fixture model writes
//! noise, so only the grammar can make its answer a call of an offered
//! tool whose arguments fit the tool's schema. Run with both call syntaxes
//! (a template in Qwen3-Coder's XML format and one in the JSON format,
//! both written here), whole and streamed.
//!
//! The schemas have only enums and booleans, so a grammar-held call is
//! short and ends within `max_tokens` whatever the model prefers.

use redlite_server::{spawn, RunningServer, ServeArgs};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// Qwen3-Coder's call syntax (as its model card shows it).
const XML_TEMPLATE: &str = r#"{%- if tools %}{{- '<|im_start|>system\nTools:' }}{%- for t in tools %}{{- ' ' ~ t.function.name }}{%- endfor %}{{- '\nCall one as <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n' }}{%- endif %}
{%- for m in messages %}{{- '<|im_start|>' ~ m.role ~ '\n' ~ (m.content or '') ~ '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

/// The JSON-in-`<tool_call>` syntax of Qwen2.5 / Qwen3.
const JSON_TEMPLATE: &str = r#"{%- for m in messages %}{{- '<|im_start|>' ~ m.role ~ '\n' ~ (m.content or '') ~ '<|im_end|>\n' }}{%- endfor %}
{{- 'Call tools as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

fn set_unit_schema() -> Value {
    json!({"type": "object",
           "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "metric": {"type": "boolean"}},
           "required": ["unit", "metric"], "additionalProperties": false})
}

fn ping_schema() -> Value {
    json!({"type": "object", "properties": {"loud": {"type": "boolean"}},
           "required": ["loud"], "additionalProperties": false})
}

/// The arguments of a call, checked against the schema it was made for:
/// the required keys, nothing else, each of its type.
fn check_args(name: &str, args: &Value) {
    let o = args.as_object().unwrap_or_else(|| panic!("{name}: {args}"));
    match name {
        "set_unit" => {
            assert_eq!(o.len(), 2, "{args}");
            assert!(
                args["unit"] == "celsius" || args["unit"] == "fahrenheit",
                "{args}"
            );
            assert!(args["metric"].is_boolean(), "{args}");
        }
        "ping" => {
            assert_eq!(o.len(), 1, "{args}");
            assert!(args["loud"].is_boolean(), "{args}");
        }
        other => panic!("a call of `{other}`, which was not offered"),
    }
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf")
}

/// The tiny fixture model with `tokenizer.chat_template` set to `template`.
fn with_template(name: &str, template: &str) -> PathBuf {
    let src = redlite_gguf::GgufFile::open(fixture()).unwrap();
    let mut w = redlite_gguf::GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if k != "general.alignment" {
            w.add_kv(k, v.clone());
        }
    }
    w.add_kv("tokenizer.chat_template", template);
    for t in src.tensors() {
        let data = src.tensor(&t.name).unwrap().data.to_vec();
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, data)
            .unwrap();
    }
    let dir = std::env::temp_dir().join(format!("redlite-forced-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    w.write(&p).unwrap();
    p
}

fn serve(model: PathBuf) -> RunningServer {
    let mut args = ServeArgs::for_model(model);
    args.port = 0;
    args.ctx_size = 1024;
    args.max_tokens_limit = 256;
    args.no_warmup = true;
    spawn(args).expect("start the server on the fixture")
}

/// (status, body text).
fn post(server: &RunningServer, path: &str, body: &Value) -> (u16, String) {
    let body = body.to_string();
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
    let status = resp[9..12].parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map_or("", |x| x.1);
    (status, body.to_string())
}

/// The `data:` objects of an SSE body (chunked transfer framing skipped:
/// every data line is whole JSON on its own line).
fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// The one call in a Responses answer: (name, arguments).
fn responses_call(server: &RunningServer, choice: Value, stream: bool) -> (String, Value) {
    let req = json!({
        "input": "Set the unit.", "max_output_tokens": 200, "temperature": 1.0, "top_k": 0,
        "tools": [
            {"type": "function", "name": "set_unit", "parameters": set_unit_schema()},
            {"type": "function", "name": "ping", "parameters": ping_schema()}],
        "tool_choice": choice, "stream": stream, "store": false,
    });
    let (status, body) = post(server, "/v1/responses", &req);
    assert_eq!(status, 200, "{body}");
    let response = if stream {
        let ev = sse_data(&body);
        let done: Vec<&Value> = ev
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.done")
            .collect();
        assert_eq!(done.len(), 1, "{body}");
        let last = ev.last().unwrap();
        assert_eq!(last["type"], "response.completed", "{body}");
        let out = &last["response"]["output"];
        assert_eq!(out[0]["arguments"], done[0]["arguments"], "{body}");
        last["response"].clone()
    } else {
        serde_json::from_str(&body).unwrap()
    };
    assert_eq!(response["status"], "completed", "{response}");
    let calls: Vec<&Value> = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{response}");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {response}"));
    (calls[0]["name"].as_str().unwrap().to_string(), args)
}

/// The one `tool_use` block of a Messages answer: (name, input).
fn messages_call(server: &RunningServer, choice: Value, stream: bool) -> (String, Value) {
    let req = json!({
        "messages": [{"role": "user", "content": "Set the unit."}],
        "max_tokens": 200, "temperature": 1.0, "top_k": 0,
        "tools": [
            {"name": "set_unit", "input_schema": set_unit_schema()},
            {"name": "ping", "input_schema": ping_schema()}],
        "tool_choice": choice, "stream": stream,
    });
    let (status, body) = post(server, "/v1/messages", &req);
    assert_eq!(status, 200, "{body}");
    if stream {
        let ev = sse_data(&body);
        let start = ev
            .iter()
            .find(|e| {
                e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use"
            })
            .unwrap_or_else(|| panic!("no tool_use block in {body}"));
        // The client's view: input_json_delta of that block, accumulated.
        let json: String = ev
            .iter()
            .filter(|e| e["index"] == start["index"] && e["delta"]["type"] == "input_json_delta")
            .map(|e| e["delta"]["partial_json"].as_str().unwrap())
            .collect();
        let delta = ev.iter().find(|e| e["type"] == "message_delta").unwrap();
        assert_eq!(delta["delta"]["stop_reason"], "tool_use", "{body}");
        let name = start["content_block"]["name"].as_str().unwrap().to_string();
        return (name, serde_json::from_str(&json).unwrap());
    }
    let m: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    (
        uses[0]["name"].as_str().unwrap().to_string(),
        uses[0]["input"].clone(),
    )
}

#[test]
fn forced_calls_are_grammar_held_on_responses_and_messages() {
    for (file, template) in [("xml.gguf", XML_TEMPLATE), ("json.gguf", JSON_TEMPLATE)] {
        let server = serve(with_template(file, template));
        for stream in [false, true] {
            let (name, args) = responses_call(&server, json!("required"), stream);
            check_args(&name, &args);
            let (name, args) =
                responses_call(&server, json!({"type": "function", "name": "ping"}), stream);
            assert_eq!(name, "ping", "{file}");
            check_args(&name, &args);

            let (name, args) = messages_call(&server, json!({"type": "any"}), stream);
            check_args(&name, &args);
            let (name, args) =
                messages_call(&server, json!({"type": "tool", "name": "set_unit"}), stream);
            assert_eq!(name, "set_unit", "{file}");
            check_args(&name, &args);
        }
    }
}

#[test]
fn a_bad_schema_in_a_forced_call_names_the_endpoints_field() {
    let server = serve(with_template("bad.gguf", JSON_TEMPLATE));
    // `pattern` is outside what the grammar compiler takes.
    let bad = json!({"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}});
    let (status, body) = post(
        &server,
        "/v1/responses",
        &json!({"input": "x", "tool_choice": "required",
                "tools": [{"type": "function", "name": "f", "parameters": bad}]}),
    );
    assert_eq!(status, 400, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        e["error"]["param"], "tools[0].parameters.properties.x.pattern",
        "{e}"
    );
    let (status, body) = post(
        &server,
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": bad}]}),
    );
    assert_eq!(status, 400, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("tools[0].input_schema.properties.x.pattern"),
        "{e}"
    );
}
