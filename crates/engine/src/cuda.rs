//! The CUDA backend behind the engine: the device memory plan, then one
//! [`CudaSequence`] per opened sequence.

use crate::{Activations, BackendOptions, EngineError, ExpertSource, KvType};
use redlite_cuda::decoder::{DecoderOptions, ExpertCacheOptions};
use redlite_cuda::device_plan::{self, plan_device, DevicePlanInput};
use redlite_cuda::ops;
use redlite_cuda::sequence::CudaSequence;
use redlite_cuda::{CudaTuning, Gpu};
use redlite_model::sequence::Sequence;
use redlite_model::{MemoryRequest, Model};
use std::sync::Arc;

fn err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Backend {
        backend: "cuda",
        what: e.to_string(),
    }
}

pub(crate) struct CudaBackend {
    /// The device opened for the plan, kept for the first sequence (its
    /// kernels are compiled once).
    gpu: Option<Gpu>,
    tuning: CudaTuning,
    pdl: bool,
    cache: Option<ExpertCacheOptions>,
    int8: bool,
    kv: ops::KvType,
    /// Prompt tokens a batched-prefill chunk asks for (the plan's choice
    /// or `--ubatch`; under a bounded cache the decoder may halve it).
    chunk: usize,
    described: String,
}

impl CudaBackend {
    pub(crate) fn open(
        model: &Model,
        opts: &BackendOptions,
        mem: &MemoryRequest,
    ) -> Result<(CudaBackend, String), EngineError> {
        let tuning = CudaTuning::from_lookup(|name| {
            opts.tuning
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
        .map_err(err)?;
        let mut gpu = Gpu::with_defines(0, &tuning.defines).map_err(err)?;
        gpu.pdl = opts.pdl;
        let kv = match opts.kv() {
            KvType::F16 => ops::KvType::F16,
            KvType::F32 => ops::KvType::F32,
        };
        let (cache, line, chunk) = plan(&gpu, model, opts, mem, kv)?;
        let described = format!("cuda: {}", gpu.name);
        Ok((
            CudaBackend {
                gpu: Some(gpu),
                tuning,
                pdl: opts.pdl,
                cache,
                int8: opts.activations == Activations::Int8,
                kv,
                chunk,
                described,
            },
            line,
        ))
    }

    pub(crate) fn open_sequence(
        &mut self,
        model: &Arc<Model>,
        ctx: usize,
    ) -> Result<Box<dyn Sequence>, EngineError> {
        let gpu = match self.gpu.take() {
            Some(g) => g,
            None => {
                let mut g = Gpu::with_defines(0, &self.tuning.defines).map_err(err)?;
                g.pdl = self.pdl;
                g
            }
        };
        let seq = CudaSequence::new(
            gpu,
            model.clone(),
            &DecoderOptions {
                ctx,
                nsplit: None,
                int8: self.int8,
                kv_type: self.kv,
                expert_cache: self.cache,
                tuning: self.tuning.clone(),
                prefill_chunk: self.chunk.min(ctx),
            },
        )
        .map_err(err)?;
        let d = seq.decoder();
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        let prefill = if d.batched_prefill() {
            let staging = match d.prefill_staging_bytes() {
                0 => String::new(),
                b => format!(
                    " + {:.0} MiB of staging images for the experts not in the cache",
                    mib(b)
                ),
            };
            format!(
                ", prompts in chunks of {} tokens ({:.0} MiB of prefill scratch{staging})",
                d.prefill_chunk(),
                mib(d.prefill_scratch_bytes())
            )
        } else {
            ", prompts token by token".to_string()
        };
        self.described = format!(
            "cuda: {}, {:.1} GiB on the device, {} activations, {} KV, {} launches, {} kernels per token in one graph{prefill}",
            d.gpu().name,
            d.device_bytes as f64 / (1u64 << 30) as f64,
            if self.int8 { "int8" } else { "f32" },
            self.kv.name(),
            if self.pdl { "PDL" } else { "plain" },
            d.n_ops(),
        );
        Ok(Box::new(seq))
    }

    pub(crate) fn describe(&self) -> String {
        self.described.clone()
    }
}

/// The batched prefill's scratch per chunk token, estimated from the
/// file's tensor shapes (`redlite_cuda::prefill_experts::scratch_per_token`
/// says what it bounds): hidden size, experts a token and their rows, and
/// the most rows of one layer's 2-D weights together.
fn prefill_bytes_per_token(model: &Model) -> u64 {
    let tensors = model.file().tensors();
    let d = tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.dims.first().copied())
        .unwrap_or(0);
    let mut ff = 0u64;
    let mut layer_rows = std::collections::BTreeMap::<&str, u64>::new();
    for t in tensors {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let layer = rest.split('.').next().unwrap_or("");
        match t.dims.as_slice() {
            [_, rows] => *layer_rows.entry(layer).or_default() += rows,
            [_, rows, _] if t.name.contains("gate") || t.name.contains("up") => ff = ff.max(*rows),
            _ => {}
        }
    }
    let rows = layer_rows.values().copied().max().unwrap_or(0);
    redlite_cuda::prefill_experts::scratch_per_token(d, model.n_expert_used() as u64, ff, rows)
}

/// The device memory plan: dense weights (everything but routed experts
/// and the token embedding, which stays on the host), the KV cache and
/// DeltaNet state of `mem.sessions` sequences of `mem.ctx` positions (the
/// live one and the checkpoints a prompt cache keeps on the device) and a
/// reserve are on the device; the routed experts are all resident when
/// they fit the budget (the device's free memory, or `memory` /
/// `expert_cache`), else each MoE layer gets an equal pool of slots fed
/// from host memory. Refuses, with the numbers, before anything is
/// uploaded.
fn plan(
    gpu: &Gpu,
    model: &Model,
    opts: &BackendOptions,
    mem: &MemoryRequest,
    kv: ops::KvType,
) -> Result<(Option<ExpertCacheOptions>, String, usize), EngineError> {
    let (free, total) = gpu.mem_info().map_err(err)?;
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
    let sessions = mem.sessions.max(1) as u64;
    let input = DevicePlanInput {
        // The decoder uploads the trunk only (decode_stages walks no NextN
        // block), so the MTP block's bytes stay on the host.
        dense_bytes: dense.saturating_sub(embd + model.mtp_bytes()),
        expert_bytes: experts,
        moe_layers: moe_layers.len() as u64,
        experts_per_layer: moe_layers.first().map_or(0, |l| l.n_expert as u64),
        slot_bytes: layout.slot_bytes(),
        k: model.n_expert_used() as u64,
        // Every held state is counted at the full context: a checkpoint
        // holds only its filled rows, but may be taken at the last one.
        kv_values_per_pos: kv_per_pos / 4 * sessions,
        kv_value_bytes: kv.bytes() as u64,
        recurrent_bytes: recurrent * sessions,
        ctx: mem.ctx as u64,
        device_free: free as u64,
        device_total: total as u64,
        memory: mem.memory,
        expert_cache: mem.expert_cache,
        host_available: mem.available,
        source: match opts.expert_source {
            ExpertSource::Auto => device_plan::ExpertSource::Auto,
            ExpertSource::Pinned => device_plan::ExpertSource::Pinned,
            ExpertSource::File => device_plan::ExpertSource::File,
        },
        pregate: mem.cache.pregate > 0,
        prefill_chunk: opts
            .ubatch
            .map_or(device_plan::BOUNDED_UBATCH, |u| u as u64)
            .min(mem.ctx as u64),
        prefill_bytes_per_token: prefill_bytes_per_token(model),
    };
    let (cache, mut line) = plan_device(&input).map_err(err)?;
    if sessions > 1 {
        line.push_str(&format!(
            " (state counted for {sessions} sequences: the live one and {} checkpoints)",
            sessions - 1
        ));
    }
    // At full residency a larger chunk where its scratch still fits;
    // under a cache the plan's share was sized from `prefill_chunk`.
    let chunk = match cache {
        None => device_plan::resident_chunk(&input, opts.ubatch.map(|u| u as u64)),
        Some(_) => input.prefill_chunk,
    };
    Ok((cache, line, chunk as usize))
}
