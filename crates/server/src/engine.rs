//! The engine loop: one thread owns the model, the live session and the
//! prompt cache, and runs jobs from a FIFO channel one at a time. Each job
//! streams its text back over its own channel; when the receiving side is
//! gone (the client disconnected), the job stops before the next token.
//!
//! The loop runs one [`Sequence`] of the engine API, so it is the same on
//! every backend. Prompt reuse: after each prompt and each generation the
//! loop keeps a checkpoint (the backend's snapshot of the whole state, in
//! host memory on the CPU and device memory on a GPU, with the tokens it
//! holds and the logits of its last position). A new prompt restores the
//! longest checkpoint that is a prefix of it. This works for recurrent
//! (DeltaNet) states, which cannot be rewound, as well as for KV caches.
//! With MTP drafting each checkpoint also keeps the MTP head's state
//! ([`mtp`]).

use crate::metrics::Metrics;
use crate::stop::StopMatcher;
use redlite_grammar::{Constraint, Grammar, GrammarError, Vocab};
use redlite_model::sample::{Sampler, SamplerConfig};
use redlite_model::sequence::{Checkpoint as State, Sequence};
use redlite_model::{Logits, Model};
use redlite_spec::mtp::MtpSnapshot;
use redlite_tokenizer::Tokenizer;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Why generation ended (tool calls are decided by the caller's parser).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
}

/// The end of a job.
#[derive(Clone, Debug, PartialEq)]
pub struct Done {
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from a checkpoint instead of computed.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Seconds from dequeue to the first token's text being ready.
    pub ttft_secs: f64,
    pub prompt_secs: f64,
    pub decode_secs: f64,
    /// One entry per generated token when the job asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
    /// The stop string that ended the answer (Anthropic's `stop_sequence`).
    pub stop_sequence: Option<String>,
}

/// A generated token's log-probability and the most likely alternatives
/// (after logit bias and penalties, before temperature and truncation).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// What a job sends back.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// More text (stop strings already cut).
    Text(String),
    Done(Done),
    Error(String),
}

/// One generation request, tokenized and checked.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub events: UnboundedSender<Event>,
    /// `Some(k)`: report each token's log-probability and the top `k`.
    pub logprobs: Option<usize>,
    /// Constrained decoding: only tokens that keep this grammar alive are
    /// sampled, and end-of-generation only once it is complete.
    pub grammar: Option<Arc<Grammar>>,
    /// The request's speculative-decoding fields.
    pub spec: crate::request::SpecRequest,
}

/// Why a job failed.
#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error(transparent)]
    Model(#[from] redlite_model::ModelError),
    #[error("constrained decoding: {0}")]
    Grammar(#[from] GrammarError),
    /// `mtp` asked of a server that cannot draft with it.
    #[error("speculative.type mtp: {0}")]
    NoMtp(String),
}

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub ctx: usize,
    /// Prompt tokens per prefill call (a client that leaves is noticed
    /// between calls).
    pub ubatch: usize,
    /// Keep and reuse checkpoints.
    pub prompt_cache: bool,
    /// How many checkpoints to keep (oldest dropped first).
    pub max_checkpoints: usize,
    /// Persist end-of-turn checkpoints as state files here (`--state-dir`).
    pub state_dir: Option<crate::statedir::StateDirConfig>,
    /// Speculative decoding where a request does not say (`--spec`).
    pub spec: redlite_spec::SpecOptions,
    /// The model, whose MTP head (when it has one) drafts `mtp` jobs
    /// (None: no MTP drafting).
    pub model: Option<Arc<Model>>,
}

/// The client side of the engine: submit jobs.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    /// Why jobs cannot draft with the MTP head (None: they can).
    no_mtp: Option<String>,
}

