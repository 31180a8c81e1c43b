//! From OpenAI requests to engine jobs: checking the fields, turning
//! messages into the chat template's input, choosing sampling settings.

use crate::api::{Content, Prompt, RequestMessage, Role, SamplingFields, Tool, ToolChoice};
use crate::error::ApiError;
use redlite_model::sample::SamplerConfig;
use redlite_tokenizer::{ChatMessage, FunctionCall, ToolCall};

/// Limits a request is checked against.
#[derive(Clone, Debug)]
pub struct Limits {
    pub ctx: usize,
    pub max_tokens_limit: usize,
}

/// Checked sampling and length settings.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// What the client asked for (`None`: as many as fit).
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Constrained decoding (`response_format`, `grammar`, a forced tool
    /// call); set by the endpoint after [`gen_params`].
    pub grammar: Option<std::sync::Arc<redlite_grammar::Grammar>>,
    /// What the request says of speculative decoding (the server's
    /// `--spec` options apply where it says nothing).
    pub spec: SpecRequest,
}

/// A request's speculative-decoding fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecRequest {
    pub mode: Option<redlite_spec::SpecMode>,
    pub draft_max: Option<usize>,
    pub draft_min: Option<usize>,
}

impl SpecRequest {
    /// The server's options with this request's fields over them.
    pub fn over(&self, base: &redlite_spec::SpecOptions) -> redlite_spec::SpecOptions {
        redlite_spec::SpecOptions {
            mode: self.mode.unwrap_or(base.mode),
            draft_max: self.draft_max.unwrap_or(base.draft_max),
            draft_min: self.draft_min.unwrap_or(base.draft_min),
            ..*base
        }
    }
}

fn spec_request(s: &SamplingFields) -> Result<SpecRequest, ApiError> {
    let mode = match s.speculative_type.as_deref() {
        None => None,
        Some(t) => Some(redlite_spec::SpecMode::parse(t).ok_or_else(|| {
            ApiError::invalid(
                "speculative.type",
                format!("`speculative.type` must be one of none, lookup, mtp; got {t:?}"),
            )
        })?),
    };
    let limit = redlite_spec::DRAFT_MAX_LIMIT as u64;
    let check = |field: &'static str, v: Option<u64>, lo: u64| -> Result<Option<usize>, ApiError> {
        match v {
            Some(n) if n < lo || n > limit => Err(ApiError::invalid(
                field,
                format!("`{field}` must be in {lo}..={limit}, got {n}"),
            )),
            v => Ok(v.map(|n| n as usize)),
        }
    };
    let r = SpecRequest {
        mode,
        draft_max: check("speculative.n_max", s.speculative_n_max, 1)?,
        draft_min: check("speculative.n_min", s.speculative_n_min, 0)?,
    };
    if let (Some(lo), Some(hi)) = (r.draft_min, r.draft_max) {
        if lo > hi {
            return Err(ApiError::invalid(
                "speculative.n_min",
                format!("`speculative.n_min` ({lo}) is above `speculative.n_max` ({hi})"),
            ));
        }
    }
    Ok(r)
}

impl GenParams {
    /// Tokens to generate for a prompt of `prompt_len`: what was asked, at
    /// most `--max-tokens-limit` and what the context leaves. Asking for
    /// more is not an error (agents send 16k-32k by default): the answer
    /// stops there with `finish_reason: length`, as llama-server's does.
    pub fn budget(&self, prompt_len: usize, limits: &Limits, default: usize) -> usize {
        let room = limits.ctx.saturating_sub(prompt_len);
        self.max_tokens
            .unwrap_or(default)
            .min(limits.max_tokens_limit)
            .min(room)
    }
}

