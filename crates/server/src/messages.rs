//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's
//! Messages API over the chat machinery. `system` and `messages` (string
//! or block content: `text`, `tool_use`, `tool_result`, `thinking`) become
//! the chat template's messages, `tools` (`input_schema`) and
//! `tool_choice` (`auto`, `any`, `tool`, `none`) go through the chat
//! route's tool plan, and the chat parser's events become content blocks
//! ([`crate::messages_out`]). Errors have Anthropic's shape:
//! `{"type": "error", "error": {"type": "invalid_request_error", "message": …}}`.

use crate::api::ToolChoice;
use crate::convo;
use crate::error::ApiError;
use crate::events::{collect_whole, EventChunker};
use crate::messages_out::MessageBuilder;
use crate::routes::{json_body, sse_response, submit, Shared};
use crate::stream::{self, SseStream};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redlite_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error in Anthropic's shape (the status is the same as OpenAI's
/// routes give).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's `error.type` for a status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The body of an Anthropic error.
pub fn error_body(e: &ApiError) -> Value {
    let mut message = e.to_string();
    // Anthropic's messages name the field first (`max_tokens: Field required`).
    if let ApiError::BadRequest { param: Some(p), .. } = e {
        if !message.contains(p.as_str()) {
            message = format!("{p}: {message}");
        }
    }
    json!({"type": "error", "error": {"type": error_type(e.status()), "message": message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status(), Json(error_body(&self.0))).into_response();
        if let ApiError::Busy { .. } = self.0 {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(crate::error::RETRY_AFTER_SECS),
            );
        }
        resp
    }
}

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<InMessage>,
    #[serde(default)]
    pub system: Option<Content>,
    /// Required by `/v1/messages`, not by `count_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<AnthropicToolChoice>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Content,
}

/// A string or a list of blocks (each checked by its `type`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct AnthropicToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Deserialize)]
struct TextBlock {
    text: String,
}

#[derive(Debug, Deserialize)]
struct ToolUseBlock {
    id: String,
    name: String,
    input: Value,
}

#[derive(Debug, Deserialize)]
struct ToolResultBlock {
    tool_use_id: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ThinkingBlock {
    thinking: String,
}

fn block_type<'a>(b: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    match b.get("type") {
        Some(Value::String(s)) => Ok(s),
        _ => Err(ApiError::invalid(
            format!("{at}.type"),
            "a content block needs a string `type`",
        )),
    }
}

/// Text of string content or of text blocks (tool results, `system`).
fn text_of(c: &Content, at: &str) -> Result<String, ApiError> {
    match c {
        Content::Text(s) => Ok(s.clone()),
        Content::Blocks(blocks) => {
            let mut out = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let bat = format!("{at}[{j}]");
                match block_type(b, &bat)? {
                    "text" => out.push(convo::parse_at::<TextBlock>(b, &bat)?.text),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{bat}.type"),
                            format!("block type `{other}` is not supported here (only `text`)"),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
    }
}

/// `system` and `messages` as template messages.
pub fn conversation(req: &MessagesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    if let Some(s) = &req.system {
        out.push(ChatMessage::system(text_of(s, "system")?));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    for (i, m) in req.messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let blocks = match &m.content {
            Content::Text(t) => {
                let role = match m.role.as_str() {
                    "user" | "assistant" => m.role.clone(),
                    other => return Err(bad_role(&at, other)),
                };
                out.push(ChatMessage::new(role, t.clone()));
                continue;
            }
            Content::Blocks(b) => b,
        };
        match m.role.as_str() {
            "user" => {
                // Tool results first (as the API requires them), each a
                // tool turn; the text after them is the user's turn.
                let mut texts = Vec::new();
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match block_type(b, &bat)? {
                        "text" => texts.push(convo::parse_at::<TextBlock>(b, &bat)?.text),
                        "tool_result" => {
                            let r: ToolResultBlock = convo::parse_at(b, &bat)?;
                            let mut text = match &r.content {
                                None => String::new(),
                                Some(c) => text_of(c, &format!("{bat}.content"))?,
                            };
                            if r.is_error == Some(true) {
                                text = format!("Error: {text}");
                            }
                            out.push(convo::tool_result(&out, r.tool_use_id, text));
                        }
                        other => return Err(unsupported(&bat, other)),
                    }
                }
                if !texts.is_empty() {
                    out.push(ChatMessage::user(texts.join("\n")));
                }
            }
            "assistant" => {
                let mut msg = ChatMessage {
                    role: "assistant".into(),
                    ..ChatMessage::default()
                };
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match block_type(b, &bat)? {
                        "text" => {
                            let t = convo::parse_at::<TextBlock>(b, &bat)?.text;
                            let c = msg.content.get_or_insert_with(String::new);
                            if !c.is_empty() {
                                c.push('\n');
                            }
                            c.push_str(&t);
                        }
                        "tool_use" => {
                            let u: ToolUseBlock = convo::parse_at(b, &bat)?;
                            if u.name.is_empty() {
                                return Err(ApiError::invalid(
                                    format!("{bat}.name"),
                                    "a tool_use block needs a name",
                                ));
                            }
                            msg.tool_calls
                                .push(convo::tool_call(&u.id, &u.name, u.input));
                        }
                        "thinking" => {
                            let t: ThinkingBlock = convo::parse_at(b, &bat)?;
                            msg.reasoning_content = Some(t.thinking);
                        }
                        // Nothing a template can render.
                        "redacted_thinking" => {}
                        other => return Err(unsupported(&bat, other)),
                    }
                }
                out.push(msg);
            }
            other => return Err(bad_role(&at, other)),
        }
    }
    Ok(out)
}

