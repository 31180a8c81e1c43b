//! `redlite bench model --device cuda` and `redlite parity`: the GPU decoder
//! (`redlite_cuda::decoder`) timed, and checked against the CPU engine.

use crate::modelbench::{ModelBenchArgs, TestResult};
use anyhow::{ensure, Context, Result};
use redlite_cuda::decoder::{CudaDecoder, DecoderOptions};
use redlite_cuda::parity::parity;
use redlite_cuda::Gpu;
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
) -> Result<Vec<TestResult>> {
    let need = tests
        .iter()
        .map(|&(p, n, d)| d + p + n + 2)
        .max()
        .unwrap_or(1);
    let mut gpu = Gpu::new(0)?;
    gpu.pdl = args.pdl;
    let t0 = Instant::now();
    let mut dec = CudaDecoder::new(
        gpu,
        model,
        &DecoderOptions {
            ctx: need,
            nsplit: None,
            int8: !args.f32_activations,
        },
    )?;
    eprintln!(
        "redlite bench: cuda: {} | {} activations | {} launches | {} stages per token in one graph | {:.1} GiB on the device | set up in {:.1} s",
        dec.gpu().name,
        if args.f32_activations { "f32" } else { "int8" },
        if args.pdl { "PDL" } else { "plain" },
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
            let t = Instant::now();
            for &id in &ids {
                std::hint::black_box(dec.step(model, id)?);
            }
            let secs = t.elapsed().as_secs_f64();
            if i > 0 {
                eprintln!(
                    "redlite bench: {} run {i}/{reps}: {:.2} tok/s",
                    r.name(),
                    len as f64 / secs
                );
                r.secs.push(secs);
            }
        }
        out.push(r);
    }
    Ok(out)
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
    // Read once by the model crate: set before any model runs.
    std::env::set_var("REDLITE_REFERENCE", "f32");
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
            let mut gpu = Gpu::new(0)?;
            gpu.pdl = pdl;
            let p = parity(gpu, &model, &prompt, n_greedy, !reference)?;
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
    println!("CPU engine (one token per forward) vs the CUDA decoder (one graph per token, f32 activations); gate on the reference rows: every argmax equal, KL <= {kl_max:e}, greedy identical; router mismatches = (MoE layer, step) pairs whose chosen experts differ (reported)");
    ensure!(all, "CUDA parity failed");
    Ok(())
}
