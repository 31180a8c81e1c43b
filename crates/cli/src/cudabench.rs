//! `redlite parity`: a GPU sequence checked against the CPU engine through
//! the engine API (`redlite_engine::parity`), and the bounded device
//! expert cache against full residency.

use anyhow::{ensure, Context, Result};
use redlite_cuda::CudaTuning;
use redlite_cuda::Gpu;
use redlite_engine::parity::{compare, compare_prefill, Parity};
use redlite_engine::{Activations, BackendOptions, Device, Engine, MemoryRequest};
use redlite_model::Model;

pub(crate) fn tokens(seed: u64, n: usize, n_vocab: usize) -> Vec<u32> {
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

/// [`tuning_vars`] parsed (for the CUDA tools that run below the engine:
/// selftest, bench kernels, the cache sweep).
pub fn tuning() -> Result<CudaTuning> {
    let vars = crate::tuning_vars();
    Ok(CudaTuning::from_lookup(|n| {
        vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
    })?)
}

/// The prompts of one file: `texts` through its tokenizer (in its chat
/// template when it has one), or `n` random ids when there are none.
fn prompts(
    file: &redlite_gguf::GgufFile,
    texts: &[String],
    n: usize,
    n_vocab: usize,
) -> Result<Vec<(String, Vec<u32>)>> {
    if texts.is_empty() {
        return Ok(vec![(format!("{n} random ids"), tokens(7, n, n_vocab))]);
    }
    let tok = redlite_tokenizer::Tokenizer::from_gguf(file.metadata())
        .context("--prompt needs the file's tokenizer")?;
    let template = redlite_tokenizer::ChatTemplate::from_gguf(file.metadata()).ok();
    texts
        .iter()
        .map(|t| {
            let text = match &template {
                Some(tpl) => tpl.render(
                    &[redlite_tokenizer::ChatMessage::user(t.clone())],
                    None,
                    true,
                    None,
                )?,
                None => t.clone(),
            };
            let ids = tok.encode(&text, true);
            let short: String = t.chars().take(24).collect();
            Ok((format!("{short:?} ({} tokens)", ids.len()), ids))
        })
        .collect()
}

/// An engine on `device` for `ctx` positions, with everything resident.
fn engine(
    file: &std::sync::Arc<redlite_gguf::GgufFile>,
    reference: bool,
    opts: &BackendOptions,
    ctx: usize,
) -> Result<Engine> {
    let mut model = Model::load(file.clone(), Default::default())?;
    model.set_reference(reference);
    Ok(Engine::open(
        model,
        opts,
        &MemoryRequest {
            ctx,
            sessions: 1,
            available: redlite_model::expertcache::residency::available_bytes(),
            ..Default::default()
        },
    )?)
}

/// `redlite parity`: every file against the CPU reference path with f32
/// activations (`REDLITE_REFERENCE=f32`: the same math as the device's
/// f32-activation kernels; gated) and against the CPU fast path (whose
/// matmuls quantize activations as ggml does: reported, not gated).
pub fn parity_cli(
    files: &[std::path::PathBuf],
    n_prompt: usize,
    n_greedy: usize,
    (kl_max, prefill_kl_max): (f64, f64),
    pdl: bool,
    texts: &[String],
    prefill_only: bool,
) -> Result<()> {
    // The gated rows need the f32 reference arithmetic whatever
    // REDLITE_REFERENCE said: set before any model runs.
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::F32);
    let tuning = tuning()?;
    if prefill_only {
        let ok = prefill_table(files, texts, n_prompt, n_greedy, prefill_kl_max, pdl)?;
        ensure!(ok, "CUDA prefill parity failed");
        return Ok(());
    }
    println!("| file | prompt | paths | steps | argmax agree | worst max abs dlogit | worst KL | router mismatches | greedy {n_greedy} identical | verdict |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---|---|");
    let mut all = true;
    for path in files {
        let file = std::sync::Arc::new(
            redlite_gguf::GgufFile::open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        );
        let n_vocab = Model::load(file.clone(), Default::default())?.n_vocab();
        for (what, prompt) in prompts(&file, texts, n_prompt, n_vocab)? {
            let ctx = prompt.len() + n_greedy + 1;
            let rows = [
                (true, "CPU reference (f32 act) / GPU f32 act"),
                (false, "CPU fast (int8 act) / GPU int8 act"),
            ];
            for (reference, label) in rows {
                let mut cpu = engine(&file, reference, &BackendOptions::default(), ctx)?;
                let gpu_opts = BackendOptions {
                    device: Device::Cuda,
                    activations: if reference {
                        Activations::F32
                    } else {
                        Activations::Int8
                    },
                    pdl,
                    tuning: crate::tuning_vars(),
                    ..Default::default()
                };
                let mut gpu = engine(&file, reference, &gpu_opts, ctx)?;
                let (mut a, mut b) = (cpu.open_sequence(ctx)?, gpu.open_sequence(ctx)?);
                let p = compare(&mut *a, &mut *b, &prompt, n_greedy)?;
                let ok = p.ok(kl_max);
                if reference {
                    all &= ok;
                }
                println!(
                    "| {} | {what} | {label} | {} | {}/{} | {:.3e} | {:.3e} | {}/{} | {} | {} |",
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
                        format!("no: cpu {:?} gpu {:?}", p.greedy_a, p.greedy_b)
                    },
                    match (ok, reference) {
                        (true, _) => "ok",
                        (false, true) => "FAIL",
                        (false, false) => "differs (not gated)",
                    }
                );
            }
        }
    }
    all &= prefill_table(files, texts, n_prompt, n_greedy, prefill_kl_max, pdl)?;
    // Checkpoints: a GPU sequence restored after a detour gives the
    // straight run's logits bit for bit.
    println!();
    println!("| file | sequence | checkpoint at | steps after restore | steps with any logit bit different | detour moved the state | verdict |");
    println!("|---|---|---:|---:|---:|---|---|");
    for path in files {
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let n_vocab = Model::load(file.clone(), Default::default())?.n_vocab();
        let prompt = tokens(7, n_prompt, n_vocab);
        let next = tokens(11, n_greedy.max(2), n_vocab);
        let detour = tokens(13, 5, n_vocab);
        let ctx = prompt.len() + next.len().max(detour.len()) + 1;
        let opts = BackendOptions {
            device: Device::Cuda,
            pdl,
            tuning: crate::tuning_vars(),
            ..Default::default()
        };
        let mut gpu = engine(&file, false, &opts, ctx)?;
        let mut seq = gpu.open_sequence(ctx)?;
        let (differing, moved) =
            redlite_engine::parity::checkpoint_roundtrip(&mut *seq, &prompt, &next, &detour)?;
        let ok = differing == 0 && moved;
        all &= ok;
        println!(
            "| {} | GPU int8 act | {} | {} | {differing} | {} | {} |",
            path.file_name()
                .map_or(path.display().to_string(), |n| n.to_string_lossy().into()),
            prompt.len(),
            next.len(),
            if moved { "yes" } else { "no" },
            if ok { "ok" } else { "FAIL" }
        );
    }
    // Speculative verify passes: rows bit for bit the decode's, and every
    // kept prefix continues as the straight run.
    println!();
    println!("| file | sequence | prompt | draft tokens | rows compared | rows with any bit different | verdict |");
    println!("|---|---|---:|---:|---:|---:|---|");
    for path in files {
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let n_vocab = Model::load(file.clone(), Default::default())?.n_vocab();
        let prompt = tokens(7, n_prompt, n_vocab);
        let next = tokens(17, 6, n_vocab);
        let ctx = prompt.len() + next.len() + 1;
        let opts = BackendOptions {
            device: Device::Cuda,
            pdl,
            tuning: crate::tuning_vars(),
            ..Default::default()
        };
        let mut gpu = engine(&file, false, &opts, ctx)?;
        let mut seq = gpu.open_sequence(ctx)?;
        let (differing, compared) =
            redlite_engine::parity::verify_roundtrip(&mut *seq, &prompt, &next)?;
        let ok = differing == 0 && compared > 0;
        all &= ok;
        println!(
            "| {} | GPU int8 act | {} | {} | {compared} | {differing} | {} |",
            path.file_name()
                .map_or(path.display().to_string(), |n| n.to_string_lossy().into()),
            prompt.len(),
            next.len(),
            if ok { "ok" } else { "FAIL" }
        );
    }
    // The bounded expert cache: every size from the minimum (a token's
    // experts) to one below full residency, pre-gating off and on, against
    // the decoder with every expert resident: identical bit for bit.
    println!();
    println!("| file | activations | slots per layer | misses from | pre-gating | steps | steps with any logit bit different | greedy identical | hit rate | prefetched (used) | verdict |");
    println!("|---|---|---|---|---|---:|---:|---|---|---|---|");
    for path in files {
        let Some(MoeFile {
            mut model,
            k,
            e,
            prompt,
            name,
        }) = MoeFile::open(path, n_prompt)?
        else {
            continue;
        };
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
    all &= prefill_cache_table(files, n_prompt, n_greedy, &tuning)?;
    println!();
    println!("CPU engine (one token per forward) vs the CUDA decoder (one graph per token, f32 activations); gate on the reference rows: every argmax equal, KL <= {kl_max:e}, greedy identical; router mismatches = (MoE layer, step) pairs whose chosen experts differ (reported)");
    // State files: a state carried between the GPU and the CPU.
    all &= crate::cudastate::state_table(files, n_prompt, n_greedy, pdl)?;
    ensure!(all, "CUDA parity failed");
    Ok(())
}

