//! A Responses API answer, built from the chat parser's events: the output
//! items (`reasoning`, `message`, `function_call`) and, when streamed, the
//! documented event sequence, each event with its `type` and
//! `sequence_number`:
//!
//! ```text
//! response.created, response.in_progress
//! per item: response.output_item.added
//!   message:   response.content_part.added, response.output_text.delta…,
//!              response.output_text.done, response.content_part.done
//!   reasoning: response.content_part.added, response.reasoning_text.delta…,
//!              response.reasoning_text.done, response.content_part.done
//!   call:      response.function_call_arguments.delta…,
//!              response.function_call_arguments.done
//!   response.output_item.done
//! response.completed (response.incomplete at max_output_tokens,
//! response.failed on an engine error)
//! ```
//!
//! The whole (non-streamed) answer is the same builder's final response,
//! so both forms carry the same items.

use crate::engine::{Done, Finish};
use crate::error::ApiError;
use crate::events::EventBuilder;
use crate::parse::{ChatParser, Parsed};
use crate::responses::Keep;
use crate::stream;
use serde_json::{json, Value};

/// The request's settings a response object repeats.
#[derive(Clone, Debug)]
pub struct Echo {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub temperature: f32,
    pub top_p: f32,
    pub tools: Vec<Value>,
    /// (function name, namespace) of the tools offered inside a namespace.
    pub namespaces: Vec<(String, String)>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub metadata: serde_json::Map<String, Value>,
}

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Message,
    Reasoning,
    Call {
        call_id: String,
        name: String,
        namespace: Option<String>,
    },
}

#[derive(Clone, Debug)]
struct Item {
    kind: Kind,
    id: String,
    /// The text, the reasoning, or the arguments' JSON text.
    text: String,
    status: &'static str,
}

