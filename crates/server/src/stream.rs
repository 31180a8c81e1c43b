//! Engine events to OpenAI responses: whole (collected) or as SSE chunks.

use crate::api::{
    ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice,
    Delta, FinishReason, FunctionCallOut, FunctionDelta, ResponseMessage, ToolCallDelta,
    ToolCallOut, Usage,
};
use crate::engine::{Done, Event, Finish};
use crate::error::ApiError;
use crate::parse::{ChatParser, Collected, Parsed};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedReceiver;

/// A random-looking id: `prefix` and 24 alphanumerics.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut s = String::from(prefix);
    for _ in 0..24 {
        // SplitMix64 step.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        s.push(ALPHA[(z % ALPHA.len() as u64) as usize] as char);
    }
    s
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn fingerprint() -> String {
    format!("fp_redlite_{}", env!("CARGO_PKG_VERSION"))
}

fn usage(d: &Done) -> Usage {
    Usage::new(
        d.prompt_tokens as u64,
        d.completion_tokens as u64,
        d.cached_tokens as u64,
    )
}

fn finish_reason(f: Finish, tool_calls: bool) -> FinishReason {
    match (f, tool_calls) {
        (Finish::Length, _) => FinishReason::Length,
        (Finish::Stop, true) => FinishReason::ToolCalls,
        (Finish::Stop, false) => FinishReason::Stop,
    }
}

/// What the handlers know about one answer.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Read a job's events to the end: the text, and how it ended.
pub async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<(String, Done), ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => return Ok((text, d)),
            Event::Error(e) => return Err(ApiError::Internal(e)),
        }
    }
    Err(ApiError::Internal("the engine stopped".into()))
}

/// A whole chat completion from the generated text.
pub fn chat_completion(
    meta: &Meta,
    mut parser: ChatParser,
    prefix: &str,
    text: &str,
    done: &Done,
) -> ChatCompletion {
    let mut c = Collected::default();
    c.add(parser.push(prefix));
    c.add(parser.push(text));
    c.add(parser.finish());
    let tool_calls: Vec<ToolCallOut> = c
        .calls
        .into_iter()
        .map(|(name, arguments)| ToolCallOut {
            id: new_id("call_"),
            kind: "function",
            function: FunctionCallOut { name, arguments },
        })
        .collect();
    let has_calls = !tool_calls.is_empty();
    ChatCompletion {
        id: meta.id.clone(),
        object: "chat.completion",
        created: meta.created,
        model: meta.model.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message: ResponseMessage {
                role: "assistant",
                content: if has_calls && c.content.is_empty() {
                    None
                } else {
                    Some(c.content)
                },
                reasoning_content: (!c.reasoning.is_empty()).then_some(c.reasoning),
                tool_calls,
            },
            logprobs: None,
            finish_reason: finish_reason(done.finish, has_calls),
        }],
        usage: usage(done),
        system_fingerprint: fingerprint(),
    }
}

/// A whole text completion.
pub fn completion(meta: &Meta, text: String, done: &Done) -> Completion {
    Completion {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        system_fingerprint: fingerprint(),
        choices: vec![CompletionChoice {
            index: 0,
            text,
            logprobs: None,
            finish_reason: Some(finish_reason(done.finish, false)),
        }],
        usage: Some(Some(usage(done))),
    }
}

/// Turns engine events into SSE `data:` payloads for one endpoint.
pub trait Chunker: Send {
    fn start(&mut self) -> Vec<String>;
    fn text(&mut self, t: &str) -> Vec<String>;
    fn done(&mut self, d: &Done) -> Vec<String>;
    /// What ends a finished stream (OpenAI chat and completions: `[DONE]`;
    /// the Responses and Messages APIs end with their own last event).
    fn end(&mut self) -> Option<String> {
        Some("data: [DONE]\n\n".into())
    }
    /// The events of a generation that failed.
    fn error(&mut self, e: ApiError) -> Vec<String> {
        vec![sse(&e.body())]
    }
    /// An event that keeps the stream alive while nothing else comes (a
    /// long prompt is being computed): agents give up on a stream that is
    /// quiet for a while (Codex after 300 s) and retry from scratch.
    fn heartbeat(&mut self) -> Option<String> {
        None
    }
    /// Whether this stream sends heartbeats.
    fn beats(&self) -> bool {
        false
    }
}

/// How long a stream may be quiet before a heartbeat.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn sse(json: &impl serde::Serialize) -> String {
    format!(
        "data: {}\n\n",
        serde_json::to_string(json).unwrap_or_else(|_| "{}".into())
    )
}

/// Chunks of `chat.completion.chunk`.
pub struct ChatChunker {
    pub meta: Meta,
    pub parser: ChatParser,
    /// Forced prompt text the parser reads first (tool_choice).
    pub prefix: String,
    pub include_usage: bool,
    call_ids: Vec<String>,
}

