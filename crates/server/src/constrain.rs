//! Constrained output: the request fields that ask for it (`response_format`,
//! `grammar`, a forced `tool_choice`) turned into one grammar, and the
//! tokenizer's vocabulary as the grammar engine sees it.

use crate::api::Tool;
use crate::error::ApiError;
use redlite_grammar::schema::{self, SchemaGrammar};
use redlite_grammar::{gbnf, Grammar, Vocab};
use redlite_tokenizer::{TokenType, Tokenizer};
use serde_json::Value;
use std::sync::Arc;

/// The vocabulary as byte strings. Control tokens (`<|im_start|>`, …) are
/// never produced under a grammar; added tokens (`<tool_call>`) are matched
/// by their text; the end-of-generation tokens only end a complete output.
pub fn vocab_for(tok: &Tokenizer) -> Vocab {
    Vocab::new(
        tok.vocab_size(),
        |id| match tok.token_type(id) {
            Some(TokenType::Control | TokenType::Unused | TokenType::Undefined) | None => None,
            _ => Some(tok.token_to_piece(id)),
        },
        tok.eog_ids(),
    )
}

fn parse_gbnf(text: &str, param: &str) -> Result<Arc<Grammar>, ApiError> {
    gbnf::parse(text)
        .map(Arc::new)
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

fn schema_error(param: &str, e: schema::SchemaError) -> ApiError {
    let at = if e.path.is_empty() {
        param.to_string()
    } else {
        format!("{param}.{}", e.path)
    };
    ApiError::invalid(at, e.to_string())
}

/// The grammar asked for by `response_format` (`json_object`, or
/// `json_schema` with `json_schema.schema`) or by `grammar` (GBNF text,
/// llama-server's extension); `None` for plain text. Both at once is a 400.
pub fn output_grammar(v: &Value) -> Result<Option<Arc<Grammar>>, ApiError> {
    let grammar = match v.get("grammar") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(parse_gbnf(s, "grammar")?),
        Some(_) => {
            return Err(ApiError::invalid(
                "grammar",
                "`grammar` must be a string of GBNF text",
            ))
        }
    };
    let format = match v.get("response_format") {
        None | Some(Value::Null) => None,
        Some(rf) => response_format(rf)?,
    };
    match (grammar, format) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            "`grammar` and a JSON `response_format` cannot both be given",
        )),
        (g, f) => Ok(g.or(f)),
    }
}

fn response_format(rf: &Value) -> Result<Option<Arc<Grammar>>, ApiError> {
    let kind = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "response_format.type",
            "`response_format` needs a `type`: `text`, `json_object` or `json_schema`",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(parse_gbnf(
            &schema::json_object_grammar(),
            "response_format",
        )?)),
        "json_schema" => {
            let js = rf.get("json_schema").filter(|j| j.is_object()).ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "`json_schema` must be an object with `name` and `schema`",
                )
            })?;
            if let Some(s) = js.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(ApiError::invalid(
                    "response_format.json_schema.strict",
                    format!("`strict` must be a boolean, got {s}"),
                ));
            }
            let param = "response_format.json_schema.schema";
            // A missing schema means any JSON value (OpenAI's own default is
            // an error; llama-server's is this).
            let text = match js.get("schema") {
                None | Some(Value::Null) => schema::compile(&Value::Bool(true)),
                Some(s) if s.is_object() || s.is_boolean() => schema::compile(s),
                Some(_) => {
                    return Err(ApiError::invalid(param, "`schema` must be a JSON Schema object"))
                }
            }
            .map_err(|e| schema_error(param, e))?;
            Ok(Some(parse_gbnf(&text, param)?))
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!("`response_format.type` must be `text`, `json_object` or `json_schema`, got `{other}`"),
        )),
    }
}

/// Each tool's `parameters` must be a JSON Schema for an object (or absent).
pub fn check_tool_parameters(tools: &[Tool]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let param = format!("tools[{i}].function.parameters");
        match &t.function.parameters {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => match o.get("type") {
                None => {}
                Some(Value::String(s)) if s == "object" => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        &param,
                        format!("a tool's `parameters` must be a JSON Schema of type `object`, got type {other}"),
                    ))
                }
            },
            Some(other) => {
                return Err(ApiError::invalid(
                    &param,
                    format!("a tool's `parameters` must be a JSON Schema object, got {other}"),
                ))
            }
        }
    }
    Ok(())
}

/// The arguments schema of a tool (absent parameters: an object of anything).
fn arguments_schema(t: &Tool) -> Value {
    match &t.function.parameters {
        Some(p @ Value::Object(_)) => p.clone(),
        _ => serde_json::json!({"type": "object", "additionalProperties": true}),
    }
}