/// The batched prefill under bounded expert caches (the minimum, a token's
/// experts, and half the experts; pre-gating off and on; chunks of 16 and
/// 5 tokens, so the prompt spans several chunks and the last is short)
/// against the batched prefill with every expert resident: identical bit
/// for bit at every position and greedy step.
fn prefill_cache_table(
    files: &[std::path::PathBuf],
    n_prompt: usize,
    n_greedy: usize,
    tuning: &redlite_cuda::CudaTuning,
) -> Result<bool> {
    println!();
    println!("| file | activations | slots per layer | pre-gating | ubatch | positions + greedy steps | steps with any logit bit different | greedy identical | experts from slots / uploaded (ahead, used) | MiB uploaded | verdict |");
    println!("|---|---|---|---|---:|---:|---:|---|---|---:|---|");
    let mut all = true;
    for path in files {
        let Some(MoeFile {
            mut model,
            k,
            e,
            prompt,
            name,
        }) = MoeFile::open(path, n_prompt)?
        else {
            continue;
        };
        let gpu = Gpu::with_defines(0, &tuning.defines)?;
        let mut sizes = vec![k, (e / 2).max(k)];
        sizes.dedup();
        sizes.retain(|&s| s < e);
        for int8 in [true, false] {
            model.set_reference(!int8);
            let runs = redlite_cuda::parity::prefill_cache_sweep(
                &gpu,
                &model,
                &prompt,
                n_greedy,
                int8,
                &sizes,
                &[16, 5],
                tuning,
            )?;
            for r in runs {
                all &= r.ok();
                let u = r.uploads;
                println!(
                    "| {name} | {} | {} | {} | {} | {} | {} | {} | {} / {} ({}, {}) | {:.2} | {} |",
                    if int8 { "int8" } else { "f32" },
                    r.slots_per_layer,
                    if r.pregate { "on" } else { "off" },
                    r.chunk,
                    r.steps,
                    r.steps_differing,
                    if r.greedy_equal { "yes" } else { "no" },
                    u.resident,
                    u.uploaded,
                    u.ahead,
                    u.ahead_used,
                    u.bytes as f64 / (1u64 << 20) as f64,
                    if r.ok() { "ok" } else { "FAIL" }
                );
            }
        }
    }
    Ok(all)
}

