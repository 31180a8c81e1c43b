//! Chat templates (`tokenizer.chat_template`) rendered with minijinja,
//! configured like the Hugging Face `transformers` chat-template environment
//! (trim_blocks, lstrip_blocks, Python string methods, `tojson` as
//! `json.dumps(ensure_ascii=False)`, `raise_exception`).

use std::collections::BTreeMap;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use redlite_gguf::Metadata;
use serde::{Deserialize, Serialize};

use crate::tokenizer::keys;
use crate::TokenizerError;

/// A function call requested by the assistant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// Arguments: a JSON object, or a string holding JSON (OpenAI style).
    pub arguments: serde_json::Value,
}

/// One tool call of an assistant message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

impl ToolCall {
    pub fn function(name: impl Into<String>, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: None,
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// One chat message (`system`, `user`, `assistant` or `tool`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool name (tool results), or participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(content.into()),
            ..ChatMessage::default()
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
    /// A tool result.
    pub fn tool(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("tool", content)
    }
}

/// How a template asks the model to write tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen2.5,
    /// Qwen3, Hermes).
    Json,
    /// `<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n
    /// </function>\n</tool_call>` (Qwen3-Coder, Qwen3-Coder-Next).
    Xml,
}

impl ToolCallFormat {
    /// The format a template's source asks for: XML when it writes
    /// `<function=` and `<parameter=` tags (as llama.cpp tells the
    /// Qwen3-Coder templates apart), else JSON.
    pub fn detect(source: &str) -> ToolCallFormat {
        if source.contains("<tool_call>")
            && source.contains("<function=")
            && source.contains("<parameter=")
        {
            ToolCallFormat::Xml
        } else {
            ToolCallFormat::Json
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    max_output: usize,
    tool_format: ToolCallFormat,
}

/// Template steps one render may take. The Qwen2 template of the
/// tokenizer fixture takes about 31 steps per message (measured: 126019
/// for 4000 messages), so this allows conversations far beyond any context
/// while stopping a looping template in about a second.
pub const DEFAULT_FUEL: u64 = 20_000_000;

/// Bytes one render may produce: a prompt longer than this is far beyond
/// the longest context (262144 tokens of a few bytes each).
pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compile a template source.
    pub fn new(source: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(DEFAULT_FUEL));
        env.add_template_owned(NAME, source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos_token: String::new(),
            eos_token: String::new(),
            max_output: DEFAULT_MAX_OUTPUT,
            tool_format: ToolCallFormat::detect(source),
        })
    }

    /// The tool-call syntax this template asks for.
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.tool_format
    }

    /// Set the render limits: template steps (`fuel`) and output bytes.
    pub fn with_limits(mut self, fuel: u64, max_output: usize) -> ChatTemplate {
        self.env.set_fuel(Some(fuel));
        self.max_output = max_output;
        self
    }

    /// The template in `tokenizer.chat_template`, with `bos_token` /
    /// `eos_token` set from the BOS / EOS token texts.
    pub fn from_gguf(meta: &Metadata) -> Result<ChatTemplate, TokenizerError> {
        let src = match meta.get(keys::CHAT_TEMPLATE) {
            None => {
                return Err(TokenizerError::MissingKey {
                    key: keys::CHAT_TEMPLATE,
                })
            }
            Some(v) => v.as_str().ok_or_else(|| TokenizerError::WrongType {
                key: keys::CHAT_TEMPLATE,
                expected: "string",
                found: v.type_name(),
            })?,
        };
        let token_text = |key: &'static str| -> String {
            let id = meta.get(key).and_then(|v| v.as_int());
            let toks = meta.get(keys::TOKENS);
            match (id, toks) {
                (Some(id), Some(redlite_gguf::MetadataValue::Array(a))) => usize::try_from(id)
                    .ok()
                    .and_then(|i| a.values.get(i))
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string(),
                _ => String::new(),
            }
        };
        let bos = token_text(keys::BOS);
        let eos = token_text(keys::EOS);
        let t = ChatTemplate::new(src).map_err(|e| TokenizerError::Invalid {
            key: keys::CHAT_TEMPLATE,
            why: format!("the template does not parse: {e}"),
        })?;
        Ok(t.with_special_tokens(bos, eos))
    }

    /// Set the `bos_token` / `eos_token` template variables.
    pub fn with_special_tokens(
        mut self,
        bos: impl Into<String>,
        eos: impl Into<String>,
    ) -> ChatTemplate {
        self.bos_token = bos.into();
        self.eos_token = eos.into();
        self
    }

    /// Render a conversation. `tools` is a JSON list of tool schemas;
    /// `enable_thinking` is passed only when given (templates test
    /// `enable_thinking is defined`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, TokenizerError> {
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from_serialize(messages));
        if let Some(t) = tools {
            if !t.is_null() {
                ctx.insert("tools", Value::from_serialize(t));
            }
        }
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        if let Some(e) = enable_thinking {
            ctx.insert("enable_thinking", Value::from(e));
        }
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        let tmpl = self.env.get_template(NAME)?;
        let mut out = Capped {
            buf: Vec::new(),
            max: self.max_output,
            over: false,
        };
        match tmpl.render_captured_to(Value::from_serialize(&ctx), &mut out) {
            Ok(_) => {}
            Err(_) if out.over => {
                return Err(TokenizerError::Template(format!(
                    "the rendered prompt is over the limit of {} bytes",
                    self.max_output
                )))
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(TokenizerError::Template(format!(
                    "rendering took more than {} template steps (a template that loops without bound?)",
                    self.env.fuel().unwrap_or(0)
                )))
            }
            Err(e) => return Err(e.into()),
        }
        String::from_utf8(out.buf)
            .map_err(|_| TokenizerError::Template("the rendered prompt is not UTF-8".into()))
    }
}

