//! What the chat-shaped endpoints share: the Responses and Messages
//! conversations become the chat template's messages, their tools the chat
//! route's tools (a forced call held by the same grammar), and their
//! sampling fields the chat route's checks.

use crate::api::{FunctionDef, SamplingFields, Stop, Tool, ToolChoice};
use crate::error::{parse_json, ApiError};
use crate::parse::ChatParser;
use crate::request::{self, GenParams, Limits, ToolPlan};
use crate::AppState;
use redlite_grammar::Grammar;
use redlite_tokenizer::{ChatMessage, FunctionCall, ToolCall, ToolCallFormat};
use serde_json::Value;
use std::sync::Arc;

/// Parse `v` (found at `at` in the body) as `T`; a 400 names the field
/// by its whole path, e.g. `input[2].call_id`.
pub fn parse_at<T: serde::de::DeserializeOwned>(v: &Value, at: &str) -> Result<T, ApiError> {
    parse_json(v).map_err(|e| match e {
        ApiError::BadRequest {
            message,
            param,
            code,
        } => {
            let (param, message) = match param {
                Some(p) => {
                    let full = if p.starts_with('[') {
                        format!("{at}{p}")
                    } else {
                        format!("{at}.{p}")
                    };
                    let m = message.replace(&format!("`{p}`"), &format!("`{full}`"));
                    (full, m)
                }
                None => (
                    at.to_string(),
                    message.replace("invalid request body", &format!("invalid `{at}`")),
                ),
            };
            ApiError::BadRequest {
                message,
                param: Some(param),
                code,
            }
        }
        other => other,
    })
}

/// A tool call's arguments as the template renders them: the JSON object
/// a string holds, else the string.
pub fn args_value(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_string()))
}

/// An assistant's tool call, for the template.
pub fn tool_call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: Some(id.to_string()),
        kind: "function".into(),
        function: FunctionCall {
            name: name.to_string(),
            arguments,
        },
    }
}

/// The name of the tool whose call `id` answers, from the conversation so far.
pub fn tool_name(msgs: &[ChatMessage], id: &str) -> Option<String> {
    msgs.iter().rev().find_map(|m| {
        m.tool_calls
            .iter()
            .find(|t| t.id.as_deref() == Some(id))
            .map(|t| t.function.name.clone())
    })
}

/// Add a tool call to the conversation: to the assistant turn that ends it,
/// or as a new assistant turn.
pub fn push_call(msgs: &mut Vec<ChatMessage>, call: ToolCall) {
    match msgs.last_mut() {
        Some(m) if m.role == "assistant" => m.tool_calls.push(call),
        _ => msgs.push(ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![call],
            ..ChatMessage::default()
        }),
    }
}

/// The fields a function tool has in both the Responses API (`parameters`,
/// `strict`) and Anthropic's (`input_schema`).
#[derive(serde::Deserialize)]
struct FunctionFields {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    strict: Option<bool>,
}

/// A tool definition found at `at` (`{name, description, SCHEMA}`, SCHEMA
/// the field named `schema_field`; `required`: it must be there) as a
/// function tool in the chat route's shape. A missing name, or a schema
/// that is not a JSON Schema object of type `object`, is a 400 naming the
/// field by its path in the request.
pub fn function_def(
    t: &Value,
    at: &str,
    schema_field: &str,
    required: bool,
) -> Result<Tool, ApiError> {
    let d: FunctionFields = parse_at(t, at)?;
    if d.name.is_empty() {
        return Err(ApiError::invalid(
            format!("{at}.name"),
            "a tool needs a name",
        ));
    }
    let field = format!("{at}.{schema_field}");
    let schema = match t.get(schema_field) {
        None | Some(Value::Null) if required => {
            return Err(ApiError::invalid(
                &field,
                format!("`{field}` is required: the tool's JSON Schema"),
            ))
        }
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => {
            if let Some(k) = o.get("type").filter(|k| k.as_str() != Some("object")) {
                return Err(ApiError::invalid(
                    &field,
                    format!("`{field}` must be a JSON Schema of type `object`, got type {k}"),
                ));
            }
            Some(Value::Object(o.clone()))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                &field,
                format!("`{field}` must be a JSON Schema object"),
            ))
        }
    };
    Ok(function_tool(d.name, d.description, schema, d.strict))
}

