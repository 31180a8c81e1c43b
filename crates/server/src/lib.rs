//! Red Lite's OpenAI-compatible HTTP server, in layers: OpenAI serde types
//! ([`api`]) → checks and template input ([`request`]) → a FIFO queue →
//! one engine loop that owns the model and the prompt cache ([`engine`]) →
//! answers, whole or streamed as SSE ([`stream`]).
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     serve: redlite_server::ServeArgs,
//! }
//! redlite_server::run(Cli::parse().serve)?;
//! # Ok::<(), redlite_server::ServerError>(())
//! ```

pub mod api;
pub mod constrain;
pub mod convo;
pub mod engine;
pub mod error;
pub mod events;
pub mod extra;
pub mod messages;
pub mod messages_out;
pub mod metrics;
pub mod ops;
pub mod page;
pub mod parse;
pub mod prompt;
pub mod request;
pub mod responses;
pub mod responses_out;
pub mod responses_store;
pub mod routes;
pub mod statedir;
pub mod stop;
pub mod stream;
pub mod xmlcall;

pub use error::{ApiError, ServerError};
pub use routes::{router, AppState};

use redlite_gguf::GgufFile;
use redlite_model::{ExpertCacheOptions, LoadOptions, MemoryRequest, Model};
use redlite_tokenizer::{ChatTemplate, Tokenizer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything `redlite serve` takes.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    pub model: PathBuf,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Context size in tokens (0, the default: the model's trained context
    /// as far as the memory plan allows, else the largest multiple of 1024
    /// that fits; the start-up log says which and why).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Worker threads (0: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Tokens per prompt batch.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// The most tokens one answer generates (a larger `max_tokens` is
    /// lowered to it, not refused).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_limit: usize,
    /// Requests that may wait or run at once; more get 503.
    #[arg(long, default_value_t = 64)]
    pub parallel_queue: usize,
    /// Do not reuse the state of earlier prompts.
    #[arg(long)]
    pub no_prompt_cache: bool,
    /// Session checkpoints kept for prompt reuse.
    #[arg(long, default_value_t = 4)]
    pub cache_checkpoints: usize,
    /// Persist each conversation's state at the end of a turn as a state
    /// file in this directory, and restore it after a restart when a
    /// request extends it (docs/state-files.md).
    #[arg(long, conflicts_with = "no_prompt_cache")]
    pub state_dir: Option<PathBuf>,
    /// Bytes the --state-dir files may take together (e.g. 20G); the least
    /// recently used are removed first.
    #[arg(long, default_value = "16G", value_parser = redlite_model::expertcache::parse_size)]
    pub state_dir_limit: u64,
    /// Largest request body in bytes (more gets 413).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// The model id reported by /v1/models (default: the file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Skip touching every weight page before serving.
    #[arg(long)]
    pub no_warmup: bool,
    /// Memory budget (e.g. 8G): dense weights, sessions, expert cache
    /// (default: what is available). A model that does not fit keeps its
    /// routed experts in a bounded cache read from the file.
    #[arg(long, value_parser = redlite_model::expertcache::parse_size)]
    pub memory: Option<u64>,
    /// Size of the bounded expert cache (default: what the budget leaves).
    #[arg(long, value_parser = redlite_model::expertcache::parse_size)]
    pub expert_cache: Option<u64>,
    /// Allow browser pages from this origin (repeatable; `*` for any):
    /// preflights get 204 with the Access-Control-Allow-* headers.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    #[command(flatten)]
    pub dev: redlite_engine::DeviceArgs,
    #[command(flatten)]
    pub spec: redlite_spec::SpecArgs,
}

impl ServeArgs {
    /// Defaults for a model file (what the command line gives).
    pub fn for_model(model: impl Into<PathBuf>) -> ServeArgs {
        ServeArgs {
            model: model.into(),
            host: "127.0.0.1".into(),
            port: 8080,
            ctx_size: 0,
            threads: 0,
            batch_size: 512,
            api_key: None,
            max_tokens_limit: 4096,
            parallel_queue: 64,
            no_prompt_cache: false,
            cache_checkpoints: 4,
            state_dir: None,
            state_dir_limit: 16 << 30,
            max_body_bytes: 4 << 20,
            alias: None,
            no_warmup: false,
            memory: None,
            expert_cache: None,
            cors_origin: Vec::new(),
            dev: Default::default(),
            spec: Default::default(),
        }
    }
}

/// Load the model, start the engine loop, and return the shared state the
/// routes use.
pub fn load(args: &ServeArgs) -> Result<Arc<AppState>, ServerError> {
    let spec = args.spec.options().map_err(ServerError::Options)?;
    let path = &args.model;
    let file = GgufFile::open(path).map_err(|source| ServerError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let file = Arc::new(file);
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata())?);
    let template = match ChatTemplate::from_gguf(file.metadata()) {
        Ok(t) => Some(Arc::new(t)),
        Err(e @ redlite_tokenizer::TokenizerError::MissingKey { .. }) => {
            tracing::warn!("no chat template ({e}): /v1/chat/completions will answer 400");
            None
        }
        // /v1/chat/completions needs it: a template that does not parse
        // stops the server here, not at the first chat request.
        Err(e) => return Err(e.into()),
    };
    let model = Model::load(
        file.clone(),
        LoadOptions {
            threads: args.threads,
            reference: false,
            ubatch: args.batch_size,
        },
    )?;
    if spec.mode == redlite_spec::SpecMode::Mtp && model.mtp().is_none() {
        return Err(ServerError::Spec {
            path: path.display().to_string(),
            source: redlite_spec::SpecError::NoMtpLayer {
                arch: model.arch().name(),
            },
        });
    }
    // The live session plus the prompt-cache checkpoints.
    let sessions = 1 + if args.no_prompt_cache {
        0
    } else {
        args.cache_checkpoints
    };
    let mut mem = MemoryRequest {
        memory: args.memory,
        expert_cache: args.expert_cache,
        available: redlite_model::expertcache::residency::available_bytes(),
        ctx: args.ctx_size,
        sessions,
        cache: ExpertCacheOptions {
            pregate: usize::MAX,
            ..Default::default()
        },
        // The server keeps an MTP head in step whenever the file has one
        // (any request may ask for `mtp` drafts), and its checkpoints hold
        // the head's KV rows too.
        draft_kv_layers: model.mtp().is_some() as usize,
    };
    if args.ctx_size == 0 {
        // The host plan decides (on a GPU the device plan may refuse it
        // later, naming the numbers; -c then chooses).
        let choice = redlite_engine::default_context(&model, &mem)?;
        tracing::info!("{}", choice.line);
        mem.ctx = choice.ctx;
    } else {
        tracing::info!("context: {} positions (-c)", args.ctx_size);
    }
    let ctx = mem.ctx;
    redlite_engine::warn_context(ctx, model.arch().context_length());
    let draft_kv = model.draft_kv_bytes_per_position() * mem.draft_kv_layers as u64;
    let mut engine = redlite_engine::Engine::open(model, &args.dev.options(), &mem)?;
    tracing::info!("{}", engine.plan_line());
    if draft_kv > 0 {
        tracing::info!(
            "the plan's state includes the MTP head's KV: {draft_kv} bytes a position, {ctx} positions x {sessions} sessions"
        );
    }
    if !args.no_warmup && engine.reads_host_weights() {
        engine.model().touch_weights(|_, _| {});
    }
    let model_id = args.alias.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "redlite".into())
    });
    let model = engine.model().clone();
    tracing::info!(
        "model {} ({}, {} layers), context {ctx}, prompt cache {}",
        path.display(),
        model.arch().name(),
        model.arch().n_layer(),
        if args.no_prompt_cache {
            "off".to_string()
        } else {
            format!("{} checkpoints", args.cache_checkpoints)
        },
    );
    let n_vocab = model.n_vocab();
    let metrics = Arc::new(metrics::Metrics::default());
    // The sequence is opened on the engine thread, which keeps it (a GPU
    // sequence stays on one thread).
    let opened = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let describe = opened.clone();
    let open: engine::OpenSequence = Box::new(move || {
        let seq = engine.open_sequence(ctx).map_err(|e| e.to_string())?;
        if let Ok(mut d) = describe.lock() {
            *d = engine.describe();
        }
        Ok(seq)
    });
    let engine = engine::start(
        open,
        tokenizer.clone(),
        engine::EngineConfig {
            ctx,
            ubatch: model.ubatch(),
            prompt_cache: !args.no_prompt_cache,
            max_checkpoints: args.cache_checkpoints,
            state_dir: args.state_dir.as_ref().map(|dir| statedir::StateDirConfig {
                dir: dir.clone(),
                limit: args.state_dir_limit,
                model: redlite_statefile::ModelId::of(
                    model.file(),
                    model.arch().name(),
                    model.n_vocab(),
                ),
                layers: redlite_model::StateLayout::of(&model, redlite_model::KvElem::F32).layers,
            }),
            spec,
            model: Some(model.clone()),
        },
        metrics.clone(),
    )?;
    if let Ok(d) = opened.lock() {
        tracing::info!("{d}");
    }
    Ok(Arc::new(AppState {
        engine,
        tokenizer,
        template,
        model_id,
        n_vocab,
        limits: request::Limits {
            ctx,
            max_tokens_limit: args.max_tokens_limit,
        },
        parallel_queue: args.parallel_queue.max(1),
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
        metrics,
        created: stream::now_secs(),
        cors_origins: args.cors_origin.clone(),
        responses: Default::default(),
    }))
}

