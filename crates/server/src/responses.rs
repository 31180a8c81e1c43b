//! `POST /v1/responses` and `GET /v1/responses/{id}`: OpenAI's Responses
//! API over the chat machinery. `input` (a string or a list of message,
//! `function_call` and `function_call_output` items) and `instructions`
//! become the chat template's messages; function `tools` and `tool_choice`
//! go through the chat route's tool plan; the answer is parsed by the chat
//! parser into `message`, `reasoning` and `function_call` output items
//! ([`crate::responses_out`]).
//!
//! `previous_response_id`: the server keeps the conversation of recent
//! stored responses (bounded: [`MAX_STORED`] responses, [`MAX_STORED_BYTES`]
//! in all, oldest dropped first). A follow-up renders that conversation
//! and its new items; the prompt it makes starts with the tokens of the
//! previous prompt and answer, so the engine resumes from the prompt-cache
//! checkpoint taken at the end of the previous answer. As in OpenAI's API,
//! `instructions` are not carried over to a follow-up.

use crate::api::ToolChoice;
use crate::convo;
use crate::error::ApiError;
use crate::events::{collect_whole, EventChunker};
use crate::responses_out::{Echo, ResponseBuilder};
pub use crate::responses_store::{Previous, Store, MAX_STORED, MAX_STORED_BYTES};
use crate::routes::{json_body, sse_response, submit, Shared};
use crate::stream::{self, SseStream};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use redlite_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: Input,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// llama-server's extension.
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub text: Option<TextConfig>,
}

/// `input`: a user message's text, or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<TextFormat>,
}

#[derive(Debug, Deserialize)]
pub struct TextFormat {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Deserialize)]
struct MessageItem {
    role: String,
    content: MessageContent,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FunctionCallItem {
    call_id: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Deserialize)]
struct FunctionCallOutputItem {
    call_id: String,
    output: MessageContent,
}

#[derive(Debug, Deserialize)]
struct NamedChoice {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
}

/// A part list's text (`input_text`, `output_text`, `refusal`), joined by
/// newlines.
fn parts_text(c: &MessageContent, at: &str) -> Result<String, ApiError> {
    match c {
        MessageContent::Text(s) => Ok(s.clone()),
        MessageContent::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let text = match p.kind.as_str() {
                    "input_text" | "output_text" | "text" => p.text.as_ref(),
                    "refusal" => p.refusal.as_ref(),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}[{j}].type"),
                            format!("content type `{other}` is not supported: this model reads text only (`input_text`, `output_text`)"),
                        ))
                    }
                };
                let Some(t) = text else {
                    return Err(ApiError::invalid(
                        format!("{at}[{j}].text"),
                        format!("a `{}` part needs `text`", p.kind),
                    ));
                };
                texts.push(t.as_str());
            }
            Ok(texts.join("\n"))
        }
    }
}

/// The input items as template messages, appended to `out`.
pub fn input_messages(input: &Input, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let items = match input {
        Input::Text(t) => {
            out.push(ChatMessage::user(t.clone()));
            return Ok(());
        }
        Input::Items(items) => items,
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(ApiError::invalid(at, "an input item must be an object"));
        }
        let kind = match item.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    "`type` must be a string",
                ))
            }
        };
        match kind {
            "message" => {
                let m: MessageItem = convo::parse_at(item, &at)?;
                let role = match m.role.as_str() {
                    "user" => "user",
                    "assistant" => "assistant",
                    "system" | "developer" => "system",
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}.role"),
                            format!("role `{other}` is not one of user, assistant, system, developer"),
                        ))
                    }
                };
                let text = parts_text(&m.content, &format!("{at}.content"))?;
                out.push(ChatMessage::new(role, text));
            }
            "function_call" => {
                let c: FunctionCallItem = convo::parse_at(item, &at)?;
                if c.name.is_empty() {
                    return Err(ApiError::invalid(
                        format!("{at}.name"),
                        "a function call needs a name",
                    ));
                }
                let call = convo::tool_call(&c.call_id, &c.name, convo::args_value(&c.arguments));
                convo::push_call(out, call);
            }
            "function_call_output" => {
                let o: FunctionCallOutputItem = convo::parse_at(item, &at)?;
                let text = parts_text(&o.output, &format!("{at}.output"))?;
                out.push(convo::tool_result(out, o.call_id, text));
            }
            // Reasoning the client hands back: the chat templates drop
            // earlier turns' reasoning, so there is nothing to render.
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("input item type `{other}` is not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    Ok(())
}