fn check_range(name: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

/// Check the sampling fields. Defaults are llama-server's (temperature
/// 0.8, top-k 40, top-p 0.95, min-p 0.05); temperature 0 is greedy.
/// `_limits`: the length limits apply in [`GenParams::budget`], once the
/// prompt's length is known (kept here for the callers' sake).
pub fn gen_params(s: &SamplingFields, _limits: &Limits) -> Result<GenParams, ApiError> {
    if let Some(n) = s.n {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("only n=1 is supported, got n={n}"),
            ));
        }
    }
    let (field, max) = match (s.max_completion_tokens, s.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    if let Some(m) = max {
        if m == 0 {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be at least 1"),
            ));
        }
    }
    check_range("temperature", s.temperature, 0.0, 2.0)?;
    check_range("top_p", s.top_p, 0.0, 1.0)?;
    check_range("min_p", s.min_p, 0.0, 1.0)?;
    check_range("repeat_penalty", s.repeat_penalty, 0.0, 10.0)?;
    let stop = s.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    let seed = s.seed.map(|x| x as u64).unwrap_or_else(clock_seed);
    Ok(GenParams {
        max_tokens: max.map(|m| m as usize),
        sampler: SamplerConfig {
            temperature: s.temperature.unwrap_or(0.8),
            top_k: s.top_k.map_or(40, |k| k as usize),
            top_p: s.top_p.unwrap_or(0.95),
            min_p: s.min_p.unwrap_or(0.05),
            repeat_penalty: s.repeat_penalty.unwrap_or(1.0),
            repeat_last_n: 64,
            seed,
            ..SamplerConfig::default()
        },
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        stream: s.stream.unwrap_or(false),
        include_usage: s
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        grammar: None,
        spec: spec_request(s)?,
    })
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Message content as one string: text parts joined by newlines.
fn content_text(c: &Option<Content>, i: usize) -> Result<Option<String>, ApiError> {
    match c {
        None => Ok(None),
        Some(Content::Text(s)) => Ok(Some(s.clone())),
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content[{j}].type"),
                        format!(
                            "content part type `{}` is not supported: this model reads text only",
                            p.kind
                        ),
                    ));
                }
                match &p.text {
                    Some(t) => texts.push(t.as_str()),
                    None => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].text"),
                            "a text part needs `text`",
                        ))
                    }
                }
            }
            Ok(Some(texts.join("\n")))
        }
    }
}

/// The conversation as the chat template takes it.
pub fn chat_messages(msgs: &[RequestMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let content = content_text(&m.content, i)?;
        let mut msg = ChatMessage {
            role: m.role.as_template_role().to_string(),
            content,
            reasoning_content: m.reasoning_content.clone(),
            name: m.name.clone(),
            tool_call_id: m.tool_call_id.clone(),
            ..ChatMessage::default()
        };
        match m.role {
            Role::Assistant => {
                for (j, tc) in m.tool_calls.iter().flatten().enumerate() {
                    if tc.function.name.is_empty() {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].tool_calls[{j}].function.name"),
                            "a tool call needs a function name",
                        ));
                    }
                    // Templates render the arguments as JSON: give them the
                    // object, not the string that holds it.
                    let arguments = match &tc.function.arguments {
                        serde_json::Value::String(s) => serde_json::from_str(s)
                            .unwrap_or_else(|_| serde_json::Value::String(s.clone())),
                        serde_json::Value::Null => serde_json::json!({}),
                        v => v.clone(),
                    };
                    msg.tool_calls.push(ToolCall {
                        id: tc.id.clone(),
                        kind: tc.kind.clone().unwrap_or_else(|| "function".into()),
                        function: FunctionCall {
                            name: tc.function.name.clone(),
                            arguments,
                        },
                    });
                }
            }
            Role::Tool => {
                if msg.content.is_none() {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        "a tool message needs `content`",
                    ));
                }
                // Name the tool from the call it answers.
                if msg.name.is_none() {
                    msg.name = m.tool_call_id.as_ref().and_then(|id| {
                        out.iter().rev().find_map(|prev| {
                            prev.tool_calls
                                .iter()
                                .find(|t| t.id.as_ref() == Some(id))
                                .map(|t| t.function.name.clone())
                        })
                    });
                }
            }
            Role::System | Role::Developer | Role::User => {
                if msg.content.is_none() {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        format!("a {} message needs `content`", m.role.as_template_role()),
                    ));
                }
            }
        }
        out.push(msg);
    }
    Ok(out)
}