/// The text after a forced prefix, in Qwen's tool-call syntax
/// (`<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`).
/// `named`: the prompt already ends in `{"name": NAME, "arguments": `, and
/// the grammar writes the arguments of that tool; otherwise it ends in
/// `<tool_call>\n` and the grammar writes a call of any offered tool.
pub fn tool_call_grammar(tools: &[Tool], named: Option<&str>) -> Result<Arc<Grammar>, ApiError> {
    let mut b = SchemaGrammar::new();
    let close = schema::literal("}\n</tool_call>");
    let root = match named {
        Some(name) => {
            let (i, t) = tools
                .iter()
                .enumerate()
                .find(|(_, t)| t.function.name == name)
                .ok_or_else(|| {
                    ApiError::invalid("tool_choice", format!("`{name}` is not in `tools`"))
                })?;
            let args = b
                .add(&t.function.name, &arguments_schema(t))
                .map_err(|e| schema_error(&format!("tools[{i}].function.parameters"), e))?;
            format!("{args} {close}")
        }
        None => {
            let mut calls = Vec::new();
            for (i, t) in tools.iter().enumerate() {
                let args = b
                    .add(&t.function.name, &arguments_schema(t))
                    .map_err(|e| schema_error(&format!("tools[{i}].function.parameters"), e))?;
                let name = serde_json::to_string(&t.function.name).unwrap_or_default();
                calls.push(format!(
                    "{} ws \",\" ws {} ws \":\" ws {args}",
                    schema::literal(&format!("{{\"name\": {name}")),
                    schema::literal("\"arguments\""),
                ));
            }
            format!("({}) {close}", calls.join(" | "))
        }
    };
    parse_gbnf(&b.finish(&root), "tools")
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_grammar::Matcher;
    use serde_json::json;

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}
        ]))
        .unwrap()
    }

    #[test]
    fn response_formats_and_grammar_fields() {
        assert!(output_grammar(&json!({})).unwrap().is_none());
        assert!(
            output_grammar(&json!({"response_format": {"type": "text"}}))
                .unwrap()
                .is_none()
        );
        let g = output_grammar(&json!({"response_format": {"type": "json_object"}}))
            .unwrap()
            .unwrap();
        assert!(Matcher::matches(&g, r#"{"a": [1, 2]}"#).unwrap());
        assert!(!Matcher::matches(&g, "hello").unwrap());
        let g = output_grammar(&json!({"response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "strict": true, "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}}))
        .unwrap()
        .unwrap();
        assert!(Matcher::matches(&g, r#"{"n": 5}"#).unwrap());
        assert!(!Matcher::matches(&g, r#"{"n": "5"}"#).unwrap());
        let g = output_grammar(&json!({"grammar": "root ::= \"yes\" | \"no\""}))
            .unwrap()
            .unwrap();
        assert!(Matcher::matches(&g, "no").unwrap());
        // Errors name the field.
        let e = output_grammar(&json!({"grammar": "root ::= foo"})).unwrap_err();
        assert_eq!(param(e.clone()), "grammar");
        assert!(e.to_string().contains("line 1, column 10"), "{e}");
        assert_eq!(
            param(output_grammar(&json!({"grammar": 3})).unwrap_err()),
            "grammar"
        );
        assert_eq!(
            param(output_grammar(&json!({"response_format": {"type": "xml"}})).unwrap_err()),
            "response_format.type"
        );
        assert_eq!(
            param(
                output_grammar(&json!({"response_format": {"type": "json_schema"}})).unwrap_err()
            ),
            "response_format.json_schema"
        );
        let e = output_grammar(&json!({"response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object", "properties": {"z": {"type": "string", "pattern": "a+"}}}}}}))
        .unwrap_err();
        assert_eq!(
            param(e),
            "response_format.json_schema.schema.properties.z.pattern"
        );
        assert_eq!(
            param(output_grammar(&json!({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})).unwrap_err()),
            "grammar"
        );
    }

    #[test]
    fn tool_parameters_must_be_object_schemas() {
        assert!(check_tool_parameters(&tools()).is_ok());
        for bad in [
            json!("object"),
            json!([1]),
            json!({"type": "string"}),
            json!(7),
        ] {
            let t: Vec<Tool> = serde_json::from_value(json!([
                {"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "b", "parameters": bad}}
            ]))
            .unwrap();
            assert_eq!(
                param(check_tool_parameters(&t).unwrap_err()),
                "tools[1].function.parameters"
            );
        }
    }

    #[test]
    fn tool_call_grammars_in_qwen_syntax() {
        let g = tool_call_grammar(&tools(), None).unwrap();
        assert!(Matcher::matches(
            &g,
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        )
        .unwrap());
        assert!(
            Matcher::matches(&g, "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>").unwrap()
        );
        assert!(
            !Matcher::matches(&g, "{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>").unwrap()
        );
        assert!(!Matcher::matches(
            &g,
            "{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"
        )
        .unwrap());
        let g = tool_call_grammar(&tools(), Some("get_weather")).unwrap();
        assert!(
            Matcher::matches(&g, "{\"city\": \"Oslo\", \"unit\": \"f\"}}\n</tool_call>").unwrap()
        );
        assert!(!Matcher::matches(&g, "{\"city\": 1}}\n</tool_call>").unwrap());
        let bad: Vec<Tool> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}}}}}
        ]))
        .unwrap();
        assert_eq!(
            param(tool_call_grammar(&bad, None).unwrap_err()),
            "tools[0].function.parameters.properties.x.minimum"
        );
    }
}