/// The render's output, refusing to grow past `max` bytes.
struct Capped {
    buf: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.max {
            self.over = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as transformers defines it: Python `json.dumps` with
/// `ensure_ascii=False` by default, keys in their order.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                let n = i64::try_from(v)?;
                Some(" ".repeat(usize::try_from(n.max(0)).unwrap_or(0)))
            }
        }
    };
    let opts = JsonOpts {
        indent,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<String>,
    ensure_ascii: bool,
    sort_keys: bool,
}

fn newline(out: &mut String, opts: &JsonOpts, level: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, level: usize) -> Result<(), Error> {
    let item_sep = if opts.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&py_float(f));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or(""), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, opts, level + 1);
                write_json(out, x, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, opts, level + 1);
                let val = v.get_item(k)?;
                match k.kind() {
                    ValueKind::String => {
                        write_json_str(out, k.as_str().unwrap_or(""), opts.ensure_ascii)
                    }
                    // Python turns other keys into strings.
                    _ => {
                        let mut s = String::new();
                        write_json(&mut s, k, opts, 0)?;
                        write_json_str(out, &s, opts.ensure_ascii);
                    }
                }
                out.push_str(": ");
                write_json(out, &val, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: undefined value is not JSON serializable",
            ))
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: {} is not JSON serializable", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form when
/// the exponent is < -4 or >= 16.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let e = format!("{f:e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mant) = match mant.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mant),
    };
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!(
                "{sign}{digits}{}.0",
                "0".repeat(point as usize - digits.len())
            )
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{sign}{a}.{b}")
        }
    } else {
        let (a, b) = digits.split_at(1);
        let m = if b.is_empty() {
            a.to_string()
        } else {
            format!("{a}.{b}")
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(-2.5), "-2.5");
        assert_eq!(py_float(123456.0), "123456.0");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1e-5), "1e-05");
        assert_eq!(py_float(1e15), "1000000000000000.0");
    }

    #[test]
    fn tojson_like_python() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}").unwrap();
        let env = &t.env;
        let tmpl = env.get_template(NAME).unwrap();
        let x: serde_json::Value =
            serde_json::json!({"b": [1, 2.5, "é\n\"", null, true], "a": {}, "c": []});
        let s = tmpl
            .render(minijinja::context! { x => Value::from_serialize(&x) })
            .unwrap();
        assert_eq!(
            s,
            "{\"b\": [1, 2.5, \"é\\n\\\"\", null, true], \"a\": {}, \"c\": []}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\\\"\",\n    null,\n    true\n  ],\n  \"a\": {},\n  \"c\": []\n}"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('nope') }}").unwrap();
        let e = t.render(&[], None, false, None).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }

    #[test]
    fn bad_template_is_an_error() {
        assert!(matches!(
            ChatTemplate::new("{% if %}"),
            Err(TokenizerError::Template(_))
        ));
    }
}
