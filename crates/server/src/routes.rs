//! The HTTP routes, authentication and request counting.

use crate::api::{
    ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, Prompt, SamplingFields,
};
use crate::engine::{EngineHandle, Event, Job};
use crate::error::{parse_json, ApiError};
use crate::metrics::Metrics;
use crate::request::{self, GenParams, Limits};
use crate::stream::{self, ChatChunker, CompletionChunker, Meta, SseStream};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use redlite_tokenizer::{ChatTemplate, Tokenizer};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::unbounded_channel;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub model_id: String,
    pub n_vocab: usize,
    pub limits: Limits,
    /// Queued plus running requests allowed before 503.
    pub parallel_queue: usize,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub metrics: Arc<Metrics>,
    pub created: u64,
    /// `--cors-origin` values.
    pub cors_origins: Vec<String>,
    /// Recent Responses API answers, for `previous_response_id`.
    pub responses: Arc<crate::responses::Store>,
}

pub type Shared = Arc<AppState>;

/// The routes (OpenAI's under `/v1`, llama-server's aliases without it).
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(crate::page::index))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models/{id}", get(crate::extra::model))
        .route("/models/{id}", get(crate::extra::model))
        .route("/tokenize", post(crate::extra::tokenize))
        .route("/detokenize", post(crate::extra::detokenize))
        .route("/v1/embeddings", post(crate::extra::embeddings))
        .route("/embeddings", post(crate::extra::embeddings))
        .route("/v1/responses", post(crate::responses::create))
        .route("/responses", post(crate::responses::create))
        .route("/v1/responses/{id}", get(crate::responses::get))
        .route("/v1/messages", post(crate::messages::create))
        .route(
            "/v1/messages/count_tokens",
            post(crate::messages::count_tokens),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .layer(middleware::from_fn_with_state(
            Arc::new(crate::ops::Cors {
                origins: state.cors_origins.clone(),
            }),
            crate::ops::cors,
        ))
        .layer(middleware::from_fn(crate::ops::access_log))
        .with_state(state)
}

const ENDPOINTS: &[&str] = &[
    "/",
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/v1/models",
    "/models",
    "/health",
    "/v1/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/v1/embeddings",
    "/embeddings",
    "/v1/responses",
    "/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// Count every answer by endpoint and status.
async fn count(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = ENDPOINTS
        .iter()
        .find(|e| **e == path)
        .copied()
        .unwrap_or("other");
    let resp = next.run(req).await;
    s.metrics.count_request(endpoint, resp.status().as_u16());
    resp
}

/// With `--api-key`, every route but `/health` and the chat page (which
/// asks for the key) needs `Authorization: Bearer KEY` (or `x-api-key:
/// KEY`, as Anthropic's clients send it).
async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let path = req.uri().path();
        let public = path == "/health"
            || path == "/v1/health"
            || (path == "/" && req.method() == Method::GET);
        if !public {
            let h = req.headers();
            let bearer = h
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
            let ok = [bearer, x_key]
                .into_iter()
                .flatten()
                .any(|g| same(g.as_bytes(), key.as_bytes()));
            if !ok {
                if path.starts_with("/v1/messages") {
                    return crate::messages::AnthropicError(ApiError::Unauthorized).into_response();
                }
                return ApiError::Unauthorized.into_response();
            }
        }
    }
    next.run(req).await
}

/// Constant-time equality (the key is a secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn models(State(s): State<Shared>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: s.model_id.clone(),
            object: "model",
            created: s.created,
            owned_by: "redlite",
        }],
    })
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

