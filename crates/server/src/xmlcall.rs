//! Qwen3-Coder's XML tool calls, the format its chat template asks for:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=ARG>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A value is raw text (a whole file survives as written: only the one
//! newline after the opening tag and before the closing one are layout).
//! The arguments become a JSON object with each value converted by the
//! tool's parameter schema: a `string` parameter (or a string enum, or one
//! without a type or not in the schema) stays a string, any other is read as
//! JSON when it parses (`42`, `true`, `[1, 2]`, `{"a": 1}`; booleans also as
//! Python's `True` / `False`, which the template writes), else kept as a
//! string.

use serde_json::{Map, Value};

const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

/// `<function=NAME>` at the start of a call block (after whitespace): the
/// name and where the parameters begin. `None` until all of it is there.
pub fn function_header(buf: &str) -> Option<(String, usize)> {
    let t = buf.trim_start();
    let skipped = buf.len() - t.len();
    let rest = t.strip_prefix(FUNCTION_OPEN)?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    if name.is_empty() || name.contains('\n') {
        return None;
    }
    Some((name, skipped + FUNCTION_OPEN.len() + end + 1))
}

/// Whether a parameter's value is written as raw text (a string, or a
/// parameter without a type or not in the schema) rather than as JSON.
pub fn is_raw_text(schema: Option<&Value>) -> bool {
    let Some(s) = schema else { return true };
    if ["$ref", "anyOf", "oneOf", "allOf"]
        .iter()
        .any(|k| s.get(*k).is_some())
    {
        return false;
    }
    if let Some(e) = s.get("enum") {
        return e.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    }
    if let Some(c) = s.get("const") {
        return c.is_string();
    }
    match s.get("type") {
        None => true,
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(a)) => a.iter().all(|t| t == "string"),
        Some(_) => false,
    }
}

fn convert(value: &str, schema: Option<&Value>) -> Value {
    if is_raw_text(schema) {
        return Value::String(value.to_string());
    }
    let is_bool = schema.and_then(|s| s.get("type")).is_some_and(|t| {
        t == "boolean"
            || t.as_array()
                .is_some_and(|a| a.iter().any(|x| x == "boolean"))
    });
    if is_bool {
        // The template renders Python's `True` / `False` (its `| string`).
        match value.trim() {
            "True" => return Value::Bool(true),
            "False" => return Value::Bool(false),
            _ => {}
        }
    }
    serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.to_string()))
}

/// Where a value ends: the first `</parameter>` followed (after
/// whitespace) by another parameter, the end of the function, or nothing;
/// failing that the first `</parameter>`, or the end of the function.
fn value_end(s: &str) -> (usize, usize) {
    let mut from = 0;
    let mut first = None;
    while let Some(i) = s[from..].find(PARAM_CLOSE) {
        let at = from + i;
        first.get_or_insert(at);
        let after = s[at + PARAM_CLOSE.len()..].trim_start();
        if after.is_empty() || after.starts_with(PARAM_OPEN) || after.starts_with(FUNCTION_CLOSE) {
            return (at, at + PARAM_CLOSE.len());
        }
        from = at + PARAM_CLOSE.len();
    }
    if let Some(at) = first {
        return (at, at + PARAM_CLOSE.len());
    }
    let end = s.find(FUNCTION_CLOSE).unwrap_or(s.len());
    (end, end)
}

/// The arguments of a call body (the text after `<function=NAME>`, up to
/// `</tool_call>`) as JSON text, typed by the tool's `parameters` schema.
pub fn arguments_json(body: &str, schema: Option<&Value>) -> String {
    let mut args = Map::new();
    let mut rest = body;
    loop {
        let t = rest.trim_start();
        if t.starts_with(FUNCTION_CLOSE) || t.is_empty() {
            break;
        }
        let Some(i) = t.find(PARAM_OPEN) else { break };
        let after = &t[i + PARAM_OPEN.len()..];
        let Some(gt) = after.find('>') else { break };
        let name = after[..gt].trim().to_string();
        let v = &after[gt + 1..];
        let (end, next) = value_end(v);
        let mut value = &v[..end];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        let param = schema
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get(&name));
        args.insert(name.clone(), convert(value, param));
        rest = &v[next..];
    }
    Value::Object(args).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_and_typed_arguments() {
        assert_eq!(
            function_header("\n<function=write_file>\n<parameter"),
            Some(("write_file".into(), 22))
        );
        assert_eq!(function_header("<function=write_fi"), None);
        let schema = json!({"type": "object", "properties": {
            "path": {"type": "string"}, "count": {"type": "integer"}, "force": {"type": "boolean"},
            "tags": {"type": "array"}, "opts": {"type": ["object", "null"]}, "n": {"type": "string"}}});
        let body = "\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=count>\n3\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=opts>\n{\"x\": 1}\n</parameter>\n<parameter=n>\n42\n</parameter>\n<parameter=other>\n7\n</parameter>\n</function>\n";
        let v: Value = serde_json::from_str(&arguments_json(body, Some(&schema))).unwrap();
        assert_eq!(
            v,
            json!({"path": "src/main.rs", "count": 3, "force": true, "tags": ["a", "b"],
                   "opts": {"x": 1}, "n": "42", "other": "7"})
        );
        // A value that does not parse as its type stays text.
        let v: Value = serde_json::from_str(&arguments_json(
            "<parameter=count>\nthree\n</parameter>",
            Some(&schema),
        ))
        .unwrap();
        assert_eq!(v, json!({"count": "three"}));
    }

    #[test]
    fn long_file_contents_survive_intact() {
        let file = "fn main() {\n    println!(\"<parameter=x> </parameter> inside\");\n}\n\n// trailing blank line above\n";
        let body = format!("\n<parameter=path>\na.rs\n</parameter>\n<parameter=content>\n{file}\n</parameter>\n</function>\n");
        let v: Value = serde_json::from_str(&arguments_json(&body, None)).unwrap();
        assert_eq!(v["content"], json!(file));
        assert_eq!(v["path"], json!("a.rs"));
    }
}
