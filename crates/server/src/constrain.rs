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

/// GBNF for raw text that never contains `stop` (a KMP automaton over its
/// characters: rule `{base}-k` has matched the first `k` characters of
/// `stop`). Any state may end: the text is followed by `stop` itself.
fn text_without(b: &mut SchemaGrammar, base: &str, stop: &str) -> String {
    let s: Vec<char> = stop.chars().collect();
    // The first character does not recur in `stop` (true of the closing
    // tags used here), so a mismatch falls back to state 0, or 1 on it.
    debug_assert!(!s[1..].contains(&s[0]));
    let names: Vec<String> = (0..s.len()).map(|k| format!("{base}-t{k}")).collect();
    let first = schema::literal(&s[0].to_string());
    for k in 0..s.len() {
        let mut alts = vec!["\"\"".to_string()];
        if k + 1 < s.len() {
            alts.push(format!(
                "{} {}",
                schema::literal(&s[k].to_string()),
                names[k + 1]
            ));
        }
        let mut excluded = vec![s[0]];
        if k > 0 {
            alts.push(format!("{first} {}", names[1]));
            excluded.push(s[k]);
        }
        let class: String = excluded
            .iter()
            .map(|c| match c {
                '\n' => "\\n".to_string(),
                ']' | '\\' | '-' | '^' => format!("\\{c}"),
                c => c.to_string(),
            })
            .collect();
        alts.push(format!("[^{class}] {}", names[0]));
        b.add_raw_rule(names[k].clone(), alts.join(" | "));
    }
    names[0].clone()
}

/// One tool's parameters in Qwen3-Coder's XML syntax, in the order its
/// schema lists them (required ones always, optional ones may be left
/// out): strings (or untyped) as raw text that cannot close the tag early,
/// other types as JSON valid for their schema.
fn xml_params(b: &mut SchemaGrammar, i: usize, t: &Tool) -> Result<String, ApiError> {
    let param = format!("tools[{i}].function.parameters");
    let schema = arguments_schema(t);
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let mut list: Vec<(String, Value, bool)> = props
        .iter()
        .map(|(k, v)| (k.clone(), v.clone(), required.contains(k)))
        .collect();
    for r in &required {
        if !props.contains_key(r) {
            list.push((r.clone(), Value::Bool(true), true));
        }
    }
    let base = format!("xml-{i}");
    let text = text_without(b, &base, "\n</parameter>");
    let mut rest = b.add_rule(&format!("{base}-end"), "\"\"".into());
    for (k, (name, sub, req)) in list.iter().enumerate().rev() {
        let value = if !crate::xmlcall::is_raw_text(Some(sub)) {
            b.add(&format!("{base}-{k}"), sub)
                .map_err(|e| schema_error(&format!("{param}.properties.{name}"), e))?
        } else if let Some(Value::Array(e)) = sub.get("enum") {
            let alts: Vec<String> = e
                .iter()
                .filter_map(Value::as_str)
                .map(schema::literal)
                .collect();
            format!("({})", alts.join(" | "))
        } else if let Some(Value::String(c)) = sub.get("const") {
            schema::literal(c)
        } else {
            text.clone()
        };
        let one = format!(
            "{} {value} {}",
            schema::literal(&format!("<parameter={name}>\n")),
            schema::literal("\n</parameter>\n")
        );
        let body = if *req {
            format!("{one} {rest}")
        } else {
            format!("{one} {rest} | {rest}")
        };
        rest = b.add_rule(&format!("{base}-p{k}"), body);
    }
    Ok(rest)
}

