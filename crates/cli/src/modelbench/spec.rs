//! `bench model --prompt-file F --spec lookup`: decode real text with and
//! without speculation, alternating, and `--verify-k`: what a verify pass
//! of k draft tokens costs against one decode step.
//!
//! The text test decodes `-n` tokens greedily after the prompt, from a
//! checkpoint of the prefilled prompt, plain and speculative in turn (one
//! warm-up each, then `-r` timed runs each), and refuses to report a
//! speed-up whose tokens differ from plain decoding's.

use anyhow::{bail, Result};
use redlite_engine::Sequence;
use redlite_model::sample::Sampler;
use redlite_model::{Logits, Model};
use redlite_spec::{SpecOptions, SpecStats};
use std::time::Instant;

use super::median;

/// One decode of `n` tokens from the checkpoint: tokens and seconds.
fn decode_text(
    seq: &mut dyn Sequence,
    start: &redlite_engine::Checkpoint,
    first: &[f32],
    prompt: &[u32],
    n: usize,
    spec: Option<&SpecOptions>,
    model: &std::sync::Arc<Model>,
) -> Result<(Vec<u32>, f64, Option<SpecStats>)> {
    seq.restore(start)?;
    let mut sampler = Sampler::greedy();
    let mut history = prompt.to_vec();
    let mut logits = first.to_vec();
    let mut out = Vec::with_capacity(n);
    let t0 = Instant::now();
    let stats = match spec {
        Some(o) => {
            let Some(mut s) = redlite_spec::from_options(o, model, seq.ctx_len())? else {
                bail!("--spec none has nothing to compare");
            };
            if s.needs_hidden() {
                // The checkpoint holds the prompt's state, the session its
                // hidden rows (kept since the prefill).
                s.prime(seq, prompt)?;
            }
            while out.len() < n {
                let step = s.step(
                    seq,
                    &mut sampler,
                    &mut history,
                    &mut logits,
                    n - out.len(),
                    &|_| false,
                )?;
                out.extend(step.tokens);
            }
            Some(s.stats())
        }
        None => {
            for i in 0..n {
                let t = sampler.sample(&logits, &history);
                out.push(t);
                history.push(t);
                if i + 1 < n {
                    logits = seq.decode(t)?;
                }
            }
            None
        }
    };
    Ok((out, t0.elapsed().as_secs_f64(), stats))
}

/// The text test's result.
pub struct TextResult {
    pub n: usize,
    pub plain_secs: Vec<f64>,
    pub spec_secs: Vec<f64>,
    pub stats: SpecStats,
}

impl TextResult {
    pub fn plain_ts(&self) -> f64 {
        self.n as f64 / median(&self.plain_secs)
    }
    pub fn spec_ts(&self) -> f64 {
        self.n as f64 / median(&self.spec_secs)
    }
}

/// Plain and speculative decoding of `n` tokens after `prompt`, alternating.
pub fn text_test(
    seq: &mut dyn Sequence,
    model: &std::sync::Arc<Model>,
    prompt: &[u32],
    n: usize,
    reps: usize,
    opts: &SpecOptions,
) -> Result<TextResult> {
    if prompt.len() + n + opts.draft_max + 1 > seq.ctx_len() {
        bail!(
            "the prompt ({} tokens) plus -n {n} and a draft of {} exceeds the context of {}",
            prompt.len(),
            opts.draft_max,
            seq.ctx_len()
        );
    }
    seq.reset()?;
    if opts.mode == redlite_spec::SpecMode::Mtp {
        seq.keep_hidden(true)?;
    }
    let t0 = Instant::now();
    let first = seq.prefill(prompt, Logits::Last)?;
    eprintln!(
        "redlite bench: prompt {} tokens in {:.2} s",
        prompt.len(),
        t0.elapsed().as_secs_f64()
    );
    let start = seq.checkpoint()?;
    let mut r = TextResult {
        n,
        plain_secs: Vec::new(),
        spec_secs: Vec::new(),
        stats: SpecStats::default(),
    };
    let mut want: Option<Vec<u32>> = None;
    for i in 0..=reps {
        let (plain, ps, _) = decode_text(seq, &start, &first, prompt, n, None, model)?;
        let (spec, ss, st) = decode_text(seq, &start, &first, prompt, n, Some(opts), model)?;
        if let Some(w) = &want {
            if *w != plain {
                bail!("plain decoding gave different tokens on run {i}: the backend is not deterministic");
            }
        }
        if let Some(at) = plain.iter().zip(&spec).position(|(a, b)| a != b) {
            bail!(
                "speculative decoding differs from plain decoding at token {at} ({} against {}): refusing to report its speed",
                spec[at],
                plain[at]
            );
        }
        want = Some(plain);
        let st = st.unwrap_or_default();
        eprintln!(
            "redlite bench: text run {i}/{reps}{}: plain {:.2} tok/s, {} {:.2} tok/s, {}",
            if i == 0 { " (warm-up)" } else { "" },
            n as f64 / ps,
            opts.mode.name(),
            n as f64 / ss,
            st.line()
        );
        if i > 0 {
            r.plain_secs.push(ps);
            r.spec_secs.push(ss);
            r.stats = st;
        }
    }
    Ok(r)
}

