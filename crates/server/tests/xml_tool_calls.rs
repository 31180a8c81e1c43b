//! Qwen3-Coder's XML tool-call format, chosen by the chat template: a
//! template written here in that format (the syntax its model card and
//! llama.cpp's `Qwen3-Coder.jinja` show; the text is this project's own)
//! is detected as XML, renders earlier calls in it, and the parser reads
//! model output in it back into OpenAI tool calls with typed arguments,
//! however the text is split while streaming.

use redlite_server::parse::{ChatParser, Collected};
use redlite_server::{spawn, RunningServer, ServeArgs};
use redlite_tokenizer::{ChatMessage, ChatTemplate, ToolCall, ToolCallFormat};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

const XML_TEMPLATE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\nYou can call these tools:' }}
{%- for t in tools %}
{{- '\n<function><name>' ~ t.function.name ~ '</name></function>' }}
{%- endfor %}
{{- '\nTo call one, answer exactly:\n<tool_call>\n<function=NAME>\n<parameter=ARGUMENT>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
{{- '<|im_start|>' ~ m.role ~ '\n' }}
{%- if m.tool_calls %}
{%- for c in m.tool_calls %}
{{- '<tool_call>\n<function=' ~ c.function.name ~ '>\n' }}
{%- for k, v in c.function.arguments|items %}
{{- '<parameter=' ~ k ~ '>\n' ~ (v if v is string else v|tojson) ~ '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{%- else %}
{{- m.content }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}"#;

/// A template in the JSON format (Hermes / Qwen2.5 style), also written here.
const JSON_TEMPLATE: &str = r#"{%- for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\n' ~ m.content ~ '<|im_end|>\n' }}{%- endfor %}
{{- 'Call tools as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}"#;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                       "mode": {"type": "integer"}, "backup": {"type": "boolean"}},
        "required": ["path", "content"]}}}])
}

fn parser() -> ChatParser {
    let t = tools();
    let f = &t[0]["function"];
    ChatParser::new(true, false, false)
        .with_tool_names(vec!["write_file".into()])
        .with_xml_calls(vec![("write_file".into(), f["parameters"].clone())])
}

fn parse_split(text: &str, split: usize) -> Collected {
    let mut p = parser();
    let mut c = Collected::default();
    let chars: Vec<char> = text.chars().collect();
    for chunk in chars.chunks(split.max(1)) {
        c.add(p.push(&chunk.iter().collect::<String>()));
    }
    c.add(p.finish());
    c
}

#[test]
fn the_template_format_is_detected() {
    let xml = ChatTemplate::new(XML_TEMPLATE).unwrap();
    assert_eq!(xml.tool_call_format(), ToolCallFormat::Xml);
    let json_t = ChatTemplate::new(JSON_TEMPLATE).unwrap();
    assert_eq!(json_t.tool_call_format(), ToolCallFormat::Json);
    // The real Qwen3-Coder template, when llama.cpp's copy is at hand.
    if let Some(p) = std::env::var_os("REDLITE_QWEN3_CODER_TEMPLATE") {
        let src = std::fs::read_to_string(p).unwrap();
        assert_eq!(ToolCallFormat::detect(&src), ToolCallFormat::Xml);
    }
}

#[test]
fn a_rendered_call_parses_back_to_the_same_arguments() {
    let file =
        "use std::io;\n\nfn main() {\n    // </parameter> in a comment\n    println!(\"hi\");\n}\n";
    let args = json!({"path": "src/main.rs", "content": file, "mode": 420, "backup": true});
    let mut m = ChatMessage::assistant("");
    m.content = None;
    m.tool_calls
        .push(ToolCall::function("write_file", args.clone()));
    let mut sources = vec![XML_TEMPLATE.to_string()];
    // Also llama.cpp's copy of the real Qwen3-Coder template, when given.
    if let Some(p) = std::env::var_os("REDLITE_QWEN3_CODER_TEMPLATE") {
        sources.push(std::fs::read_to_string(p).unwrap());
    }
    for src in sources {
        round_trip(&src, m.clone(), &args);
    }
}

fn round_trip(src: &str, m: ChatMessage, args: &Value) {
    let t = ChatTemplate::new(src).unwrap();
    let text = t
        .render(
            &[ChatMessage::user("write it"), m],
            Some(&tools()),
            false,
            None,
        )
        .unwrap();
    assert!(
        text.contains("<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>"),
        "{text}"
    );
    // The assistant turn's text, as the model would write it.
    let start = text.rfind("<tool_call>").unwrap();
    let end = text.rfind("</tool_call>").unwrap() + "</tool_call>".len();
    let answer = format!("I'll write the file.\n{}", &text[start..end]);
    let whole = parse_split(&answer, usize::MAX);
    for split in 1..16 {
        assert_eq!(parse_split(&answer, split), whole, "split {split}");
    }
    assert_eq!(whole.content, "I'll write the file.");
    assert_eq!(whole.calls.len(), 1);
    assert_eq!(whole.calls[0].0, "write_file");
    let got: Value = serde_json::from_str(&whole.calls[0].1).unwrap();
    assert_eq!(&got, args, "typed by the schema; the file intact");
}

#[test]
fn unoffered_and_unfinished_xml_calls() {
    let c = parse_split(
        "<tool_call>\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>",
        3,
    );
    assert!(c.calls.is_empty());
    assert!(c.content.contains("<function=rm>"), "{:?}", c.content);
    // Cut off by max_tokens: what arrived is still the call.
    let c = parse_split("<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nhal", 4);
    assert_eq!(c.calls.len(), 1);
    let got: Value = serde_json::from_str(&c.calls[0].1).unwrap();
    assert_eq!(got, json!({"path": "a.txt", "content": "hal"}));
    // Two calls in a row.
    let two = "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nx\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n<parameter=path>\nb\n</parameter>\n<parameter=content>\ny\n</parameter>\n</function>\n</tool_call>";
    let c = parse_split(two, 5);
    assert_eq!(c.calls.len(), 2);
    assert_eq!(c.content, "");
}

// ------------------------------------------------- over HTTP, tiny model ----

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
    let dir = std::env::temp_dir().join(format!("redlite-xmlcalls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    w.write(&p).unwrap();
    p
}

fn post(server: &RunningServer, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map_or("", |x| x.1);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn serve(model: PathBuf) -> RunningServer {
    let mut args = ServeArgs::for_model(model);
    args.port = 0;
    args.ctx_size = 512;
    args.max_tokens_limit = 8;
    spawn(args).expect("start the server on the fixture")
}

#[test]
fn a_model_with_the_xml_template_answers_named_calls_in_xml() {
    // The tiny model writes noise; a named tool_choice still makes the
    // answer a call of that tool, read through the template's format.
    let xml = serve(with_template("xml.gguf", XML_TEMPLATE));
    let req = json!({"messages": [{"role": "user", "content": "write a.txt"}],
        "tools": tools(), "max_tokens": 4, "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "write_file"}}});
    let (status, r) = post(&xml, &req);
    assert_eq!(status, 200, "{r}");
    let call = &r["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "write_file", "{r}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");
    drop(xml);
    // The same request with a JSON-format template: the call comes from the
    // JSON syntax, its arguments held to the schema by the grammar.
    let js = serve(with_template("json.gguf", JSON_TEMPLATE));
    let (status, r) = post(&js, &req);
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "write_file",
        "{r}"
    );
}
