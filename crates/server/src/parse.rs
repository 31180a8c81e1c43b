//! Qwen's assistant output, parsed as it streams: `<think>…</think>` becomes
//! reasoning, `<tool_call>{"name": …, "arguments": {…}}</tool_call>` becomes
//! an OpenAI tool call (the name as soon as it is complete, then the
//! arguments' JSON text in chunks), the rest is content. Like llama.cpp's
//! Hermes/Qwen parser, an answer that *starts* with a bare
//! `{"name": …, "arguments": …}` object (optionally in a ```` ```json ````
//! fence) is a tool call too: small Qwen models often drop the tags.

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// What the parser found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    Content(String),
    Reasoning(String),
    /// A tool call begins: its index among this answer's calls and its name.
    ToolCallStart {
        index: u32,
        name: String,
    },
    /// More of the arguments' JSON text of the call `index`.
    ToolCallArgs {
        index: u32,
        text: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Content,
    Think,
    Tool,
}

/// The streaming parser. Push text as it comes; the concatenated events
/// are the same however the text was split.
#[derive(Debug, Clone)]
pub struct ChatParser {
    buf: String,
    state: State,
    tools: bool,
    think: bool,
    /// Leading whitespace of the next content or reasoning is dropped.
    trim_start: bool,
    calls: u32,
    /// In a tool call: where the arguments start in `buf`, once the name
    /// has been sent.
    args_start: Option<usize>,
    /// Bytes of the arguments already sent.
    args_sent: usize,
    /// Nothing but whitespace has been seen since the start or the last
    /// bare call: a bare JSON call may begin here.
    at_start: bool,
    /// The current call is a bare JSON object (no tags).
    bare: bool,
    /// The current bare call sits in a code fence.
    fenced: bool,
    /// Drop a closing code fence that may follow.
    skip_fence: bool,
    /// The offered tools: a block calling another name stays text.
    names: Option<Vec<String>>,
    /// The current block names a tool that was not offered.
    rejected: bool,
    /// Calls are Qwen3-Coder's XML; each tool's `parameters` schema types
    /// its arguments.
    xml: Option<Vec<(String, serde_json::Value)>>,
    /// The name of the XML call being read.
    xml_name: String,
}

impl ChatParser {
    /// `tools`: parse `<tool_call>` blocks. `think`: parse `<think>` blocks.
    /// `in_think`: the prompt already opened a `<think>` block.
    pub fn new(tools: bool, think: bool, in_think: bool) -> ChatParser {
        ChatParser {
            buf: String::new(),
            state: if in_think && think {
                State::Think
            } else {
                State::Content
            },
            tools,
            think,
            trim_start: in_think && think,
            calls: 0,
            args_start: None,
            args_sent: 0,
            at_start: true,
            bare: false,
            fenced: false,
            skip_fence: false,
            names: None,
            rejected: false,
            xml: None,
            xml_name: String::new(),
        }
    }

    /// Read calls in Qwen3-Coder's XML format (see [`crate::xmlcall`]);
    /// `schemas`: (tool name, `parameters`) to type the arguments by.
    pub fn with_xml_calls(mut self, schemas: Vec<(String, serde_json::Value)>) -> ChatParser {
        self.xml = Some(schemas);
        self
    }

    /// An XML call block: the name once `<function=NAME>` is complete, the
    /// arguments as one JSON text when the block closes. `true`: go on
    /// draining.
    fn drain_xml(&mut self, out: &mut Vec<Parsed>, last: bool) -> bool {
        if self.args_start.is_none() && !self.rejected {
            if let Some((name, end)) = crate::xmlcall::function_header(&self.buf) {
                if self.offered(&name) {
                    out.push(Parsed::ToolCallStart {
                        index: self.calls,
                        name: name.clone(),
                    });
                    self.calls += 1;
                    self.args_start = Some(end);
                    self.xml_name = name;
                } else {
                    self.rejected = true;
                }
            }
        }
        let (end, next) = match self.buf.find(TOOL_CLOSE) {
            Some(c) => (c, c + TOOL_CLOSE.len()),
            None if last => (self.buf.len(), self.buf.len()),
            None => return false,
        };
        match self.args_start {
            Some(start) => {
                let schema = self
                    .xml
                    .as_ref()
                    .and_then(|s| s.iter().find(|(n, _)| *n == self.xml_name))
                    .map(|(_, v)| v);
                let args = crate::xmlcall::arguments_json(&self.buf[start..end], schema);
                self.send_args(out, &args);
            }
            None => {
                let close = if next > end { TOOL_CLOSE } else { "" };
                let raw = format!("{TOOL_OPEN}{}{close}", &self.buf[..end]);
                self.emit_text(out, &raw, false);
            }
        }
        self.buf.drain(..next);
        self.end_call();
        !last || !self.buf.is_empty()
    }