/// Hosted tools of OpenAI's (run by its servers, not the model's client):
/// nothing runs them here, so they are not offered to the model and not
/// echoed in the response's `tools`. Agents send them by default (Codex
/// sends `web_search`), so refusing them would refuse the agent.
const HOSTED: &[&str] = &[
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "mcp",
    "local_shell",
    "tool_search",
];

/// The request's tools: function tools (those inside a `namespace`
/// flattened, each remembered with its namespace for the calls' items),
/// and the accepted tools as the response echoes them.
#[derive(Debug, Default)]
pub struct Tools {
    pub functions: Vec<crate::api::Tool>,
    /// (function name, namespace).
    pub namespaces: Vec<(String, String)>,
    pub echo: Vec<Value>,
}

fn function(t: &Value, at: &str) -> Result<crate::api::Tool, ApiError> {
    convo::function_def(t, at, "parameters", false)
}

fn tool_type<'a>(t: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    t.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{at}.type"), "a tool needs a string `type`"))
}

/// Check and gather the tools (other types are a 400 naming them).
fn tools(req: &[Value]) -> Result<Tools, ApiError> {
    let mut out = Tools::default();
    for (i, t) in req.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool_type(t, &at)? {
            "function" => {
                out.functions.push(function(t, &at)?);
                out.echo.push(t.clone());
            }
            "namespace" => {
                let ns = t.get("name").and_then(Value::as_str).unwrap_or_default();
                if ns.is_empty() {
                    return Err(ApiError::invalid(format!("{at}.name"), "a namespace needs a name"));
                }
                let inner = t.get("tools").and_then(Value::as_array).ok_or_else(|| {
                    ApiError::invalid(format!("{at}.tools"), "a namespace needs a `tools` list")
                })?;
                for (j, f) in inner.iter().enumerate() {
                    let fat = format!("{at}.tools[{j}]");
                    match tool_type(f, &fat)? {
                        "function" => {
                            let f = function(f, &fat)?;
                            out.namespaces.push((f.function.name.clone(), ns.to_string()));
                            out.functions.push(f);
                        }
                        other => {
                            return Err(ApiError::invalid(
                                format!("{fat}.type"),
                                format!("tool type `{other}` is not supported in a namespace (only `function`)"),
                            ))
                        }
                    }
                }
                out.echo.push(t.clone());
            }
            h if HOSTED.contains(&h) => {
                tracing::debug!("{at}: hosted tool `{h}` left out (this server runs none)");
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!("tool type `{other}` is not supported (`function` and `namespace`; hosted tools are left out)"),
                ))
            }
        }
    }
    Ok(out)
}

/// `tool_choice`: a mode or `{"type": "function", "name": …}`.
fn tool_choice(v: &Option<Value>) -> Result<Option<ToolChoice>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(m)) => Ok(Some(ToolChoice::Mode(m.clone()))),
        Some(o) => {
            let c: NamedChoice = convo::parse_at(o, "tool_choice")?;
            match (c.kind.as_str(), c.name) {
                ("function", Some(name)) => Ok(Some(convo::named_choice(name))),
                ("function", None) => Err(ApiError::invalid(
                    "tool_choice.name",
                    "a function tool_choice needs `name`",
                )),
                (other, _) => Err(ApiError::invalid(
                    "tool_choice.type",
                    format!(
                        "tool_choice type `{other}` is not supported (a mode string or `function`)"
                    ),
                )),
            }
        }
    }
}

