//! An Anthropic Messages answer, built from the chat parser's events:
//! content blocks (`thinking`, `text`, `tool_use`) and, when streamed,
//! Anthropic's events:
//!
//! ```text
//! message_start, ping,
//! per block: content_block_start, content_block_delta… (text_delta,
//!            thinking_delta, input_json_delta), content_block_stop
//! message_delta (stop_reason, stop_sequence, usage), message_stop
//! ```
//!
//! A tool call's arguments are held until the call ends and sent as one
//! `input_json_delta` once they parse as a JSON object (a client
//! accumulates the deltas and parses them; arguments that are not an
//! object come out as a text block instead, so every `tool_use` has a
//! valid `input`).

use crate::engine::{Done, Finish};
use crate::error::ApiError;
use crate::events::EventBuilder;
use crate::parse::{ChatParser, Parsed};
use crate::stream;
use serde_json::{json, Value};

#[derive(Clone, Debug, PartialEq)]
enum Open {
    Text,
    Thinking,
    /// A tool call being collected: its name and arguments so far.
    Call {
        name: String,
        args: String,
    },
}

/// Builds one message from generated text.
pub struct MessageBuilder {
    id: String,
    model: String,
    parser: ChatParser,
    prefix: String,
    blocks: Vec<Value>,
    open: Option<Open>,
    tool_uses: usize,
    stop_reason: Value,
    stop_sequence: Value,
    usage: Value,
}

impl MessageBuilder {
    pub fn new(
        id: String,
        model: String,
        parser: ChatParser,
        prefix: String,
        prompt_tokens: usize,
    ) -> MessageBuilder {
        MessageBuilder {
            id,
            model,
            parser,
            prefix,
            blocks: Vec::new(),
            open: None,
            tool_uses: 0,
            stop_reason: Value::Null,
            stop_sequence: Value::Null,
            usage: json!({"input_tokens": prompt_tokens, "output_tokens": 0}),
        }
    }

