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
//! Prompt tests run at depth 0 (with `--pp-at-depth` at every `-d` depth, as
//! llama-bench runs them); decode tests at every `-d` depth (llama-bench
//! runs both kinds at every depth: pass `-p 0` to it for decode-only depths).
//! Each test gets an untimed warm-up (the whole prompt for pp, one token for
//! tg, as llama-bench does) and then `-r` timed runs; the table shows the
//! median ± the sample standard deviation.

use crate::memory;
use anyhow::{bail, Context, Result};
mod spec;
mod steps;

use redlite_engine::{Engine, Sequence};
use redlite_gguf::{GgmlType, GgufFile};
use redlite_model::{LoadOptions, Logits, Model};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use steps::{cache_delta, decode, fill, print_prefill_profile, print_profile, prompt, Rng};

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
    /// Prompt tests at every `-d` depth too, as llama-bench runs them
    /// (default: prompt tests at depth 0 only).
    #[arg(long)]
    pub pp_at_depth: bool,
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
    #[command(flatten)]
    pub dev: redlite_engine::DeviceArgs,
    /// How a decode test's depth is reached: compute (prefill the depth
    /// with random ids, untimed; checkpointed once and restored for every
    /// run), or skip (set the position without computing the tokens before
    /// it: the KV rows there are whatever the cache holds; the timing is
    /// that of the depth; on backends that can, i.e. the GPU, whose
    /// prompts still run token by token).
    #[arg(long, value_enum, default_value_t = DepthFill::Compute)]
    pub depth_fill: DepthFill,
    /// After the tests, where one decode token's time goes per kernel
    /// class, at each tested depth (backends that can say: the GPU, with
    /// timing events between the classes inside a copy of the token's
    /// graph).
    #[arg(long)]
    pub profile: bool,
    #[command(flatten)]
    pub spec: redlite_spec::SpecArgs,
    /// A text prompt (a file) for the speculative-decoding test: with
    /// --spec, the largest -n of tokens is decoded greedily after it with
    /// and without speculation, alternating; tokens must be identical.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Use --prompt-file as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Verify-pass costs for these draft lengths (k draft tokens + 1),
    /// against one decode step, at each -d depth.
    #[arg(long, value_delimiter = ',')]
    pub verify_k: Vec<usize>,
}