/// How tools are used for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPlan {
    /// Tool schemas for the template (`None`: no tools).
    pub tools: Option<serde_json::Value>,
    /// Parse `<tool_call>` blocks in the answer.
    pub parse: bool,
    /// Text appended to the prompt to force a call (`required` or a named
    /// function); the parser reads it as the answer's start.
    pub forced_prefix: String,
    /// The function `tool_choice` names, if it names one.
    pub forced_name: Option<String>,
    /// The names of the offered tools: a call to any other is not a call.
    pub names: Vec<String>,
    /// The template writes calls in Qwen3-Coder's XML format.
    pub xml: bool,
}

/// Check `tools` and `tool_choice`.
pub fn tool_plan(
    tools: &Option<Vec<Tool>>,
    choice: &Option<ToolChoice>,
) -> Result<ToolPlan, ApiError> {
    let tools: &[Tool] = tools.as_deref().unwrap_or(&[]);
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("tool type `{}` is not supported (only `function`)", t.kind),
            ));
        }
        if t.function.name.is_empty() {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "a tool needs a name",
            ));
        }
    }
    crate::constrain::check_tool_parameters(tools)?;
    let names: Vec<String> = tools.iter().map(|t| t.function.name.clone()).collect();
    let none = ToolPlan {
        tools: None,
        parse: false,
        forced_prefix: String::new(),
        forced_name: None,
        names: Vec::new(),
        xml: false,
    };
    let schemas = || serde_json::to_value(tools).ok();
    let mode = match choice {
        None => "auto",
        Some(ToolChoice::Mode(m)) => m.as_str(),
        Some(ToolChoice::Named(n)) => {
            if !tools.iter().any(|t| t.function.name == n.function.name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice names `{}`, which is not in `tools`",
                        n.function.name
                    ),
                ));
            }
            let name = serde_json::to_string(&n.function.name).unwrap_or_default();
            return Ok(ToolPlan {
                tools: schemas(),
                parse: true,
                forced_prefix: format!("<tool_call>\n{{\"name\": {name}, \"arguments\": "),
                forced_name: Some(n.function.name.clone()),
                names,
                xml: false,
            });
        }
    };
    match mode {
        "none" => Ok(none),
        "auto" if tools.is_empty() => Ok(none),
        "auto" => Ok(ToolPlan {
            tools: schemas(),
            parse: true,
            forced_prefix: String::new(),
            forced_name: None,
            names,
            xml: false,
        }),
        "required" if tools.is_empty() => Err(ApiError::invalid(
            "tool_choice",
            "tool_choice `required` needs `tools`",
        )),
        "required" => Ok(ToolPlan {
            tools: schemas(),
            parse: true,
            forced_prefix: "<tool_call>\n".into(),
            forced_name: None,
            names,
            xml: false,
        }),
        other => Err(ApiError::invalid(
            "tool_choice",
            format!("tool_choice must be `none`, `auto`, `required` or a function, got `{other}`"),
        )),
    }
}

impl ToolPlan {
    /// For a template that asks for Qwen3-Coder's XML calls: a named
    /// `tool_choice` starts the answer with `<tool_call>\n<function=NAME>\n`.
    pub fn in_xml_format(mut self) -> ToolPlan {
        if let Some(name) = &self.forced_name {
            self.forced_prefix = format!("<tool_call>\n<function={name}>\n");
        }
        self.xml = true;
        self
    }