    /// The message as it stands.
    pub fn message(&self) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self.usage,
        })
    }

    fn parsed(&mut self, parsed: Vec<Parsed>) -> Vec<Value> {
        let mut out = Vec::new();
        for p in parsed {
            match p {
                Parsed::Content(t) => self.append(&mut out, Open::Text, &t),
                Parsed::Reasoning(t) => self.append(&mut out, Open::Thinking, &t),
                Parsed::ToolCallStart { name, .. } => {
                    out.extend(self.close());
                    self.open = Some(Open::Call {
                        name,
                        args: String::new(),
                    });
                }
                Parsed::ToolCallArgs { text, .. } => {
                    if let Some(Open::Call { args, .. }) = &mut self.open {
                        args.push_str(&text);
                    }
                }
            }
        }
        out
    }

    fn append(&mut self, out: &mut Vec<Value>, kind: Open, t: &str) {
        if t.is_empty() {
            return;
        }
        if self.open.as_ref() != Some(&kind) {
            out.extend(self.close());
            let block = match kind {
                Open::Text => json!({"type": "text", "text": ""}),
                _ => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push(
                json!({"type": "content_block_start", "index": self.blocks.len(),
                            "content_block": block}),
            );
            self.blocks.push(block);
            self.open = Some(kind.clone());
        }
        let i = self.blocks.len() - 1;
        let (field, delta) = match kind {
            Open::Text => ("text", json!({"type": "text_delta", "text": t})),
            _ => ("thinking", json!({"type": "thinking_delta", "thinking": t})),
        };
        let so_far = self.blocks[i][field].as_str().unwrap_or("").to_string() + t;
        self.blocks[i][field] = so_far.into();
        out.push(json!({"type": "content_block_delta", "index": i, "delta": delta}));
    }

    /// Close the open block (a tool call is sent whole here).
    fn close(&mut self) -> Vec<Value> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let i = self.blocks.len();
        match open {
            Open::Text | Open::Thinking => {
                vec![json!({"type": "content_block_stop", "index": i - 1})]
            }
            Open::Call { name, args } => {
                let input = serde_json::from_str::<Value>(&args)
                    .ok()
                    .filter(Value::is_object);
                let Some(input) = input else {
                    // Not a call a client can run: say what the model wrote.
                    let raw = format!("{{\"name\": {}, \"arguments\": {args}}}", json!(name));
                    let mut out = Vec::new();
                    self.append(&mut out, Open::Text, &raw);
                    out.extend(self.close());
                    return out;
                };
                self.tool_uses += 1;
                let id = stream::new_id("toolu_");
                self.blocks
                    .push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
                vec![
                    json!({"type": "content_block_start", "index": i, "content_block":
                           {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    json!({"type": "content_block_delta", "index": i, "delta":
                           {"type": "input_json_delta", "partial_json": args}}),
                    json!({"type": "content_block_stop", "index": i}),
                ]
            }
        }
    }
}

impl EventBuilder for MessageBuilder {
    /// `message_start` and `ping`, then whatever the forced prefix says.
    fn start(&mut self) -> Vec<Value> {
        let mut start = self.message();
        start["content"] = json!([]);
        let mut out = vec![
            json!({"type": "message_start", "message": start}),
            json!({"type": "ping"}),
        ];
        let prefix = std::mem::take(&mut self.prefix);
        let parsed = self.parser.push(&prefix);
        out.extend(self.parsed(parsed));
        out
    }

    fn text(&mut self, t: &str) -> Vec<Value> {
        let parsed = self.parser.push(t);
        self.parsed(parsed)
    }

    /// The last block closed, `message_delta` and `message_stop`.
    fn done(&mut self, d: &Done) -> Vec<Value> {
        let parsed = self.parser.finish();
        let mut out = self.parsed(parsed);
        out.extend(self.close());
        let reason = match (d.finish, &d.stop_sequence) {
            (Finish::Length, _) => "max_tokens",
            _ if self.tool_uses > 0 => "tool_use",
            (Finish::Stop, Some(_)) => "stop_sequence",
            (Finish::Stop, None) => "end_turn",
        };
        self.stop_reason = reason.into();
        if reason == "stop_sequence" {
            self.stop_sequence = d.stop_sequence.clone().into();
        }
        // Anthropic counts cache reads apart from `input_tokens`.
        self.usage = json!({
            "input_tokens": d.prompt_tokens - d.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": d.cached_tokens,
            "output_tokens": d.completion_tokens,
        });
        out.push(json!({
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
            "usage": self.usage,
        }));
        out.push(json!({"type": "message_stop"}));
        out
    }

    fn fail(&mut self, e: &ApiError) -> Vec<Value> {
        vec![crate::messages::error_body(e)]
    }

    /// Anthropic's own keep-alive event.
    fn heartbeat(&mut self) -> Value {
        json!({"type": "ping"})
    }

    fn whole(&self) -> Value {
        self.message()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(finish: Finish, stop: Option<&str>) -> Done {
        Done {
            finish,
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            ttft_secs: 0.0,
            prompt_secs: 0.0,
            decode_secs: 0.0,
            logprobs: vec![],
            stop_sequence: stop.map(String::from),
        }
    }

    fn run(tools: bool, think: bool, chunks: &[&str], d: Done) -> (Vec<Value>, Value) {
        let mut b = MessageBuilder::new(
            "msg_1".into(),
            "m".into(),
            ChatParser::new(tools, think, false),
            String::new(),
            10,
        );
        let mut ev = b.start();
        for c in chunks {
            ev.extend(b.text(c));
        }
        ev.extend(b.done(&d));
        (ev, b.message())
    }

    fn types(ev: &[Value]) -> Vec<&str> {
        ev.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_text_answer_streams_anthropics_events() {
        let (ev, m) = run(false, false, &["Hel", "lo"], done(Finish::Stop, None));
        assert_eq!(
            types(&ev),
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[0]["message"]["content"], json!([]));
        assert_eq!(ev[0]["message"]["usage"]["input_tokens"], 10);
        assert_eq!(m["content"], json!([{"type": "text", "text": "Hello"}]));
        assert_eq!(m["stop_reason"], "end_turn");
        assert_eq!(m["usage"]["input_tokens"], 6);
        assert_eq!(m["usage"]["cache_read_input_tokens"], 4);
        assert_eq!(ev[6]["delta"]["stop_reason"], "end_turn");
        assert_eq!(ev[6]["usage"]["output_tokens"], 3);
    }

    #[test]
    fn stop_reasons() {
        let r = |d: Done| run(false, false, &["x"], d).1;
        assert_eq!(r(done(Finish::Length, None))["stop_reason"], "max_tokens");
        let m = r(done(Finish::Stop, Some("END")));
        assert_eq!(
            (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
            (Some("stop_sequence"), Some("END"))
        );
    }

    #[test]
    fn a_tool_call_is_one_tool_use_block() {
        let (ev, m) = run(
            true,
            true,
            &[
                "<think>hm</think>\nOK.\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"d\"",
                ": \".\"}}\n</tool_call>",
            ],
            done(Finish::Stop, None),
        );
        assert_eq!(
            m["content"][0],
            json!({"type": "thinking", "thinking": "hm", "signature": ""})
        );
        assert_eq!(m["content"][1], json!({"type": "text", "text": "OK."}));
        assert_eq!(m["content"][2]["type"], "tool_use");
        assert_eq!(m["content"][2]["input"], json!({"d": "."}));
        assert!(m["content"][2]["id"]
            .as_str()
            .unwrap()
            .starts_with("toolu_"));
        assert_eq!(m["stop_reason"], "tool_use");
        let start = ev
            .iter()
            .find(|e| e["content_block"]["type"] == "tool_use")
            .unwrap();
        assert_eq!(start["index"], 2);
        assert_eq!(start["content_block"]["input"], json!({}));
        let d = ev
            .iter()
            .find(|e| e["delta"]["type"] == "input_json_delta")
            .unwrap();
        assert_eq!(d["delta"]["partial_json"], "{\"d\": \".\"}");
        // Indexes of starts and stops pair up.
        let starts: Vec<&Value> = ev
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| &e["index"])
            .collect();
        let stops: Vec<&Value> = ev
            .iter()
            .filter(|e| e["type"] == "content_block_stop")
            .map(|e| &e["index"])
            .collect();
        assert_eq!(starts, stops);
    }

    #[test]
    fn arguments_that_are_not_an_object_are_text() {
        let (_, m) = run(
            true,
            false,
            &["<tool_call>\n{\"name\": \"ls\", \"arguments\": [1, 2]}\n</tool_call>"],
            done(Finish::Stop, None),
        );
        assert_eq!(m["content"][0]["type"], "text");
        assert!(m["content"][0]["text"].as_str().unwrap().contains("[1, 2]"));
        assert_eq!(m["stop_reason"], "end_turn");
        let mut c = crate::events::EventChunker(MessageBuilder::new(
            "msg".into(),
            "m".into(),
            ChatParser::new(false, false, false),
            String::new(),
            1,
        ));
        let e = crate::stream::Chunker::error(&mut c, ApiError::Internal("boom".into()));
        assert!(e[0].starts_with("event: error\ndata: {"), "{}", e[0]);
    }
}
