//! `redlite perplexity`: llama-perplexity's method through the engine API
//! (so it runs wherever the engine does).
//!
//! The text is tokenized as a whole (BOS first when the file asks for it),
//! cut into chunks of `-c` tokens (a tail shorter than a chunk is left
//! out), and each chunk runs from an empty state with its first token
//! replaced by BOS when the model adds one. The logits at positions
//! `c/2 … c−2` score the tokens after them: the first half of a chunk is
//! context only. The running estimate is printed per chunk and the final
//! one with the standard error of the mean log-likelihood, as
//! `llama-perplexity` prints them.
//!
//! KL mode: `--kl-divergence-base FILE` alone writes every scored
//! position's log-probabilities to FILE (llama.cpp's format, see
//! [`base_file`]); with `--kl-divergence` the chunks come from FILE and
//! this model's logits are compared with the base's.

pub mod base_file;
pub mod stats;

use anyhow::{bail, Context, Result};
use base_file::{BaseReader, BaseWriter};
use indicatif::{ProgressBar, ProgressStyle};
use redlite_engine::{Engine, Sequence};
use redlite_model::{LoadOptions, Logits, Model};
use redlite_tokenizer::Tokenizer;
use stats::{Kld, Ppl};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::out::STDOUT;
use crate::{limits, memory};

/// Everything `redlite perplexity` takes.
#[derive(clap::Args, Debug, Clone)]
pub struct PerplexityArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    pub model: PathBuf,
    /// The text to score (one trailing newline is dropped, as
    /// llama-perplexity drops it).
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Tokens per chunk; the second half of each is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(4..=1048576))]
    pub ctx_size: u32,
    /// Score at most this many chunks (default: all of the text).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Tokens per prefill batch.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Run the float reference path instead of the fast path.
    #[arg(long)]
    pub reference: bool,
    /// The base log-probabilities: written here (llama.cpp's format), or
    /// read from here with --kl-divergence.
    #[arg(long = "kl-divergence-base")]
    pub kl_base: Option<PathBuf>,
    /// Compare with the base of --kl-divergence-base: KL divergence, top-1
    /// agreement, Δ perplexity (the chunks come from the base file).
    #[arg(long, requires = "kl_base")]
    pub kl_divergence: bool,
    #[command(flatten)]
    pub dev: redlite_engine::DeviceArgs,
    #[command(flatten)]
    pub mem: crate::residency::MemoryArgs,
}

/// The scored chunks of a run.
struct Plan {
    n_ctx: usize,
    n_chunk: usize,
    tokens: Vec<u32>,
    bos: Option<u32>,
}