/// Read a request body of at most `limit` bytes. A larger one is still read
/// (and dropped) up to [`DRAIN_CAP`] before the 413, so a client that is
/// still sending sees the answer instead of a reset connection.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) =
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut stream), cx)).await
    {
        let chunk = chunk.map_err(|e| ApiError::BadRequest {
            message: format!("could not read the request body: {e}"),
            param: None,
            code: None,
        })?;
        total += chunk.len();
        if total <= limit {
            buf.extend_from_slice(&chunk);
        } else if total > DRAIN_CAP.max(limit) {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    Ok(buf)
}

/// How much of an oversized body is read before giving up on it.
const DRAIN_CAP: usize = 64 << 20;

/// The body as a JSON object; 413 over the limit, 400 when it is not JSON.
pub(crate) async fn json_body(body: Body, limit: usize) -> Result<serde_json::Value, ApiError> {
    let bytes = read_body(body, limit).await?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest {
            message: format!("We could not parse the JSON body of your request: {e}"),
            param: None,
            code: Some("invalid_json"),
        })?;
    if !v.is_object() {
        return Err(ApiError::BadRequest {
            message: "the request body must be a JSON object".into(),
            param: None,
            code: Some("invalid_json"),
        });
    }
    Ok(v)
}

/// Queue a job, or 503 when the queue is full.
pub(crate) fn submit(
    s: &AppState,
    prompt: Vec<u32>,
    max_tokens: usize,
    g: &GenParams,
    logprobs: Option<usize>,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<Event>, ApiError> {
    let queued =
        s.metrics.queued.load(Ordering::SeqCst) + s.metrics.processing.load(Ordering::SeqCst);
    if queued >= s.parallel_queue {
        return Err(ApiError::Busy {
            queued,
            limit: s.parallel_queue,
        });
    }
    if g.spec.mode == Some(redlite_spec::SpecMode::Mtp) {
        if let Some(why) = s.engine.mtp_unavailable() {
            return Err(ApiError::invalid(
                "speculative.type",
                format!("`speculative.type` mtp is not available on this server: {why}"),
            ));
        }
    }
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler: g.sampler.clone(),
        stop: g.stop.clone(),
        events: tx,
        logprobs,
        grammar: g.grammar.clone(),
        spec: g.spec,
    };
    if !s.engine.submit(job) {
        return Err(ApiError::Internal("the engine thread stopped".into()));
    }
    Ok(crate::ops::observe(rx))
}

pub(crate) fn sse_response(stream: SseStream) -> Response {
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

async fn chat(State(s): State<Shared>, body: Body) -> Result<Response, ApiError> {
    let v = json_body(body, s.max_body_bytes).await?;
    let req: ChatCompletionRequest = parse_json(&v)?;
    let sampling: SamplingFields = parse_json(&v)?;
    let mut g = request::gen_params(&sampling, &s.limits)?;
    crate::extra::apply_sampling_extras(
        &sampling,
        s.n_vocab.min(s.tokenizer.vocab_size()),
        &mut g.sampler,
    )?;
    let messages = request::chat_messages(&req.messages)?;
    let mut plan = request::tool_plan(&req.tools, &req.tool_choice)?;
    if crate::convo::xml_calls(&s) {
        plan = plan.in_xml_format();
    }
    g.grammar = plan.grammar(&req.tools, &v)?;
    let constrained = g.grammar.is_some();
    let enable_thinking = match req
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.get("enable_thinking"))
    {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs.enable_thinking",
                "`enable_thinking` must be a boolean",
            ))
        }
    };
    let Some(template) = s.template.clone() else {
        return Err(ApiError::invalid(
            "messages",
            "this model file has no chat template: use /v1/completions",
        ));
    };
    let parse_special = crate::prompt::parse_special(&v)?;
    let p = crate::prompt::build(
        &s,
        template,
        messages,
        plan.tools.clone(),
        plan.forced_prefix.clone(),
        constrained,
        enable_thinking,
        parse_special,
        None,
    )
    .await?;
    request::check_prompt_len(p.ids.len(), &s.limits, "messages")?;
    let budget = g.budget(p.ids.len(), &s.limits, s.limits.max_tokens_limit);
    let lp = crate::extra::logprobs_request(&v, true)?;
    let mut rx = submit(&s, p.ids, budget, &g, lp)?;
    let meta = Meta {
        id: stream::new_id("chatcmpl-"),
        created: stream::now_secs(),
        model: s.model_id.clone(),
    };
    let parser = crate::convo::chat_parser(
        &plan,
        req.tools.as_deref().unwrap_or(&[]),
        p.think,
        p.in_think,
    );
    if g.stream {
        let chunker = ChatChunker::new(meta.clone(), parser, p.prefix, g.include_usage);
        let chunker = crate::extra::stream_chunker(
            Box::new(chunker),
            lp,
            &s.tokenizer,
            meta,
            true,
            g.include_usage,
        );
        return Ok(sse_response(SseStream::new(rx, chunker)));
    }
    let (text, done) = stream::collect(&mut rx).await?;
    let mut out = stream::chat_completion(&meta, parser, &p.prefix, &text, &done);
    if lp.is_some() {
        out.choices[0].logprobs = Some(crate::extra::chat_logprobs(&s.tokenizer, &done.logprobs));
    }
    Ok(Json(out).into_response())
}