impl Item {
    fn json(&self) -> Value {
        match &self.kind {
            Kind::Message => {
                let content = if self.status == "in_progress" {
                    vec![]
                } else {
                    vec![text_part(&self.text)]
                };
                json!({"type": "message", "id": self.id, "status": self.status,
                       "role": "assistant", "content": content})
            }
            Kind::Reasoning => {
                let content = if self.status == "in_progress" {
                    vec![]
                } else {
                    vec![json!({"type": "reasoning_text", "text": self.text})]
                };
                json!({"type": "reasoning", "id": self.id, "status": self.status,
                       "summary": [], "content": content})
            }
            Kind::Call {
                call_id,
                name,
                namespace,
            } => {
                let mut v = json!({
                    "type": "function_call", "id": self.id, "call_id": call_id, "name": name,
                    "arguments": self.text, "status": self.status,
                });
                if let Some(ns) = namespace {
                    v["namespace"] = ns.as_str().into();
                }
                v
            }
        }
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// Builds one response from generated text.
pub struct ResponseBuilder {
    pub echo: Echo,
    parser: ChatParser,
    /// Forced prompt text the parser reads first (tool_choice).
    prefix: String,
    items: Vec<Item>,
    /// The item text is going to.
    open: Option<usize>,
    seq: u64,
    status: &'static str,
    usage: Value,
    incomplete: bool,
    error: Value,
    /// The answer as generated, forced prefix included.
    raw: String,
    /// Where the finished response is stored.
    keep: Option<Keep>,
}

impl ResponseBuilder {
    pub fn new(echo: Echo, parser: ChatParser, prefix: String) -> ResponseBuilder {
        ResponseBuilder {
            echo,
            parser,
            prefix,
            items: Vec::new(),
            open: None,
            seq: 0,
            status: "in_progress",
            usage: Value::Null,
            incomplete: false,
            error: Value::Null,
            raw: String::new(),
            keep: None,
        }
    }

    /// Store the finished response ([`Keep`]).
    pub fn with_keep(mut self, keep: Keep) -> ResponseBuilder {
        self.keep = Some(keep);
        self
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = kind.into();
        body["sequence_number"] = self.seq.into();
        self.seq += 1;
        body
    }

    /// The response object as it stands.
    pub fn response(&self) -> Value {
        let e = &self.echo;
        json!({
            "id": e.id,
            "object": "response",
            "created_at": e.created_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": if self.incomplete {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": e.model,
            "output": self.items.iter().map(Item::json).collect::<Vec<_>>(),
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": e.store,
            "temperature": e.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": self.usage,
            "user": null,
            "metadata": e.metadata,
        })
    }

    fn parsed(&mut self, parsed: Vec<Parsed>) -> Vec<Value> {
        let mut out = Vec::new();
        for p in parsed {
            match p {
                Parsed::Content(t) => self.append(&mut out, Kind::Message, &t),
                Parsed::Reasoning(t) => self.append(&mut out, Kind::Reasoning, &t),
                Parsed::ToolCallStart { name, .. } => {
                    out.extend(self.close("completed"));
                    let namespace = self
                        .echo
                        .namespaces
                        .iter()
                        .find(|(f, _)| *f == name)
                        .map(|(_, ns)| ns.clone());
                    let kind = Kind::Call {
                        call_id: stream::new_id("call_"),
                        name,
                        namespace,
                    };
                    self.add(&mut out, kind, "fc_");
                }
                Parsed::ToolCallArgs { text, .. } => {
                    if !matches!(self.open_kind(), Some(Kind::Call { .. })) {
                        continue;
                    }
                    let (i, id) = self.current();
                    self.items[i].text.push_str(&text);
                    let ev = json!({"item_id": id, "output_index": i, "delta": text});
                    out.push(self.event("response.function_call_arguments.delta", ev));
                }
            }
        }
        out
    }

    fn open_kind(&self) -> Option<&Kind> {
        self.open.map(|i| &self.items[i].kind)
    }

    fn current(&self) -> (usize, String) {
        let i = self.open.unwrap_or(0);
        (i, self.items[i].id.clone())
    }

    /// Text for a message or reasoning item: a new item unless one of that
    /// kind is open.
    fn append(&mut self, out: &mut Vec<Value>, kind: Kind, t: &str) {
        if t.is_empty() {
            return;
        }
        if self.open_kind() != Some(&kind) {
            out.extend(self.close("completed"));
            let prefix = if kind == Kind::Message { "msg_" } else { "rs_" };
            self.add(out, kind.clone(), prefix);
        }
        let (i, id) = self.current();
        self.items[i].text.push_str(t);
        let ev = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": t});
        let ev = match kind {
            Kind::Message => {
                let mut ev = ev;
                ev["logprobs"] = json!([]);
                self.event("response.output_text.delta", ev)
            }
            _ => self.event("response.reasoning_text.delta", ev),
        };
        out.push(ev);
    }

    fn add(&mut self, out: &mut Vec<Value>, kind: Kind, prefix: &str) {
        let item = Item {
            kind,
            id: stream::new_id(prefix),
            text: String::new(),
            status: "in_progress",
        };
        let i = self.items.len();
        let (id, j) = (item.id.clone(), item.json());
        let kind = item.kind.clone();
        self.items.push(item);
        self.open = Some(i);
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": j}),
        ));
        let part = match kind {
            Kind::Message => text_part(""),
            Kind::Reasoning => json!({"type": "reasoning_text", "text": ""}),
            Kind::Call { .. } => return,
        };
        let ev = json!({"item_id": id, "output_index": i, "content_index": 0, "part": part});
        out.push(self.event("response.content_part.added", ev));
    }

