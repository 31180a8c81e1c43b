//! `redlite bench model --device cuda` and `redlite parity`: the GPU decoder
//! (`redlite_cuda::decoder`) timed, and checked against the CPU engine.

use crate::modelbench::{ModelBenchArgs, TestResult};
use crate::residency::MemoryArgs;
use anyhow::{ensure, Context, Result};
use redlite_cuda::decoder::{CudaDecoder, DecoderOptions, ExpertCacheOptions};
use redlite_cuda::device_plan::{plan_device, DevicePlanInput, ExpertSource};
use redlite_cuda::ops::KvType;
use redlite_cuda::parity::parity;
use redlite_cuda::{CudaTuning, Gpu};
use redlite_model::Model;
use std::time::Instant;

fn tokens(seed: u64, n: usize, n_vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

/// The CUDA tuning switches (`REDLITE_CUDA_*`, docs/cuda.md) from the
/// environment, parsed once per process: the one place they are read.
pub fn tuning() -> Result<CudaTuning> {
    static T: std::sync::OnceLock<Result<CudaTuning, String>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        CudaTuning::from_lookup(|n| std::env::var(n).ok()).map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// `--kv-type` (None: `KvType::default_for(int8)`: f16 with int8
/// activations, f32 with f32 activations).
pub fn kv_type(arg: Option<&str>, int8: bool) -> KvType {
    match arg {
        Some("f16") => KvType::F16,
        Some("f32") => KvType::F32,
        _ => KvType::default_for(int8),
    }
}

/// The device memory plan: dense weights (everything but routed experts
/// and the token embedding, which stays on the host), the KV cache and
/// DeltaNet state for `ctx` positions and a reserve are on the device; the
/// routed experts are all resident when they fit the budget (the device's
/// free memory, or `--memory` / `--expert-cache`), else each MoE layer
/// gets an equal pool of slots and every expert is kept in pinned host
/// memory, from where misses are copied. Refuses, with the numbers, before
/// anything is uploaded. Returns the cache options (None: full residency)
/// and the plan line.
pub fn device_plan(
    gpu: &Gpu,
    model: &Model,
    mem: &MemoryArgs,
    ctx: usize,
    kv: KvType,
) -> Result<(Option<ExpertCacheOptions>, String)> {
    let (free, total) = gpu.mem_info()?;
    let layout = model.expert_layout()?;
    let (dense, experts) = model.weight_split()?;
    let embd = model
        .file()
        .tensors()
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .map_or(0, |t| t.n_bytes);
    let moe_layers: Vec<_> = layout.layers.iter().flatten().collect();
    // Model::state_bytes counts f32 K and V (4 bytes a value).
    let (kv_per_pos, recurrent) = model.state_bytes();
    let input = DevicePlanInput {
        dense_bytes: dense - embd,
        expert_bytes: experts,
        moe_layers: moe_layers.len() as u64,
        experts_per_layer: moe_layers.first().map_or(0, |l| l.n_expert as u64),
        slot_bytes: layout.slot_bytes(),
        k: model.n_expert_used() as u64,
        kv_values_per_pos: kv_per_pos / 4,
        kv_value_bytes: kv.bytes() as u64,
        recurrent_bytes: recurrent,
        ctx: ctx as u64,
        device_free: free as u64,
        device_total: total as u64,
        memory: mem.memory,
        expert_cache: mem.expert_cache,
        host_available: crate::memory::available_bytes(),
        source: match mem.expert_source.as_str() {
            "pinned" => ExpertSource::Pinned,
            "file" => ExpertSource::File,
            _ => ExpertSource::Auto,
        },
        pregate: mem.pregate.is_none_or(|n| n > 0),
    };
    Ok(plan_device(&input)?)
}

/// The decode tests of `tests` on the GPU: per depth D the position is set
/// to D (the tokens before it are not computed), one warm-up token, then
/// `reps` runs of N tokens, each token one graph replay with its logits
/// read back. Prompt tests run their tokens one by one the same way.
pub fn results(
    args: &ModelBenchArgs,
    model: &Model,
    tests: &[(usize, usize, usize)],
    reps: usize,
    seed: u64,
) -> Result<(Vec<TestResult>, String)> {
    let need = tests
        .iter()
        .map(|&(p, n, d)| d + p + n + 2)
        .max()
        .unwrap_or(1);
    let tuning = tuning()?;
    let mut gpu = Gpu::with_defines(0, &tuning.defines)?;
    gpu.pdl = !args.no_pdl;
    let int8 = !args.f32_activations;
    let kv = kv_type(args.kv_type.as_deref(), int8);
    let (cache, plan_line) = device_plan(&gpu, model, &args.mem, need, kv)?;
    eprintln!("redlite: {plan_line}");
    let t0 = Instant::now();
    let mut dec = CudaDecoder::new(
        gpu,
        model,
        &DecoderOptions {
            ctx: need,
            nsplit: None,
            int8,
            kv_type: kv,
            expert_cache: cache,
            tuning,
        },
    )?;
    eprintln!(
        "redlite bench: cuda: {} | {} activations | {} KV | {} launches | {} stages per token in one graph | {:.1} GiB on the device | set up in {:.1} s",
        dec.gpu().name,
        if args.f32_activations { "f32" } else { "int8" },
        kv.name(),
        if args.no_pdl { "plain" } else { "PDL" },
        dec.n_ops(),
        dec.device_bytes as f64 / (1u64 << 30) as f64,
        t0.elapsed().as_secs_f64()
    );
    let n_vocab = model.n_vocab();
    let mut out = Vec::new();
    for &(p, n, d) in tests {
        let mut r = TestResult {
            n_prompt: p,
            n_gen: n,
            n_depth: d,
            secs: Vec::with_capacity(reps),
        };
        let len = p + n;
        for i in 0..=reps {
            dec.reset()?;
            dec.set_pos(d)?;
            if i == 0 && args.no_warmup {
                continue;
            }
            let ids = tokens(seed + i as u64, if i == 0 { 1 } else { len }, n_vocab);
            let before = dec.cache_totals()?;
            let t = Instant::now();
            for &id in &ids {
                std::hint::black_box(dec.step(model, id)?);
            }
            let secs = t.elapsed().as_secs_f64();
            if i > 0 {
                let cache = match (before, dec.cache_totals()?) {
                    (Some((b, bb)), Some((a, ab))) => {
                        let (hits, misses) = (a.hits - b.hits, a.misses - b.misses);
                        let (pre, used) = (
                            a.prefetched - b.prefetched,
                            a.prefetch_used - b.prefetch_used,
                        );
                        format!(
                            " | cache: {:.1}% hits ({hits} hits, {misses} misses), prefetched {pre} ({used} used), PCIe {:.1} MiB/token",
                            100.0 * hits as f64 / (hits + misses).max(1) as f64,
                            (ab - bb) as f64 / ids.len() as f64 / (1u64 << 20) as f64
                        )
                    }
                    _ => String::new(),
                };
                eprintln!(
                    "redlite bench: {} run {i}/{reps}: {:.2} tok/s{cache}",
                    r.name(),
                    len as f64 / secs
                );
                r.secs.push(secs);
            }
        }
        out.push(r);
    }
    if args.profile {
        let mut depths: Vec<usize> = tests.iter().map(|t| t.2).collect();
        depths.dedup();
        for d in depths {
            dec.reset()?;
            dec.set_pos(d)?;
            let p = dec.profile(model, tokens(seed, 1, n_vocab)[0], reps.max(3) * 10)?;
            print_profile(&p, d);
        }
    }
    Ok((out, plan_line))
}

/// The profile as a markdown table (stdout).
fn print_profile(p: &redlite_cuda::decoder::TokenProfile, depth: usize) {
    println!();
    println!(
        "where one decode token's GPU time goes, depth {depth}: {:.1} µs with the profiling events, {:.1} µs without ({:.1} tok/s)",
        p.total_us,
        p.plain_us,
        1e6 / p.plain_us.max(1e-9)
    );
    println!();
    println!("| kernel class | µs per token | share | kernels per token | µs per kernel |");
    println!("|---|---:|---:|---:|---:|");
    let sum: f64 = p.rows.iter().map(|r| r.1).sum();
    let kernels: usize = p.rows.iter().map(|r| r.2).sum();
    for (label, us, k) in &p.rows {
        println!(
            "| {label} | {us:.1} | {:.1}% | {k} | {:.2} |",
            100.0 * us / sum.max(1e-9),
            us / (*k).max(1) as f64
        );
    }
    println!(
        "| all | {sum:.1} | 100% | {kernels} | {:.2} |",
        sum / kernels.max(1) as f64
    );
}

/// `redlite parity`: every file against the CPU reference path with f32
/// activations (`REDLITE_REFERENCE=f32`: the same math as the device's
/// f32-activation kernels; gated) and against the CPU fast path (whose
/// matmuls quantize activations as ggml does: reported, not gated).
pub fn parity_cli(
    files: &[std::path::PathBuf],
    n_prompt: usize,
    n_greedy: usize,
    kl_max: f64,
    pdl: bool,
) -> Result<()> {
    // The gated rows need the f32 reference arithmetic whatever
    // REDLITE_REFERENCE said: set before any model runs.
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::F32);
    let tuning = tuning()?;
    println!("| file | paths | steps | argmax agree | worst max abs dlogit | worst KL | router mismatches | greedy {n_greedy} identical | verdict |");
    println!("|---|---|---:|---:|---:|---:|---:|---|---|");
    let mut all = true;
    for path in files {
        let file = std::sync::Arc::new(
            redlite_gguf::GgufFile::open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        );
        let mut model = Model::load(file, Default::default())?;
        let prompt = tokens(7, n_prompt, model.n_vocab());
        let rows = [
            (true, "CPU reference (f32 act) / GPU f32 act"),
            (false, "CPU fast (int8 act) / GPU int8 act"),
        ];
        for (reference, label) in rows {
            model.set_reference(reference);
            let mut gpu = Gpu::with_defines(0, &tuning.defines)?;
            gpu.pdl = pdl;
            let p = parity(gpu, &model, &prompt, n_greedy, !reference, &tuning)?;
            let ok = p.ok(kl_max);
            if reference {
                all &= ok;
            }
            println!(
                "| {} | {label} | {} | {}/{} | {:.3e} | {:.3e} | {}/{} | {} | {} |",
                path.file_name()
                    .map_or(path.display().to_string(), |n| n.to_string_lossy().into()),
                p.steps,
                p.argmax_agree,
                p.steps,
                p.worst.max_abs,
                p.worst.kl,
                p.router_mismatches,
                p.router_checks,
                if p.greedy_equal() {
                    "yes".to_string()
                } else {
                    format!("no: cpu {:?} gpu {:?}", p.greedy_cpu, p.greedy_gpu)
                },
                match (ok, reference) {
                    (true, _) => "ok",
                    (false, true) => "FAIL",
                    (false, false) => "differs (not gated)",
                }
            );
        }
    }
    // The bounded expert cache: every size from the minimum (a token's
    // experts) to one below full residency, pre-gating off and on, against
    // the decoder with every expert resident: identical bit for bit.
    println!();
    println!("| file | activations | slots per layer | misses from | pre-gating | steps | steps with any logit bit different | greedy identical | hit rate | prefetched (used) | verdict |");
    println!("|---|---|---|---|---|---:|---:|---|---|---|---|");
    for path in files {
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let mut model = Model::load(file, Default::default())?;
        let (k, e) = match model.expert_layout()?.layers.iter().flatten().next() {
            Some(l) => (model.n_expert_used(), l.n_expert),
            None => continue,
        };
        let prompt = tokens(7, n_prompt, model.n_vocab());
        let name = path
            .file_name()
            .map_or(path.display().to_string(), |n| n.to_string_lossy().into());
        let gpu = Gpu::with_defines(0, &tuning.defines)?;
        for int8 in [true, false] {
            model.set_reference(!int8);
            let sizes: Vec<usize> = (k..e).collect();
            let runs = redlite_cuda::parity::cache_sweep(
                &gpu, &model, &prompt, n_greedy, int8, &sizes, &tuning,
            )?;
            for (pregate, from_file) in [(false, false), (true, false), (false, true)] {
                let rs: Vec<_> = runs
                    .iter()
                    .filter(|r| r.pregate == pregate && r.from_file == from_file)
                    .collect();
                let ok = rs.iter().all(|r| r.ok());
                all &= ok;
                let hr: Vec<f64> = rs.iter().map(|r| r.counters.hit_rate()).collect();
                let lo = hr.iter().cloned().fold(f64::INFINITY, f64::min);
                let hi = hr.iter().cloned().fold(0.0, f64::max);
                let (pre, used): (u64, u64) = rs.iter().fold((0, 0), |a, r| {
                    (a.0 + r.counters.prefetched, a.1 + r.counters.prefetch_used)
                });
                println!(
                    "| {name} | {} | {k}..{} (each) | {} | {} | {} each | {} | {}/{} | {:.1}%..{:.1}% | {pre} ({used}) | {} |",
                    if int8 { "int8" } else { "f32" },
                    e - 1,
                    if from_file { "file" } else { "pinned" },
                    if pregate { "on" } else { "off" },
                    rs.first().map_or(0, |r| r.steps),
                    rs.iter().map(|r| r.steps_differing).sum::<usize>(),
                    rs.iter().filter(|r| r.greedy_equal).count(),
                    rs.len(),
                    100.0 * lo,
                    100.0 * hi,
                    if ok { "ok" } else { "FAIL" }
                );
            }
        }
    }
    println!();
    println!("CPU engine (one token per forward) vs the CUDA decoder (one graph per token, f32 activations); gate on the reference rows: every argmax equal, KL <= {kl_max:e}, greedy identical; router mismatches = (MoE layer, step) pairs whose chosen experts differ (reported)");
    ensure!(all, "CUDA parity failed");
    Ok(())
}
