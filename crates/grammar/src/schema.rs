//! JSON Schema into GBNF, for tool parameters and `response_format`.
//!
//! Covered: `type` (one or a list), `properties`, `required`,
//! `additionalProperties` (absent or `false`: no other keys, as llama.cpp's
//! converter does, so a model is not invited to invent keys; `true` or a
//! schema: other keys after the listed ones), `items`, `minItems`,
//! `maxItems`, `enum`, `const`, `anyOf`, `oneOf`, `allOf` of one schema,
//! `$ref` to `#`, `#/$defs/…` and `#/definitions/…`, `minLength`,
//! `maxLength`. Annotations (`title`, `description`, `default`, `format`, …)
//! are ignored. Assertions that cannot be expressed here (`pattern`,
//! numeric bounds, `not`, …) are refused with an error naming where they
//! are, rather than silently producing output the schema rejects.
//!
//! Properties are written in the order the schema lists them; optional ones
//! may be left out. Whitespace between tokens is bounded (one space, or a
//! newline and up to 20 spaces or tabs), numbers have at most 16 digits per
//! part and 2 in the exponent (so they fit an f64): a model cannot loop on
//! either.

use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write;

/// A schema the compiler cannot turn into a grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSON schema at `{path}`: {message}")]
pub struct SchemaError {
    /// Where in the schema, as dotted keys from its root (`` for the root).
    pub path: String,
    pub message: String,
}

/// Assertion keywords this compiler cannot honour.
const UNSUPPORTED: &[&str] = &[
    "pattern",
    "patternProperties",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "not",
    "if",
    "then",
    "else",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "prefixItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
];

/// The rules every JSON grammar shares.
pub const JSON_RULES: &str = r#"ws ::= "" | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\"" ws
json-int ::= "0" | [1-9] [0-9]{0,15}
json-integer ::= "-"? json-int ws
json-number ::= "-"? json-int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? ws
json-boolean ::= ("true" | "false") ws
json-null ::= "null" ws
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ":" ws json-value ("," ws json-string ":" ws json-value)*)? "}" ws
json-array ::= "[" ws (json-value ("," ws json-value)*)? "]" ws
"#;

/// GBNF for any JSON object (`response_format: json_object`).
pub fn json_object_grammar() -> String {
    format!("root ::= json-object\n{JSON_RULES}")
}

/// GBNF for the values `schema` accepts.
pub fn compile(schema: &Value) -> Result<String, SchemaError> {
    let mut b = SchemaGrammar::new();
    let r = b.add("schema", schema)?;
    Ok(b.finish(&r))
}