/// `POST /v1/responses`.
pub async fn create(State(s): State<Shared>, body: Body) -> Result<Response, ApiError> {
    let v = json_body(body, s.max_body_bytes).await?;
    let req: ResponsesRequest = crate::error::parse_json(&v)?;
    if let Some(f) = req.text.as_ref().and_then(|t| t.format.as_ref()) {
        if f.kind != "text" {
            return Err(ApiError::invalid(
                "text.format.type",
                format!(
                    "text.format `{}` is not supported here (only `text`)",
                    f.kind
                ),
            ));
        }
    }
    let stream = req.stream.unwrap_or(false);
    let mut g = convo::gen_params(
        "max_output_tokens",
        req.max_output_tokens,
        req.temperature,
        req.top_p,
        req.top_k,
        None,
        stream,
        &s.limits,
    )?;
    let tools = tools(req.tools.as_deref().unwrap_or(&[]))?;
    let choice = tool_choice(&req.tool_choice)?;
    let setup = convo::tool_setup(&s, &tools.functions, &choice, "parameters")?;
    let plan = &setup.plan;
    let Some(template) = s.template.clone() else {
        return Err(ApiError::invalid(
            "input",
            "this model file has no chat template: use /v1/completions",
        ));
    };
    let prev = match &req.previous_response_id {
        None => None,
        Some(id) => Some(s.responses.previous(id).ok_or_else(|| {
            ApiError::invalid(
                "previous_response_id",
                format!("Previous response with id '{id}' not found (responses are kept in memory, {MAX_STORED} at most, and only with `store`)"),
            )
        })?),
    };
    let (mut conversation, resume, calls) = match prev {
        Some(p) => (p.conversation, Some(p.ids), p.calls),
        None => (Vec::new(), None, Vec::new()),
    };
    let start = conversation.len();
    input_messages(&req.input, &mut conversation)?;
    // Results of the previous answer's calls: name them from its items
    // (its turn is kept as the model wrote it, without parsed calls).
    for m in &mut conversation[start..] {
        if m.role == "tool" && m.name.is_none() {
            m.name = calls
                .iter()
                .find(|(id, _)| Some(id) == m.tool_call_id.as_ref())
                .map(|(_, n)| n.clone());
        }
    }
    if conversation.is_empty() {
        return Err(ApiError::invalid("input", "`input` must not be empty"));
    }
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &req.instructions {
        messages.push(ChatMessage::system(i.clone()));
    }
    messages.extend(conversation.iter().cloned());
    let parse_special = crate::prompt::parse_special(&v)?;
    let p = crate::prompt::build(
        &s,
        template,
        messages,
        plan.tools.clone(),
        plan.forced_prefix.clone(),
        setup.grammar.is_some(),
        None,
        parse_special,
        resume,
    )
    .await?;
    crate::request::check_prompt_len(p.ids.len(), &s.limits, "input")?;
    let budget = g.budget(p.ids.len(), &s.limits, s.limits.max_tokens_limit);
    let store = req.store.unwrap_or(true);
    let prompt_ids = if store { p.ids.clone() } else { Vec::new() };
    // With `store`, the answer's token ids are kept to resume from (the
    // engine reports them with log-probabilities; none are asked for).
    let parser = convo::chat_parser(plan, &tools.functions, p.think, p.in_think);
    g.grammar = setup.grammar.clone();
    let mut rx = submit(&s, p.ids, budget, &g, store.then_some(0))?;
    let echo = Echo {
        id: stream::new_id("resp_"),
        created_at: stream::now_secs(),
        model: s.model_id.clone(),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id.clone(),
        store,
        temperature: g.sampler.temperature,
        top_p: g.sampler.top_p,
        tools: tools.echo,
        namespaces: tools.namespaces,
        tool_choice: req.tool_choice.clone().unwrap_or_else(|| "auto".into()),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        metadata: req.metadata.clone().unwrap_or_default(),
    };
    let keep = Keep {
        store: s.responses.clone(),
        conversation,
        prompt_ids,
    };
    let mut b = ResponseBuilder::new(echo, parser, p.prefix).with_keep(keep);
    if stream {
        return Ok(sse_response(SseStream::new(rx, Box::new(EventChunker(b)))));
    }
    Ok(Json(collect_whole(&mut b, &mut rx).await?).into_response())
}

/// Where a finished response goes for follow-ups.
pub struct Keep {
    pub store: Arc<Store>,
    /// The conversation the prompt was made of (without instructions).
    pub conversation: Vec<ChatMessage>,
    pub prompt_ids: Vec<u32>,
}

