//! Chat-template renders against Python jinja2
//! (scripts/make_tokenizer_fixtures.py).

mod common;

use redlite_tokenizer::{ChatMessage, ChatTemplate, ToolCall};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    template: Option<String>,
    messages: Vec<ChatMessage>,
    tools: Option<serde_json::Value>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    expected: String,
}

fn cases() -> Vec<Case> {
    let s = std::fs::read_to_string(common::fixture("qwen2_chat.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

#[test]
fn renders_match_jinja2() {
    let gguf_template = common::qwen2_template();
    let cases = cases();
    assert!(cases.len() >= 8);
    for c in cases {
        let own;
        let t = match &c.template {
            Some(src) => {
                own = ChatTemplate::new(src)
                    .unwrap()
                    .with_special_tokens("<|endoftext|>", "<|im_end|>");
                &own
            }
            None => &gguf_template,
        };
        let got = t
            .render(
                &c.messages,
                c.tools.as_ref(),
                c.add_generation_prompt,
                c.enable_thinking,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(got, c.expected, "case {}", c.name);
    }
}

#[test]
fn rendered_prompt_tokenizes_with_specials() {
    let tok = common::qwen2();
    let t = common::qwen2_template();
    let s = t
        .render(&[ChatMessage::user("Hi")], None, true, None)
        .unwrap();
    let ids = tok.encode(&s, true);
    assert_eq!(ids[0], 151644); // <|im_start|>
    assert_eq!(tok.decode(&ids), s);
    assert!(s.ends_with("<|im_start|>assistant\n"));
}

#[test]
fn builder_messages_serialize_like_fixture_dicts() {
    let mut m = ChatMessage::assistant("");
    m.tool_calls
        .push(ToolCall::function("add", serde_json::json!({"a": 1})));
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]})
    );
}

#[test]
fn missing_template_names_the_key() {
    let meta = redlite_gguf::Metadata::new();
    let e = ChatTemplate::from_gguf(&meta).unwrap_err();
    assert!(e.to_string().contains("tokenizer.chat_template"), "{e}");
}