/// GBNF text as a literal that matches `s` exactly.
pub fn literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Builds one grammar from several schemas (a tool call offers one per
/// tool); [`SchemaGrammar::finish`] adds the root.
#[derive(Debug, Default)]
pub struct SchemaGrammar {
    rules: Vec<(String, String)>,
    used: HashMap<String, usize>,
    /// `$ref` target → rule, per document.
    refs: HashMap<(usize, String), String>,
    docs: Vec<Value>,
}

fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl SchemaGrammar {
    pub fn new() -> SchemaGrammar {
        SchemaGrammar::default()
    }

    /// A fresh rule name from `hint`.
    fn name(&mut self, hint: &str) -> String {
        let mut base: String = hint
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        if base.is_empty() {
            base = "r".into();
        }
        let n = self.used.entry(base.clone()).or_insert(0);
        *n += 1;
        format!("s-{base}-{n}")
    }

    fn rule(&mut self, name: String, body: String) {
        self.rules.push((name, body));
    }

    /// Add the schema `schema` (its `$ref`s resolved within it); returns
    /// the rule matching its values.
    pub fn add(&mut self, hint: &str, schema: &Value) -> Result<String, SchemaError> {
        self.docs.push(schema.clone());
        let doc = self.docs.len() - 1;
        self.visit(doc, schema, "", hint)
    }

    /// Add a rule under exactly `name` (the caller keeps names unique;
    /// `s-…` names are this builder's).
    pub fn add_raw_rule(&mut self, name: String, body: String) {
        self.rule(name, body);
    }

    /// Add a raw rule (GBNF body text).
    pub fn add_rule(&mut self, hint: &str, body: String) -> String {
        let n = self.name(hint);
        self.rule(n.clone(), body);
        n
    }

    /// The grammar text with `root ::= root_body`.
    pub fn finish(self, root_body: &str) -> String {
        let mut out = format!("root ::= {root_body}\n");
        for (n, b) in &self.rules {
            let _ = writeln!(out, "{n} ::= {b}");
        }
        out.push_str(JSON_RULES);
        out
    }

    fn err(path: &str, message: impl Into<String>) -> SchemaError {
        SchemaError {
            path: path.to_string(),
            message: message.into(),
        }
    }

    fn visit(
        &mut self,
        doc: usize,
        s: &Value,
        path: &str,
        hint: &str,
    ) -> Result<String, SchemaError> {
        let obj = match s {
            Value::Bool(true) => return Ok("json-value".into()),
            Value::Bool(false) => {
                return Err(Self::err(path, "the schema `false` accepts no value"))
            }
            Value::Object(o) => o,
            _ => return Err(Self::err(path, "a schema must be an object or a boolean")),
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(doc, r, path);
        }
        for k in UNSUPPORTED {
            if obj.contains_key(*k) {
                return Err(Self::err(
                    &join_path(path, k),
                    format!("`{k}` is not supported by the grammar compiler"),
                ));
            }
        }
        if let Some(c) = obj.get("const") {
            let body = format!("{} ws", literal(&c.to_string()));
            return Ok(self.add_rule(hint, body));
        }
        if let Some(e) = obj.get("enum") {
            let Some(list) = e.as_array().filter(|l| !l.is_empty()) else {
                return Err(Self::err(
                    &join_path(path, "enum"),
                    "`enum` must be a non-empty array",
                ));
            };
            let alts: Vec<String> = list.iter().map(|v| literal(&v.to_string())).collect();
            let body = format!("({}) ws", alts.join(" | "));
            return Ok(self.add_rule(hint, body));
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            let Some(v) = obj.get(key) else { continue };
            let p = join_path(path, key);
            let Some(list) = v.as_array().filter(|l| !l.is_empty()) else {
                return Err(Self::err(&p, format!("`{key}` must be a non-empty array")));
            };
            if key == "allOf" && list.len() > 1 {
                return Err(Self::err(
                    &p,
                    "`allOf` with more than one schema is not supported",
                ));
            }
            let mut alts = Vec::new();
            for (i, sub) in list.iter().enumerate() {
                // Sibling keywords apply to each branch (`type` next to
                // `anyOf` is common).
                let merged = merge(obj, sub, key);
                alts.push(self.visit(doc, &merged, &format!("{p}[{i}]"), hint)?);
            }
            return Ok(self.add_rule(hint, alts.join(" | ")));
        }
        match obj.get("type") {
            None => {
                let t = if ["properties", "required", "additionalProperties"]
                    .iter()
                    .any(|k| obj.contains_key(*k))
                {
                    "object"
                } else if ["items", "minItems", "maxItems"]
                    .iter()
                    .any(|k| obj.contains_key(*k))
                {
                    "array"
                } else if ["minLength", "maxLength"]
                    .iter()
                    .any(|k| obj.contains_key(*k))
                {
                    "string"
                } else {
                    return Ok("json-value".into());
                };
                self.typed(doc, obj, t, path, hint)
            }
            Some(Value::String(t)) => self.typed(doc, obj, t, path, hint),
            Some(Value::Array(ts)) if !ts.is_empty() => {
                let mut alts = Vec::new();
                for (i, t) in ts.iter().enumerate() {
                    let Some(t) = t.as_str() else {
                        return Err(Self::err(
                            &format!("{path}.type[{i}]"),
                            "a type must be a string",
                        ));
                    };
                    alts.push(self.typed(doc, obj, t, path, hint)?);
                }
                Ok(self.add_rule(hint, alts.join(" | ")))
            }
            Some(_) => Err(Self::err(
                &join_path(path, "type"),
                "`type` must be a string or a non-empty array of strings",
            )),
        }
    }

    fn reference(&mut self, doc: usize, r: &Value, path: &str) -> Result<String, SchemaError> {
        let p = join_path(path, "$ref");
        let Some(target) = r.as_str() else {
            return Err(Self::err(&p, "`$ref` must be a string"));
        };
        if let Some(n) = self.refs.get(&(doc, target.to_string())) {
            return Ok(n.clone());
        }
        let sub = if target == "#" {
            Some(self.docs[doc].clone())
        } else {
            ["#/$defs/", "#/definitions/"].iter().find_map(|pre| {
                let name = target.strip_prefix(pre)?;
                let key = &pre[2..pre.len() - 1];
                self.docs[doc].get(key)?.get(name).cloned()
            })
        };
        let Some(sub) = sub else {
            return Err(Self::err(
                &p,
                format!("`{target}` does not resolve (only `#`, `#/$defs/NAME` and `#/definitions/NAME` are supported)"),
            ));
        };
        // Reserve the name first: recursive schemas refer to themselves.
        let hint = target.rsplit('/').next().unwrap_or("ref").to_string();
        let name = self.name(&format!("ref-{hint}"));
        self.refs.insert((doc, target.to_string()), name.clone());
        let body = self.visit(doc, &sub, target.trim_start_matches("#/"), &hint)?;
        self.rule(name.clone(), body);
        Ok(name)
    }

    fn count(
        obj: &serde_json::Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<u32>, SchemaError> {
        match obj.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n <= crate::gbnf::MAX_REPEAT as u64)
                .map(|n| Some(n as u32))
                .ok_or_else(|| {
                    Self::err(
                        &join_path(path, key),
                        format!(
                            "`{key}` must be an integer from 0 to {}",
                            crate::gbnf::MAX_REPEAT
                        ),
                    )
                }),
        }
    }

    fn typed(
        &mut self,
        doc: usize,
        obj: &serde_json::Map<String, Value>,
        t: &str,
        path: &str,
        hint: &str,
    ) -> Result<String, SchemaError> {
        match t {
            "string" => {
                let min = Self::count(obj, "minLength", path)?;
                let max = Self::count(obj, "maxLength", path)?;
                if min.is_none() && max.is_none() {
                    return Ok("json-string".into());
                }
                let min = min.unwrap_or(0);
                if max.is_some_and(|m| m < min) {
                    return Err(Self::err(path, "`maxLength` is below `minLength`"));
                }
                let rep = match max {
                    Some(m) => format!("{{{min},{m}}}"),
                    None => format!("{{{min},}}"),
                };
                Ok(self.add_rule(hint, format!("\"\\\"\" json-char{rep} \"\\\"\" ws")))
            }
            "number" => Ok("json-number".into()),
            "integer" => Ok("json-integer".into()),
            "boolean" => Ok("json-boolean".into()),
            "null" => Ok("json-null".into()),
            "object" => self.object(doc, obj, path, hint),
            "array" => self.array(doc, obj, path, hint),
            other => Err(Self::err(
                &join_path(path, "type"),
                format!("unknown type `{other}`"),
            )),
        }
    }

    fn object(
        &mut self,
        doc: usize,
        obj: &serde_json::Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Result<String, SchemaError> {
        let empty = serde_json::Map::new();
        let props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => {
                return Err(Self::err(
                    &join_path(path, "properties"),
                    "`properties` must be an object",
                ))
            }
        };
        let required: Vec<String> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => {
                let mut v = Vec::new();
                for (i, x) in r.iter().enumerate() {
                    match x.as_str() {
                        Some(s) => v.push(s.to_string()),
                        None => {
                            return Err(Self::err(
                                &format!("{path}.required[{i}]"),
                                "`required` must list property names",
                            ))
                        }
                    }
                }
                v
            }
            Some(_) => {
                return Err(Self::err(
                    &join_path(path, "required"),
                    "`required` must be an array",
                ))
            }
        };
        let extra = match obj.get("additionalProperties") {
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some("json-value".to_string()),
            Some(s) => Some(self.visit(
                doc,
                s,
                &join_path(path, "additionalProperties"),
                &format!("{hint}-extra"),
            )?),
        };
        // (key, value rule, required)
        let mut kvs: Vec<(String, String, bool)> = Vec::new();
        for (k, sub) in props {
            let p = join_path(path, &format!("properties.{k}"));
            let v = self.visit(doc, sub, &p, &format!("{hint}-{k}"))?;
            kvs.push((k.clone(), v, required.contains(k)));
        }
        for r in &required {
            if !props.contains_key(r) {
                let v = extra.clone().unwrap_or_else(|| "json-value".into());
                kvs.push((r.clone(), v, true));
            }
        }
        let n = kvs.len();
        // rest[i][started]: properties i.. given whether one was written.
        let names: Vec<[String; 2]> = (0..=n)
            .map(|i| {
                [
                    self.name(&format!("{hint}-p{i}")),
                    self.name(&format!("{hint}-p{i}c")),
                ]
            })
            .collect();
        // Other keys must differ from the declared ones (a repeated key
        // would be read with the declared key's schema).
        let declared: Vec<String> = kvs.iter().map(|(k, _, _)| k.clone()).collect();
        let extra_kv = match extra {
            Some(v) => {
                let key = self.key_not_in(hint, &declared);
                Some(format!("{key} \":\" ws {v}"))
            }
            None => None,
        };
        match &extra_kv {
            Some(kv) => {
                self.rule(names[n][0].clone(), format!("({kv} (\",\" ws {kv})*)?"));
                self.rule(names[n][1].clone(), format!("(\",\" ws {kv})*"));
            }
            None => {
                self.rule(names[n][0].clone(), "\"\"".into());
                self.rule(names[n][1].clone(), "\"\"".into());
            }
        }
        for (i, (k, v, req)) in kvs.iter().enumerate().rev() {
            let kv = format!(
                "{} ws \":\" ws {v}",
                literal(&serde_json::to_string(k).unwrap_or_default())
            );
            let next_started = &names[i + 1][1];
            let b0 = if *req {
                format!("{kv} {next_started}")
            } else {
                format!("{kv} {next_started} | {}", names[i + 1][0])
            };
            let b1 = if *req {
                format!("\",\" ws {kv} {next_started}")
            } else {
                format!("\",\" ws {kv} {next_started} | {next_started}")
            };
            self.rule(names[i][0].clone(), b0);
            self.rule(names[i][1].clone(), b1);
        }
        Ok(self.add_rule(hint, format!("\"{{\" ws {} \"}}\" ws", names[0][0])))
    }

    /// A JSON string (then `ws`) whose text is none of `keys`: a trie of
    /// the keys, leaving it by any other character. Escapes count as other
    /// characters (so `\u0061` is not recognised as `a`).
    fn key_not_in(&mut self, hint: &str, keys: &[String]) -> String {
        if keys.is_empty() {
            return "json-string".into();
        }
        let base = self.name(&format!("{hint}-key"));
        let mut counter = 0usize;
        self.key_node(&base, &mut counter, keys, 0);
        format!("\"\\\"\" {base}-0 ws")
    }

    /// The rule `{base}-{n}` for the keys sharing their first `depth` chars.
    fn key_node(&mut self, base: &str, counter: &mut usize, keys: &[String], depth: usize) {
        let me = *counter;
        *counter += 1;
        let mut children: Vec<char> = keys.iter().filter_map(|k| k.chars().nth(depth)).collect();
        children.sort_unstable();
        children.dedup();
        let terminal = keys.iter().any(|k| k.chars().count() == depth);
        let mut alts = Vec::new();
        for &c in &children {
            let sub: Vec<String> = keys
                .iter()
                .filter(|k| k.chars().nth(depth) == Some(c))
                .cloned()
                .collect();
            let id = *counter;
            self.key_node(base, counter, &sub, depth + 1);
            alts.push(format!("{} {base}-{id}", literal(&c.to_string())));
        }
        let mut class = String::from("[^\"\\\\\\x7F\\x00-\\x1F");
        for c in &children {
            if matches!(c, ']' | '\\' | '-' | '^') {
                class.push('\\');
            }
            class.push(*c);
        }
        class.push(']');
        alts.push(format!(
            "({class} | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{{4}})) json-char* \"\\\"\""
        ));
        if !terminal {
            alts.push("\"\\\"\"".into());
        }
        self.rule(format!("{base}-{me}"), alts.join(" | "));
    }

    fn array(
        &mut self,
        doc: usize,
        obj: &serde_json::Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Result<String, SchemaError> {
        let item = match obj.get("items") {
            None => "json-value".to_string(),
            Some(Value::Array(_)) => {
                return Err(Self::err(
                    &join_path(path, "items"),
                    "tuple `items` (an array of schemas) is not supported",
                ))
            }
            Some(s) => self.visit(doc, s, &join_path(path, "items"), &format!("{hint}-item"))?,
        };
        let min = Self::count(obj, "minItems", path)?.unwrap_or(0);
        let max = Self::count(obj, "maxItems", path)?;
        if max.is_some_and(|m| m < min) {
            return Err(Self::err(path, "`maxItems` is below `minItems`"));
        }
        let more = |lo: u32, hi: Option<u32>| match hi {
            None => format!("(\",\" ws {item}){{{lo},}}"),
            Some(h) => format!("(\",\" ws {item}){{{lo},{h}}}"),
        };
        let body = match (min, max) {
            (_, Some(0)) => "\"[\" ws \"]\" ws".to_string(),
            (0, m) => format!("\"[\" ws ({item} {})? \"]\" ws", more(0, m.map(|m| m - 1))),
            (lo, m) => format!(
                "\"[\" ws {item} {} \"]\" ws",
                more(lo - 1, m.map(|m| m - 1))
            ),
        };
        Ok(self.add_rule(hint, body))
    }
}

/// `sub` with the keywords of `parent` it does not set (except `key`, the
/// combinator being expanded).
fn merge(parent: &serde_json::Map<String, Value>, sub: &Value, key: &str) -> Value {
    let Value::Object(s) = sub else {
        return sub.clone();
    };
    let mut out = s.clone();
    for (k, v) in parent {
        if k != key && !out.contains_key(k) && !matches!(k.as_str(), "anyOf" | "oneOf" | "allOf") {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}
