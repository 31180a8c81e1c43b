//! `redlite generate`: prompt in, tokens out, streamed.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use redlite_engine::Engine;
use redlite_gguf::GgufFile;
use redlite_model::sample::{Sampler, SamplerConfig};
use redlite_model::{LoadOptions, Logits, Model};
use redlite_outfile::Output;
use redlite_spec::SpecMode;
use redlite_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::limits;
use crate::memory;
use crate::out::STDOUT;

/// Everything `redlite generate` takes.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    pub model: PathBuf,
    /// Map the model file (pages read on demand) even when it fits in memory.
    #[arg(long, conflicts_with = "no_mmap")]
    pub mmap: bool,
    /// Read the whole model file into memory (huge pages) even when it takes
    /// more than half of the available memory. Default: read in when it fits
    /// in half of it, else map.
    #[arg(long)]
    pub no_mmap: bool,
    /// The prompt text.
    #[arg(short, long, conflicts_with_all = ["prompt_ids", "file"])]
    pub prompt: Option<String>,
    /// Read the prompt text from this file (UTF-8; for prompts too long for
    /// a command-line argument).
    #[arg(short = 'f', long, conflicts_with = "prompt_ids")]
    pub file: Option<PathBuf>,
    /// The prompt as token ids (comma-separated), bypassing the tokenizer.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template (the default when the file has one).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Use the prompt as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Pass enable_thinking to the chat template.
    #[arg(long)]
    pub think: Option<bool>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Sampling temperature; 0 is greedy (0 to 2).
    #[arg(long, default_value_t = 0.8, value_parser = limits::temperature)]
    pub temp: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass (1: off).
    #[arg(long, default_value_t = 0.95, value_parser = limits::probability)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely (0: off).
    #[arg(long, default_value_t = 0.05, value_parser = limits::probability)]
    pub min_p: f32,
    /// Penalty for repeating recent tokens (1: off; 0 to 10).
    #[arg(long, default_value_t = 1.0, value_parser = limits::repeat_penalty)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Context size in tokens (0: the model's trained context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Tokens per prompt batch.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Print the generated token ids as a JSON array on stdout instead of text.
    #[arg(long)]
    pub print_ids: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Run the float reference path instead of the fast path.
    #[arg(long)]
    pub reference: bool,
    #[command(flatten)]
    pub dev: redlite_engine::DeviceArgs,
    /// Write the logits of every prompt position and every generated token as little-endian f32 (rows of n_vocab).
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Write every named intermediate of the prompt pass (layer, stage) as JSON lines to this file.
    #[arg(long)]
    pub dump_trace: Option<PathBuf>,
    /// Save the sequence's state when done (tokens, KV rows, DeltaNet
    /// states, the sampler's RNG, the last logits) to this file, written
    /// atomically; `--load-state` continues from it.
    #[arg(long)]
    pub save_state: Option<PathBuf>,
    /// Continue from a state file of --save-state (same model, same KV
    /// type). A prompt given with it must begin with the file's tokens; the
    /// rest is prefilled. Without --seed the sampler continues the file's
    /// RNG stream.
    #[arg(long)]
    pub load_state: Option<PathBuf>,
    /// Skip touching every weight page before the first token.
    #[arg(long)]
    pub no_warmup: bool,
    #[command(flatten)]
    pub mem: crate::residency::MemoryArgs,
    #[command(flatten)]
    pub spec: redlite_spec::SpecArgs,
}

/// Touch every weight page with a progress bar: the loading step of a
/// mapped model.
fn warm_pages(model: &Model) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    model.touch_weights(|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
}