/// A file of a MoE model for the cache tables: the model, experts a
/// token (`k`) and per layer (`e`), the random prompt, the file's name.
struct MoeFile {
    model: Model,
    k: usize,
    e: usize,
    prompt: Vec<u32>,
    name: String,
}

impl MoeFile {
    /// None for a file without routed experts.
    fn open(path: &std::path::Path, n_prompt: usize) -> Result<Option<MoeFile>> {
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let model = Model::load(file, Default::default())?;
        let Some(e) = model
            .expert_layout()?
            .layers
            .iter()
            .flatten()
            .next()
            .map(|l| l.n_expert)
        else {
            return Ok(None);
        };
        Ok(Some(MoeFile {
            k: model.n_expert_used(),
            e,
            prompt: tokens(7, n_prompt, model.n_vocab()),
            name: path
                .file_name()
                .map_or(path.display().to_string(), |n| n.to_string_lossy().into()),
            model,
        }))
    }
}

/// The KL above which a batched-prefill step counts as an outlier (an
/// expert flipped by a near tie, see `--prefill-kl-max`).
const PREFILL_STEP_KL: f64 = 1e-4;

/// The batched prefill's gate: the worst step within `kl_max`, at most 2%
/// of the steps (at least one) over [`PREFILL_STEP_KL`], 99% of the
/// argmaxes equal, the greedy tokens identical. A systematic error lifts
/// every step's KL and fails the 2% rule long before the worst bound.
fn prefill_ok(p: &Parity, kl_max: f64) -> bool {
    let outliers = (p.steps / 50).max(1);
    p.worst.kl <= kl_max
        && p.steps_over(PREFILL_STEP_KL) <= outliers
        && p.argmax_agree * 100 >= p.steps * 99
        && p.greedy_equal()
}