impl EngineHandle {
    /// Queue a job; `false` when the engine thread is gone.
    pub fn submit(&self, job: Job) -> bool {
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(job).is_err() {
            self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Why `speculative.type: mtp` cannot run here (no MTP layer in the
    /// file, or a backend that keeps no hidden rows); None when it can.
    pub fn mtp_unavailable(&self) -> Option<&str> {
        self.no_mtp.as_deref()
    }
}

struct Checkpoint {
    tokens: Vec<u32>,
    state: State,
    logits: Vec<f32>,
    /// The MTP drafter's state at the same point (None: not kept then).
    mtp: Option<MtpSnapshot>,
    last_used: u64,
}

/// Makes the loop's sequence, on the engine thread (a GPU sequence stays
/// on the thread that made it).
pub type OpenSequence = Box<dyn FnOnce() -> Result<Box<dyn Sequence>, String> + Send + 'static>;

/// Start the engine thread; it opens its sequence with `open` and runs
/// until every [`EngineHandle`] is dropped. Fails when the sequence cannot
/// be opened (the error names why).
pub fn start(
    open: OpenSequence,
    tokenizer: Arc<Tokenizer>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
) -> std::io::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Option<String>, String>>();
    let m = metrics.clone();
    std::thread::Builder::new()
        .name("redlite-engine".into())
        .spawn(move || {
            let opened = open().and_then(|mut seq| {
                let mtp = match &cfg.model {
                    None => Err("the server has no model to draft from".to_string()),
                    Some(m) => mtp::MtpTrack::open(m, cfg.ctx, seq.as_mut()),
                };
                if let (Err(e), redlite_spec::SpecMode::Mtp) = (&mtp, cfg.spec.mode) {
                    return Err(e.clone());
                }
                let disk = match &cfg.state_dir {
                    Some(d) => Some(
                        crate::statedir::StateDir::open(d.clone(), seq.kv_elem(), seq.ctx_len())
                            .map_err(|e| format!("--state-dir {}: {e}", d.dir.display()))?,
                    ),
                    None => None,
                };
                Ok((seq, disk, mtp))
            });
            let (seq, disk, mtp) = match opened {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(s.2.as_ref().err().cloned()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut engine = Engine::new(seq, tokenizer, cfg, m);
            engine.disk = disk;
            engine.mtp = mtp.ok();
            for job in rx {
                engine.metrics.queued.fetch_sub(1, Ordering::SeqCst);
                engine.metrics.processing.store(1, Ordering::SeqCst);
                engine.run(job);
                engine.metrics.processing.store(0, Ordering::SeqCst);
            }
            tracing::debug!("engine loop: all handles dropped, stopping");
        })?;
    match ready_rx.recv() {
        Ok(Ok(no_mtp)) => Ok(EngineHandle {
            tx,
            metrics,
            no_mtp,
        }),
        Ok(Err(e)) => Err(std::io::Error::other(format!("opening the sequence: {e}"))),
        Err(_) => Err(std::io::Error::other(
            "the engine thread stopped while opening its sequence",
        )),
    }
}

struct Engine {
    seq: Box<dyn Sequence>,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
    checkpoints: Vec<Checkpoint>,
    clock: u64,
    /// The persisted checkpoints (`--state-dir`).
    disk: Option<crate::statedir::StateDir>,
    /// The end-of-turn checkpoint to write once the answer is sent.
    to_persist: Option<Vec<u32>>,
    /// The vocabulary as the grammar engine reads it, built on the first
    /// constrained job.
    vocab: Option<Arc<Vocab>>,
    /// The MTP drafter, kept in step with `seq` by the jobs that track it
    /// (None: the model or backend cannot draft with MTP).
    mtp: Option<mtp::MtpTrack>,
}

impl Engine {
    fn new(
        seq: Box<dyn Sequence>,
        tok: Arc<Tokenizer>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Engine {
        metrics.ctx.store(cfg.ctx as u64, Ordering::Relaxed);
        Engine {
            seq,
            tok,
            cfg,
            metrics,
            checkpoints: Vec::new(),
            clock: 0,
            disk: None,
            to_persist: None,
            vocab: None,
            mtp: None,
        }
    }

    fn vocab(&mut self) -> Arc<Vocab> {
        let tok = &self.tok;
        self.vocab
            .get_or_insert_with(|| Arc::new(crate::constrain::vocab_for(tok)))
            .clone()
    }

    /// The checkpoint to start `prompt` from: the longest whose tokens are a
    /// prefix of it (and that keeps the MTP state, for a job that tracks
    /// it).
    fn best_checkpoint(&self, prompt: &[u32], need_mtp: bool) -> Option<usize> {
        if !self.cfg.prompt_cache {
            return None;
        }
        self.checkpoints
            .iter()
            .enumerate()
            .filter(|(_, c)| c.tokens.len() <= prompt.len() && prompt.starts_with(&c.tokens))
            .filter(|(_, c)| !need_mtp || c.mtp.is_some())
            .max_by_key(|(_, c)| (c.tokens.len(), c.last_used))
            .map(|(i, _)| i)
    }

    /// When a saved state extends further into `prompt` than any
    /// checkpoint in memory (that keeps the MTP state, with `need_mtp`),
    /// bring it into memory (the next [`Engine::best_checkpoint`] picks
    /// it), with its MTP state when one was saved beside it.
    fn load_from_disk(&mut self, prompt: &[u32], need_mtp: bool) {
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        let in_memory = self
            .checkpoints
            .iter()
            .filter(|c| prompt.starts_with(&c.tokens) && (!need_mtp || c.mtp.is_some()))
            .map(|c| c.tokens.len())
            .max()
            .unwrap_or(0);
        let Some(len) = disk.best(prompt, need_mtp).filter(|&l| l > in_memory) else {
            return;
        };
        let t0 = Instant::now();
        match disk.load(prompt, len, self.seq.as_ref()) {
            Ok((tokens, state, logits)) => {
                tracing::info!(
                    "--state-dir: restored {} prompt tokens from a saved state in {:.3} s",
                    tokens.len(),
                    t0.elapsed().as_secs_f64()
                );
                let mtp = match self.mtp.as_mut() {
                    Some(m) if disk.has_mtp(&tokens) => match disk.load_mtp(&tokens, m.drafter()) {
                        Ok(snap) => Some(snap),
                        Err(e) => {
                            tracing::warn!("--state-dir: a saved MTP state did not load: {e}");
                            None
                        }
                    },
                    _ => None,
                };
                self.clock += 1;
                self.checkpoints.retain(|c| c.tokens != tokens);
                self.checkpoints.push(Checkpoint {
                    tokens,
                    state,
                    logits,
                    mtp,
                    last_used: self.clock,
                });
                self.trim_checkpoints();
            }
            Err(e) => tracing::warn!("--state-dir: a saved state did not load: {e}"),
        }
    }

    /// Write the memory checkpoint holding exactly `tokens` to the state
    /// directory (a failure is logged: serving goes on without it).
    fn persist(&mut self, tokens: &[u32]) {
        let Some(disk) = self.disk.as_mut() else {
            return;
        };
        let Some(c) = self.checkpoints.iter().find(|c| c.tokens == tokens) else {
            return;
        };
        let t0 = Instant::now();
        let mtp = match (&c.mtp, self.mtp.as_mut()) {
            (Some(snap), Some(m)) => Some((snap, m.drafter().kv_row())),
            _ => None,
        };
        match disk.save(self.seq.as_ref(), &c.state, &c.tokens, &c.logits, mtp) {
            Ok(()) => tracing::info!(
                "--state-dir: saved a state of {} tokens in {:.3} s",
                tokens.len(),
                t0.elapsed().as_secs_f64()
            ),
            Err(e) => tracing::warn!("--state-dir: saving a state: {e}"),
        }
    }

    fn trim_checkpoints(&mut self) {
        while self.checkpoints.len() > self.cfg.max_checkpoints.max(1) {
            let oldest = self
                .checkpoints
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(i, _)| i)
                .unwrap_or(0);
            self.checkpoints.remove(oldest);
        }
        self.publish_cache_metrics();
    }

    /// Keep the live sequence's state as holding `tokens`.
    fn save_checkpoint(
        &mut self,
        tokens: Vec<u32>,
        logits: Vec<f32>,
    ) -> Result<(), redlite_model::ModelError> {
        if !self.cfg.prompt_cache || self.cfg.max_checkpoints == 0 || tokens.is_empty() {
            return Ok(());
        }
        let state = self.seq.checkpoint()?;
        let mtp = self
            .mtp
            .as_ref()
            .and_then(|m| m.snapshot(self.seq.as_ref()));
        self.clock += 1;
        self.checkpoints.retain(|c| c.tokens != tokens);
        self.checkpoints.push(Checkpoint {
            tokens,
            state,
            logits,
            mtp,
            last_used: self.clock,
        });
        while self.checkpoints.len() > self.cfg.max_checkpoints {
            let oldest = self
                .checkpoints
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(i, _)| i)
                .unwrap_or(0);
            self.checkpoints.remove(oldest);
        }
        self.publish_cache_metrics();
        Ok(())
    }

    fn publish_cache_metrics(&self) {
        let tokens: usize = self.checkpoints.iter().map(|c| c.tokens.len()).sum();
        let bytes = self
            .checkpoints
            .iter()
            .map(|c| {
                c.state.bytes()
                    + c.logits.len() as u64 * 4
                    + c.mtp.as_ref().map_or(0, |m| m.bytes())
            })
            .sum();
        let m = &self.metrics;
        m.checkpoints
            .store(self.checkpoints.len() as u64, Ordering::Relaxed);
        m.checkpoint_tokens.store(tokens as u64, Ordering::Relaxed);
        m.checkpoint_bytes.store(bytes, Ordering::Relaxed);
    }

    fn run(&mut self, job: Job) {
        if job.events.is_closed() {
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let events = job.events.clone();
        match self.generate(job) {
            Ok(Some(done)) => {
                let m = &self.metrics;
                m.prompt_tokens
                    .fetch_add(done.prompt_tokens as u64, Ordering::Relaxed);
                m.cached_tokens
                    .fetch_add(done.cached_tokens as u64, Ordering::Relaxed);
                m.generated_tokens
                    .fetch_add(done.completion_tokens as u64, Ordering::Relaxed);
                m.record_speeds(
                    done.prompt_tokens - done.cached_tokens,
                    done.prompt_secs,
                    done.completion_tokens.saturating_sub(1),
                    done.decode_secs,
                );
                if done.completion_tokens > 0 {
                    m.ttft.observe(done.ttft_secs);
                }
                if done.prompt_tokens > done.cached_tokens {
                    m.prompt_latency.observe(done.prompt_secs);
                }
                // Not processing once the answer is complete: a client that
                // sends its next request at once must not find the slot
                // still taken (a spurious 503 with --parallel-queue 1).
                m.processing.store(0, Ordering::SeqCst);
                let _ = events.send(Event::Done(done));
                // Written after the answer is complete, so the write delays
                // the next queued request, not this one.
                if let Some(tokens) = self.to_persist.take() {
                    self.persist(&tokens);
                }
            }
            Ok(None) => {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                tracing::info!("request cancelled: the client went away");
            }
            Err(e) => {
                tracing::error!("generation failed: {e}");
                let _ = events.send(Event::Error(e.to_string()));
            }
        }
    }

    /// Run one job; `Ok(None)` when it was cancelled.
    fn generate(&mut self, job: Job) -> Result<Option<Done>, JobError> {
        let t0 = Instant::now();
        let prompt = &job.prompt;
        let spec_opts = job.spec.over(&self.cfg.spec);
        let wants_mtp = spec_opts.mode == redlite_spec::SpecMode::Mtp;
        if wants_mtp && self.mtp.is_none() {
            return Err(JobError::NoMtp(
                "this server cannot draft with an MTP head".into(),
            ));
        }
        // Every job keeps the MTP drafter in step when MTP is the server's
        // default, so that any turn's checkpoint serves the next MTP turn.
        let track =
            self.mtp.is_some() && (wants_mtp || self.cfg.spec.mode == redlite_spec::SpecMode::Mtp);
        if self.cfg.prompt_cache {
            self.load_from_disk(prompt, track);
        }
        let (cached, mut logits) = match self.best_checkpoint(prompt, track) {
            Some(i) => {
                self.clock += 1;
                let c = &mut self.checkpoints[i];
                c.last_used = self.clock;
                self.seq.restore(&c.state)?;
                if let Some(m) = self.mtp.as_mut() {
                    m.begin(self.seq.as_mut(), track, c.mtp.as_ref())?;
                }
                (c.tokens.len(), c.logits.clone())
            }
            None => {
                self.seq.reset()?;
                if let Some(m) = self.mtp.as_mut() {
                    m.begin(self.seq.as_mut(), track, None)?;
                }
                (0, Vec::new())
            }
        };
        // Prefill what the checkpoint does not hold, in batches, so a
        // client that leaves stops a long prompt too.
        if cached < prompt.len() {
            let mut done = cached;
            for chunk in prompt[cached..].chunks(self.cfg.ubatch.max(1)) {
                if job.events.is_closed() {
                    // Keep what was computed: a client that timed out on a
                    // long prompt and retries it resumes here.
                    if done > cached {
                        self.save_checkpoint(prompt[..done].to_vec(), logits)?;
                    }
                    return Ok(None);
                }
                logits = self.seq.prefill(chunk, Logits::Last)?;
                if let Some(m) = self.mtp.as_mut() {
                    m.ran(self.seq.as_mut(), chunk)?;
                }
                done += chunk.len();
            }
        }
        let prompt_secs = t0.elapsed().as_secs_f64();
        self.metrics
            .kv_tokens
            .store(self.seq.pos() as u64, Ordering::Relaxed);
        if cached < prompt.len() {
            self.save_checkpoint(prompt.clone(), logits.clone())?;
        }

        let mut constraint = match &job.grammar {
            Some(g) => Some(Constraint::new(g.clone(), self.vocab())?),
            None => None,
        };
        let mut sampler = Sampler::new(job.sampler.clone());
        let mut history = prompt.clone();
        let mut decoder = self.tok.stream_decoder();
        let mut stop = StopMatcher::new(job.stop.clone());
        let mut generated = 0usize;
        let mut ttft = None;
        let mut finish = Finish::Length;
        let t1 = Instant::now();
        let send = |text: String| text.is_empty() || job.events.send(Event::Text(text)).is_ok();
        let mut cancelled = false;
        let mut logprobs = Vec::new();
        // When the last token was ready: the time from one token to the
        // next (sampling, the grammar's mask, the model's step) goes to
        // the token-latency histogram, one observation per token after the
        // first.
        let mut last_token: Option<Instant> = None;
        // Speculation needs every kept token's choice made from its own
        // logits by the plain rule: grammars and log-probabilities take
        // the token-by-token loop.
        let speculate = spec_opts.mode != redlite_spec::SpecMode::None
            && constraint.is_none()
            && job.logprobs.is_none();
        if speculate {
            let mut lookup = redlite_spec::drafter(&spec_opts);
            let mut also_track;
            let drafter: &mut (dyn redlite_spec::Drafter + Send) =
                match (lookup.as_mut(), self.mtp.as_mut()) {
                    (Some(inner), Some(m)) if m.on() => {
                        also_track = mtp::AlsoTrack {
                            inner: &mut **inner,
                            mtp: m.drafter(),
                        };
                        &mut also_track
                    }
                    (Some(inner), _) => &mut **inner,
                    (None, Some(m)) => m.drafter(),
                    (None, None) => {
                        return Err(JobError::NoMtp("no MTP drafter".into()));
                    }
                };
            let mut spec = redlite_spec::Speculator::new(drafter, spec_opts);
            let tok = self.tok.clone();
            let is_stop = move |t: u32| tok.is_eog(t);
            'steps: while generated < job.max_tokens {
                if job.events.is_closed() {
                    cancelled = true;
                    break;
                }
                // A step may emit one token it does not run (as the plain
                // loop's last one), never run one past the context.
                let room = self.seq.ctx_len().saturating_sub(self.seq.pos()) + 1;
                let budget = (job.max_tokens - generated).min(room);
                let step_start = Instant::now();
                let step = spec.step(
                    &mut *self.seq,
                    &mut sampler,
                    &mut history,
                    &mut logits,
                    budget,
                    &is_stop,
                )?;
                // A step's tokens arrive together: each is counted at an
                // even share of the time since the token before them.
                let n = step.tokens.len();
                if n > 0 {
                    let now = Instant::now();
                    let gap = (now - last_token.unwrap_or(step_start)).as_secs_f64();
                    let counted = if last_token.is_some() { n } else { n - 1 };
                    self.metrics
                        .token_latency
                        .observe_n(gap / n as f64, counted as u64);
                    last_token = Some(now);
                }
                for &next in &step.tokens {
                    generated += 1;
                    let piece = decoder.push(next);
                    let (text, stopped) = stop.push(&piece);
                    ttft.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                    if !send(text) {
                        cancelled = true;
                        break 'steps;
                    }
                    if stopped {
                        finish = Finish::Stop;
                        break 'steps;
                    }
                }
                if step.stop.is_some() {
                    finish = Finish::Stop;
                    break;
                }
                if !step.all_run || self.seq.pos() >= self.seq.ctx_len() {
                    break;
                }
                self.metrics
                    .kv_tokens
                    .store(self.seq.pos() as u64, Ordering::Relaxed);
            }
            let st = spec.stats();
            self.metrics
                .spec_passes
                .fetch_add(st.passes, Ordering::Relaxed);
            self.metrics
                .spec_drafted
                .fetch_add(st.drafted, Ordering::Relaxed);
            self.metrics
                .spec_accepted
                .fetch_add(st.accepted, Ordering::Relaxed);
            tracing::info!("request ({}): {}", spec_opts.mode.name(), st.line());
        } else {
            for i in 0..job.max_tokens {
                if job.events.is_closed() {
                    cancelled = true;
                    break;
                }
                let next = match constraint.as_mut() {
                    None => sampler.sample(&logits, &history),
                    Some(c) => {
                        let mut masked = Ok(());
                        let next =
                            sampler.sample_masked(&logits, &history, |l| masked = c.apply(l));
                        masked?;
                        if !c.accept_token(next)? {
                            return Err(GrammarError::Invalid(format!(
                                "the sampler chose token {next}, which the grammar refuses"
                            ))
                            .into());
                        }
                        next
                    }
                };
                if self.tok.is_eog(next) {
                    finish = Finish::Stop;
                    break;
                }
                if let Some(k) = job.logprobs {
                    // The distribution the choice was made from, before
                    // temperature: bias and penalties applied (OpenAI's).
                    let adjusted = job.sampler.adjusted_logits(&logits, &history);
                    let (logprob, top) = redlite_model::sample::log_probs(&adjusted, next, k);
                    logprobs.push(TokenLogprob {
                        id: next,
                        logprob,
                        top,
                    });
                }
                generated += 1;
                history.push(next);
                let piece = decoder.push(next);
                let (text, stopped) = stop.push(&piece);
                ttft.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                let now = Instant::now();
                if let Some(prev) = last_token {
                    self.metrics
                        .token_latency
                        .observe((now - prev).as_secs_f64());
                }
                last_token = Some(now);
                if !send(text) {
                    cancelled = true;
                    break;
                }
                if stopped {
                    finish = Finish::Stop;
                    break;
                }
                // A finished grammar allows only end-of-generation: stop here
                // rather than compute a token whose choice is made.
                if constraint.as_ref().is_some_and(|c| c.is_finished()) {
                    finish = Finish::Stop;
                    break;
                }
                if i + 1 == job.max_tokens || self.seq.pos() >= self.seq.ctx_len() {
                    break;
                }
                logits = self.seq.decode(next)?;
                if let Some(m) = self.mtp.as_mut() {
                    m.ran(self.seq.as_mut(), &[next])?;
                }
                self.metrics
                    .kv_tokens
                    .store(self.seq.pos() as u64, Ordering::Relaxed);
            }
        }
        if cancelled {
            return Ok(None);
        }
        if !stop.stopped() {
            let (text, _) = stop.push(&decoder.finish());
            let rest = text + &stop.finish();
            if !send(rest) {
                return Ok(None);
            }
        }
        let decode_secs = t1.elapsed().as_secs_f64();
        // The session now holds the prompt and every generated token that
        // was fed back (all but the last sampled one).
        let fed = self.seq.pos();
        if fed > prompt.len() {
            let tokens = history[..fed].to_vec();
            if self.disk.is_some() {
                self.to_persist = Some(tokens.clone());
            }
            self.save_checkpoint(tokens, logits)?;
        } else if self.disk.is_some() {
            // Nothing generated was fed back: the prompt's state ends the turn.
            self.to_persist = Some(prompt.clone());
        }
        Ok(Some(Done {
            finish,
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            completion_tokens: generated,
            ttft_secs: ttft.unwrap_or(prompt_secs),
            prompt_secs,
            decode_secs,
            logprobs,
            stop_sequence: stop.matched().map(String::from),
        }))
    }
}

mod mtp;
#[cfg(test)]
mod mtp_tests;
#[cfg(test)]
mod tests;