    /// The grammar of the output: a call of an offered tool with valid
    /// arguments when `tool_choice` forces one, else what `response_format`
    /// or `grammar` in `body` ask for. `grammar` with a forced call is a 400.
    pub fn grammar(
        &self,
        tools: &Option<Vec<Tool>>,
        body: &serde_json::Value,
    ) -> Result<Option<std::sync::Arc<redlite_grammar::Grammar>>, ApiError> {
        let output = crate::constrain::output_grammar(body)?;
        if self.forced_prefix.is_empty() {
            return Ok(output);
        }
        if body.get("grammar").is_some_and(|g| !g.is_null()) {
            return Err(ApiError::invalid(
                "grammar",
                "`grammar` cannot be combined with a `tool_choice` that forces a call",
            ));
        }
        self.forced_grammar(tools.as_deref().unwrap_or(&[]))
    }

    /// The grammar of a forced call alone (`None` when `tool_choice`
    /// forces none): a call of an offered tool, in the template's syntax,
    /// with arguments valid against that tool's parameters.
    pub fn forced_grammar(
        &self,
        tools: &[Tool],
    ) -> Result<Option<std::sync::Arc<redlite_grammar::Grammar>>, ApiError> {
        if self.forced_prefix.is_empty() {
            return Ok(None);
        }
        let named = self.forced_name.as_deref();
        if self.xml {
            return crate::constrain::xml_tool_call_grammar(tools, named).map(Some);
        }
        crate::constrain::tool_call_grammar(tools, named).map(Some)
    }
}

/// A completion prompt as token ids (text is encoded by `encode`).
pub fn completion_prompt(
    p: &Prompt,
    encode: impl Fn(&str) -> Vec<u32>,
    n_vocab: usize,
) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid(
                "prompt",
                format!("only one prompt per request is supported, got {n}"),
            ))
        }
    };
    let ids = match p {
        Prompt::Text(t) => encode(t),
        Prompt::TextList(v) => {
            one(v.len())?;
            encode(&v[0])
        }
        Prompt::Tokens(ids) => ids.clone(),
        Prompt::TokensList(v) => {
            one(v.len())?;
            v[0].clone()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {bad} is outside the vocabulary of {n_vocab}"),
        ));
    }
    Ok(ids)
}

/// 400 when the prompt leaves no room to generate.
pub fn check_prompt_len(n: usize, limits: &Limits, param: &str) -> Result<(), ApiError> {
    if n >= limits.ctx {
        return Err(ApiError::BadRequest {
            message: format!(
                "This model's maximum context length is {} tokens. However, your {param} resulted in {n} tokens. Shorten it or start the server with a larger --ctx-size.",
                limits.ctx
            ),
            param: Some(param.to_string()),
            code: Some("context_length_exceeded"),
        });
    }
    Ok(())
}

/// The fill-in-the-middle tokens of a vocabulary (prefix, suffix, middle),
/// by the names the code models use: Qwen2.5-Coder / Qwen3-Coder
/// (`<|fim_prefix|>` ...) and StarCoder (`<fim_prefix>` ...).
pub fn fim_tokens(token_to_id: impl Fn(&str) -> Option<u32>) -> Option<[u32; 3]> {
    let sets = [
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    ];
    sets.iter().find_map(|names| {
        Some([
            token_to_id(names[0])?,
            token_to_id(names[1])?,
            token_to_id(names[2])?,
        ])
    })
}