/// A `tool_choice` naming one function.
pub fn named_choice(name: String) -> ToolChoice {
    ToolChoice::Named(crate::api::NamedToolChoice {
        kind: Some("function".into()),
        function: crate::api::NamedFunction { name },
    })
}

/// A tool's result as the template's `tool` turn, named after the call it
/// answers (found in the conversation so far).
pub fn tool_result(msgs: &[ChatMessage], call_id: String, text: String) -> ChatMessage {
    ChatMessage {
        role: "tool".into(),
        content: Some(text),
        name: tool_name(msgs, &call_id),
        tool_call_id: Some(call_id),
        ..ChatMessage::default()
    }
}

/// A function tool in the chat route's shape.
pub fn function_tool(
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    strict: Option<bool>,
) -> Tool {
    Tool {
        kind: "function".into(),
        function: FunctionDef {
            name,
            description,
            parameters,
            strict,
        },
    }
}

/// Whether the model's chat template writes calls in Qwen3-Coder's XML
/// syntax (else the JSON-in-`<tool_call>` of Qwen2.5 / Qwen3).
pub fn xml_calls(s: &AppState) -> bool {
    s.template
        .as_ref()
        .is_some_and(|t| t.tool_call_format() == ToolCallFormat::Xml)
}

/// How tools are used for one request, as every chat-shaped endpoint
/// needs it: the plan (template tools, forced prefix, offered names) in
/// the template's call syntax, and the grammar that holds a forced call
/// (`tool_choice` required or named) to an offered tool with arguments
/// valid against its schema.
pub struct ToolSetup {
    pub plan: ToolPlan,
    pub grammar: Option<Arc<Grammar>>,
}

/// [`ToolSetup`] for `tools` and `choice` in the chat route's shapes.
/// `params`: what the endpoint calls a tool's parameter schema
/// (`parameters`, `input_schema`); an error's field path is rewritten from
/// the chat route's `tools[i].function.…` to the endpoint's `tools[i].…`.
pub fn tool_setup(
    s: &AppState,
    tools: &[Tool],
    choice: &Option<ToolChoice>,
    params: &str,
) -> Result<ToolSetup, ApiError> {
    let rename = |e: ApiError| match e {
        ApiError::BadRequest {
            message,
            param,
            code,
        } => ApiError::BadRequest {
            message,
            param: param.map(|p| {
                p.replace(".function.parameters", &format!(".{params}"))
                    .replace(".function.", ".")
            }),
            code,
        },
        other => other,
    };
    let tools_opt = Some(tools.to_vec());
    let mut plan = request::tool_plan(&tools_opt, choice).map_err(rename)?;
    if xml_calls(s) {
        plan = plan.in_xml_format();
    }
    let grammar = plan.forced_grammar(tools).map_err(rename)?;
    Ok(ToolSetup { plan, grammar })
}

/// The parser of an answer: tool calls of the offered tools only, in the
/// template's syntax (XML calls typed by each tool's schema), reasoning
/// blocks when the vocabulary has them (`think`; `in_think`: the prompt
/// opened one).
pub fn chat_parser(plan: &ToolPlan, tools: &[Tool], think: bool, in_think: bool) -> ChatParser {
    let parser = ChatParser::new(plan.parse, think, in_think).with_tool_names(plan.names.clone());
    if !plan.xml {
        return parser;
    }
    let schemas = tools
        .iter()
        .map(|t| {
            let params = t.function.parameters.clone().unwrap_or_default();
            (t.function.name.clone(), params)
        })
        .collect();
    parser.with_xml_calls(schemas)
}