impl ChatChunker {
    pub fn new(meta: Meta, parser: ChatParser, prefix: String, include_usage: bool) -> ChatChunker {
        ChatChunker {
            meta,
            parser,
            prefix,
            include_usage,
            call_ids: Vec::new(),
        }
    }

    fn chunk(&self, delta: Delta, finish: Option<FinishReason>) -> String {
        sse(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
            }],
            usage: self.include_usage.then_some(None),
        })
    }

    fn events(&mut self, parsed: Vec<Parsed>) -> Vec<String> {
        let mut out = Vec::new();
        for p in parsed {
            let delta = match p {
                Parsed::Content(t) => Delta {
                    content: Some(t),
                    ..Delta::default()
                },
                Parsed::Reasoning(t) => Delta {
                    reasoning_content: Some(t),
                    ..Delta::default()
                },
                Parsed::ToolCallStart { index, name } => {
                    let id = new_id("call_");
                    self.call_ids.push(id.clone());
                    Delta {
                        tool_calls: Some(vec![ToolCallDelta {
                            index,
                            id: Some(id),
                            kind: Some("function"),
                            function: FunctionDelta {
                                name: Some(name),
                                arguments: Some(String::new()),
                            },
                        }]),
                        ..Delta::default()
                    }
                }
                Parsed::ToolCallArgs { index, text } => Delta {
                    tool_calls: Some(vec![ToolCallDelta {
                        index,
                        function: FunctionDelta {
                            name: None,
                            arguments: Some(text),
                        },
                        ..ToolCallDelta::default()
                    }]),
                    ..Delta::default()
                },
            };
            out.push(self.chunk(delta, None));
        }
        out
    }
}

impl Chunker for ChatChunker {
    fn start(&mut self) -> Vec<String> {
        let mut out = vec![self.chunk(
            Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Delta::default()
            },
            None,
        )];
        let prefix = std::mem::take(&mut self.prefix);
        let parsed = self.parser.push(&prefix);
        out.extend(self.events(parsed));
        out
    }

    fn text(&mut self, t: &str) -> Vec<String> {
        let parsed = self.parser.push(t);
        self.events(parsed)
    }

    fn done(&mut self, d: &Done) -> Vec<String> {
        let parsed = self.parser.finish();
        let mut out = self.events(parsed);
        let reason = finish_reason(d.finish, self.parser.tool_calls() > 0);
        out.push(self.chunk(Delta::default(), Some(reason)));
        if self.include_usage {
            out.push(sse(&ChatCompletionChunk {
                id: self.meta.id.clone(),
                object: "chat.completion.chunk",
                created: self.meta.created,
                model: self.meta.model.clone(),
                system_fingerprint: fingerprint(),
                choices: vec![],
                usage: Some(Some(usage(d))),
            }));
        }
        out
    }
}

/// Chunks of `text_completion`.
pub struct CompletionChunker {
    pub meta: Meta,
    pub include_usage: bool,
    /// `echo`: the prompt's text, sent as the first chunk.
    pub echo: Option<String>,
}

impl CompletionChunker {
    fn chunk(&self, text: String, finish: Option<FinishReason>) -> String {
        sse(&Completion {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: finish,
            }],
            usage: self.include_usage.then_some(None),
        })
    }
}

impl Chunker for CompletionChunker {
    fn start(&mut self) -> Vec<String> {
        match self.echo.take() {
            Some(p) => vec![self.chunk(p, None)],
            None => Vec::new(),
        }
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        vec![self.chunk(t.to_string(), None)]
    }
    fn done(&mut self, d: &Done) -> Vec<String> {
        let mut out = vec![self.chunk(String::new(), Some(finish_reason(d.finish, false)))];
        if self.include_usage {
            out.push(sse(&Completion {
                id: self.meta.id.clone(),
                object: "text_completion",
                created: self.meta.created,
                model: self.meta.model.clone(),
                system_fingerprint: fingerprint(),
                choices: vec![],
                usage: Some(Some(usage(d))),
            }));
        }
        out
    }
}

/// The body of a streamed answer. Dropping it (the client went away)
/// drops the receiver, which tells the engine to stop.
pub struct SseStream {
    rx: UnboundedReceiver<Event>,
    chunker: Box<dyn Chunker>,
    queue: VecDeque<String>,
    started: bool,
    finished: bool,
    /// Ticks while the stream is quiet (made at the first poll, inside
    /// the runtime).
    beat: Option<tokio::time::Interval>,
}

impl SseStream {
    pub fn new(rx: UnboundedReceiver<Event>, chunker: Box<dyn Chunker>) -> SseStream {
        SseStream {
            rx,
            chunker,
            queue: VecDeque::new(),
            started: false,
            finished: false,
            beat: None,
        }
    }