/// The forced call in Qwen3-Coder's XML syntax, after the prompt's
/// `<tool_call>\n` (or, `named`, after `<tool_call>\n<function=NAME>\n`).
pub fn xml_tool_call_grammar(
    tools: &[Tool],
    named: Option<&str>,
) -> Result<Arc<Grammar>, ApiError> {
    let mut b = SchemaGrammar::new();
    let close = schema::literal("</function>\n</tool_call>");
    let root = match named {
        Some(name) => {
            let (i, t) = tools
                .iter()
                .enumerate()
                .find(|(_, t)| t.function.name == name)
                .ok_or_else(|| {
                    ApiError::invalid("tool_choice", format!("`{name}` is not in `tools`"))
                })?;
            format!("{} {close}", xml_params(&mut b, i, t)?)
        }
        None => {
            let mut calls = Vec::new();
            for (i, t) in tools.iter().enumerate() {
                let params = xml_params(&mut b, i, t)?;
                calls.push(format!(
                    "{} {params}",
                    schema::literal(&format!("<function={}>\n", t.function.name))
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
    fn xml_tool_call_grammars() {
        let g = xml_tool_call_grammar(&tools(), None).unwrap();
        let ok = "<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
        assert!(Matcher::matches(&g, ok).unwrap());
        // A value may hold newlines and tags, but not the closing tag.
        let ml = "<function=get_weather>\n<parameter=city>\na\n<b>\n</param\n</parameter>\n</function>\n</tool_call>";
        assert!(Matcher::matches(&g, ml).unwrap());
        let early = "<function=get_weather>\n<parameter=city>\na\n</parameter>\nb\n</parameter>\n</function>\n</tool_call>";
        assert!(!Matcher::matches(&g, early).unwrap());
        // Required parameters, declared order, offered names, typed values.
        assert!(
            !Matcher::matches(&g, "<function=get_weather>\n</function>\n</tool_call>").unwrap()
        );
        assert!(Matcher::matches(&g, "<function=now>\n</function>\n</tool_call>").unwrap());
        assert!(!Matcher::matches(&g, "<function=rm>\n</function>\n</tool_call>").unwrap());
        let bad_enum = "<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n</tool_call>";
        assert!(!Matcher::matches(&g, bad_enum).unwrap());
        let g = xml_tool_call_grammar(&tools(), Some("get_weather")).unwrap();
        assert!(Matcher::matches(
            &g,
            "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
        )
        .unwrap());
    }

    /// Calls sampled under the XML grammar with random logits over a byte
    /// vocabulary, read back by the XML parser: every one names an offered
    /// tool and carries its required parameters with values of their types.
    #[test]
    fn sampled_xml_calls_parse_to_valid_arguments() {
        let t: Vec<Tool> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "edit", "parameters": {"type": "object",
                "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                               "mode": {"enum": ["add", "del"]}, "force": {"type": "boolean"}},
                "required": ["path", "line", "mode"]}}}
        ]))
        .unwrap();
        let g = xml_tool_call_grammar(&t, None).unwrap();
        let mut pieces: Vec<Vec<u8>> = vec![b"<eog>".to_vec()];
        pieces.extend((0u8..128).map(|b| vec![b]));
        for p in [
            "<parameter=",
            "</parameter>\n",
            "\n</",
            "<function=",
            "edit>\n",
            "path>\n",
            "12",
            "true",
            "add",
        ] {
            pieces.push(p.as_bytes().to_vec());
        }
        let vocab = Arc::new(Vocab::new(
            pieces.len(),
            |id| Some(pieces[id as usize].as_slice()),
            &[0],
        ));
        let mut seed = 99u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut ended = 0;
        for _ in 0..60 {
            let mut c = redlite_grammar::Constraint::new(g.clone(), vocab.clone()).unwrap();
            let mut out = Vec::new();
            for _ in 0..300 {
                let mut l: Vec<f32> = (0..pieces.len()).map(|_| rnd()).collect();
                // Favour closing a value so that calls end.
                l[pieces.len() - 8] += 0.3;
                c.apply(&mut l).unwrap();
                let pick = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
                assert!(c.accept_token(pick).unwrap());
                if pick == 0 || c.is_finished() {
                    if pick != 0 {
                        out.extend_from_slice(&pieces[pick as usize]);
                    }
                    break;
                }
                out.extend_from_slice(&pieces[pick as usize]);
            }
            if !c.is_complete() {
                continue;
            }
            ended += 1;
            let text = format!("<tool_call>\n{}", String::from_utf8(out).unwrap());
            let mut p = crate::parse::ChatParser::new(true, false, false)
                .with_tool_names(vec!["edit".into()])
                .with_xml_calls(vec![(
                    "edit".into(),
                    t[0].function.parameters.clone().unwrap(),
                )]);
            let mut col = crate::parse::Collected::default();
            col.add(p.push(&text));
            col.add(p.finish());
            assert_eq!(col.calls.len(), 1, "{text:?}");
            let args: Value = serde_json::from_str(&col.calls[0].1).unwrap();
            assert!(args["path"].is_string(), "{text:?} {args}");
            assert!(
                args["line"].is_i64() || args["line"].is_u64(),
                "{text:?} {args}"
            );
            assert!(
                args["mode"] == "add" || args["mode"] == "del",
                "{text:?} {args}"
            );
            assert!(
                args.get("force").is_none_or(Value::is_boolean),
                "{text:?} {args}"
            );
        }
        assert!(ended >= 20, "only {ended} calls ended");
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
