//! The smaller endpoints beside generation: one model by id, llama-server's
//! `/tokenize` and `/detokenize`, the refusal of `/v1/embeddings`; and the
//! request fields that only adjust the sampler (penalties, `logit_bias`).

use crate::api::{
    ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice, Delta, ErrorBody, ErrorDetail,
    ModelCard, SamplingFields,
};
use crate::engine::{Done, TokenLogprob};
use crate::error::{parse_json, ApiError};
use crate::routes::Shared;
use crate::stream::{self, Chunker, Meta};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redlite_model::sample::SamplerConfig;
use redlite_tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `GET /v1/models/{id}`: the card of the served model, or OpenAI's 404.
pub async fn model(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    model_reply(&s.model_id, s.created, &id)
}

fn model_reply(served: &str, created: u64, id: &str) -> Response {
    if id == served {
        return Json(ModelCard {
            id: served.to_string(),
            object: "model",
            created,
            owned_by: "redlite",
        })
        .into_response();
    }
    // OpenAI answers an unknown model with 404 and `model_not_found`.
    let body = ErrorBody {
        error: ErrorDetail {
            message: format!(
                "The model `{id}` does not exist: this server serves `{served}` (GET /v1/models)"
            ),
            kind: "invalid_request_error".into(),
            param: Some("model".into()),
            code: Some("model_not_found".into()),
        },
    };
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

/// `POST /tokenize` as llama-server has it.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    /// Add the BOS / EOS the model file asks for (llama-server's default:
    /// no).
    #[serde(default)]
    pub add_special: bool,
    /// Control tokens written in the text become their ids (default: yes).
    #[serde(default = "yes")]
    pub parse_special: bool,
    /// Answer `{"id", "piece"}` objects instead of bare ids.
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

pub async fn tokenize(State(s): State<Shared>, body: Body) -> Result<Json<Value>, ApiError> {
    let v = crate::routes::json_body(body, s.max_body_bytes).await?;
    let req: TokenizeRequest = parse_json(&v)?;
    let tok = s.tokenizer.clone();
    // Long texts take a while: off the async workers.
    let out = tokio::task::spawn_blocking(move || tokenize_reply(&tok, &req))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(out))
}

pub fn tokenize_reply(tok: &Tokenizer, req: &TokenizeRequest) -> Value {
    let mut ids = tok.encode(&req.content, req.parse_special);
    if !req.add_special {
        // `encode` adds exactly the BOS / EOS the file asks for: drop them.
        if tok.add_bos() && tok.bos_id().is_some() && ids.first() == tok.bos_id().as_ref() {
            ids.remove(0);
        }
        if tok.add_eos() && tok.eos_id().is_some() && ids.last() == tok.eos_id().as_ref() {
            ids.pop();
        }
    }
    if !req.with_pieces {
        return json!({ "tokens": ids });
    }
    // llama-server: the piece as a string when it is valid UTF-8, else its
    // bytes (a token may hold part of a character).
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = tok.token_to_piece(id);
            let piece = match std::str::from_utf8(bytes) {
                Ok(s) => json!(s),
                Err(_) => json!(bytes),
            };
            json!({ "id": id, "piece": piece })
        })
        .collect();
    json!({ "tokens": tokens })
}

pub async fn detokenize(State(s): State<Shared>, body: Body) -> Result<Json<Value>, ApiError> {
    let v = crate::routes::json_body(body, s.max_body_bytes).await?;
    let req: DetokenizeRequest = parse_json(&v)?;
    Ok(Json(detokenize_reply(&s.tokenizer, &req)?))
}

