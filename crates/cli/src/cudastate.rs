//! `redlite parity`'s state-file table: a state carried between the GPU
//! and the CPU through the image a state file holds
//! (`redlite_engine::parity::state_handoff`).

use anyhow::Result;
use redlite_engine::parity::{first_diff, state_handoff, state_roundtrip, MAX_LAYER_REL};
use redlite_engine::{Activations, BackendOptions, Device, Engine, KvType, MemoryRequest};
use redlite_model::Model;
use std::path::PathBuf;

fn engine(
    file: &std::sync::Arc<redlite_gguf::GgufFile>,
    opts: &BackendOptions,
    ctx: usize,
) -> Result<Engine> {
    let mut model = Model::load(file.clone(), Default::default())?;
    model.set_reference(true);
    Ok(Engine::open(
        model,
        opts,
        &MemoryRequest {
            ctx,
            sessions: 2,
            available: redlite_model::expertcache::residency::available_bytes(),
            ..Default::default()
        },
    )?)
}

/// Print the table for `files`; false when a gated row fails. Rows: the
/// GPU (f32 activations and KV) to the CPU reference path and back, each
/// continuation against the receiving backend's straight run (a
/// cross-backend one may part where the two backends' own runs part);
/// the GPU's fast path (f16 KV) saved and loaded on the GPU, exactly; and
/// that f16 image refused by the CPU.
pub fn state_table(files: &[PathBuf], n_prompt: usize, n_greedy: usize, pdl: bool) -> Result<bool> {
    println!();
    println!("| file | state from -> to | KV | greedy {n_greedy} after the state | worst layer max abs diff / max abs | verdict |");
    println!("|---|---|---|---|---:|---|");
    let mut all = true;
    let ctx = n_prompt + n_greedy + 1;
    for path in files {
        let name = path
            .file_name()
            .map_or(path.display().to_string(), |n| n.to_string_lossy().into());
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(path)?);
        let n_vocab = Model::load(file.clone(), Default::default())?.n_vocab();
        let prompt = &crate::cudabench::tokens(7, n_prompt, n_vocab)[..];
        // The f32 handoffs take the GPU's prompts token by token: they
        // check the state's conversion between the backends against each
        // one's own run, and the decode path is the CPU's arithmetic (KL
        // ~1e-12), while the batched prefill's f16 GEMM inputs can flip an
        // expert at a near tie (the prefill table gates that). The f16
        // round trip below keeps the batched prefill.
        let gpu_opts = |kv, activations, ubatch| BackendOptions {
            device: Device::Cuda,
            activations,
            kv_type: Some(kv),
            ubatch,
            pdl,
            tuning: crate::tuning_vars(),
            ..Default::default()
        };
        let mut cpu = engine(&file, &BackendOptions::default(), ctx)?;
        let mut gpu = engine(
            &file,
            &gpu_opts(KvType::F32, Activations::F32, Some(0)),
            ctx,
        )?;
        let mut c = cpu.open_sequence(ctx)?;
        let mut g = gpu.open_sequence(ctx)?;
        let to_cpu = state_handoff(&mut *g, &mut *c, prompt, n_greedy)?;
        let to_gpu = state_handoff(&mut *c, &mut *g, prompt, n_greedy)?;
        // Where the two backends' own greedy runs part (None: they agree).
        let part = first_diff(&to_cpu.straight, &to_gpu.straight);
        for (dir, h) in [
            ("GPU f32 act -> CPU reference", &to_cpu),
            ("CPU reference -> GPU f32 act", &to_gpu),
        ] {
            let d = first_diff(&h.loaded, &h.straight);
            let rel = h.worst_rel();
            let ok = h.continues(part) && rel <= MAX_LAYER_REL;
            all &= ok;
            println!(
                "| {name} | {dir} | f32 | {} | {rel:.3e} | {} |",
                match d {
                    None => "as the receiver's straight run".to_string(),
                    Some(i) => format!(
                        "differs from token {i} (the backends part at {part:?}): {:?} vs {:?}",
                        h.loaded, h.straight
                    ),
                },
                if ok { "ok" } else { "FAIL" }
            );
        }
        drop((g, gpu));
        let mut gpu = engine(&file, &gpu_opts(KvType::F16, Activations::Int8, None), ctx)?;
        let mut g = gpu.open_sequence(ctx)?;
        let h = state_roundtrip(&mut *g, prompt, n_greedy)?;
        let ok = h.loaded == h.straight;
        all &= ok;
        println!(
            "| {name} | GPU int8 act -> the same | f16 | {} | | {} |",
            if ok {
                "as the straight run".to_string()
            } else {
                format!("{:?} vs {:?}", h.loaded, h.straight)
            },
            if ok { "ok" } else { "FAIL" }
        );
        let refused = state_handoff(&mut *g, &mut *c, prompt, 1);
        let ok = refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("f16"));
        all &= ok;
        println!(
            "| {name} | GPU int8 act -> CPU | f16 | {} | | {} |",
            match &refused {
                Ok(_) => "accepted".to_string(),
                Err(e) => format!("refused: {e}"),
            },
            if ok { "ok" } else { "FAIL" }
        );
    }
    Ok(all)
}
