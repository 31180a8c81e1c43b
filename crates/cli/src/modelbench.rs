//! `redlite bench model`: prompt and decode speed of a whole model, printed
//! like llama-bench (markdown table or JSON objects with the same field
//! names), so `bench/compare.sh` can put both engines in one table.
//!
//! Tests, as llama-bench names them:
//! - `ppP`: a fresh session runs P random token ids as one prompt (batched
//!   in `-b` tokens); tok/s = P / time, logits of the last token included.
//! - `tgN` / `tgN@dD`: the context is first filled with D random ids by
//!   batched prompt processing (not timed, progress on stderr; done once per
//!   depth and cloned for each run), then N single-token steps are timed,
//!   each computing the last token's logits; tok/s = N / time.
//!
//! Prompt tests run at depth 0; decode tests at every `-d` depth (llama-bench
//! runs both kinds at every depth: pass `-p 0` to it for decode-only depths).
//! Each test gets an untimed warm-up (the whole prompt for pp, one token for
//! tg, as llama-bench does) and then `-r` timed runs; the table shows the
//! median ± the sample standard deviation.

use crate::memory;
use anyhow::{bail, Context, Result};
use redlite_gguf::{GgmlType, GgufFile};
use redlite_model::{LoadOptions, Logits, Model, Session};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything `redlite bench model` takes (flags named as llama-bench's).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelBenchArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    pub model: PathBuf,
    /// Map the model file even when it fits in memory.
    #[arg(long, conflicts_with = "no_mmap")]
    pub mmap: bool,
    /// Read the whole model file into memory (huge pages). Default: read in
    /// when it fits in half of the available memory, else map.
    #[arg(long)]
    pub no_mmap: bool,
    /// Prompt lengths to time (0 or empty: no prompt test).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Decode lengths to time (0: no decode test).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "64"
    )]
    pub n_gen: Vec<usize>,
    /// Context depths for the decode tests (filled first, not timed).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Skip decode tests whose depth exceeds this (a harness knob: keeps the
    /// -d list but bounds the untimed fill).
    #[arg(long)]
    pub max_depth: Option<usize>,
    /// Timed runs per test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Worker threads (0: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Tokens per prompt batch (prompt tests and depth fills).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Output: md (a table like llama-bench's) or json (an array of objects
    /// with llama-bench's field names: n_prompt, n_gen, n_depth, avg_ts, ...).
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
    /// Same as `-o json`.
    #[arg(long)]
    pub json: bool,
    /// No warm-up run and no page touching before the tests.
    #[arg(long)]
    pub no_warmup: bool,
    /// Run the float reference path instead of the fast path.
    #[arg(long)]
    pub reference: bool,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// madvise the whole mapped file before the tests (Linux): `random`
    /// turns off the kernel's read-ahead around page faults, which on a
    /// memory-capped run otherwise reads read_ahead_kb around every expert
    /// slice touched; `normal` is the kernel's default.
    #[arg(long, value_parser = ["normal", "random", "sequential", "willneed"])]
    pub mmap_advice: Option<String>,
    /// Append each timed decode step's routing (per layer, the chosen
    /// experts) to this file, one line per token (the trace format of
    /// `redlite_expertcache::sim`).
    #[arg(long)]
    pub dump_routes: Option<PathBuf>,
    #[command(flatten)]
    pub mem: crate::residency::MemoryArgs,
    /// Where to run: cpu, or cuda (builds with `--features cuda`; decode
    /// only: one token per CUDA graph replay, prompts run token by token,
    /// and a depth is set as a position without computing the tokens before
    /// it: the KV rows there are zeros, the timing is that of the depth).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// With --device cuda: f32 activations everywhere instead of int8
    /// activations for the formats with int8 kernels.
    #[arg(long)]
    pub f32_activations: bool,
    /// With --device cuda: element type of the KV cache (f16 halves the
    /// bytes the decode attention reads; default f16 with int8
    /// activations, f32 with --f32-activations).
    #[arg(long, value_parser = ["f16", "f32"])]
    pub kv_type: Option<String>,
    /// With --device cuda: after the tests, where one decode token's GPU
    /// time goes, per kernel class (timing events recorded between the
    /// classes inside a copy of the token's graph), at each tested depth.
    #[arg(long)]
    pub profile: bool,
    /// With --device cuda: plain kernel launches instead of programmatic
    /// dependent launch (PDL, the default: each kernel starts while the
    /// previous one finishes and prefetches its weights into L2;
    /// docs/cuda.md).
    #[arg(long)]
    pub no_pdl: bool,
}