fn bad_role(at: &str, role: &str) -> ApiError {
    ApiError::invalid(
        format!("{at}.role"),
        format!("role `{role}` is not one of user, assistant (the system prompt goes in `system`)"),
    )
}

fn unsupported(at: &str, kind: &str) -> ApiError {
    ApiError::invalid(
        format!("{at}.type"),
        format!("content block type `{kind}` is not supported: this model reads text (text, tool_use, tool_result, thinking)"),
    )
}

/// Tools in the chat route's shape; Anthropic's server tools (a `type`
/// such as `web_search_20250305`) are a 400: nothing runs them here.
fn tools(req: &[Value]) -> Result<Vec<crate::api::Tool>, ApiError> {
    req.iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            match t.get("type") {
                None | Some(Value::Null) => {}
                Some(Value::String(k)) if k == "custom" => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        format!("{at}.type"),
                        format!("tool type {other} is not supported (only custom tools with `input_schema`)"),
                    ))
                }
            }
            convo::function_def(t, &at, "input_schema", true)
        })
        .collect()
}

fn tool_choice(c: &Option<AnthropicToolChoice>) -> Result<Option<ToolChoice>, ApiError> {
    let Some(c) = c else { return Ok(None) };
    let mode = |m: &str| Ok(Some(ToolChoice::Mode(m.into())));
    match (c.kind.as_str(), &c.name) {
        ("auto", _) => mode("auto"),
        ("any", _) => mode("required"),
        ("none", _) => mode("none"),
        ("tool", Some(name)) => Ok(Some(convo::named_choice(name.clone()))),
        ("tool", None) => Err(ApiError::invalid(
            "tool_choice.name",
            "tool_choice `tool` needs `name`",
        )),
        (other, _) => Err(ApiError::invalid(
            "tool_choice.type",
            format!("tool_choice type `{other}` is not one of auto, any, tool, none"),
        )),
    }
}

/// What both routes make of a request: the prompt, the tools in the chat
/// route's shape, and how they are used.
struct Prepared {
    prompt: crate::prompt::ChatPrompt,
    tools: Vec<crate::api::Tool>,
    setup: convo::ToolSetup,
}

async fn prepare(s: &Shared, v: &Value, req: &MessagesRequest) -> Result<Prepared, ApiError> {
    let tools = tools(req.tools.as_deref().unwrap_or(&[]))?;
    let choice = tool_choice(&req.tool_choice)?;
    let setup = convo::tool_setup(s, &tools, &choice, "input_schema")?;
    let plan = &setup.plan;
    let enable_thinking = match req.thinking.as_ref().map(|t| t.kind.as_str()) {
        None => None,
        Some("enabled") | Some("adaptive") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!("thinking type `{other}` is not one of enabled, disabled"),
            ))
        }
    };
    let messages = conversation(req)?;
    let Some(template) = s.template.clone() else {
        return Err(ApiError::invalid(
            "messages",
            "this model file has no chat template",
        ));
    };
    let parse_special = crate::prompt::parse_special(v)?;
    let prompt = crate::prompt::build(
        s,
        template,
        messages,
        plan.tools.clone(),
        plan.forced_prefix.clone(),
        setup.grammar.is_some(),
        enable_thinking,
        parse_special,
        None,
    )
    .await?;
    Ok(Prepared {
        prompt,
        tools,
        setup,
    })
}