pub fn run(mut args: PerplexityArgs) -> Result<()> {
    args.threads = limits::cap_threads(args.threads, "--threads");
    args.mem.io_threads = limits::cap_io_threads(args.mem.io_threads, "--io-threads");
    let path = args.model.clone();
    limits::input_file(&path, "--model")?;
    let mut inputs: Vec<&Path> = vec![path.as_path()];
    if let Some(f) = &args.file {
        limits::input_file(f, "--file")?;
        inputs.push(f);
    }
    let writes_base = args.kl_base.is_some() && !args.kl_divergence;
    if let (true, Some(b)) = (writes_base, &args.kl_base) {
        redlite_outfile::check_target(b, &inputs).context("--kl-divergence-base")?;
    }
    let file = Arc::new(memory::open_model(
        &path,
        args.dev.offloads_weights(),
        false,
        &args.mem,
    )?);
    let tokenizer = Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("the tokenizer of {}", path.display()))?;
    if tokenizer.add_eos() {
        bail!(
            "{}: the tokenizer adds EOS to every text, which perplexity (as llama-perplexity) cannot score",
            path.display()
        );
    }
    let model = Model::load(
        file.clone(),
        LoadOptions {
            threads: args.threads,
            reference: args.reference,
            ubatch: args.batch_size as usize,
        },
    )
    .with_context(|| format!("loading model {}", path.display()))?;
    let n_vocab = model.n_vocab();
    let bos = if tokenizer.add_bos() {
        Some(tokenizer.bos_id().with_context(|| {
            format!(
                "{}: add_bos_token is set but there is no BOS id",
                path.display()
            )
        })?)
    } else {
        None
    };

    let mut base_in = None;
    let plan = if args.kl_divergence {
        let b = args
            .kl_base
            .as_ref()
            .expect("clap: --kl-divergence requires it");
        let r = BaseReader::open(b, n_vocab)?;
        if r.n_ctx != args.ctx_size as usize {
            tracing::warn!(
                "-c {} ignored: the base file's chunks are {} tokens",
                args.ctx_size,
                r.n_ctx
            );
        }
        let n_chunk = args.chunks.map_or(r.n_chunk, |c| c.min(r.n_chunk));
        let p = Plan {
            n_ctx: r.n_ctx,
            n_chunk,
            tokens: r.tokens.clone(),
            bos,
        };
        base_in = Some(r);
        p
    } else {
        let f = args
            .file
            .as_ref()
            .expect("clap: required without --kl-divergence");
        let bytes = std::fs::read(f).with_context(|| format!("--file {}", f.display()))?;
        let mut text = String::from_utf8(bytes)
            .map_err(|e| anyhow::anyhow!("--file {}: not UTF-8 text ({e})", f.display()))?;
        if text.ends_with('\n') {
            text.pop();
        }
        let tokens = tokenizer.encode(&text, false);
        let n_ctx = args.ctx_size as usize;
        if tokens.len() < 2 * n_ctx {
            bail!(
                "--file {}: {} tokens, but a context of {n_ctx} needs at least {} (as llama-perplexity): lower -c or give a longer text",
                f.display(),
                tokens.len(),
                2 * n_ctx
            );
        }
        let max = tokens.len() / n_ctx;
        Plan {
            n_ctx,
            n_chunk: args.chunks.map_or(max, |c| c.min(max)),
            tokens,
            bos,
        }
    };
    if plan.n_chunk == 0 {
        bail!("--chunks 0: nothing to score");
    }
    limits::warn_context(plan.n_ctx, model.arch().context_length());
    crate::residency::check_in_memory(&model, &args.mem)?;
    let mut engine = Engine::open(model, &args.dev.options(), &args.mem.request(plan.n_ctx, 1))
        .with_context(|| format!("opening {} on {:?}", path.display(), args.dev.device))?;
    eprintln!("redlite: {}", engine.plan_line());
    let mut seq = engine.open_sequence(plan.n_ctx)?;
    eprintln!("redlite: {}", engine.describe());
    eprintln!(
        "redlite: perplexity over {} chunks of {} tokens ({} tokens of text), batch {}",
        plan.n_chunk,
        plan.n_ctx,
        plan.tokens.len(),
        args.batch_size
    );

    let mut base_out = match (&args.kl_base, writes_base) {
        (Some(b), true) => Some(BaseWriter::create(
            b,
            &inputs,
            plan.n_ctx,
            n_vocab,
            plan.n_chunk,
            &plan.tokens,
        )?),
        _ => None,
    };
    let bar = ProgressBar::new(plan.n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("chunk {pos}/{len} {bar:30} {elapsed} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut ppl = Ppl::default();
    let mut kld = Kld::default();
    let mut row = vec![0u16; stats::row_len(n_vocab)];
    let stdout = std::io::stdout();
    if base_in.is_some() {
        bar.suspend(|| {
            println!("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p")
        });
    }
    let t0 = std::time::Instant::now();
    for c in 0..plan.n_chunk {
        let chunk = &plan.tokens[c * plan.n_ctx..(c + 1) * plan.n_ctx];
        let mut scored = |logits: &[f32], next: usize| -> Result<()> {
            if let Some(w) = base_out.as_mut() {
                ppl.add(stats::quantize_row(logits, next, &mut row));
                w.row(&row)
            } else if let Some(r) = base_in.as_mut() {
                r.row(&mut row)?;
                kld.add(logits, &row, next);
                Ok(())
            } else {
                ppl.add(stats::nll(logits, next));
                Ok(())
            }
        };
        run_chunk(
            seq.as_mut(),
            chunk,
            plan.bos,
            args.batch_size as usize,
            n_vocab,
            &mut scored,
        )?;
        bar.inc(1);
        if base_in.is_some() {
            let line = kl_chunk_line(c + 1, &kld);
            bar.suspend(|| println!("{line}"));
        } else {
            bar.suspend(|| -> Result<()> {
                let mut out = stdout.lock();
                write!(out, "[{}]{:.4},", c + 1, ppl.ppl()).context(STDOUT)?;
                out.flush().context(STDOUT)
            })?;
        }
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let mut out = stdout.lock();
    if base_in.is_some() {
        writeln!(out).context(STDOUT)?;
        print_kl_summary(&mut out, &mut kld)?;
    } else {
        writeln!(out).context(STDOUT)?;
        match ppl.estimate() {
            (v, Some(e)) => writeln!(out, "Final estimate: PPL = {v:.4} +/- {e:.5}"),
            (v, None) => writeln!(
                out,
                "Final estimate: PPL = {v:.4} (no error: the log-likelihoods do not vary)"
            ),
        }
        .context(STDOUT)?;
    }
    if let Some(w) = base_out {
        w.commit()?;
    }
    eprintln!(
        "redlite: {} chunks, {} tokens scored, in {secs:.1} s ({:.1} tokens/s run)",
        plan.n_chunk,
        ppl.count.max(kld.count),
        (plan.n_chunk * plan.n_ctx) as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// Run one chunk from an empty state and hand each scored position's
/// logits with the token after it to `scored`. The first half is context
/// (its logits are not computed past the last one); the second half runs
/// in pieces of `batch` tokens so only `batch` rows of logits are held.
fn run_chunk(
    seq: &mut dyn Sequence,
    chunk: &[u32],
    bos: Option<u32>,
    batch: usize,
    n_vocab: usize,
    scored: &mut dyn FnMut(&[f32], usize) -> Result<()>,
) -> Result<()> {
    let n_ctx = chunk.len();
    let first = n_ctx / 2;
    let mut toks = chunk.to_vec();
    if let Some(b) = bos {
        toks[0] = b;
    }
    seq.reset()?;
    seq.prefill(&toks[..first], Logits::Last)?;
    // Positions first … n_ctx−2 score tokens first+1 … n_ctx−1; the last
    // token's logits would score nothing.
    let mut at = first;
    while at < n_ctx - 1 {
        let end = (at + batch).min(n_ctx - 1);
        let logits = seq.prefill(&toks[at..end], Logits::All)?;
        for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
            scored(row, toks[at + i + 1] as usize)?;
        }
        at = end;
    }
    Ok(())
}

fn kl_chunk_line(chunk: usize, k: &Kld) -> String {
    use stats::{covariance, mean_and_uncertainty as mu};
    let lp = mu(k.sum_nll, k.sum_nll2, k.count);
    let lb = mu(k.sum_nll_base, k.sum_nll_base2, k.count);
    let cov = covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count);
    let ratio_unc = (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt();
    let kl = mu(k.sum_kld, k.sum_kld2, k.count);
    let mse = mu(k.sum_p_diff2, k.sum_p_diff4, k.count);
    let rms = mse.0.sqrt();
    let rms_unc = if rms > 0.0 { 0.5 / rms * mse.1 } else { 0.0 };
    let top = k.n_same_top as f64 / k.count as f64;
    let top_unc = (top * (1.0 - top) / (k.count as f64 - 1.0).max(1.0)).sqrt();
    format!(
        "{chunk:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
        lp.0.exp(),
        lp.0.exp() * lp.1,
        lp.0 - lb.0,
        ratio_unc,
        kl.0,
        kl.1,
        100.0 * rms,
        100.0 * rms_unc,
        100.0 * top,
        100.0 * top_unc
    )
}

/// The final statistics of KL mode, as llama-perplexity prints them.
fn print_kl_summary(out: &mut impl Write, k: &mut Kld) -> Result<()> {
    use stats::{covariance, mean_and_uncertainty as mu, median, percentile};
    let lp = mu(k.sum_nll, k.sum_nll2, k.count);
    let lb = mu(k.sum_nll_base, k.sum_nll_base2, k.count);
    let (ppl, ppl_unc) = (lp.0.exp(), lp.0.exp() * lp.1);
    let (base, base_unc) = (lb.0.exp(), lb.0.exp() * lb.1);
    let cov = covariance(k.sum_nll, k.sum_nll_base, k.sum_nll_nll_base, k.count);
    let ratio = lp.0 - lb.0;
    let ratio_unc = (lp.1 * lp.1 + lb.1 * lb.1 - 2.0 * cov).max(0.0).sqrt();
    let diff_unc = (ppl_unc * ppl_unc + base_unc * base_unc - 2.0 * ppl * base * cov)
        .max(0.0)
        .sqrt();
    let kl = mu(k.sum_kld, k.sum_kld2, k.count);
    k.klds.sort_by(f32::total_cmp);
    k.p_diffs.sort_by(f32::total_cmp);
    let mse = mu(k.sum_p_diff2, k.sum_p_diff4, k.count);
    let rms = mse.0.sqrt();
    let top = k.n_same_top as f64 / k.count as f64;
    let v = &k.klds;
    let mut s = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(s, "====== Perplexity statistics ======");
    let _ = writeln!(
        s,
        "Mean PPL(Q)                   : {ppl:10.6} ± {ppl_unc:10.6}"
    );
    let _ = writeln!(
        s,
        "Mean PPL(base)                : {base:10.6} ± {base_unc:10.6}"
    );
    if lp.1 > 0.0 && lb.1 > 0.0 {
        let _ = writeln!(
            s,
            "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
            100.0 * cov / (lp.1 * lb.1)
        );
    }
    let _ = writeln!(
        s,
        "Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_unc:10.6}"
    );
    let _ = writeln!(
        s,
        "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
        ratio.exp(),
        ratio.exp() * ratio_unc
    );
    let _ = writeln!(
        s,
        "Mean PPL(Q)-PPL(base)         : {:10.6} ± {diff_unc:10.6}",
        ppl - base
    );
    let _ = writeln!(s, "\n====== KL divergence statistics ======");
    let _ = writeln!(s, "Mean    KLD: {:10.6} ± {:10.6}", kl.0, kl.1);
    let _ = writeln!(s, "Maximum KLD: {:10.6}", v[v.len() - 1]);
    for (name, f) in [
        ("99.9%", 0.999),
        ("99.0%", 0.99),
        ("95.0%", 0.95),
        ("90.0%", 0.9),
    ] {
        let _ = writeln!(s, "{name}   KLD: {:10.6}", percentile(v, f));
    }
    let _ = writeln!(s, "Median  KLD: {:10.6}", median(v));
    let _ = writeln!(s, "Minimum KLD: {:10.6}", v[0]);
    let _ = writeln!(s, "\n====== Token probability statistics ======");
    let pd = mu(k.sum_p_diff, k.sum_p_diff2, k.count);
    let _ = writeln!(
        s,
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * pd.0,
        100.0 * pd.1
    );
    let _ = writeln!(
        s,
        "Maximum Δp: {:6.3}%",
        100.0 * k.p_diffs[k.p_diffs.len() - 1]
    );
    let _ = writeln!(s, "Median  Δp: {:6.3}%", 100.0 * median(&k.p_diffs));
    let _ = writeln!(s, "Minimum Δp: {:6.3}%", 100.0 * k.p_diffs[0]);
    let _ = writeln!(
        s,
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * rms,
        if rms > 0.0 {
            100.0 * 0.5 / rms * mse.1
        } else {
            0.0
        }
    );
    let _ = writeln!(
        s,
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * top,
        100.0 * (top * (1.0 - top) / (k.count as f64 - 1.0).max(1.0)).sqrt()
    );
    out.write_all(s.as_bytes()).context(STDOUT)?;
    Ok(())
}