    /// Only calls of these tools are calls; a block naming another tool is
    /// returned as content (a model must not call what it was not given).
    /// Empty: any name.
    pub fn with_tool_names(mut self, names: Vec<String>) -> ChatParser {
        self.names = (!names.is_empty()).then_some(names);
        self
    }

    fn offered(&self, name: &str) -> bool {
        self.names
            .as_ref()
            .is_none_or(|n| n.iter().any(|x| x == name))
    }

    /// Tool calls started so far.
    pub fn tool_calls(&self) -> u32 {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Parsed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// End of text: flush what was held back.
    pub fn finish(&mut self) -> Vec<Parsed> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    fn emit_text(&mut self, out: &mut Vec<Parsed>, mut text: &str, reasoning: bool) {
        if self.trim_start {
            text = text.trim_start();
            if text.is_empty() {
                return;
            }
            self.trim_start = false;
        }
        if text.is_empty() {
            return;
        }
        let s = text.to_string();
        match (out.last_mut(), reasoning) {
            (Some(Parsed::Content(c)), false) => c.push_str(&s),
            (Some(Parsed::Reasoning(c)), true) => c.push_str(&s),
            _ => out.push(if reasoning {
                Parsed::Reasoning(s)
            } else {
                Parsed::Content(s)
            }),
        }
    }

    fn drain(&mut self, out: &mut Vec<Parsed>, last: bool) {
        loop {
            match self.state {
                State::Content => {
                    if self.skip_fence {
                        let t = self.buf.trim_start();
                        if let Some(rest) = t.strip_prefix("```") {
                            let drop = self.buf.len() - rest.len();
                            self.buf.drain(..drop);
                            self.skip_fence = false;
                            continue;
                        }
                        if !last && "```".starts_with(t) {
                            return;
                        }
                        self.skip_fence = false;
                    }
                    if self.tools && self.at_start {
                        match bare_start(&self.buf) {
                            Bare::Yes { obj_at, fenced } => {
                                self.buf.drain(..obj_at);
                                self.state = State::Tool;
                                self.bare = true;
                                self.fenced = fenced;
                                self.args_start = None;
                                self.args_sent = 0;
                                self.at_start = false;
                                continue;
                            }
                            Bare::Maybe if !last => return,
                            _ => self.at_start = false,
                        }
                    }
                    let mut found: Option<(usize, &str)> = None;
                    for (on, tag) in [(self.think, THINK_OPEN), (self.tools, TOOL_OPEN)] {
                        if let Some(at) = on.then(|| self.buf.find(tag)).flatten() {
                            if found.is_none_or(|(f, _)| at < f) {
                                found = Some((at, tag));
                            }
                        }
                    }
                    if let Some((at, tag)) = found {
                        let before = self.buf[..at].to_string();
                        // Whitespace between text and a tag is layout.
                        self.emit_text(out, before.trim_end(), false);
                        self.buf.drain(..at + tag.len());
                        if tag == THINK_OPEN {
                            self.state = State::Think;
                            self.trim_start = true;
                        } else {
                            self.state = State::Tool;
                            self.bare = false;
                            self.args_start = None;
                            self.args_sent = 0;
                        }
                        continue;
                    }
                    let keep = if last {
                        0
                    } else {
                        let mut tags = Vec::new();
                        if self.think {
                            tags.push(THINK_OPEN);
                        }
                        if self.tools {
                            tags.push(TOOL_OPEN);
                        }
                        hold_back(&self.buf, &tags, true)
                    };
                    let cut = self.buf.len() - keep;
                    let text: String = self.buf.drain(..cut).collect();
                    self.emit_text(out, &text, false);
                    return;
                }
                State::Think => {
                    if let Some(at) = self.buf.find(THINK_CLOSE) {
                        let before = self.buf[..at].to_string();
                        self.emit_text(out, before.trim_end(), true);
                        self.buf.drain(..at + THINK_CLOSE.len());
                        self.state = State::Content;
                        self.trim_start = true;
                        continue;
                    }
                    let keep = if last {
                        0
                    } else {
                        hold_back(&self.buf, &[THINK_CLOSE], true)
                    };
                    let cut = self.buf.len() - keep;
                    let text: String = self.buf.drain(..cut).collect();
                    self.emit_text(out, &text, true);
                    return;
                }
                State::Tool if self.xml.is_some() && !self.bare => {
                    if self.drain_xml(out, last) {
                        continue;
                    }
                    return;
                }
                State::Tool => {
                    if self.args_start.is_none() && !self.rejected {
                        if let Some((name, end)) = call_header(&self.buf) {
                            if self.offered(&name) {
                                out.push(Parsed::ToolCallStart {
                                    index: self.calls,
                                    name,
                                });
                                self.calls += 1;
                                self.args_start = Some(end);
                            } else {
                                self.rejected = true;
                            }
                        }
                    }
                    // Where the block's text ends, and where what follows begins.
                    let close = if self.bare {
                        object_end(&self.buf).map(|e| (e + 1, e + 1))
                    } else {
                        self.buf.find(TOOL_CLOSE).map(|c| (c, c + TOOL_CLOSE.len()))
                    };
                    match (self.args_start, close) {
                        (Some(start), Some((end, next))) => {
                            let args = final_args(&self.buf[start..end]).to_string();
                            self.send_args(out, &args);
                            self.buf.drain(..next);
                            self.end_call();
                            continue;
                        }
                        (None, Some((end, next))) => {
                            // No `{"name": …, "arguments": …` header: try the
                            // whole block as JSON, else give it back as text.
                            let inner = self.buf[..end].to_string();
                            self.buf.drain(..next);
                            let call = whole_call(&inner)
                                .filter(|(name, _)| !self.rejected && self.offered(name));
                            match call {
                                Some((name, args)) => {
                                    out.push(Parsed::ToolCallStart {
                                        index: self.calls,
                                        name,
                                    });
                                    out.push(Parsed::ToolCallArgs {
                                        index: self.calls,
                                        text: args,
                                    });
                                    self.calls += 1;
                                }
                                None => {
                                    let raw = if self.bare {
                                        inner
                                    } else {
                                        format!("{TOOL_OPEN}{inner}{TOOL_CLOSE}")
                                    };
                                    self.emit_text(out, &raw, false);
                                }
                            }
                            self.end_call();
                            continue;
                        }
                        (Some(start), None) => {
                            let region = &self.buf[start..];
                            let safe = if last {
                                final_args(region).len()
                            } else {
                                safe_args_len(region)
                            };
                            let args = region[..safe].to_string();
                            self.send_args(out, &args);
                            if last {
                                self.buf.clear();
                                self.end_call();
                            }
                            return;
                        }
                        (None, None) => {
                            if last {
                                let open = if self.bare { "" } else { TOOL_OPEN };
                                let raw = format!("{open}{}", self.buf);
                                self.buf.clear();
                                self.emit_text(out, &raw, false);
                                self.end_call();
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Send `args[self.args_sent..]` for the current call.
    fn send_args(&mut self, out: &mut Vec<Parsed>, args: &str) {
        if args.len() > self.args_sent {
            let text = args[self.args_sent..].to_string();
            self.args_sent = args.len();
            out.push(Parsed::ToolCallArgs {
                index: self.calls - 1,
                text,
            });
        }
    }

    fn end_call(&mut self) {
        self.rejected = false;
        self.state = State::Content;
        self.args_start = None;
        self.args_sent = 0;
        self.trim_start = true;
        if self.bare {
            self.skip_fence = self.fenced;
            self.at_start = true;
        }
        self.bare = false;
        self.fenced = false;
    }
}

/// Length of the longest suffix of `buf` that is a proper prefix of one of
/// `tags`, plus (with `ws`) the whitespace right before it.
fn hold_back(buf: &str, tags: &[&str], ws: bool) -> usize {
    let mut keep = 0;
    for tag in tags {
        for k in (1..tag.len().min(buf.len() + 1)).rev() {
            if buf.ends_with(&tag[..k]) {
                keep = keep.max(k);
                break;
            }
        }
    }
    if ws {
        let rest = &buf[..buf.len() - keep];
        keep += rest.len() - rest.trim_end().len();
    }
    keep
}

enum Bare {
    /// A bare call begins at byte `obj_at` (its `{`).
    Yes {
        obj_at: usize,
        fenced: bool,
    },
    /// Too little text to tell.
    Maybe,
    No,
}

/// Does `buf` start (after whitespace and an optional ```` ```json ````
/// fence) with `{ "name"`?
fn bare_start(buf: &str) -> Bare {
    let skip_ws = |i: usize| buf.len() - buf[i..].trim_start().len();
    // Some(true): `lit` is there; Some(false): only its beginning so far.
    let lit = |i: usize, lit: &str| -> Option<bool> {
        let rest = &buf[i..];
        if rest.starts_with(lit) {
            Some(true)
        } else if lit.starts_with(rest) {
            Some(false)
        } else {
            None
        }
    };
    let mut i = skip_ws(0);
    let mut fenced = false;
    if i == buf.len() {
        return Bare::Maybe;
    }
    if buf[i..].starts_with('`') {
        match lit(i, "```") {
            None => return Bare::No,
            Some(false) => return Bare::Maybe,
            Some(true) => i += 3,
        }
        fenced = true;
        if i == buf.len() {
            return Bare::Maybe;
        }
        if buf[i..].starts_with('j') {
            match lit(i, "json") {
                None => return Bare::No,
                Some(false) => return Bare::Maybe,
                Some(true) => i += 4,
            }
        }
        i = skip_ws(i);
        if i == buf.len() {
            return Bare::Maybe;
        }
    }
    let obj_at = i;
    if !buf[i..].starts_with('{') {
        return Bare::No;
    }
    i = skip_ws(i + 1);
    if i == buf.len() {
        return Bare::Maybe;
    }
    match lit(i, "\"name\"") {
        None => Bare::No,
        Some(false) => Bare::Maybe,
        Some(true) => Bare::Yes { obj_at, fenced },
    }
}

/// The index of the `}` that closes the JSON object `buf` starts with
/// (after whitespace), strings and nesting respected.
fn object_end(buf: &str) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, b) in buf.bytes().enumerate() {
        if in_str {
            match b {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `{"name": "NAME", "arguments": ` at the start of a tool call: the name
/// and where the arguments begin. `None` until all of it is there.
fn call_header(buf: &str) -> Option<(String, usize)> {
    let b = buf.as_bytes();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let expect = |i: &mut usize, lit: &str| -> Option<()> {
        if b.get(*i..*i + lit.len())? == lit.as_bytes() {
            *i += lit.len();
            Some(())
        } else {
            None
        }
    };
    skip_ws(&mut i);
    expect(&mut i, "{")?;
    skip_ws(&mut i);
    expect(&mut i, "\"name\"")?;
    skip_ws(&mut i);
    expect(&mut i, ":")?;
    skip_ws(&mut i);
    let name_start = i;
    expect(&mut i, "\"")?;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => {
                i += 1;
                break;
            }
            _ => i += 1,
        }
    }
    let name: String = serde_json::from_str(buf.get(name_start..i)?).ok()?;
    skip_ws(&mut i);
    expect(&mut i, ",")?;
    skip_ws(&mut i);
    expect(&mut i, "\"arguments\"")?;
    skip_ws(&mut i);
    expect(&mut i, ":")?;
    skip_ws(&mut i);
    // Wait for the first character of the value.
    b.get(i)?;
    Some((name, i))
}

/// The arguments text once the block is closed: without the call object's
/// closing brace and the whitespace around it.
fn final_args(region: &str) -> &str {
    let t = region.trim_end();
    t.strip_suffix('}').unwrap_or(t).trim_end()
}

/// How much of an open call's arguments can be sent: all but what may be the
/// call object's closing brace, trailing whitespace, or a partial close tag.
fn safe_args_len(region: &str) -> usize {
    let mut end = region.len() - hold_back(region, &[TOOL_CLOSE], true);
    let t = &region[..end];
    if t.ends_with('}') {
        end -= 1;
        end = region[..end].trim_end().len();
    }
    end
}

/// A whole `<tool_call>` body as JSON: `{"name", "arguments"}`.
fn whole_call(inner: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(inner.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments") {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some((name, args))
}

/// The parts of a finished answer, gathered from [`Parsed`] events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub content: String,
    pub reasoning: String,
    /// (name, arguments JSON text) per call.
    pub calls: Vec<(String, String)>,
}

impl Collected {
    pub fn add(&mut self, events: Vec<Parsed>) {
        for e in events {
            match e {
                Parsed::Content(t) => self.content.push_str(&t),
                Parsed::Reasoning(t) => self.reasoning.push_str(&t),
                Parsed::ToolCallStart { name, .. } => self.calls.push((name, String::new())),
                Parsed::ToolCallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(index as usize) {
                        c.1.push_str(&text);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