pub fn run(mut args: GenerateArgs) -> Result<()> {
    if let Some(p) = &args.file {
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("--file {}: reading the prompt", p.display()))?;
        args.prompt = Some(text);
    }
    let spec_opts = args.spec.options().map_err(anyhow::Error::msg)?;
    if spec_opts.mode != SpecMode::None && args.dump_logits.is_some() {
        bail!("--dump-logits writes one row per decode step; it cannot be combined with --spec (drafts are verified several tokens a pass)");
    }
    args.threads = limits::cap_threads(args.threads, "--threads");
    args.mem.io_threads = limits::cap_io_threads(args.mem.io_threads, "--io-threads");
    let path = &args.model;
    limits::input_file(path, "--model")?;
    // Outputs first: an output that is the model file (or a directory) is
    // refused before the model is even opened, and nothing appears at an
    // output path until its contents are complete.
    let inputs = [path.as_path()];
    let mut logit_dump = match &args.dump_logits {
        Some(p) => Some(Output::create(p, &inputs).context("--dump-logits")?),
        None => None,
    };
    if let Some(p) = &args.save_state {
        redlite_outfile::check_target(p, &inputs).context("--save-state")?;
    }
    if let Some(p) = &args.load_state {
        limits::input_file(p, "--load-state")?;
    }
    let mut trace_out = match &args.dump_trace {
        Some(p) => Some(Output::create(p, &inputs).context("--dump-trace")?),
        None => None,
    };
    let file = Arc::new(memory::open_model(
        path,
        args.mmap || args.dev.offloads_weights(),
        args.no_mmap,
        &args.mem,
    )?);
    // The template is checked before the weights load: one that does not
    // parse is an error when --chat asks for it, a warning otherwise.
    let template = if args.raw || args.prompt_ids.is_some() || args.prompt.is_none() {
        None
    } else {
        chat_template(&file, path, args.chat)?
    };
    let model = Model::load(
        file.clone(),
        LoadOptions {
            threads: args.threads,
            reference: args.reference,
            ubatch: args.batch_size,
        },
    )
    .with_context(|| format!("loading model {}", path.display()))?;

    // Memory: the plan decides what is resident (dense weights mapped from
    // the file, experts mapped or in a bounded cache) or refuses here,
    // before any weight is read.
    let ctx = if args.ctx_size == 0 {
        model.arch().context_length()
    } else {
        args.ctx_size
    };
    limits::warn_context(ctx, model.arch().context_length());
    eprintln!(
        "redlite: {} ({}), {} layers, {} threads, {} path, weights {}",
        path.display(),
        model.arch().name(),
        model.arch().n_layer(),
        model.threads(),
        if model.is_reference() {
            "reference"
        } else {
            "fast"
        },
        memory::weights_residency(&file),
    );
    crate::residency::check_in_memory(&model, &args.mem)?;
    let mtp = spec_opts.mode == SpecMode::Mtp;
    let req = args.mem.request_with_draft(ctx, 1, mtp);
    let draft_kv = crate::residency::draft_kv_line(&model, &req);
    let mut engine = Engine::open(model, &args.dev.options(), &req)
        .with_context(|| format!("opening {} on {:?}", path.display(), args.dev.device))?;
    eprintln!("redlite: {}{draft_kv}", engine.plan_line());

    let tokenizer = Tokenizer::from_gguf(file.metadata());
    let prompt: Vec<u32> = if let Some(ids) = &args.prompt_ids {
        ids.clone()
    } else if args.prompt.is_none() && args.load_state.is_some() {
        // Continue the saved sequence as it is.
        Vec::new()
    } else {
        let text = args
            .prompt
            .clone()
            .context("give a prompt: -p TEXT or --prompt-ids 1,2,3")?;
        let tok = tokenizer
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("this file's tokenizer")?;
        let use_chat = !args.raw && (args.chat || template.is_some());
        let text = if use_chat {
            let template = template.as_ref().with_context(|| {
                format!("--chat: {} has no tokenizer.chat_template", path.display())
            })?;
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(ChatMessage::system(s.clone()));
            }
            messages.push(ChatMessage::user(text));
            template
                .render(&messages, None, true, args.think)
                .with_context(|| format!("the chat template of {}", path.display()))?
        } else {
            text
        };
        // encode adds BOS itself when the file asks for it.
        tok.encode(&text, true)
    };
    if prompt.is_empty() && args.load_state.is_none() {
        bail!("the prompt is empty");
    }
    if prompt.len() + args.n_predict > ctx {
        bail!(
            "the prompt ({} tokens) plus -n {} exceeds the context of {ctx} tokens: raise --ctx-size or shorten the prompt",
            prompt.len(),
            args.n_predict
        );
    }
    if !args.no_warmup && engine.reads_host_weights() {
        warm_pages(engine.model());
    }

    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
        ..Default::default()
    });

    let mut session = engine.open_sequence(ctx)?;
    eprintln!("redlite: {}", engine.describe());
    let model = engine.model().clone();
    let mut spec = redlite_spec::from_options(&spec_opts, &model, ctx)?;
    let spec_reads_hidden = spec.as_ref().is_some_and(|s| s.needs_hidden());
    if spec_reads_hidden {
        if args.load_state.is_some() {
            bail!("--spec mtp reads the hidden rows of the whole prompt, which a --load-state file does not hold: use --spec lookup with it");
        }
        session.keep_hidden(true)?;
    }
    if trace_out.is_some() {
        session.enable_trace()?;
    }
    let n_vocab = model.n_vocab();
    let want = if logit_dump.is_some() {
        Logits::All
    } else {
        Logits::Last
    };
    // A loaded state covers a prefix of the prompt (or, with no prompt,
    // is the whole of it); only the rest is prefilled.
    let mut history = Vec::new();
    let mut logits = Vec::new();
    if let Some(p) = &args.load_state {
        let loaded = crate::state::load(p, &model, session.as_mut())?;
        if !prompt.is_empty() {
            check_prefix(p, &loaded.tokens, &prompt)?;
        }
        if let (Some(r), None) = (loaded.rng, args.seed) {
            sampler.set_rng_state(r);
        }
        history = loaded.tokens;
        logits = loaded.logits;
    }
    let rest = prompt.get(history.len()..).unwrap_or(&[]).to_vec();
    if history.len() + rest.len() + args.n_predict > ctx {
        bail!(
            "the loaded state ({} tokens) plus the prompt's {} new tokens plus -n {} exceeds the context of {ctx} tokens: raise --ctx-size",
            history.len(),
            rest.len(),
            args.n_predict
        );
    }
    let t0 = Instant::now();
    if !rest.is_empty() {
        logits = session.prefill(&rest, want)?;
        if let Some(w) = logit_dump.as_mut() {
            write_f32(w, &logits)?;
        }
        if want == Logits::All {
            logits.drain(..logits.len() - n_vocab);
        }
        history.extend_from_slice(&rest);
    }
    if logits.is_empty() {
        bail!("nothing to continue from: the prompt is empty and the state has no tokens");
    }
    if let (Some(s), true) = (spec.as_mut(), spec_reads_hidden) {
        s.prime(session.as_mut(), &history)?;
    }
    let prompt_secs = t0.elapsed().as_secs_f64();
    if let Some(mut w) = trace_out.take() {
        write_trace(&mut w, &session.take_trace())?;
        w.commit()?;
    }

    let mut generated = Vec::new();
    // The last sampled token when the loop stops before running it.
    let mut undecoded = None;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut decoder = tokenizer.as_ref().ok().map(|t| t.stream_decoder());
    let t1 = Instant::now();
    let mut emit = |out: &mut std::io::StdoutLock, t: u32| -> Result<()> {
        if !args.print_ids {
            if let Some(d) = decoder.as_mut() {
                let piece = d.push(t);
                out.write_all(piece.as_bytes()).context(STDOUT)?;
                out.flush().context(STDOUT)?;
            }
        }
        Ok(())
    };
    let is_stop = |t: u32| !args.ignore_eos && tokenizer.as_ref().is_ok_and(|k| k.is_eog(t));
    let mut spec_stats = None;
    if let Some(mut spec) = spec {
        while generated.len() < args.n_predict {
            let budget = args.n_predict - generated.len();
            let step = spec.step(
                session.as_mut(),
                &mut sampler,
                &mut history,
                &mut logits,
                budget,
                &is_stop,
            )?;
            for &t in &step.tokens {
                generated.push(t);
                emit(&mut out, t)?;
            }
            if !step.all_run {
                undecoded = step.tokens.last().copied();
            }
            if step.stop.is_some() || step.tokens.is_empty() {
                break;
            }
        }
        spec_stats = Some(spec.stats());
    } else {
        for i in 0..args.n_predict {
            let next = sampler.sample(&logits, &history);
            if is_stop(next) {
                break;
            }
            generated.push(next);
            history.push(next);
            emit(&mut out, next)?;
            if i + 1 == args.n_predict {
                undecoded = Some(next);
                break;
            }
            logits = session.decode(next)?;
            if let Some(w) = logit_dump.as_mut() {
                write_f32(w, &logits)?;
            }
        }
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    if args.print_ids {
        writeln!(out, "{}", serde_json::to_string(&generated)?).context(STDOUT)?;
    } else {
        if let Some(d) = decoder.as_mut() {
            out.write_all(d.finish().as_bytes()).context(STDOUT)?;
        }
        writeln!(out).context(STDOUT)?;
    }
    out.flush().context(STDOUT)?;
    if let Some(w) = logit_dump {
        w.commit()?;
    }
    if let Some(p) = &args.save_state {
        // The state covers every token of the history: the last sampled
        // one is run first, so a load continues by sampling.
        if let Some(t) = undecoded {
            logits = session.decode(t)?;
        }
        let rng = Some(sampler.rng_state());
        crate::state::save(p, &inputs, &model, session.as_mut(), &history, rng, &logits)?;
    }
    // Decode speed counts the forward passes after the first sampled token.
    let decode_steps = generated.len().saturating_sub(1).max(1);
    if let Some(c) = model.expert_cache() {
        eprintln!(
            "redlite: {}",
            crate::residency::stats_line(&c.stats(), prompt.len() + generated.len())
        );
    } else if let Some(c) = session.cache_counters()? {
        eprintln!("redlite: {}", crate::residency::counters_line(&c));
    }
    if let Some(st) = spec_stats {
        eprintln!("redlite: {}", st.line());
    }
    eprintln!(
        "redlite: prompt {} tokens in {:.2} s ({:.1} tok/s) | decode {} tokens in {:.2} s ({:.1} tok/s)",
        rest.len(),
        prompt_secs,
        rest.len() as f64 / prompt_secs.max(1e-9),
        generated.len(),
        decode_secs,
        decode_steps as f64 / decode_secs.max(1e-9),
    );
    Ok(())
}