/// The sampling fields both endpoints have, checked as the chat route
/// checks them; `max_field` names the length field in errors.
#[allow(clippy::too_many_arguments)]
pub fn gen_params(
    max_field: &str,
    max_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    stop: Option<Vec<String>>,
    stream: bool,
    limits: &Limits,
) -> Result<GenParams, ApiError> {
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            max_field,
            format!("`{max_field}` must be at least 1"),
        ));
    }
    let fields = SamplingFields {
        max_tokens,
        temperature,
        top_p,
        top_k,
        stop: stop.map(Stop::Many),
        stream: Some(stream),
        ..SamplingFields::default()
    };
    request::gen_params(&fields, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Call {
        call_id: String,
        arguments: String,
    }

    #[test]
    fn errors_name_the_whole_path() {
        let e = parse_at::<Call>(
            &serde_json::json!({"call_id": 3, "arguments": ""}),
            "input[2]",
        )
        .unwrap_err();
        let b = e.body().error;
        assert_eq!(b.param.as_deref(), Some("input[2].call_id"));
        assert!(b.message.contains("`input[2].call_id`"), "{}", b.message);
        let e = parse_at::<Call>(&serde_json::json!({"call_id": "c"}), "input[0]").unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("input[0].arguments"));
    }

    #[test]
    fn function_definitions_of_both_apis() {
        use serde_json::json;
        let param = |r: Result<Tool, ApiError>| r.unwrap_err().body().error.param.unwrap();
        let t = function_def(
            &json!({"name": "f", "description": "d", "input_schema": {"type": "object"}}),
            "tools[0]",
            "input_schema",
            true,
        )
        .unwrap();
        assert_eq!(t.function.name, "f");
        assert_eq!(t.function.parameters, Some(json!({"type": "object"})));
        let t = function_def(
            &json!({"type": "function", "name": "g", "strict": true}),
            "tools[1]",
            "parameters",
            false,
        )
        .unwrap();
        assert_eq!(
            (t.function.parameters, t.function.strict),
            (None, Some(true))
        );
        // Errors name the field where the request has it.
        for (v, schema, required, want) in [
            (
                json!({"name": "f"}),
                "input_schema",
                true,
                "tools[2].tools[1].input_schema",
            ),
            (
                json!({"name": "f", "parameters": "x"}),
                "parameters",
                false,
                "tools[2].tools[1].parameters",
            ),
            (
                json!({"name": "f", "parameters": {"type": "array"}}),
                "parameters",
                false,
                "tools[2].tools[1].parameters",
            ),
            (
                json!({"name": ""}),
                "parameters",
                false,
                "tools[2].tools[1].name",
            ),
            (
                json!({"name": 3}),
                "parameters",
                false,
                "tools[2].tools[1].name",
            ),
        ] {
            assert_eq!(
                param(function_def(&v, "tools[2].tools[1]", schema, required)),
                want,
                "{v}"
            );
        }
        let r = tool_result(&[], "c9".into(), "out".into());
        assert_eq!(
            (r.role.as_str(), r.name, r.tool_call_id.as_deref()),
            ("tool", None, Some("c9"))
        );
    }

    #[test]
    fn calls_join_the_assistant_turn_and_results_find_their_tool() {
        let mut m = vec![
            ChatMessage::user("hi"),
            ChatMessage::assistant("let me see"),
        ];
        push_call(&mut m, tool_call("c1", "ls", args_value("{\"d\": \".\"}")));
        push_call(&mut m, tool_call("c2", "cat", args_value("not json")));
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].tool_calls[0].function.arguments["d"], ".");
        assert_eq!(m[1].tool_calls[1].function.arguments, "not json");
        assert_eq!(tool_name(&m, "c2").as_deref(), Some("cat"));
        assert_eq!(tool_name(&m, "c3"), None);
        let mut n = vec![ChatMessage::user("hi")];
        push_call(&mut n, tool_call("c1", "ls", Value::Null));
        assert_eq!(n[1].role, "assistant");
    }
}