/// The batched prefill (every position's logits from one `prefill`, in
/// chunks of `--ubatch` tokens: the default and 16, which splits even a
/// short prompt) against the same device token by token and against the
/// CPU reference path; gated by [`prefill_ok`].
fn prefill_table(
    files: &[std::path::PathBuf],
    texts: &[String],
    n_prompt: usize,
    n_greedy: usize,
    kl_max: f64,
    pdl: bool,
) -> Result<bool> {
    println!();
    println!("| file | prompt | batched prefill against | ubatch | positions + greedy steps | argmax agree | worst max abs dlogit | worst KL | at step | median KL | steps over 1e-4 | greedy {n_greedy} identical | verdict |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mut all = true;
    for path in files {
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let n_vocab = Model::load(file.clone(), Default::default())?.n_vocab();
        let name = path
            .file_name()
            .map_or(path.display().to_string(), |n| n.to_string_lossy().into());
        let ps = prompts(&file, texts, n_prompt, n_vocab)?;
        let ctx = ps.iter().map(|p| p.1.len()).max().unwrap_or(1) + n_greedy + 1;
        // Engines per file, not per prompt: each GPU engine compiles the
        // kernels once.
        let rows: [(Activations, &[Option<usize>]); 2] = [
            (Activations::F32, &[None, Some(16)]),
            (Activations::Int8, &[None]),
        ];
        for (act, ubatches) in rows {
            let reference = act == Activations::F32;
            let label = if reference { "f32" } else { "int8" };
            let gpu_opts = |ub: Option<usize>| BackendOptions {
                device: Device::Cuda,
                activations: act,
                pdl,
                ubatch: ub,
                tuning: crate::tuning_vars(),
                ..Default::default()
            };
            let mut others: Vec<(String, Box<dyn redlite_model::sequence::Sequence>)> = Vec::new();
            let mut tok = engine(&file, reference, &gpu_opts(Some(0)), ctx)?;
            others.push((
                format!("GPU {label} act token by token"),
                tok.open_sequence(ctx)?,
            ));
            if reference {
                let mut cpu = engine(&file, true, &BackendOptions::default(), ctx)?;
                others.push(("CPU reference".into(), cpu.open_sequence(ctx)?));
            }
            for &ubatch in ubatches {
                let mut batched = engine(&file, reference, &gpu_opts(ubatch), ctx)?;
                let mut a = batched.open_sequence(ctx)?;
                for (what, prompt) in &ps {
                    for (against, b) in others.iter_mut() {
                        let p: Parity = compare_prefill(&mut *a, &mut **b, prompt, n_greedy)?;
                        let ok = prefill_ok(&p, kl_max);
                        // Gated: f32 activations (the reference arithmetic
                        // on both sides but the GEMMs' f16 inputs); the
                        // int8 rows compare two roundings of activations.
                        if reference {
                            all &= ok;
                        }
                        println!(
                            "| {name} | {what} | {against} | {} | {} | {}/{} | {:.3e} | {:.3e} | {} | {:.1e} | {} | {} | {} |",
                            ubatch.map_or("default".to_string(), |u| u.to_string()),
                            p.steps,
                            p.argmax_agree,
                            p.steps,
                            p.worst.max_abs,
                            p.worst.kl,
                            p.worst_kl_step,
                            p.median_kl(),
                            p.steps_over(PREFILL_STEP_KL),
                            if p.greedy_equal() {
                                "yes".to_string()
                            } else {
                                format!("no: batched {:?} other {:?}", p.greedy_a, p.greedy_b)
                            },
                            match (ok, reference) {
                                (true, _) => "ok",
                                (false, true) => "FAIL",
                                (false, false) => "differs (not gated)",
                            }
                        );
                    }
                }
            }
        }
    }
    Ok(all)
}
