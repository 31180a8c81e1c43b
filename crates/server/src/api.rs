//! OpenAI wire types: what each endpoint accepts and returns.
//!
//! Requests ignore unknown fields (clients send many we do not use);
//! responses follow the shapes of the OpenAI API so its client libraries
//! parse them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

// ------------------------------------------------------------- requests ----

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The sampling and length fields shared by both generation endpoints.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingFields {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    /// llama.cpp's extension; 1 is off.
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) → bias; checked in `extra`.
    #[serde(default)]
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Speculative decoding for this request (llama-server's field names
    /// for the lengths): `none`, `lookup` or `mtp`.
    #[serde(default, rename = "speculative.type")]
    pub speculative_type: Option<String>,
    #[serde(default, rename = "speculative.n_max")]
    pub speculative_n_max: Option<u64>,
    #[serde(default, rename = "speculative.n_min")]
    pub speculative_n_min: Option<u64>,
}

/// `POST /v1/chat/completions` (its sampling fields are read separately as
/// [`SamplingFields`] from the same object; no `flatten`, so errors keep
/// their field paths).
#[derive(Clone, Debug, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<RequestMessage>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// Extra chat-template variables (llama.cpp): `enable_thinking` is used.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Return the prompt's text before the completion.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Text after the insertion point: the prompt becomes a
    /// fill-in-the-middle prompt through the model's FIM tokens.
    #[serde(default)]
    pub suffix: Option<String>,
}

/// A completion prompt: text, or token ids; a list of one is accepted.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    TextList(Vec<String>),
    TokensList(Vec<Vec<u32>>),
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for system.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_template_role(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// Message content: a string or a list of parts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RequestMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<RequestToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// Earlier reasoning, for templates that render it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RequestToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: RequestFunctionCall,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RequestFunctionCall {
    pub name: String,
    /// A string holding JSON (OpenAI) or a JSON object.
    #[serde(default)]
    pub arguments: Value,
}

/// A tool the model may call.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none" | "auto" | "required"` or a named function.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct NamedToolChoice {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: NamedFunction,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct NamedFunction {
    pub name: String,
}

// ------------------------------------------------------------ responses ----

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prompt cache.
    pub cached_tokens: u64,
}

impl Usage {
    pub fn new(prompt: u64, completion: u64, cached: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: cached,
            },
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FunctionCallOut {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ResponseMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ResponseMessage,
    pub logprobs: Option<Value>,
    pub finish_reason: FinishReason,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: String,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<FinishReason>,
}

/// One SSE event of a streamed chat completion.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChunkChoice>,
    /// With `stream_options.include_usage`: `null` on every chunk but the
    /// last, which has no choices and the usage. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<FinishReason>,
}

/// A `text_completion` (whole, or one streamed chunk).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// The body of every error: `{"error": {...}}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_request_accepts_openai_shapes_and_ignores_unknown_fields() {
        let body = json!({
            "model": "x",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}
            ],
            "max_completion_tokens": 5,
            "stop": "\n",
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "logit_bias": {"1": 2},
            "user": "someone",
        });
        let r: ChatCompletionRequest = serde_json::from_value(body.clone()).unwrap();
        let s: SamplingFields = serde_json::from_value(body).unwrap();
        assert_eq!(r.messages.len(), 4);
        assert_eq!(r.messages[0].role, Role::Developer);
        assert_eq!(
            r.messages[1].content,
            Some(Content::Parts(vec![ContentPart {
                kind: "text".into(),
                text: Some("hi".into())
            }]))
        );
        assert_eq!(s.max_completion_tokens, Some(5));
        assert_eq!(s.stop, Some(Stop::One("\n".into())));
        assert_eq!(s.stream_options.unwrap().include_usage, Some(true));
        assert_eq!(
            r.tool_choice,
            Some(ToolChoice::Named(NamedToolChoice {
                kind: Some("function".into()),
                function: NamedFunction { name: "f".into() }
            }))
        );
    }

    #[test]
    fn completion_prompt_forms() {
        for (v, want) in [
            (json!("hi"), Prompt::Text("hi".into())),
            (json!([1, 2]), Prompt::Tokens(vec![1, 2])),
            (json!(["a"]), Prompt::TextList(vec!["a".into()])),
            (json!([[3]]), Prompt::TokensList(vec![vec![3]])),
        ] {
            let r: CompletionRequest = serde_json::from_value(json!({"prompt": v})).unwrap();
            assert_eq!(r.prompt, want);
        }
    }

    #[test]
    fn chunk_usage_is_absent_null_or_filled() {
        let mut c = ChatCompletionChunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk",
            created: 1,
            model: "m".into(),
            system_fingerprint: "fp".into(),
            choices: vec![],
            usage: None,
        };
        let v = serde_json::to_value(&c).unwrap();
        assert!(v.get("usage").is_none());
        c.usage = Some(None);
        assert_eq!(serde_json::to_value(&c).unwrap()["usage"], Value::Null);
        c.usage = Some(Some(Usage::new(3, 4, 1)));
        assert_eq!(
            serde_json::to_value(&c).unwrap()["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                   "prompt_tokens_details": {"cached_tokens": 1}})
        );
    }

    #[test]
    fn tool_call_only_message_has_null_content() {
        let m = ResponseMessage {
            role: "assistant",
            content: None,
            reasoning_content: None,
            tool_calls: vec![ToolCallOut {
                id: "call_x".into(),
                kind: "function",
                function: FunctionCallOut {
                    name: "f".into(),
                    arguments: "{}".into(),
                },
            }],
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["content"], Value::Null);
        assert_eq!(v["tool_calls"][0]["type"], "function");
        assert!(v.get("reasoning_content").is_none());
    }
}