/// `POST /v1/messages`.
pub async fn create(State(s): State<Shared>, body: Body) -> Result<Response, AnthropicError> {
    let v = json_body(body, s.max_body_bytes).await?;
    let req: MessagesRequest = crate::error::parse_json(&v)?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid("max_tokens", "Field required").into());
    };
    let stream = req.stream.unwrap_or(false);
    let mut g = convo::gen_params(
        "max_tokens",
        Some(max_tokens),
        req.temperature,
        req.top_p,
        req.top_k,
        req.stop_sequences.clone(),
        stream,
        &s.limits,
    )?;
    let Prepared {
        prompt: p,
        tools,
        setup,
    } = prepare(&s, &v, &req).await?;
    crate::request::check_prompt_len(p.ids.len(), &s.limits, "messages")?;
    let budget = g.budget(p.ids.len(), &s.limits, s.limits.max_tokens_limit);
    let prompt_len = p.ids.len();
    let parser = convo::chat_parser(&setup.plan, &tools, p.think, p.in_think);
    g.grammar = setup.grammar;
    let mut rx = submit(&s, p.ids, budget, &g, None)?;
    let mut b = MessageBuilder::new(
        stream::new_id("msg_"),
        s.model_id.clone(),
        parser,
        p.prefix,
        prompt_len,
    );
    if stream {
        let chunker = EventChunker(b);
        return Ok(sse_response(SseStream::new(rx, Box::new(chunker))));
    }
    Ok(Json(collect_whole(&mut b, &mut rx).await?).into_response())
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt the
/// same request would make.
pub async fn count_tokens(State(s): State<Shared>, body: Body) -> Result<Response, AnthropicError> {
    let v = json_body(body, s.max_body_bytes).await?;
    let req: MessagesRequest = crate::error::parse_json(&v)?;
    let p = prepare(&s, &v, &req).await?;
    Ok(Json(json!({"input_tokens": p.prompt.ids.len()})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    #[test]
    fn blocks_become_template_messages() {
        let m = conversation(&req(json!({
            "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "be kind"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need a tool", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "and tomorrow?"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": true}]}
            ]
        })))
        .unwrap();
        assert_eq!(m[0].role, "system");
        assert_eq!(m[0].content.as_deref(), Some("be brief\nbe kind"));
        assert_eq!(m[2].content.as_deref(), Some("Checking."));
        assert_eq!(m[2].reasoning_content.as_deref(), Some("need a tool"));
        assert_eq!(
            m[2].tool_calls[0].function.arguments,
            json!({"city": "Oslo"})
        );
        assert_eq!(m[3].role, "tool");
        assert_eq!(m[3].name.as_deref(), Some("get_weather"));
        assert_eq!(m[3].content.as_deref(), Some("sunny"));
        assert_eq!(
            (m[4].role.as_str(), m[4].content.as_deref()),
            ("user", Some("and tomorrow?"))
        );
        assert_eq!(m[5].content.as_deref(), Some("Error: boom"));
    }

    #[test]
    fn bad_requests_name_the_field() {
        let bad = |v: Value| param(conversation(&req(v)).unwrap_err());
        assert_eq!(bad(json!({"messages": []})), "messages");
        assert_eq!(
            bad(json!({"messages": [{"role": "system", "content": "x"}]})),
            "messages[0].role"
        );
        assert_eq!(
            bad(
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            bad(
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]})
            ),
            "messages[0].content[0].id"
        );
        assert_eq!(
            bad(
                json!({"system": [{"type": "image"}], "messages": [{"role": "user", "content": "x"}]})
            ),
            "system[0].type"
        );
        assert_eq!(
            param(tools(&[json!({"name": "f"})]).unwrap_err()),
            "tools[0].input_schema"
        );
        assert_eq!(
            param(
                tools(&[json!({"type": "web_search_20250305", "name": "web_search"})]).unwrap_err()
            ),
            "tools[0].type"
        );
        assert_eq!(
            param(tools(&[json!({"name": "f", "input_schema": "x"})]).unwrap_err()),
            "tools[0].input_schema"
        );
    }

    #[test]
    fn tool_choices_map_to_the_chat_route() {
        let c = |v: Value| tool_choice(&Some(serde_json::from_value(v).unwrap()));
        assert_eq!(
            c(json!({"type": "any"})).unwrap(),
            Some(ToolChoice::Mode("required".into()))
        );
        assert_eq!(
            c(json!({"type": "auto"})).unwrap(),
            Some(ToolChoice::Mode("auto".into()))
        );
        assert!(matches!(
            c(json!({"type": "tool", "name": "f"})).unwrap(),
            Some(ToolChoice::Named(_))
        ));
        assert_eq!(
            param(c(json!({"type": "tool"})).unwrap_err()),
            "tool_choice.name"
        );
        assert_eq!(
            param(c(json!({"type": "some"})).unwrap_err()),
            "tool_choice.type"
        );
    }

    #[test]
    fn errors_have_anthropics_shape() {
        let b = error_body(&ApiError::invalid("max_tokens", "Field required"));
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "max_tokens: Field required");
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(error_type(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(
            error_type(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error"
        );
        assert_eq!(error_type(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
        let r = AnthropicError(ApiError::Busy {
            queued: 1,
            limit: 1,
        })
        .into_response();
        assert_eq!(r.status(), 503);
        assert!(r.headers().get(axum::http::header::RETRY_AFTER).is_some());
    }
}