    fn on_event(&mut self, ev: Option<Event>) {
        match ev {
            Some(Event::Text(t)) => self.queue.extend(self.chunker.text(&t)),
            Some(Event::Done(d)) => {
                self.queue.extend(self.chunker.done(&d));
                self.queue.extend(self.chunker.end());
                self.finished = true;
            }
            Some(Event::Error(e)) => {
                self.queue.extend(self.chunker.error(ApiError::Internal(e)));
                self.finished = true;
            }
            None => {
                let e = ApiError::Internal("the engine stopped".into());
                self.queue.extend(self.chunker.error(e));
                self.finished = true;
            }
        }
    }
}

impl futures_core::Stream for SseStream {
    type Item = Result<String, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if !this.started {
            this.started = true;
            let first = this.chunker.start();
            this.queue.extend(first);
        }
        // Take everything that is ready, send it as one write.
        let mut heard = false;
        while !this.finished {
            match this.rx.poll_recv(cx) {
                Poll::Ready(ev) => {
                    heard = true;
                    this.on_event(ev)
                }
                Poll::Pending => break,
            }
        }
        if !this.finished {
            if this.beat.is_none() && this.chunker.beats() {
                let start = tokio::time::Instant::now() + HEARTBEAT;
                this.beat = Some(tokio::time::interval_at(start, HEARTBEAT));
            }
            if let Some(beat) = &mut this.beat {
                if heard {
                    beat.reset();
                }
                if beat.poll_tick(cx).is_ready() && this.queue.is_empty() {
                    this.queue.extend(this.chunker.heartbeat());
                    // Register for the next tick.
                    let _ = beat.poll_tick(cx);
                }
            }
        }
        if this.queue.is_empty() {
            return if this.finished {
                Poll::Ready(None)
            } else {
                Poll::Pending
            };
        }
        let out: String = this.queue.drain(..).collect();
        Poll::Ready(Some(Ok(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_core::Stream;

    fn done(finish: Finish) -> Done {
        Done {
            finish,
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: 3,
            ttft_secs: 0.0,
            prompt_secs: 0.0,
            decode_secs: 0.0,
            logprobs: Vec::new(),
            stop_sequence: None,
        }
    }

    fn meta() -> Meta {
        Meta {
            id: "chatcmpl-x".into(),
            created: 1,
            model: "m".into(),
        }
    }

    /// Drive the stream to its end (all events are already queued).
    fn drain(mut s: SseStream) -> Vec<serde_json::Value> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut text = String::new();
        loop {
            match Pin::new(&mut s).poll_next(&mut cx) {
                Poll::Ready(Some(Ok(t))) => text.push_str(&t),
                Poll::Ready(None) => break,
                Poll::Pending => panic!("pending with everything queued"),
            }
        }
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        text.split("\n\n")
            .filter(|l| !l.is_empty() && *l != "data: [DONE]")
            .map(|l| serde_json::from_str(l.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn streamed_tool_call_deltas() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for t in [
            "<tool_call>\n{\"name\": \"get_",
            "weather\", \"arguments\": {\"city\":",
            " \"Paris\"}}\n</tool_call>",
        ] {
            tx.send(Event::Text(t.into())).unwrap();
        }
        tx.send(Event::Done(done(Finish::Stop))).unwrap();
        let chunker = ChatChunker::new(
            meta(),
            ChatParser::new(true, false, false),
            String::new(),
            true,
        );
        let chunks = drain(SseStream::new(rx, Box::new(chunker)));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunks[0]["usage"], serde_json::Value::Null);
        let calls: Vec<&serde_json::Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls[0][0]["function"]["name"], "get_weather");
        assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
        let args: String = calls
            .iter()
            .map(|c| c[0]["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&args).unwrap(),
            serde_json::json!({"city": "Paris"})
        );
        let last_choice = &chunks[chunks.len() - 2]["choices"][0];
        assert_eq!(last_choice["finish_reason"], "tool_calls");
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 8);
    }

    #[test]
    fn whole_answer_with_reasoning() {
        let c = chat_completion(
            &meta(),
            ChatParser::new(false, true, false),
            "",
            "<think>hm</think>\n\nFour.",
            &done(Finish::Length),
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "Four.");
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "hm");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
    }

    #[test]
    fn forced_prefix_is_parsed_not_sent() {
        let c = chat_completion(
            &meta(),
            ChatParser::new(true, false, false),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": ",
            "{\"a\": 1}}\n</tool_call>",
            &done(Finish::Stop),
        );
        let m = &c.choices[0].message;
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls[0].function.name, "f");
        assert_eq!(m.tool_calls[0].function.arguments, "{\"a\": 1}");
        assert_eq!(c.choices[0].finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn completion_stream_and_errors() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Event::Text("a".into())).unwrap();
        tx.send(Event::Done(done(Finish::Length))).unwrap();
        let chunks = drain(SseStream::new(
            rx,
            Box::new(CompletionChunker {
                meta: meta(),
                include_usage: false,
                echo: None,
            }),
        ));
        assert_eq!(chunks[0]["choices"][0]["text"], "a");
        assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
        assert!(chunks[1].get("usage").is_none());
        assert_eq!(new_id("call_").len(), 29);
        assert_ne!(new_id("x"), new_id("x"));
    }
}