/// One test's result.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    /// Seconds of each timed run.
    pub secs: Vec<f64>,
}

impl TestResult {
    pub fn name(&self) -> String {
        let base = if self.n_prompt > 0 {
            format!("pp{}", self.n_prompt)
        } else {
            format!("tg{}", self.n_gen)
        };
        if self.n_depth > 0 {
            format!("{base}@d{}", self.n_depth)
        } else {
            base
        }
    }

    fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// Tokens per second of each run.
    pub fn samples_ts(&self) -> Vec<f64> {
        self.secs
            .iter()
            .map(|s| self.n_tokens() as f64 / s.max(1e-12))
            .collect()
    }
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Sample standard deviation (0 for fewer than two values).
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// The tests to run, in order: prompt tests at depth 0, then decode tests
/// at each depth (duplicates and zero lengths dropped).
pub fn plan(args: &ModelBenchArgs) -> Vec<(usize, usize, usize)> {
    let mut tests = Vec::new();
    for &p in &args.n_prompt {
        if p > 0 && !tests.contains(&(p, 0, 0)) {
            tests.push((p, 0, 0));
        }
    }
    for &d in &args.n_depth {
        if args.max_depth.is_some_and(|m| d > m) {
            continue;
        }
        for &n in &args.n_gen {
            if n > 0 && !tests.contains(&(0, n, d)) {
                tests.push((0, n, d));
            }
        }
    }
    tests
}

/// Small, fast, seeded generator of token ids (wyrand).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) ^ t) as u64
    }

    fn tokens(&mut self, n: usize, n_vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() % n_vocab as u64) as u32)
            .collect()
    }
}

/// How the model column describes the file: architecture, layers, the
/// tensor type holding most bytes, and the synth layout when there is one.
fn describe(file: &GgufFile) -> String {
    let meta = file.metadata();
    let arch = meta.architecture().unwrap_or("?").to_owned();
    let layers = meta
        .get_u64(&format!("{arch}.block_count"))
        .map_or(String::new(), |n| format!(" {n}L"));
    let mut by_type: BTreeMap<GgmlType, u64> = BTreeMap::new();
    for t in file.tensors() {
        *by_type.entry(t.ty).or_default() += t.n_bytes;
    }
    let main_ty = by_type
        .iter()
        .max_by_key(|(_, b)| **b)
        .map_or("?", |(t, _)| t.name());
    let synth = meta
        .get_str("redlite.synth.layout")
        .map_or(String::new(), |l| format!(" (synth {l})"));
    format!("{arch}{layers} {main_ty}{synth}")
}

/// Peak resident set of this process (VmHWM), bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Touch every weight page (one byte a page) so the tests do not time the
/// first reads from disk.
fn touch_pages(file: &GgufFile) {
    let t0 = Instant::now();
    let mut sink = 0u8;
    let mut bytes = 0u64;
    for t in file.tensors() {
        if let Ok(v) = file.tensor(&t.name) {
            for page in v.data.iter().step_by(4096) {
                sink = sink.wrapping_add(*page);
            }
            bytes += v.data.len() as u64;
        }
    }
    std::hint::black_box(sink);
    eprintln!(
        "redlite bench: touched {} of weights in {:.1} s",
        memory::human(bytes),
        t0.elapsed().as_secs_f64()
    );
}