/// Median seconds of one decode step and of a verify pass of k drafts
/// (k + 1 tokens, then all but the first dropped) for each k, at the
/// current position (restored from a checkpoint before each run).
pub fn verify_costs(
    seq: &mut dyn Sequence,
    ks: &[usize],
    reps: usize,
    n_vocab: usize,
    seed: u64,
) -> Result<(f64, Vec<(usize, f64)>)> {
    let start = seq.checkpoint()?;
    let mut rng = super::steps::Rng(seed);
    let mut time = |seq: &mut dyn Sequence, k: usize| -> Result<f64> {
        let mut v = Vec::new();
        for i in 0..=reps {
            seq.restore(&start)?;
            let ids = rng.tokens(k + 1, n_vocab);
            let t0 = Instant::now();
            if k == 0 {
                std::hint::black_box(seq.decode(ids[0])?);
            } else {
                std::hint::black_box(seq.verify(&ids)?);
                seq.accept(1)?;
            }
            if i > 0 {
                v.push(t0.elapsed().as_secs_f64());
            }
        }
        Ok(median(&v))
    };
    let step = time(seq, 0)?;
    let mut rows = Vec::new();
    for &k in ks {
        let s = time(seq, k)?;
        eprintln!(
            "redlite bench: verify k={k}: {:.3} ms ({:.2}x a decode step of {:.3} ms)",
            s * 1e3,
            s / step,
            step * 1e3
        );
        rows.push((k, s));
    }
    seq.restore(&start)?;
    Ok((step, rows))
}

/// The prompt file's token ids: through the chat template (as one user
/// message) unless `raw` or the file has none.
fn prompt_ids(
    file: &redlite_gguf::GgufFile,
    path: &std::path::Path,
    raw: bool,
) -> Result<Vec<u32>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--prompt-file {}", path.display()))?;
    let tok = redlite_tokenizer::Tokenizer::from_gguf(file.metadata())
        .context("the model file's tokenizer")?;
    let text = match (
        raw,
        redlite_tokenizer::ChatTemplate::from_gguf(file.metadata()),
    ) {
        (false, Ok(t)) => t
            .render(
                &[redlite_tokenizer::ChatMessage::user(text)],
                None,
                true,
                None,
            )
            .context("the model file's chat template")?,
        _ => text,
    };
    Ok(tok.encode(&text, true))
}