pub fn detokenize_reply(tok: &Tokenizer, req: &DetokenizeRequest) -> Result<Value, ApiError> {
    let n = tok.vocab_size();
    if let Some((i, &id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= n)
    {
        return Err(ApiError::invalid(
            format!("tokens[{i}]"),
            format!("token id {id} is outside the vocabulary of {n} tokens"),
        ));
    }
    Ok(json!({ "content": tok.decode(&req.tokens) }))
}

/// `POST /v1/embeddings`: refused in OpenAI's error shape (the model is a
/// generative one; no pooled hidden state is computed).
pub async fn embeddings(State(s): State<Shared>) -> ApiError {
    embeddings_refusal(&s.model_id)
}

fn embeddings_refusal(model: &str) -> ApiError {
    ApiError::BadRequest {
        message: format!(
            "`{model}` is a generative model: this server does not compute embeddings \
             (use /v1/chat/completions or /v1/completions)"
        ),
        param: Some("model".into()),
        code: Some("embeddings_not_supported"),
    }
}

/// The request fields that only adjust the logits: `presence_penalty`,
/// `frequency_penalty` (OpenAI's range [-2, 2]) and `logit_bias` (token id
/// → bias in [-100, 100], ids within the first `n_vocab`).
pub fn apply_sampling_extras(
    f: &SamplingFields,
    n_vocab: usize,
    cfg: &mut SamplerConfig,
) -> Result<(), ApiError> {
    for (name, v) in [
        ("presence_penalty", f.presence_penalty),
        ("frequency_penalty", f.frequency_penalty),
    ] {
        if let Some(x) = v {
            if !(x.is_finite() && (-2.0..=2.0).contains(&x)) {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` must be between -2 and 2, got {x}"),
                ));
            }
        }
    }
    cfg.presence_penalty = f.presence_penalty.unwrap_or(0.0);
    cfg.frequency_penalty = f.frequency_penalty.unwrap_or(0.0);
    cfg.logit_bias.clear();
    for (key, val) in f.logit_bias.iter().flatten() {
        let param = format!("logit_bias.{key}");
        let id: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                &param,
                format!("`logit_bias` keys are token ids, got `{key}`"),
            )
        })?;
        if id as usize >= n_vocab {
            return Err(ApiError::invalid(
                &param,
                format!("`logit_bias` token id {id} is outside the vocabulary of {n_vocab} tokens"),
            ));
        }
        let bias = val.as_f64().filter(|b| (-100.0..=100.0).contains(b));
        let Some(bias) = bias else {
            return Err(ApiError::invalid(
                &param,
                format!("`logit_bias` values must be numbers between -100 and 100, got {val}"),
            ));
        };
        cfg.logit_bias.push((id, bias as f32));
    }
    Ok(())
}

/// How many alternatives per token a request asks for: chat's `logprobs`
/// (bool) with `top_logprobs` (0..=20), completions' `logprobs` (0..=20).
/// `None` when none are asked for.
pub fn logprobs_request(v: &Value, chat: bool) -> Result<Option<usize>, ApiError> {
    let field = |name: &str| v.get(name).filter(|x| !x.is_null());
    let top = |name: &str| -> Result<Option<usize>, ApiError> {
        match field(name) {
            None => Ok(None),
            Some(x) => match x.as_u64().filter(|&k| k <= 20) {
                Some(k) => Ok(Some(k as usize)),
                None => Err(ApiError::invalid(
                    name,
                    format!("`{name}` must be an integer between 0 and 20, got {x}"),
                )),
            },
        }
    };
    let k = if chat {
        let on = match field("logprobs") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(x) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("`logprobs` must be a boolean, got {x}"),
                ))
            }
        };
        let k = top("top_logprobs")?;
        match (on, k) {
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ))
            }
            (false, None) => None,
            (true, k) => Some(k.unwrap_or(0)),
        }
    } else {
        top("logprobs")?
    };
    Ok(k)
}

fn piece(tok: &Tokenizer, id: u32) -> (String, &[u8]) {
    let b = tok.token_to_piece(id);
    (String::from_utf8_lossy(b).into_owned(), b)
}

/// Chat's `choices[].logprobs`: `{"content": [{token, logprob, bytes,
/// top_logprobs}]}` (over every generated token, reasoning and tool-call
/// text included).
pub fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            let (text, bytes) = piece(tok, t.id);
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (text, bytes) = piece(tok, id);
                    json!({"token": text, "logprob": lp, "bytes": bytes})
                })
                .collect();
            json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// Legacy completions' `choices[].logprobs`: parallel lists of tokens,
/// their log-probabilities, `{token: logprob}` maps of the top ones, and
/// each token's byte offset in the text.
pub fn completion_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let mut offset = 0usize;
    let (mut tokens, mut lp, mut top, mut offs) = (vec![], vec![], vec![], vec![]);
    for t in lps {
        let (text, bytes) = piece(tok, t.id);
        offs.push(offset);
        offset += bytes.len();
        tokens.push(text);
        lp.push(t.logprob);
        let m: serde_json::Map<String, Value> = t
            .top
            .iter()
            .map(|&(id, l)| (piece(tok, id).0, json!(l)))
            .collect();
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offs})
}

/// Adds the log-probabilities to a stream: one chunk carrying every
/// generated token's entry, just before the chunk with `finish_reason`
/// (the engine reports them with the end of the job; clients concatenate
/// the `logprobs` of the chunks).
pub struct LogprobChunker {
    pub inner: Box<dyn Chunker>,
    pub tokenizer: Arc<Tokenizer>,
    pub meta: Meta,
    pub chat: bool,
    pub include_usage: bool,
}

impl LogprobChunker {
    fn chunk(&self, d: &Done) -> String {
        let usage = self.include_usage.then_some(None);
        let v = if self.chat {
            serde_json::to_value(ChatCompletionChunk {
                id: self.meta.id.clone(),
                object: "chat.completion.chunk",
                created: self.meta.created,
                model: self.meta.model.clone(),
                system_fingerprint: stream::fingerprint(),
                choices: vec![ChunkChoice {
                    index: 0,
                    delta: Delta::default(),
                    logprobs: Some(chat_logprobs(&self.tokenizer, &d.logprobs)),
                    finish_reason: None,
                }],
                usage,
            })
        } else {
            serde_json::to_value(Completion {
                id: self.meta.id.clone(),
                object: "text_completion",
                created: self.meta.created,
                model: self.meta.model.clone(),
                system_fingerprint: stream::fingerprint(),
                choices: vec![CompletionChoice {
                    index: 0,
                    text: String::new(),
                    logprobs: Some(completion_logprobs(&self.tokenizer, &d.logprobs)),
                    finish_reason: None,
                }],
                usage,
            })
        };
        format!("data: {}\n\n", v.unwrap_or_default())
    }
}

impl Chunker for LogprobChunker {
    fn start(&mut self) -> Vec<String> {
        self.inner.start()
    }
    fn text(&mut self, t: &str) -> Vec<String> {
        self.inner.text(t)
    }
    fn done(&mut self, d: &Done) -> Vec<String> {
        let mut out = self.inner.done(d);
        // Before the finish chunk: the inner chunker's done ends with it,
        // then the usage chunk when asked for.
        let at = out
            .len()
            .saturating_sub(1 + usize::from(self.include_usage));
        out.insert(at, self.chunk(d));
        out
    }
}

/// Wrap `inner` when the request asked for log-probabilities.
pub fn stream_chunker(
    inner: Box<dyn Chunker>,
    logprobs: Option<usize>,
    tokenizer: &Arc<Tokenizer>,
    meta: Meta,
    chat: bool,
    include_usage: bool,
) -> Box<dyn Chunker> {
    match logprobs {
        None => inner,
        Some(_) => Box::new(LogprobChunker {
            inner,
            tokenizer: tokenizer.clone(),
            meta,
            chat,
            include_usage,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn fixture() -> Arc<Tokenizer> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf");
        let file = redlite_gguf::GgufFile::open(&path).expect("fixture");
        Arc::new(Tokenizer::from_gguf(file.metadata()).expect("fixture tokenizer"))
    }

    /// The fixture's Hugging Face `tokenizer.json`: an independent source for
    /// token ids.
    fn hf_vocab() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/qwen3next/tokenizer.json");
        let t: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        t["model"]["vocab"].clone()
    }

    fn tokenize_req(v: Value) -> Result<TokenizeRequest, ApiError> {
        parse_json(&v)
    }

    fn param(e: ApiError) -> String {
        e.body().error.param.unwrap_or_default()
    }

    #[test]
    fn tokenize_matches_the_hf_vocabulary() {
        let tok = fixture();
        let vocab = hf_vocab();
        let want = vec![vocab["token"].clone(), vocab["Ġtoken"].clone()];
        let out = tokenize_reply(
            &tok,
            &tokenize_req(json!({"content": "token token"})).unwrap(),
        );
        assert_eq!(out["tokens"], Value::Array(want));
        // `<|im_end|>` is id 511 in tokenizer.json's added_tokens: one id
        // when parsed, several text pieces when not.
        let parsed = tokenize_reply(
            &tok,
            &tokenize_req(json!({"content": "<|im_end|>"})).unwrap(),
        );
        assert_eq!(parsed["tokens"], json!([511]));
        let plain = tokenize_reply(
            &tok,
            &tokenize_req(json!({"content": "<|im_end|>", "parse_special": false})).unwrap(),
        );
        assert!(plain["tokens"].as_array().unwrap().len() > 1, "{plain}");
        // with_pieces: each id with its text.
        let pieces = tokenize_reply(
            &tok,
            &tokenize_req(json!({"content": "token token", "with_pieces": true})).unwrap(),
        );
        assert_eq!(
            pieces["tokens"],
            json!([{"id": vocab["token"], "piece": "token"}, {"id": vocab["Ġtoken"], "piece": " token"}])
        );
    }

    #[test]
    fn detokenize_round_trips_and_refuses_unknown_ids() {
        let tok = fixture();
        let text = "Special tokens stay text: <|im_start|>user\nHello!<|im_end|>";
        let ids = tokenize_reply(&tok, &tokenize_req(json!({ "content": text })).unwrap());
        let req: DetokenizeRequest = parse_json(&ids).unwrap();
        assert_eq!(
            detokenize_reply(&tok, &req).unwrap()["content"],
            json!(text)
        );
        let n = tok.vocab_size() as u32;
        let req: DetokenizeRequest = parse_json(&json!({"tokens": [1, n]})).unwrap();
        assert_eq!(
            param(detokenize_reply(&tok, &req).unwrap_err()),
            "tokens[1]"
        );
        // Field errors name the field.
        let e = parse_json::<DetokenizeRequest>(&json!({"tokens": [1, -2]})).unwrap_err();
        assert_eq!(param(e), "tokens[1]");
        let e = parse_json::<DetokenizeRequest>(&json!({})).unwrap_err();
        assert_eq!(param(e), "tokens");
        let e = tokenize_req(json!({"content": 3})).unwrap_err();
        assert_eq!(param(e), "content");
        let e = tokenize_req(json!({"content": "a", "with_pieces": "yes"})).unwrap_err();
        assert_eq!(param(e), "with_pieces");
    }

    #[test]
    fn model_by_id_and_embeddings() {
        let r = model_reply("demo", 5, "demo");
        assert_eq!(r.status(), StatusCode::OK);
        let r = model_reply("demo", 5, "gpt-4o");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let e = embeddings_refusal("demo");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body().error.code.as_deref(),
            Some("embeddings_not_supported")
        );
    }

    fn extras(v: Value) -> Result<SamplerConfig, ApiError> {
        let f: SamplingFields = parse_json(&v)?;
        let mut cfg = SamplerConfig::default();
        apply_sampling_extras(&f, 100, &mut cfg)?;
        Ok(cfg)
    }

    #[test]
    fn penalties_and_bias_are_checked_and_carried() {
        let c = extras(json!({
            "presence_penalty": 0.5, "frequency_penalty": -1.5,
            "logit_bias": {"7": -100, "99": 2.5}
        }))
        .unwrap();
        assert_eq!(c.presence_penalty, 0.5);
        assert_eq!(c.frequency_penalty, -1.5);
        let mut b = c.logit_bias.clone();
        b.sort_by_key(|x| x.0);
        assert_eq!(b, vec![(7, -100.0), (99, 2.5)]);
        assert_eq!(
            param(extras(json!({"presence_penalty": 2.5})).unwrap_err()),
            "presence_penalty"
        );
        assert_eq!(
            param(extras(json!({"frequency_penalty": -3})).unwrap_err()),
            "frequency_penalty"
        );
        for bad in [
            json!({"100": 1}),
            json!({"x": 1}),
            json!({"5": 101}),
            json!({"5": "1"}),
        ] {
            let p = param(extras(json!({ "logit_bias": bad })).unwrap_err());
            assert!(p.starts_with("logit_bias"), "{p}");
        }
    }

    #[test]
    fn logprobs_requests_are_checked() {
        let lp = |v: Value, chat: bool| logprobs_request(&v, chat);
        assert_eq!(lp(json!({}), true).unwrap(), None);
        assert_eq!(lp(json!({"logprobs": false}), true).unwrap(), None);
        assert_eq!(lp(json!({"logprobs": true}), true).unwrap(), Some(0));
        assert_eq!(
            lp(json!({"logprobs": true, "top_logprobs": 3}), true).unwrap(),
            Some(3)
        );
        assert_eq!(lp(json!({"logprobs": 2}), false).unwrap(), Some(2));
        for (v, chat, want) in [
            (json!({"top_logprobs": 3}), true, "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                true,
                "top_logprobs",
            ),
            (json!({"logprobs": 1}), true, "logprobs"),
            (json!({"logprobs": -1}), false, "logprobs"),
            (json!({"logprobs": 21}), false, "logprobs"),
        ] {
            assert_eq!(param(lp(v.clone(), chat).unwrap_err()), want, "{v}");
        }
    }

    #[test]
    fn logprob_shapes() {
        let tok = fixture();
        let vocab = hf_vocab();
        let id = vocab["token"].as_u64().unwrap() as u32;
        let alt = vocab["vocab"].as_u64().unwrap() as u32;
        let lps = [TokenLogprob {
            id,
            logprob: -0.5,
            top: vec![(id, -0.5), (alt, -1.5)],
        }];
        let c = chat_logprobs(&tok, &lps);
        assert_eq!(c["content"][0]["token"], "token");
        assert_eq!(c["content"][0]["bytes"], json!(b"token".to_vec()));
        assert_eq!(c["content"][0]["top_logprobs"][1]["token"], "vocab");
        assert_eq!(c["content"][0]["top_logprobs"][1]["logprob"], -1.5);
        let c = completion_logprobs(&tok, &[lps[0].clone(), lps[0].clone()]);
        assert_eq!(c["tokens"], json!(["token", "token"]));
        assert_eq!(c["token_logprobs"], json!([-0.5, -0.5]));
        assert_eq!(c["top_logprobs"][0]["vocab"], -1.5);
        assert_eq!(c["text_offset"], json!([0, 5]));
    }
}
