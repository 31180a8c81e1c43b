//! The bounded in-memory store of recent Responses API answers, for
//! `previous_response_id` and `GET /v1/responses/{id}`: each response with
//! its conversation and the token ids to resume from. The oldest go first
//! when over [`MAX_STORED`] responses or [`MAX_STORED_BYTES`] in all.

use redlite_tokenizer::ChatMessage;
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
pub const MAX_STORED: usize = 256;
/// Their JSON size in all.
pub const MAX_STORED_BYTES: usize = 64 << 20;

/// A response kept for follow-ups.
struct Stored {
    id: String,
    /// The response object as it was answered.
    response: Value,
    /// The conversation up to and with its answer, without `instructions`.
    conversation: Vec<ChatMessage>,
    /// The prompt's and the answer's tokens, to resume from.
    ids: Vec<u32>,
    /// (call_id, name) of the answer's function calls.
    calls: Vec<(String, String)>,
    bytes: usize,
}

/// What a follow-up continues from.
pub struct Previous {
    pub conversation: Vec<ChatMessage>,
    pub ids: Vec<u32>,
    pub calls: Vec<(String, String)>,
}

/// The bounded store of recent responses.
#[derive(Default)]
pub struct Store {
    inner: Mutex<(VecDeque<Stored>, usize)>,
}

impl Store {
    /// Keep a response (the oldest go when over the bounds; one larger
    /// than the whole bound is not kept).
    pub fn put(&self, id: String, response: Value, prev: Previous) {
        let Previous {
            conversation,
            ids,
            calls,
        } = prev;
        let bytes = response.to_string().len()
            + serde_json::to_string(&conversation).map_or(0, |s| s.len())
            + ids.len() * 4
            + calls.iter().map(|(a, b)| a.len() + b.len()).sum::<usize>();
        if bytes > MAX_STORED_BYTES {
            tracing::warn!("response {id} is too large to keep for follow-ups ({bytes} bytes)");
            return;
        }
        let Ok(mut g) = self.inner.lock() else { return };
        let (list, total) = &mut *g;
        while list.len() >= MAX_STORED || *total + bytes > MAX_STORED_BYTES {
            match list.pop_front() {
                Some(old) => *total -= old.bytes,
                None => break,
            }
        }
        *total += bytes;
        list.push_back(Stored {
            id,
            response,
            conversation,
            ids,
            calls,
            bytes,
        });
    }

    fn find<T>(&self, id: &str, f: impl FnOnce(&Stored) -> T) -> Option<T> {
        let g = self.inner.lock().ok()?;
        g.0.iter().find(|s| s.id == id).map(f)
    }

    pub fn response(&self, id: &str) -> Option<Value> {
        self.find(id, |s| s.response.clone())
    }

    pub fn previous(&self, id: &str) -> Option<Previous> {
        self.find(id, |s| Previous {
            conversation: s.conversation.clone(),
            ids: s.ids.clone(),
            calls: s.calls.clone(),
        })
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |g| g.0.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prev(m: ChatMessage) -> Previous {
        Previous {
            conversation: vec![m],
            ids: vec![1, 2],
            calls: vec![],
        }
    }

    #[test]
    fn the_store_is_bounded() {
        let s = Store::default();
        for i in 0..MAX_STORED + 5 {
            s.put(
                format!("r{i}"),
                json!({"id": i}),
                prev(ChatMessage::user("x")),
            );
        }
        assert_eq!(s.len(), MAX_STORED);
        assert!(s.response("r0").is_none(), "the oldest went first");
        assert_eq!(
            s.response(&format!("r{}", MAX_STORED + 4)).unwrap()["id"],
            MAX_STORED + 4
        );
        // Bytes bound: one huge conversation pushes the others out.
        let big = "y".repeat(MAX_STORED_BYTES / 2);
        s.put(
            "big1".into(),
            json!({}),
            prev(ChatMessage::user(big.clone())),
        );
        s.put(
            "big2".into(),
            json!({}),
            prev(ChatMessage::user(big.clone())),
        );
        assert!(s.response("big1").is_none() && s.response("big2").is_some());
        // Larger than the whole bound: not kept.
        s.put(
            "huge".into(),
            json!({}),
            prev(ChatMessage::user("z".repeat(MAX_STORED_BYTES + 1))),
        );
        assert!(s.response("huge").is_none());
    }
}