/// `bench model` with `--prompt-file` and/or `--verify-k`.
pub fn run(args: &super::ModelBenchArgs, model: Model) -> Result<()> {
    use anyhow::Context;
    let opts = args.spec.options().map_err(anyhow::Error::msg)?;
    let prompt = match &args.prompt_file {
        Some(p) => {
            crate::limits::input_file(p, "--prompt-file")?;
            prompt_ids(model.file(), p, args.raw)?
        }
        None => Vec::new(),
    };
    if !prompt.is_empty() && opts.mode == redlite_spec::SpecMode::None {
        bail!("--prompt-file times speculative decoding: give --spec lookup (or mtp)");
    }
    let n = args.n_gen.iter().copied().max().unwrap_or(0);
    let depth = args.n_depth.iter().copied().max().unwrap_or(0);
    let kmax = args.verify_k.iter().copied().max().unwrap_or(0);
    let ctx = (prompt.len() + n + opts.draft_max + 2).max(depth + kmax + 2);
    crate::residency::check_in_memory(&model, &args.mem)?;
    let req = args
        .mem
        .request_with_draft(ctx, 2, opts.mode == redlite_spec::SpecMode::Mtp);
    let draft_kv = crate::residency::draft_kv_line(&model, &req);
    let mut engine = redlite_engine::Engine::open(model, &args.dev.options(), &req)?;
    eprintln!("redlite bench: {}{draft_kv}", engine.plan_line());
    let model = engine.model().clone();
    let mut seq = engine.open_sequence(ctx)?;
    eprintln!("redlite bench: {}", engine.describe());
    let backend = engine.device().name().to_uppercase();
    let mut json = Vec::new();
    let md = args.output == "md" && !args.json;
    if !prompt.is_empty() {
        let r = text_test(
            &mut *seq,
            &model,
            &prompt,
            n,
            args.repetitions.max(1),
            &opts,
        )?;
        let name = args
            .prompt_file
            .as_ref()
            .and_then(|p| p.file_name())
            .map_or("text".into(), |s| s.to_string_lossy().to_string());
        if md {
            println!("| backend | prompt | n | plain tok/s | {} tok/s | speed-up | acceptance | tokens per pass | identical |", opts.mode.name());
            println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
            println!(
                "| {backend} | {name} ({} tokens) | {n} | {:.2} | {:.2} | {:.2}x | {:.1}% | {:.2} | yes |",
                prompt.len(),
                r.plain_ts(),
                r.spec_ts(),
                r.spec_ts() / r.plain_ts(),
                100.0 * r.stats.acceptance(),
                r.stats.mean_accepted_len()
            );
        }
        json.push(serde_json::json!({
            "test": "text", "backend": backend, "prompt": name, "n_prompt": prompt.len(), "n_gen": n,
            "spec": opts.mode.name(), "draft_max": opts.draft_max, "draft_min": opts.draft_min,
            "plain_ts": r.plain_ts(), "spec_ts": r.spec_ts(), "speedup": r.spec_ts() / r.plain_ts(),
            "acceptance": r.stats.acceptance(), "mean_accepted_len": r.stats.mean_accepted_len(),
            "passes": r.stats.passes, "drafted": r.stats.drafted, "accepted": r.stats.accepted,
            "plain_samples_s": r.plain_secs, "spec_samples_s": r.spec_secs, "identical": true,
        }));
    }
    if !args.verify_k.is_empty() {
        let n_vocab = model.n_vocab();
        let mut rng = super::steps::Rng(args.seed);
        if md {
            println!("| backend | depth | decode step ms | k | verify ms | verify / step |");
            println!("|---|---:|---:|---:|---:|---:|");
        }
        for &d in &args.n_depth {
            seq.reset()?;
            if d > 0 {
                let ids = rng.tokens(d, n_vocab);
                seq.prefill(&ids, Logits::Last)
                    .context("filling the depth")?;
            }
            let (step, rows) = verify_costs(
                &mut *seq,
                &args.verify_k,
                args.repetitions.max(1),
                n_vocab,
                args.seed,
            )?;
            for (k, s) in rows {
                if md {
                    println!(
                        "| {backend} | {d} | {:.3} | {k} | {:.3} | {:.2} |",
                        step * 1e3,
                        s * 1e3,
                        s / step
                    );
                }
                json.push(serde_json::json!({
                    "test": "verify", "backend": backend, "n_depth": d, "k": k,
                    "step_ms": step * 1e3, "verify_ms": s * 1e3, "ratio": s / step,
                }));
            }
        }
    }
    if !md {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    Ok(())
}
