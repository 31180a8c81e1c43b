//! The answer shape the Responses and Messages APIs share: a builder turns
//! the engine's text into the API's typed events (`response.*`,
//! `message_*`), streamed as `event: TYPE` / `data: {...}` pairs with no
//! `[DONE]`, or fed all at once for the whole answer, so both forms carry
//! the same content.

use crate::engine::{Done, Event};
use crate::error::ApiError;
use crate::stream::Chunker;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

/// An API's answer built from the engine's text, as events.
pub trait EventBuilder: Send {
    /// The opening events (and whatever a forced prefix already says).
    fn start(&mut self) -> Vec<Value>;
    fn text(&mut self, t: &str) -> Vec<Value>;
    /// The closing events.
    fn done(&mut self, d: &Done) -> Vec<Value>;
    /// The events of an engine error mid-answer.
    fn fail(&mut self, e: &ApiError) -> Vec<Value>;
    /// The keep-alive event of a quiet stream.
    fn heartbeat(&mut self) -> Value;
    /// The whole answer as it stands (the non-streamed body).
    fn whole(&self) -> Value;
    /// Called once with the finished answer (Responses stores it here).
    fn finished(&mut self, _d: &Done) {}
}

/// One event as SSE: `event: TYPE` and `data: {...}`.
pub fn sse(ev: &Value) -> String {
    let kind = ev["type"].as_str().unwrap_or("message");
    format!("event: {kind}\ndata: {ev}\n\n")
}

/// The streamed form of a builder.
pub struct EventChunker<B>(pub B);

impl<B: EventBuilder> Chunker for EventChunker<B> {
    fn start(&mut self) -> Vec<String> {
        self.0.start().iter().map(sse).collect()
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        self.0.text(t).iter().map(sse).collect()
    }
    fn done(&mut self, d: &Done) -> Vec<String> {
        let out = self.0.done(d).iter().map(sse).collect();
        self.0.finished(d);
        out
    }
    /// The last event says the answer is over.
    fn end(&mut self) -> Option<String> {
        None
    }
    fn error(&mut self, e: ApiError) -> Vec<String> {
        self.0.fail(&e).iter().map(sse).collect()
    }
    fn heartbeat(&mut self) -> Option<String> {
        Some(sse(&self.0.heartbeat()))
    }
    fn beats(&self) -> bool {
        true
    }
}

/// The whole answer: the engine's text collected, fed to the builder at
/// once; the answer's body.
pub async fn collect_whole<B: EventBuilder>(
    b: &mut B,
    rx: &mut UnboundedReceiver<Event>,
) -> Result<Value, ApiError> {
    let (text, done) = crate::stream::collect(rx).await?;
    b.start();
    b.text(&text);
    b.done(&done);
    b.finished(&done);
    Ok(b.whole())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Finish;
    use serde_json::json;

    /// A builder that records what it was given.
    #[derive(Default)]
    struct Echo {
        text: String,
        finished: u32,
    }

    impl EventBuilder for Echo {
        fn start(&mut self) -> Vec<Value> {
            vec![json!({"type": "begin"})]
        }
        fn text(&mut self, t: &str) -> Vec<Value> {
            self.text.push_str(t);
            vec![json!({"type": "delta", "text": t})]
        }
        fn done(&mut self, _d: &Done) -> Vec<Value> {
            vec![json!({"type": "end"})]
        }
        fn fail(&mut self, e: &ApiError) -> Vec<Value> {
            vec![json!({"type": "failed", "message": e.to_string()})]
        }
        fn heartbeat(&mut self) -> Value {
            json!({"type": "ping"})
        }
        fn whole(&self) -> Value {
            json!({"text": self.text})
        }
        fn finished(&mut self, _d: &Done) {
            self.finished += 1;
        }
    }

    fn done() -> Done {
        Done {
            finish: Finish::Stop,
            prompt_tokens: 1,
            cached_tokens: 0,
            completion_tokens: 2,
            ttft_secs: 0.0,
            prompt_secs: 0.0,
            decode_secs: 0.0,
            logprobs: vec![],
            stop_sequence: None,
        }
    }

    #[test]
    fn streamed_and_whole_forms() {
        let mut c = EventChunker(Echo::default());
        assert_eq!(c.start(), ["event: begin\ndata: {\"type\":\"begin\"}\n\n"]);
        let t = c.text("hi");
        let data = t[0].strip_prefix("event: delta\ndata: ").unwrap();
        assert!(data.ends_with("\n\n"), "{data:?}");
        let v: Value = serde_json::from_str(data.trim_end()).unwrap();
        assert_eq!(v, json!({"type": "delta", "text": "hi"}));
        assert_eq!(c.done(&done()).len(), 1);
        assert_eq!(c.0.finished, 1);
        assert_eq!(c.end(), None);
        assert!(c.beats());
        assert!(c.heartbeat().unwrap().starts_with("event: ping\n"));
        assert!(c.error(ApiError::Internal("boom".into()))[0].contains("boom"));

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Event::Text("a".into())).unwrap();
        tx.send(Event::Text("b".into())).unwrap();
        tx.send(Event::Done(done())).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut b = Echo::default();
        let body = rt.block_on(collect_whole(&mut b, &mut rx)).unwrap();
        assert_eq!(body, json!({"text": "ab"}));
        assert_eq!(b.finished, 1);
    }
}