    /// Close the open item with `status`.
    fn close(&mut self, status: &'static str) -> Vec<Value> {
        let Some(i) = self.open.take() else {
            return Vec::new();
        };
        self.items[i].status = status;
        let (id, text, kind) = {
            let it = &self.items[i];
            (it.id.clone(), it.text.clone(), it.kind.clone())
        };
        let mut out = Vec::new();
        match kind {
            Kind::Message => {
                let ev = json!({"item_id": id, "output_index": i, "content_index": 0,
                                "text": text, "logprobs": []});
                out.push(self.event("response.output_text.done", ev));
                let ev = json!({"item_id": id, "output_index": i, "content_index": 0,
                                "part": text_part(&text)});
                out.push(self.event("response.content_part.done", ev));
            }
            Kind::Reasoning => {
                let ev =
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text});
                out.push(self.event("response.reasoning_text.done", ev));
                let ev = json!({"item_id": id, "output_index": i, "content_index": 0,
                                "part": {"type": "reasoning_text", "text": text}});
                out.push(self.event("response.content_part.done", ev));
            }
            Kind::Call { name, .. } => {
                let ev = json!({"item_id": id, "output_index": i, "name": name, "arguments": text});
                out.push(self.event("response.function_call_arguments.done", ev));
            }
        }
        let item = self.items[i].json();
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        ));
        out
    }

    /// The answer's text as generated (forced prefix included).
    pub fn raw_text(&self) -> &str {
        &self.raw
    }

    /// (call_id, name) of the answer's function calls.
    pub fn calls(&self) -> Vec<(String, String)> {
        self.items
            .iter()
            .filter_map(|it| match &it.kind {
                Kind::Call { call_id, name, .. } => Some((call_id.clone(), name.clone())),
                _ => None,
            })
            .collect()
    }
}