/// `--depth-fill`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepthFill {
    Compute,
    Skip,
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
    let prompt_depths: Vec<usize> = if args.pp_at_depth {
        args.n_depth
            .iter()
            .copied()
            .filter(|&d| args.max_depth.is_none_or(|m| d <= m))
            .collect()
    } else {
        vec![0]
    };
    for &d in &prompt_depths {
        for &p in &args.n_prompt {
            if p > 0 && !tests.contains(&(p, 0, d)) {
                tests.push((p, 0, d));
            }
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

/// How the model column describes the file: architecture, layers, the
/// tensor type holding most bytes, and the synth layout when there is one.
fn describe(file: &GgufFile) -> String {
    let meta = file.metadata();
    let arch = meta.architecture().unwrap_or("?").to_owned();
    // block_count counts NextN (MTP) blocks too; the label gives the trunk.
    let nextn = meta
        .get_u64(&format!("{arch}.nextn_predict_layers"))
        .unwrap_or(0);
    let layers =
        meta.get_u64(&format!("{arch}.block_count"))
            .map_or(String::new(), |n| match nextn {
                0 => format!(" {n}L"),
                m => format!(" {}L+{m}MTP", n.saturating_sub(m)),
            });
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
        args.mmap || args.mmap_advice.is_some() || args.dev.offloads_weights(),
        args.no_mmap,
        &args.mem,
    )?);
    eprintln!(
        "redlite bench: weights {}",
        crate::memory::weights_residency(&file)
    );
    let model = Model::load(
        file.clone(),
        LoadOptions {
            threads: args.threads,
            reference: args.reference,
            ubatch: args.batch_size,
        },
    )
    .with_context(|| format!("loading model {}", path.display()))?;
    if args.prompt_file.is_some() || !args.verify_k.is_empty() {
        return spec::run(&args, model);
    }
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
        .map(|&(p, n, d)| (d + p).max(d + n + 1))
        .max()
        .unwrap_or(1);
    crate::limits::warn_context(ctx, model.arch().context_length());
    // A computed depth is checkpointed once and restored for every run:
    // two states at once.
    let checkpointed = args.depth_fill == DepthFill::Compute && tests.iter().any(|t| t.2 > 0);
    crate::residency::check_in_memory(&model, &args.mem)?;
    let mut engine = Engine::open(
        model,
        &args.dev.options(),
        &args.mem.request(ctx, 1 + checkpointed as usize),
    )?;
    let mem_plan = engine.plan_line().to_string();
    eprintln!("redlite bench: {mem_plan}");
    let model = engine.model().clone();
    let n_vocab = model.n_vocab();
    if let Some(a) = &args.mmap_advice {
        advise(&file, a)?;
    }
    if !args.no_warmup && engine.reads_host_weights() {
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
    let t0 = Instant::now();
    let mut seq = engine.open_sequence(ctx)?;
    eprintln!(
        "redlite bench: {} | ready in {:.1} s",
        engine.describe(),
        t0.elapsed().as_secs_f64()
    );
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
    let backend = engine.device().name().to_uppercase();
    // The filled depth, and its checkpoint when it was computed.
    let mut filled: Option<(usize, Option<redlite_engine::Checkpoint>)> = None;
    for &(p, n, d) in &tests {
        let mut r = TestResult {
            n_prompt: p,
            n_gen: n,
            n_depth: d,
            secs: Vec::with_capacity(reps),
        };
        if p > 0 && d > 0 {
            // A prompt at depth d: the depth filled once (and
            // checkpointed), each run restored to it, then timed.
            drop(filled.take());
            fill(
                &mut *seq,
                model.ubatch(),
                n_vocab,
                d,
                args.depth_fill,
                &mut rng,
            )?;
            let cp = match args.depth_fill {
                DepthFill::Compute => Some(seq.checkpoint()?),
                DepthFill::Skip => None,
            };
            for i in 0..reps + usize::from(!args.no_warmup) {
                match &cp {
                    Some(cp) => seq.restore(cp)?,
                    None => {
                        seq.reset()?;
                        seq.skip_to(d)?;
                    }
                }
                let ids = rng.tokens(p, n_vocab);
                let t0 = std::time::Instant::now();
                std::hint::black_box(seq.prefill(&ids, Logits::Last)?);
                let s = t0.elapsed().as_secs_f64();
                if i == 0 && !args.no_warmup {
                    continue;
                }
                eprintln!(
                    "redlite bench: {} run {}/{reps}: {:.2} tok/s",
                    r.name(),
                    r.secs.len() + 1,
                    p as f64 / s
                );
                r.secs.push(s);
            }
        } else if p > 0 {
            filled = None;
            if !args.no_warmup {
                prompt(&mut *seq, n_vocab, p, &mut rng)?;
            }
            for i in 0..reps {
                if let Some(c) = model.expert_cache() {
                    c.reset_stats();
                }
                let before = seq.cache_counters()?;
                let s = prompt(&mut *seq, n_vocab, p, &mut rng)?;
                eprintln!(
                    "redlite bench: {} run {}/{reps}: {:.2} tok/s{}",
                    r.name(),
                    i + 1,
                    p as f64 / s,
                    cache_delta(before, seq.cache_counters()?, p)
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
            if filled.as_ref().is_none_or(|(fd, _)| *fd != d) {
                drop(filled.take()); // free the previous depth's checkpoint first
                fill(
                    &mut *seq,
                    model.ubatch(),
                    n_vocab,
                    d,
                    args.depth_fill,
                    &mut rng,
                )?;
                let cp = match args.depth_fill {
                    DepthFill::Compute => Some(seq.checkpoint()?),
                    DepthFill::Skip => None,
                };
                filled = Some((d, cp));
            }
            let cp = filled.as_ref().and_then(|f| f.1.as_ref());
            let back_to_depth = |seq: &mut dyn Sequence| -> Result<()> {
                match cp {
                    Some(cp) => seq.restore(cp)?,
                    None => {
                        seq.reset()?;
                        seq.skip_to(d)?;
                    }
                }
                Ok(())
            };
            if !args.no_warmup {
                back_to_depth(&mut *seq)?;
                decode(&mut *seq, n_vocab, 1, &mut rng, "warm-up", None)?;
            }
            for i in 0..reps {
                back_to_depth(&mut *seq)?;
                if let Some(c) = model.expert_cache() {
                    c.reset_stats();
                }
                let before = seq.cache_counters()?;
                let w = route_file.as_mut().map(|w| w as &mut dyn std::io::Write);
                let secs = decode(&mut *seq, n_vocab, n, &mut rng, "decode", w)?;
                eprintln!(
                    "redlite bench: {} run {}/{reps}: {:.3} tok/s{}",
                    r.name(),
                    i + 1,
                    n as f64 / secs,
                    cache_delta(before, seq.cache_counters()?, n)
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
    if args.profile {
        // The prompt test's time by step class, where the backend has a
        // batched prefill to profile (the first prompt size, from depth 0).
        if let Some(&(p, _, _)) = tests.iter().find(|t| t.0 > 0) {
            seq.reset()?;
            let ids = rng.tokens(p, n_vocab);
            match seq.profile_prefill(&ids) {
                Ok(prof) => print_prefill_profile(&prof, p),
                Err(e) => eprintln!("redlite bench: no prefill profile: {e}"),
            }
        }
        let mut depths: Vec<usize> = tests.iter().map(|t| t.2).collect();
        depths.dedup();
        for d in depths {
            fill(
                &mut *seq,
                model.ubatch(),
                n_vocab,
                d,
                args.depth_fill,
                &mut rng,
            )?;
            let token = rng.tokens(1, n_vocab)[0];
            let p = seq.profile(token, reps.max(3) * 10)?;
            print_profile(&p, d);
        }
    }

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
        let a = parse("-m f -p 512 -n 0 -d 0,4096 --pp-at-depth");
        assert_eq!(plan(&a), vec![(512, 0, 0), (512, 0, 4096)]);
        let a = parse("-m f -p 512 -n 0 -o json");
        assert_eq!(plan(&a), vec![(512, 0, 0)]);
        assert_eq!(a.output, "json");
    }

    #[test]
    fn device_flags() {
        use redlite_engine::{Device, KvType};
        let o = parse("-m f").dev.options();
        assert_eq!((o.device, o.kv_type), (Device::Cpu, None));
        let a = parse("-m f --device cuda --kv-type f32 --depth-fill skip");
        assert_eq!(a.dev.options().kv_type, Some(KvType::F32));
        assert_eq!(a.depth_fill, DepthFill::Skip);
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