impl Keep {
    /// Store the response with its conversation: the answer is the
    /// assistant turn as the model wrote it (tool-call markup included),
    /// so a follow-up's prompt renders the very text the model saw and
    /// can resume from the engine's checkpoint of it.
    pub fn keep(self, b: &ResponseBuilder, response: &Value, done: &crate::engine::Done) {
        if !b.echo.store {
            return;
        }
        let mut conversation = self.conversation;
        conversation.push(ChatMessage::assistant(b.raw_text()));
        let mut ids = self.prompt_ids;
        ids.extend(done.logprobs.iter().map(|l| l.id));
        let prev = Previous {
            conversation,
            ids,
            calls: b.calls(),
        };
        self.store.put(b.echo.id.clone(), response.clone(), prev);
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get(State(s): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match s.responses.response(&id) {
        Some(r) => Ok(Json(r).into_response()),
        None => Err(ApiError::NotFoundResource {
            message: format!("No response found with id '{id}' (responses are kept in memory, {MAX_STORED} at most, and only with `store`)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NamedFunction, NamedToolChoice};
    use serde_json::json;

    fn msgs(input: Value) -> Result<Vec<ChatMessage>, ApiError> {
        let input: Input = serde_json::from_value(input).unwrap();
        let mut out = Vec::new();
        input_messages(&input, &mut out)?;
        Ok(out)
    }

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    #[test]
    fn items_become_template_messages() {
        let m = msgs(json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "list"}, {"type": "input_text", "text": "files"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{\"dir\": \".\"}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}
        ]))
        .unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(
            (m[0].role.as_str(), m[0].content.as_deref()),
            ("system", Some("be brief"))
        );
        assert_eq!(m[1].content.as_deref(), Some("list\nfiles"));
        // The call joins the assistant turn before it.
        assert_eq!(m[2].content.as_deref(), Some("ok"));
        assert_eq!(m[2].tool_calls[0].function.arguments, json!({"dir": "."}));
        assert_eq!(m[2].tool_calls[0].id.as_deref(), Some("call_1"));
        assert_eq!(m[3].role, "tool");
        assert_eq!(m[3].name.as_deref(), Some("ls"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(msgs(json!("hi")).unwrap(), vec![ChatMessage::user("hi")]);
    }

    #[test]
    fn bad_items_name_the_field() {
        assert_eq!(
            param(msgs(json!([{"type": "image", "url": "x"}])).unwrap_err()),
            "input[0].type"
        );
        assert_eq!(
            param(msgs(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])).unwrap_err()),
            "input[0].content[0].type"
        );
        assert_eq!(
            param(
                msgs(json!([{"type": "function_call", "name": "f", "arguments": "{}"}]))
                    .unwrap_err()
            ),
            "input[0].call_id"
        );
        assert_eq!(
            param(
                msgs(json!([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]))
                    .unwrap_err()
            ),
            "input[1].role"
        );
        assert_eq!(
            param(
                msgs(json!([{"type": "function_call_output", "call_id": "c", "output": 5}]))
                    .unwrap_err()
            ),
            "input[0].output"
        );
    }

    #[test]
    fn tools_and_choices() {
        let t = tools(&[
            json!({"type": "function", "name": "f", "parameters": {"type": "object"}}),
            json!({"type": "web_search", "external_web_access": true}),
            json!({"type": "namespace", "name": "agents", "description": "d", "tools": [
                {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]}),
        ])
        .unwrap();
        let names: Vec<&str> = t
            .functions
            .iter()
            .map(|f| f.function.name.as_str())
            .collect();
        assert_eq!(names, ["f", "spawn"]);
        assert_eq!(t.namespaces, [("spawn".to_string(), "agents".to_string())]);
        // The hosted tool is not offered, nor echoed.
        assert_eq!(t.echo.len(), 2);
        assert_eq!(
            param(tools(&[json!({"type": "shell_magic"})]).unwrap_err()),
            "tools[0].type"
        );
        assert_eq!(
            param(tools(&[json!({"type": "namespace", "name": "n", "tools": [{"type": "custom", "name": "x"}]})]).unwrap_err()),
            "tools[0].tools[0].type"
        );
        assert_eq!(
            param(tools(&[json!({"type": "function"})]).unwrap_err()),
            "tools[0].name"
        );
        assert_eq!(
            tool_choice(&Some(json!({"type": "function", "name": "f"}))).unwrap(),
            Some(ToolChoice::Named(NamedToolChoice {
                kind: Some("function".into()),
                function: NamedFunction { name: "f".into() }
            }))
        );
        assert_eq!(
            param(tool_choice(&Some(json!({"type": "function"}))).unwrap_err()),
            "tool_choice.name"
        );
        assert_eq!(
            tool_choice(&Some(json!("required"))).unwrap(),
            Some(ToolChoice::Mode("required".into()))
        );
    }
}