impl EventBuilder for ResponseBuilder {
    /// `response.created` and `response.in_progress`, then whatever the
    /// forced prefix already says.
    fn start(&mut self) -> Vec<Value> {
        let r = self.response();
        let mut out = vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ];
        let prefix = std::mem::take(&mut self.prefix);
        self.raw.push_str(&prefix);
        let parsed = self.parser.push(&prefix);
        out.extend(self.parsed(parsed));
        out
    }

    /// `response.in_progress` again, with the response as it stands.
    fn heartbeat(&mut self) -> Value {
        let r = self.response();
        self.event("response.in_progress", json!({"response": r}))
    }

    fn text(&mut self, t: &str) -> Vec<Value> {
        self.raw.push_str(t);
        let parsed = self.parser.push(t);
        self.parsed(parsed)
    }

    /// The last items closed and `response.completed` (or
    /// `response.incomplete`).
    fn done(&mut self, d: &Done) -> Vec<Value> {
        let parsed = self.parser.finish();
        let mut out = self.parsed(parsed);
        self.incomplete = d.finish == Finish::Length;
        out.extend(self.close(if self.incomplete {
            "incomplete"
        } else {
            "completed"
        }));
        self.usage = json!({
            "input_tokens": d.prompt_tokens,
            "input_tokens_details": {"cached_tokens": d.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": d.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": d.prompt_tokens + d.completion_tokens,
        });
        let (status, kind) = if self.incomplete {
            ("incomplete", "response.incomplete")
        } else {
            ("completed", "response.completed")
        };
        self.status = status;
        let r = self.response();
        out.push(self.event(kind, json!({"response": r})));
        out
    }

    /// `response.failed`, for an engine error mid-answer.
    fn fail(&mut self, e: &ApiError) -> Vec<Value> {
        let mut out = self.close("incomplete");
        self.status = "failed";
        self.error = json!({"code": "server_error", "message": e.to_string()});
        let r = self.response();
        out.push(self.event("response.failed", json!({"response": r})));
        out
    }

    fn whole(&self) -> Value {
        self.response()
    }

    /// Stored for follow-ups, with the conversation it answers.
    fn finished(&mut self, d: &Done) {
        if let Some(k) = self.keep.take() {
            k.keep(self, &self.response(), d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> Echo {
        Echo {
            id: "resp_1".into(),
            created_at: 1,
            model: "m".into(),
            instructions: None,
            max_output_tokens: None,
            previous_response_id: None,
            store: true,
            temperature: 0.8,
            top_p: 0.95,
            tools: vec![],
            namespaces: vec![("ls".into(), "fs".into())],
            tool_choice: "auto".into(),
            parallel_tool_calls: true,
            metadata: Default::default(),
        }
    }

    fn done(finish: Finish) -> Done {
        Done {
            finish,
            prompt_tokens: 7,
            cached_tokens: 3,
            completion_tokens: 5,
            ttft_secs: 0.0,
            prompt_secs: 0.0,
            decode_secs: 0.0,
            logprobs: vec![],
            stop_sequence: None,
        }
    }

    fn run(tools: bool, think: bool, chunks: &[&str], finish: Finish) -> (Vec<Value>, Value) {
        let mut b =
            ResponseBuilder::new(echo(), ChatParser::new(tools, think, false), String::new());
        let mut ev = b.start();
        for c in chunks {
            ev.extend(b.text(c));
        }
        ev.extend(b.done(&done(finish)));
        (ev, b.response())
    }

    fn types(ev: &[Value]) -> Vec<&str> {
        ev.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_text_answer_has_the_documented_event_sequence() {
        let (ev, r) = run(false, false, &["Hel", "lo"], Finish::Stop);
        assert_eq!(
            types(&ev),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in ev.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        assert_eq!(ev[0]["response"]["status"], "in_progress");
        assert_eq!(ev[6]["text"], "Hello");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(r["usage"]["input_tokens"], 7);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
        assert_eq!(r["usage"]["total_tokens"], 12);
        assert_eq!(ev.last().unwrap()["response"], r);
    }

    #[test]
    fn a_function_call_streams_its_arguments() {
        let (ev, r) = run(
            true,
            false,
            &[
                "<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"d\"",
                ": \".\"}}\n</tool_call>",
            ],
            Finish::Stop,
        );
        let t = types(&ev);
        assert_eq!(t[2], "response.output_item.added");
        assert_eq!(ev[2]["item"]["type"], "function_call");
        assert_eq!(ev[2]["item"]["name"], "ls");
        assert!(t.contains(&"response.function_call_arguments.delta"));
        let args: String = ev
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"d\": \".\"}");
        let d = ev
            .iter()
            .find(|e| e["type"] == "response.function_call_arguments.done")
            .unwrap();
        assert_eq!(d["arguments"], args);
        let call = &r["output"][0];
        assert_eq!(call["call_id"].as_str().unwrap()[..5], *"call_");
        assert_eq!(call["status"], "completed");
        // A tool offered inside a namespace is called with it.
        assert_eq!(call["namespace"], "fs");
        let mut b = ResponseBuilder::new(
            echo(),
            ChatParser::new(true, false, false),
            "<tool_call>\n{\"name\": ".into(),
        );
        b.start();
        b.text("\"ls\", \"arguments\": {}}</tool_call>");
        b.done(&done(Finish::Stop));
        // Kept for a follow-up: the text as generated, and the call's id.
        assert_eq!(
            b.raw_text(),
            "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}</tool_call>"
        );
        let calls = b.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, "ls");
        assert_eq!(b.response()["output"][0]["call_id"], calls[0].0);
    }

    #[test]
    fn reasoning_then_text_and_a_cut_answer() {
        let (ev, r) = run(false, true, &["<think>hm</think>\n\nIt is"], Finish::Length);
        assert_eq!(r["output"][0]["type"], "reasoning");
        assert_eq!(r["output"][0]["content"][0]["text"], "hm");
        assert_eq!(r["output"][0]["status"], "completed");
        assert_eq!(r["output"][1]["content"][0]["text"], "It is");
        assert_eq!(r["output"][1]["status"], "incomplete");
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(ev.last().unwrap()["type"], "response.incomplete");
        assert!(types(&ev).contains(&"response.reasoning_text.delta"));
    }

    #[test]
    fn an_engine_error_is_response_failed() {
        let mut b =
            ResponseBuilder::new(echo(), ChatParser::new(false, false, false), String::new());
        b.start();
        b.text("partial");
        let ev = b.fail(&ApiError::Internal("boom".into()));
        let last = ev.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["response"]["status"], "failed");
        assert!(last["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("boom"));
        assert_eq!(
            crate::events::sse(last).lines().next().unwrap(),
            "event: response.failed"
        );
    }
}