async fn completions(State(s): State<Shared>, body: Body) -> Result<Response, ApiError> {
    let v = json_body(body, s.max_body_bytes).await?;
    let req: CompletionRequest = parse_json(&v)?;
    let sampling: SamplingFields = parse_json(&v)?;
    let mut g = request::gen_params(&sampling, &s.limits)?;
    crate::extra::apply_sampling_extras(
        &sampling,
        s.n_vocab.min(s.tokenizer.vocab_size()),
        &mut g.sampler,
    )?;
    g.grammar = crate::constrain::output_grammar(&v)?;
    let echo = req.echo.unwrap_or(false);
    let suffix = req.suffix.clone().filter(|x| !x.is_empty());
    if echo && suffix.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "`echo` and `suffix` cannot be used together",
        ));
    }
    if echo && v.get("logprobs").is_some_and(|l| !l.is_null()) {
        return Err(ApiError::invalid(
            "echo",
            "`echo` with `logprobs` (the prompt tokens' logprobs) is not supported",
        ));
    }
    let fim = match &suffix {
        Some(_) => Some(
            request::fim_tokens(|t| s.tokenizer.token_to_id(t)).ok_or_else(|| {
                ApiError::invalid(
                    "suffix",
                    "this model's vocabulary has no fill-in-the-middle tokens",
                )
            })?,
        ),
        None => None,
    };
    let tok = s.tokenizer.clone();
    let n_vocab = s.n_vocab;
    let prompt = req.prompt.clone();
    let (ids, echoed) = tokio::task::spawn_blocking(move || {
        let ids = match (fim, &suffix) {
            (Some(f), Some(sfx)) => request::fim_prompt(f, &prompt, sfx, |t| tok.encode(t, false))?,
            _ => request::completion_prompt(&prompt, |t| tok.encode(t, true), n_vocab)?,
        };
        // The prompt as sent; token prompts as their text.
        let echoed = echo.then(|| match &prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::TextList(v) if v.len() == 1 => v[0].clone(),
            _ => tok.decode_with(&ids, false),
        });
        Ok::<_, ApiError>((ids, echoed))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    request::check_prompt_len(ids.len(), &s.limits, "prompt")?;
    // OpenAI's default for legacy completions is 16 tokens.
    let budget = g.budget(ids.len(), &s.limits, 16);
    let lp = crate::extra::logprobs_request(&v, false)?;
    let mut rx = submit(&s, ids, budget, &g, lp)?;
    let meta = Meta {
        id: stream::new_id("cmpl-"),
        created: stream::now_secs(),
        model: s.model_id.clone(),
    };
    if g.stream {
        let chunker = CompletionChunker {
            meta: meta.clone(),
            include_usage: g.include_usage,
            echo: echoed,
        };
        let chunker = crate::extra::stream_chunker(
            Box::new(chunker),
            lp,
            &s.tokenizer,
            meta,
            false,
            g.include_usage,
        );
        return Ok(sse_response(SseStream::new(rx, chunker)));
    }
    let (text, done) = stream::collect(&mut rx).await?;
    let text = match echoed {
        Some(p) => p + &text,
        None => text,
    };
    let mut out = stream::completion(&meta, text, &done);
    if lp.is_some() {
        out.choices[0].logprobs = Some(crate::extra::completion_logprobs(
            &s.tokenizer,
            &done.logprobs,
        ));
    }
    Ok(Json(out).into_response())
}