/// A fill-in-the-middle prompt in the prefix-suffix-middle order the
/// Qwen coder models are trained on: `<prefix> prompt <suffix> suffix
/// <middle>`; the model writes the middle. The texts are plain (their
/// control-token text is not parsed).
pub fn fim_prompt(
    fim: [u32; 3],
    prompt: &Prompt,
    suffix: &str,
    encode: impl Fn(&str) -> Vec<u32>,
) -> Result<Vec<u32>, ApiError> {
    let text = match prompt {
        Prompt::Text(t) => t.as_str(),
        Prompt::TextList(v) if v.len() == 1 => v[0].as_str(),
        _ => {
            return Err(ApiError::invalid(
                "suffix",
                "`suffix` needs the prompt as one text",
            ))
        }
    };
    let mut ids = vec![fim[0]];
    ids.extend(encode(text));
    ids.push(fim[1]);
    ids.extend(encode(suffix));
    ids.push(fim[2]);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ChatCompletionRequest;
    use serde_json::json;

    const L: Limits = Limits {
        ctx: 100,
        max_tokens_limit: 50,
    };

    fn sampling(v: serde_json::Value) -> Result<GenParams, ApiError> {
        gen_params(&serde_json::from_value(v).unwrap(), &L)
    }

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    #[test]
    fn sampling_checks_name_the_field() {
        assert_eq!(param(sampling(json!({"n": 2})).unwrap_err()), "n");
        assert_eq!(
            param(sampling(json!({"max_completion_tokens": 0})).unwrap_err()),
            "max_completion_tokens"
        );
        assert_eq!(
            param(sampling(json!({"temperature": 3.0})).unwrap_err()),
            "temperature"
        );
        assert_eq!(
            param(sampling(json!({"top_p": -0.1})).unwrap_err()),
            "top_p"
        );
        let g = sampling(
            json!({"max_tokens": 50, "temperature": 0, "seed": 7, "stop": ["a", ""], "n": 1}),
        )
        .unwrap();
        assert_eq!(g.max_tokens, Some(50));
        assert_eq!(g.sampler.temperature, 0.0);
        assert_eq!(g.sampler.seed, 7);
        assert_eq!(g.stop, vec!["a".to_string()]);
        // The budget never passes the context.
        assert_eq!(g.budget(80, &L, 16), 20);
        assert_eq!(sampling(json!({})).unwrap().budget(10, &L, 16), 16);
    }

    #[test]
    fn max_tokens_over_the_limits_is_lowered_not_refused() {
        // L: context 100, --max-tokens-limit 50.
        for field in ["max_tokens", "max_completion_tokens"] {
            let g = sampling(json!({ field: 10_000_000u64 })).unwrap();
            assert_eq!(g.budget(10, &L, 16), 50, "{field}: the server's limit");
            assert_eq!(g.budget(70, &L, 16), 30, "{field}: what the context leaves");
            assert_eq!(g.budget(99, &L, 16), 1);
        }
        // Within both limits: what was asked.
        assert_eq!(
            sampling(json!({"max_tokens": 7}))
                .unwrap()
                .budget(10, &L, 16),
            7
        );
        // No max_tokens and a default above the limit (chat's default).
        assert_eq!(sampling(json!({})).unwrap().budget(10, &L, 4096), 50);
        // A prompt that alone fills the context is still a 400 naming sizes.
        let e = check_prompt_len(100, &L, "messages").unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        let b = e.body().error;
        assert_eq!(b.param.as_deref(), Some("messages"));
        assert!(b.message.contains("100 tokens") && b.message.contains("is 100"));
        assert!(check_prompt_len(99, &L, "messages").is_ok());
    }

    #[test]
    fn messages_become_template_input() {
        let r: ChatCompletionRequest = serde_json::from_value(json!({"messages": [
            {"role": "developer", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
        ]}))
        .unwrap();
        let m = chat_messages(&r.messages).unwrap();
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content.as_deref(), Some("a\nb"));
        assert_eq!(m[2].tool_calls[0].function.arguments, json!({"x": 1}));
        assert_eq!(m[3].name.as_deref(), Some("f"));
    }

    #[test]
    fn bad_messages_name_the_field() {
        let r: ChatCompletionRequest = serde_json::from_value(json!({"messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
        ]}))
        .unwrap();
        assert_eq!(
            param(chat_messages(&r.messages).unwrap_err()),
            "messages[0].content[0].type"
        );
        assert_eq!(param(chat_messages(&[]).unwrap_err()), "messages");
        let r: ChatCompletionRequest =
            serde_json::from_value(json!({"messages": [{"role": "user"}]})).unwrap();
        assert_eq!(
            param(chat_messages(&r.messages).unwrap_err()),
            "messages[0].content"
        );
    }

    #[test]
    fn tool_choices() {
        let tools: Option<Vec<Tool>> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ]))
        .unwrap();
        let auto = tool_plan(&tools, &None).unwrap();
        assert!(auto.parse && auto.forced_prefix.is_empty());
        assert_eq!(auto.tools.unwrap()[0]["function"]["name"], "get_weather");
        let none = tool_plan(&tools, &Some(ToolChoice::Mode("none".into()))).unwrap();
        assert!(!none.parse && none.tools.is_none());
        let req = tool_plan(&tools, &Some(ToolChoice::Mode("required".into()))).unwrap();
        assert_eq!(req.forced_prefix, "<tool_call>\n");
        let named: ToolChoice = serde_json::from_value(
            json!({"type": "function", "function": {"name": "get_weather"}}),
        )
        .unwrap();
        let n = tool_plan(&tools, &Some(named)).unwrap();
        assert_eq!(
            n.forced_prefix,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        );
        let bad: ToolChoice =
            serde_json::from_value(json!({"type": "function", "function": {"name": "nope"}}))
                .unwrap();
        assert_eq!(
            param(tool_plan(&tools, &Some(bad)).unwrap_err()),
            "tool_choice"
        );
        assert_eq!(
            param(tool_plan(&None, &Some(ToolChoice::Mode("required".into()))).unwrap_err()),
            "tool_choice"
        );
        assert_eq!(
            param(tool_plan(&tools, &Some(ToolChoice::Mode("sometimes".into()))).unwrap_err()),
            "tool_choice"
        );
    }

    #[test]
    fn forced_calls_take_a_tool_grammar_and_refuse_a_user_grammar() {
        let tools: Option<Vec<Tool>> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
        ]))
        .unwrap();
        let req = tool_plan(&tools, &Some(ToolChoice::Mode("required".into()))).unwrap();
        let g = req.grammar(&tools, &json!({})).unwrap().unwrap();
        let ok = "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        assert!(redlite_grammar::Matcher::matches(&g, ok).unwrap());
        assert_eq!(
            param(
                req.grammar(&tools, &json!({"grammar": "root ::= \"a\""}))
                    .unwrap_err()
            ),
            "grammar"
        );
        let auto = tool_plan(&tools, &None).unwrap();
        assert!(auto.grammar(&tools, &json!({})).unwrap().is_none());
        assert!(auto
            .grammar(&tools, &json!({"response_format": {"type": "json_object"}}))
            .unwrap()
            .is_some());
        let bad: Option<Vec<Tool>> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "f", "parameters": "x"}}
        ]))
        .unwrap();
        assert_eq!(
            param(tool_plan(&bad, &None).unwrap_err()),
            "tools[0].function.parameters"
        );
    }

    #[test]
    fn completion_prompts() {
        let enc = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
        assert_eq!(
            completion_prompt(&Prompt::Text("ab".into()), enc, 1000).unwrap(),
            vec![97, 98]
        );
        assert_eq!(
            param(completion_prompt(&Prompt::Tokens(vec![5000]), enc, 1000).unwrap_err()),
            "prompt"
        );
        assert_eq!(
            param(
                completion_prompt(&Prompt::TextList(vec!["a".into(), "b".into()]), enc, 1000)
                    .unwrap_err()
            ),
            "prompt"
        );
        assert_eq!(
            param(completion_prompt(&Prompt::Text(String::new()), enc, 1000).unwrap_err()),
            "prompt"
        );
        let e = check_prompt_len(100, &L, "messages").unwrap_err();
        assert_eq!(
            e.body().error.code.as_deref(),
            Some("context_length_exceeded")
        );
        assert!(check_prompt_len(99, &L, "messages").is_ok());
    }
}