/// A prompt given with --load-state must begin with the state's tokens.
fn check_prefix(path: &Path, saved: &[u32], prompt: &[u32]) -> Result<()> {
    if let Some(i) = saved.iter().zip(prompt).position(|(a, b)| a != b) {
        bail!(
            "--load-state {}: the prompt differs from the state's tokens at token {i} ({} there, {} in the state): a state continues only the tokens it holds",
            path.display(),
            prompt[i],
            saved[i]
        );
    }
    if prompt.len() < saved.len() {
        bail!(
            "--load-state {}: the prompt ({} tokens) is shorter than the state ({} tokens): give the whole text, or no prompt to continue the state as it is",
            path.display(),
            prompt.len(),
            saved.len()
        );
    }
    Ok(())
}

fn write_f32(w: &mut Output, v: &[f32]) -> Result<()> {
    let mut bytes = Vec::with_capacity(v.len() * 4);
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    w.write_all(&bytes)
        .with_context(|| format!("writing {}", w.target().display()))?;
    Ok(())
}

fn write_trace(w: &mut Output, records: &[redlite_model::trace::TraceRecord]) -> Result<()> {
    for r in records {
        let line = serde_json::json!({
            "layer": r.layer,
            "name": r.name,
            "n_tokens": r.n_tokens,
            "data": r.data,
        });
        writeln!(w, "{line}").with_context(|| format!("writing {}", w.target().display()))?;
    }
    Ok(())
}

/// The file's chat template: `None` when it has none, or (with a warning)
/// when it does not parse and `required` (`--chat`) is off.
fn chat_template(file: &GgufFile, path: &Path, required: bool) -> Result<Option<ChatTemplate>> {
    match ChatTemplate::from_gguf(file.metadata()) {
        Ok(t) => Ok(Some(t)),
        Err(TokenizerError::MissingKey { .. }) => Ok(None),
        Err(e) if required => Err(e).with_context(|| format!("--chat: {}", path.display())),
        Err(e) => {
            tracing::warn!(
                "{}: {e}; the prompt is used without a template (--chat makes this an error)",
                path.display()
            );
            Ok(None)
        }
    }
}

/// `redlite tokenize`: the ids of a text as a JSON array.
pub fn tokenize(model: &Path, text: &str, no_special: bool) -> Result<Vec<u32>> {
    limits::input_file(model, "--model")?;
    let file =
        GgufFile::open(model).with_context(|| format!("opening model {}", model.display()))?;
    let tok = Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("tokenizer of {}", model.display()))?;
    Ok(tok.encode(text, !no_special))
}