/// Serve on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("redlite-http")
        .enable_all()
        .build()?)
}

async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, ServerError> {
    let addr = format!("{host}:{port}");
    tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// `redlite serve`: load, bind, serve until Ctrl-C.
pub fn run(args: ServeArgs) -> Result<(), ServerError> {
    let state = load(&args)?;
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = bind(&args.host, args.port).await?;
        let addr = listener.local_addr()?;
        tracing::info!("listening on http://{addr}/v1 (OpenAI API)");
        if args.api_key.is_none() && !addr.ip().is_loopback() {
            tracing::warn!("listening beyond loopback without --api-key");
        }
        serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        })
        .await
    })
}

/// A server running on its own threads (for tests and embedding); stops
/// when dropped.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl RunningServer {
    /// The OpenAI base URL, e.g. `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Load and serve in the background on `args.host:args.port` (port 0
/// picks a free one).
pub fn spawn(args: ServeArgs) -> Result<RunningServer, ServerError> {
    let state = load(&args)?;
    let rt = runtime()?;
    let listener = rt.block_on(bind(&args.host, args.port))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let thread = std::thread::Builder::new()
        .name("redlite-server".into())
        .spawn(move || {
            rt.block_on(serve(listener, st, async {
                let _ = stopped.await;
            }))
        })?;
    Ok(RunningServer {
        addr,
        state,
        stop: Some(stop),
        thread: Some(thread),
    })
}