/// Apply `advice` to the whole mapped file (Linux; a no-op elsewhere).
fn advise(file: &GgufFile, advice: &str) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        unsafe extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        // <sys/mman.h>: MADV_NORMAL 0, MADV_RANDOM 1, MADV_SEQUENTIAL 2, MADV_WILLNEED 3.
        let code = match advice {
            "random" => 1,
            "sequential" => 2,
            "willneed" => 3,
            _ => 0,
        };
        let bytes = file.bytes();
        // madvise wants a page-aligned start: round down to the page (the
        // mapping itself starts on one, so this stays inside it).
        let start = bytes.as_ptr() as usize;
        let aligned = start & !4095;
        let len = bytes.len() + (start - aligned);
        // SAFETY: advice only; the range lies within this process's mapping of the file.
        let rc = unsafe { madvise(aligned as *mut std::ffi::c_void, len, code) };
        if rc != 0 {
            bail!(
                "madvise({advice}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        eprintln!("redlite bench: madvise({advice}) on the mapped file");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, advice);
    Ok(())
}

/// Fill a fresh session with `depth` random ids in batches, with progress on
/// stderr (not timed as part of any test).
fn fill(model: &Model, ctx: usize, depth: usize, rng: &mut Rng) -> Result<Session> {
    let mut s = model.new_session(ctx);
    if depth == 0 {
        return Ok(s);
    }
    let ids = rng.tokens(depth, model.n_vocab());
    let t0 = Instant::now();
    let mut last = Instant::now();
    for chunk in ids.chunks(model.ubatch()) {
        s.forward(model, chunk, Logits::Last)?;
        if last.elapsed() > Duration::from_secs(5) || s.pos() == depth {
            let secs = t0.elapsed().as_secs_f64();
            let rate = s.pos() as f64 / secs.max(1e-9);
            eprintln!(
                "redlite bench: fill d{depth}: {}/{depth} tokens, {secs:.0} s, {rate:.1} tok/s, eta {:.0} s",
                s.pos(),
                (depth - s.pos()) as f64 / rate.max(1e-9),
            );
            last = Instant::now();
        }
    }
    Ok(s)
}

/// Time `n` single-token steps on `s` (random ids). Steps slower than a
/// second are reported on stderr one by one (`LABEL step i/n: S s`), so a
/// run stopped from outside still shows how far it got.
fn decode(
    model: &Model,
    s: &mut Session,
    n: usize,
    rng: &mut Rng,
    label: &str,
    mut routes: Option<&mut dyn std::io::Write>,
) -> Result<f64> {
    let ids = rng.tokens(n, model.n_vocab());
    let t0 = Instant::now();
    let mut spent = 0f64;
    for (i, &id) in ids.iter().enumerate() {
        let ts = Instant::now();
        let l = s.forward(model, &[id], Logits::Last)?;
        std::hint::black_box(l);
        let step = ts.elapsed().as_secs_f64();
        if let Some(w) = routes.as_mut() {
            let t = Instant::now();
            let layers: Vec<Vec<u32>> = s
                .last_routes()
                .iter()
                .map(|l| {
                    l.first()
                        .map_or(Vec::new(), |r| r.iter().map(|&(e, _)| e as u32).collect())
                })
                .collect();
            writeln!(
                w,
                "{}",
                redlite_model::expertcache::sim::format_token(&layers)
            )?;
            spent += t.elapsed().as_secs_f64();
        }
        if step > 1.0 {
            eprintln!("redlite bench: {label} step {}/{n}: {step:.2} s", i + 1);
        }
    }
    Ok(t0.elapsed().as_secs_f64() - spent)
}

/// Time one prompt of `p` ids on a fresh session.
fn prompt(model: &Model, p: usize, rng: &mut Rng) -> Result<f64> {
    let ids = rng.tokens(p, model.n_vocab());
    let mut s = model.new_session(p);
    let t0 = Instant::now();
    let l = s.forward(model, &ids, Logits::Last)?;
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(l);
    Ok(secs)
}

pub fn run(mut args: ModelBenchArgs) -> Result<()> {
    args.threads = crate::limits::cap_threads(args.threads, "--threads");
    args.mem.io_threads = crate::limits::cap_io_threads(args.mem.io_threads, "--io-threads");
    let path = &args.model;
    crate::limits::input_file(path, "--model")?;
    if let Some(p) = &args.dump_routes {
        // Appended to (a trace across runs), so not through a temporary;
        // but never the model file, nor a directory.
        redlite_outfile::check_target(p, &[path.as_path()]).context("--dump-routes")?;
    }
    let file = Arc::new(crate::memory::open_model(
        path,
        // On the GPU the weights are copied to the device (or to pinned
        // host memory): a second copy in anonymous memory would only cost.
        args.mmap || args.mmap_advice.is_some() || args.device == "cuda",
        args.no_mmap,
        &args.mem,
    )?);
    eprintln!(
        "redlite bench: weights {}",
        crate::memory::weights_residency(&file)
    );
    let mut model = Model::load(
        file.clone(),
        LoadOptions {
            threads: args.threads,
            reference: args.reference,
            ubatch: args.batch_size,
        },
    )
    .with_context(|| format!("loading model {}", path.display()))?;
    let tests = plan(&args);
    if tests.is_empty() {
        bail!("nothing to run: give -p and/or -n greater than 0");
    }
    let size: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let desc = describe(&file);
    let threads = model.threads();
    let avail = memory::available_bytes();
    eprintln!(
        "redlite bench: {} | {desc} | {} of weights | {threads} threads | {} path | available {} | tests {}",
        path.display(),
        memory::human(size),
        if model.is_reference() { "reference" } else { "fast" },
        avail.map_or("unknown".into(), memory::human),
        tests
            .iter()
            .map(|&(p, n, d)| TestResult { n_prompt: p, n_gen: n, n_depth: d, secs: vec![] }.name())
            .collect::<Vec<_>>()
            .join(" "),
    );
    let ctx = tests
        .iter()
        .map(|&(p, n, d)| p.max(d + n + 1))
        .max()
        .unwrap_or(1);
    crate::limits::warn_context(ctx, model.arch().context_length());
    // On the GPU the device plan (made once the device is open) replaces
    // the host one (assigned again only in builds with the cuda feature).
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut mem_plan = if args.device == "cuda" {
        String::new()
    } else {
        crate::residency::apply(&mut model, &args.mem, ctx)?.to_string()
    };
    let model = model;
    if let Some(a) = &args.mmap_advice {
        advise(&file, a)?;
    }
    if !args.no_warmup && args.device == "cpu" {
        if model.expert_cache().is_some() {
            // Bounded experts: read the dense weights only.
            let t0 = Instant::now();
            model.touch_weights(|_, _| {});
            eprintln!(
                "redlite bench: touched the dense weights in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        } else if avail.is_none_or(|a| size < a) {
            // Touch every page only when the weights fit: under a memory
            // cap touching would just read the whole file once and evict it.
            touch_pages(&file);
        } else {
            eprintln!(
                "redlite bench: weights ({}) exceed available memory: pages are read from disk as the tests touch them",
                memory::human(size)
            );
        }
    }
    let mut route_file = match &args.dump_routes {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))?,
        )),
        None => None,
    };
    let mut cache_stats = Vec::new();

    let reps = args.repetitions.max(1);
    let mut rng = Rng(args.seed);
    let mut results = Vec::new();
    let backend = if args.device == "cuda" { "CUDA" } else { "CPU" };
    if args.device == "cuda" {
        #[cfg(feature = "cuda")]
        {
            (results, mem_plan) =
                crate::cudabench::results(&args, &model, &tests, reps, args.seed)?;
        }
        #[cfg(not(feature = "cuda"))]
        bail!("--device cuda: this redlite was built without the cuda feature");
    }
    // Depth fills are done once per depth and cloned for every run.
    let mut filled: Option<(usize, Session)> = None;
    for &(p, n, d) in tests.iter().filter(|_| args.device == "cpu") {
        let mut r = TestResult {
            n_prompt: p,
            n_gen: n,
            n_depth: d,
            secs: Vec::with_capacity(reps),
        };
        if p > 0 {
            if !args.no_warmup {
                prompt(&model, p, &mut rng)?;
            }
            for i in 0..reps {
                if let Some(c) = model.expert_cache() {
                    c.reset_stats();
                }
                let s = prompt(&model, p, &mut rng)?;
                eprintln!(
                    "redlite bench: {} run {}/{reps}: {:.2} tok/s",
                    r.name(),
                    i + 1,
                    p as f64 / s
                );
                if let Some(c) = model.expert_cache() {
                    // A batch reads each layer's experts for all its tokens:
                    // the counters say how much of that the cache held.
                    let st = c.stats();
                    eprintln!("redlite bench: {}", crate::residency::stats_line(&st, p));
                    cache_stats.push((r.name(), st));
                }
                r.secs.push(s);
            }
        } else {
            let need = d + n + 1;
            let reuse = matches!(&filled, Some((fd, s)) if *fd == d && s.ctx_len() >= need);
            if !reuse {
                drop(filled.take()); // free the previous depth's caches first
                let max_n = args.n_gen.iter().copied().max().unwrap_or(n);
                filled = Some((d, fill(&model, d + max_n + 1, d, &mut rng)?));
            }
            let base = &filled.as_ref().expect("filled above").1;
            if !args.no_warmup {
                let mut s = base.clone();
                decode(&model, &mut s, 1, &mut rng, "warm-up", None)?;
            }
            for i in 0..reps {
                let mut s = base.clone();
                if let Some(c) = model.expert_cache() {
                    c.reset_stats();
                }
                let w = route_file.as_mut().map(|w| w as &mut dyn std::io::Write);
                let secs = decode(&model, &mut s, n, &mut rng, "decode", w)?;
                eprintln!(
                    "redlite bench: {} run {}/{reps}: {:.3} tok/s",
                    r.name(),
                    i + 1,
                    n as f64 / secs
                );
                if let Some(c) = model.expert_cache() {
                    let st = c.stats();
                    eprintln!("redlite bench: {}", crate::residency::stats_line(&st, n));
                    cache_stats.push((r.name(), st));
                }
                r.secs.push(secs);
            }
        }
        results.push(r);
    }
    drop(filled);

    let json = args.json || args.output == "json";
    if json {
        let objs: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                let ts = r.samples_ts();
                let ns: Vec<u64> = r.secs.iter().map(|s| (s * 1e9) as u64).collect();
                serde_json::json!({
                    "engine": "redlite",
                    "backend": backend,
                    "model_filename": path.display().to_string(),
                    "model_type": desc,
                    "model_size": size,
                    "model_n_params": n_params,
                    "n_threads": threads,
                    "n_batch": model.ubatch(),
                    "n_prompt": r.n_prompt,
                    "n_gen": r.n_gen,
                    "n_depth": r.n_depth,
                    "test": r.name(),
                    "avg_ns": ns.iter().sum::<u64>() / ns.len().max(1) as u64,
                    "samples_ns": ns,
                    "avg_ts": mean(&ts),
                    "median_ts": median(&ts),
                    "stddev_ts": stddev(&ts),
                    "samples_ts": ts,
                    "peak_rss": peak_rss_bytes(),
                    "memory_plan": mem_plan,
                    "expert_cache": cache_stats
                        .iter()
                        .rev()
                        .find(|(name, _)| *name == r.name())
                        .map(|(_, st)| crate::residency::stats_json(st)),
                })
            })
            .collect();
        crate::outln!("{}", serde_json::to_string_pretty(&objs)?)?;
    } else {
        crate::outln!("| model | size | params | backend | threads | test | t/s |")?;
        crate::outln!("| --- | ---: | ---: | --- | ---: | ---: | ---: |")?;
        for r in &results {
            let ts = r.samples_ts();
            crate::outln!(
                "| {desc} | {:.2} GiB | {:.2} B | {backend} | {threads} | {} | {:.2} ± {:.2} |",
                size as f64 / (1u64 << 30) as f64,
                n_params as f64 / 1e9,
                r.name(),
                median(&ts),
                stddev(&ts),
            )?;
        }
        crate::outln!("\nt/s: median of {reps} runs ± sample standard deviation")?;
    }
    if let Some(peak) = peak_rss_bytes() {
        eprintln!(
            "redlite bench: peak resident (VmHWM) {}",
            memory::human(peak)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ModelBenchArgs,
    }

    fn parse(s: &str) -> ModelBenchArgs {
        Cli::parse_from(std::iter::once("x").chain(s.split_whitespace())).args
    }

    #[test]
    fn plan_matches_flags() {
        let a = parse("-m f -p 512,2048 -n 64 -d 0,4096,32768");
        assert_eq!(
            plan(&a),
            vec![
                (512, 0, 0),
                (2048, 0, 0),
                (0, 64, 0),
                (0, 64, 4096),
                (0, 64, 32768)
            ]
        );
        let a = parse("-m f -p 0 -n 4 -d 0,4096 --max-depth 0");
        assert_eq!(plan(&a), vec![(0, 4, 0)]);
        let a = parse("-m f -p 512 -n 0 -o json");
        assert_eq!(plan(&a), vec![(512, 0, 0)]);
        assert_eq!(a.output, "json");
    }

    #[test]
    fn kv_type_flag() {
        assert_eq!(parse("-m f").kv_type, None);
        let a = parse("-m f --device cuda --kv-type f32");
        assert_eq!(a.kv_type.as_deref(), Some("f32"));
        let bad = Cli::try_parse_from(["x", "-m", "f", "--kv-type", "q8_0"]);
        assert!(bad.is_err());
    }

    #[test]
    fn names_and_stats() {
        let r = TestResult {
            n_prompt: 0,
            n_gen: 64,
            n_depth: 4096,
            secs: vec![2.0, 4.0, 1.0],
        };
        assert_eq!(r.name(), "tg64@d4096");
        assert_eq!(r.samples_ts(), vec![32.0, 16.0, 64.0]);
        assert_eq!(median(&r.samples_ts()), 32.0);
        assert_eq!(median(&[1.0, 3.0]), 2.0);
        assert_eq!(stddev(&[5.0]), 0.0);
        assert!((stddev(&[1.0, 3.0]) - 2f64.sqrt()).abs() < 1e-12);
    }
}
