//! A whole decode token on the GPU as one CUDA graph.
//!
//! [`CudaDecoder::new`] walks the architecture's stages
//! ([`redlite_model::stages::TokenStages`]) once: each stage uploads its
//! weights (device-resident, experts in slot stacks at full residency),
//! allocates its state (KV caches, DeltaNet conv windows and states) and
//! scratch, and becomes one `Op`. The ops' launches are then captured
//! into one graph. Per token the host writes two things (the token's
//! embedding row, dequantized on the host, and the position), replays the
//! graph and reads the logits back: no host round trip per layer. Every
//! kernel reads the position from device memory, so the same graph serves
//! every position.
//!
//! Activations: f32 (the CPU reference path's math: the parity partner), or
//! with [`DecoderOptions::int8`] quantized to int8 per 32 values once per
//! vector for the formats with int8 kernels (`gemv::Q8_TYPES`: IQ2_XXS,
//! Q8_0, Q4_K, IQ4_NL, Q6_K, IQ2_XS, IQ1_M; routed gate and up in one
//! launch; the output head too), as the CPU fast path and llama.cpp
//! quantize activations. Formats without a device kernel are dequantized
//! to F32 at upload.
//!
//! Where things are: this module is the API (options, [`CudaDecoder`]:
//! build, step, position, routes, counters). `stages` turns the
//! architecture's stages into ops (`Op`, the `TokenStages` builder);
//! one module per op family with its struct, its builder and its run
//! (`attn`, `gdn`, `moe`, `ffn`: dense layers and shared experts);
//! `proj` the uploads and stacked projections; `fusion` the build-time
//! passes; `capture` the graph recording and the profile; `files` the
//! misses the host serves from the model file. The switches are
//! [`CudaTuning`] (`crate::tuning`).

mod attn;
mod capture;
mod chunk_bufs;
mod embed_rows;
mod ffn;
mod files;
mod fusion;
mod gdn;
mod moe;
mod prefill;
mod prefill_moe;
mod prefill_profile;
mod proj;
mod stages;

use crate::device::Gpu;
use crate::error::{ensure, Context, Result};
use crate::expert_cache::{read_counters, CacheCounters, HostExperts};
use crate::gemv::Q8Vec;
use crate::ops::KvType;
pub use crate::tuning::CudaTuning;
use cudarc::driver::{CudaGraph, CudaSlice};
use fusion::{fuse_norms, fuse_router_norms};
use proj::q8vec;
use redlite_model::weights::Weight;
use redlite_model::Model;
use stages::{Builder, Op};

/// The activations every op reads or writes.
struct Bufs {
    /// The residual stream.
    x: CudaSlice<f32>,
    /// The normed input of the next block.
    h: CudaSlice<f32>,
    /// The mixer output.
    mix: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// The position of the token being run, and the token counter the
    /// expert cache stamps its slots with (two i32).
    pos: CudaSlice<i32>,
    /// `h` quantized for the int8 kernels (int8 mode).
    hq: Option<Q8Vec>,
    /// Expert cache counters, 4 u64 per MoE layer.
    counters: CudaSlice<u64>,
}

/// Options of the device decoder.
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// Positions the KV caches hold.
    pub ctx: usize,
    /// Slices of the split attention (None: about two blocks per SM).
    pub nsplit: Option<usize>,
    /// int8 activations for the formats with int8 kernels (faster; the
    /// CPU fast path's kind of rounding instead of the reference path's).
    pub int8: bool,
    /// Element type of the KV caches (`KvType::default_for(int8)`: f16 in
    /// int8 mode, f32 in f32 mode).
    pub kv_type: KvType,
    /// A bounded expert cache (None: every expert resident).
    pub expert_cache: Option<ExpertCacheOptions>,
    /// The tuning switches (GEMV configurations, ablation).
    pub tuning: CudaTuning,
    /// Prompt tokens per batched-prefill chunk (`prefill`); 0: prompts
    /// run token by token.
    pub prefill_chunk: usize,
}

/// Where one decode token's GPU time goes ([`CudaDecoder::profile`]).
#[derive(Clone, Debug)]
pub struct TokenProfile {
    /// (kernel class, µs per token, kernels per token), in first-seen order.
    pub rows: Vec<(&'static str, f64, usize)>,
    /// The profiled graph's token, first event to last (µs).
    pub total_us: f64,
    /// The same token through the plain graph (µs).
    pub plain_us: f64,
}

/// The bounded device expert cache ([`crate::expert_cache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCacheOptions {
    /// Slots per MoE layer (at least the experts a token uses; at or above
    /// the layer's expert count the layer is fully resident).
    pub slots_per_layer: usize,
    /// Prefetch the next layer's experts chosen by its router on this
    /// layer's input.
    pub pregate: bool,
    /// Thread blocks of the copy of a routed miss (on the critical path;
    /// 0: one per SM), and of a prefetch (beside compute: fewer, so
    /// compute keeps the SMs).
    pub fetch_blocks: u32,
    pub prefetch_blocks: u32,
    /// Misses read from the model file by the host (through the page
    /// cache) instead of every expert kept in pinned host memory: for
    /// hosts whose RAM cannot hold the experts. The token's graph is then
    /// cut after each MoE layer's plan so the host can serve the misses;
    /// no pre-gating.
    pub from_file: bool,
    /// Device bytes the memory plan set aside for the batched prefill
    /// under this cache (its staging images and chunk scratch: the chunk
    /// is fitted to it); `u64::MAX`: no plan, the requested chunk; too
    /// little for the staging: prompts run token by token.
    pub prefill_bytes: u64,
}

impl ExpertCacheOptions {
    pub fn new(slots_per_layer: usize) -> Self {
        Self {
            slots_per_layer,
            pregate: true,
            fetch_blocks: 0,
            prefetch_blocks: 16,
            from_file: false,
            prefill_bytes: u64::MAX,
        }
    }
}

/// Borrowed state buffers of a [`CudaDecoder`] (see `state_buffers`).
pub(crate) struct StateBuffers<'a> {
    pub gpu: &'a Gpu,
    pub ctx: usize,
    pub pos: &'a mut usize,
    pub kv: Vec<&'a mut crate::ops::KvCache>,
    pub gdn: Vec<(&'a mut CudaSlice<f32>, &'a mut CudaSlice<f32>)>,
}

/// One sequence decoded on the GPU, a token per graph replay.
pub struct CudaDecoder {
    gpu: Gpu,
    ops: Vec<Op>,
    bufs: Bufs,
    /// The token's graphs: one, or with experts read from the file one per
    /// MoE layer plus one, the host serving misses between them.
    graphs: Vec<CudaGraph>,
    /// After graph i, the op whose misses the host serves.
    host_points: Vec<usize>,
    /// Staging sets of the file-read misses.
    staging: Vec<[HostExperts; 3]>,
    embd: Weight,
    row: Vec<f32>,
    pos: usize,
    ctx: usize,
    /// Tokens run (the expert cache's clock; never reset).
    tick: u32,
    /// The stream pre-gating prefetches run on (a branch of the graph).
    side: Gpu,
    /// The stream shared experts run on (another branch).
    shared_side: Gpu,
    cache: Option<ExpertCacheOptions>,
    tuning: CudaTuning,
    prefill_chunk: usize,
    /// Device bytes of the uploaded weights and state.
    pub device_bytes: usize,
    /// Scratch of the batched prefill (allocated by the first prompt).
    chunk: Option<prefill::ChunkBufs>,
    /// The batched prefill's staging images under a bounded cache.
    prefill_staging: Option<prefill_moe::Staging>,
}

impl CudaDecoder {
    /// Upload `model`'s weights, allocate the state for `opts.ctx`
    /// positions and capture one token's graph.
    pub fn new(gpu: Gpu, model: &Model, opts: &DecoderOptions) -> Result<Self> {
        ensure!(
            opts.ctx >= 1 && opts.ctx <= i32::MAX as usize,
            "context size"
        );
        opts.tuning.check()?;
        gpu.ctx.bind_to_thread()?;
        let (free0, _) = cudarc::driver::result::mem_get_info()?;
        let mut b = Builder {
            gpu: &gpu,
            file: model.file(),
            ctx: opts.ctx,
            nsplit: opts.nsplit,
            int8: opts.int8,
            kv: opts.kv_type,
            cache: opts.expert_cache,
            n_moe: 0,
            staging: Vec::new(),
            ops: Vec::new(),
            embd: None,
            n_vocab: 0,
        };
        if let Some(c) = opts.expert_cache {
            ensure!(c.slots_per_layer >= 1, "expert cache: no slots");
        }
        model.arch().decode_stages(&mut b)?;
        let n_moe = b.n_moe;
        let staging: Vec<[HostExperts; 3]> = b.staging.into_iter().map(|(_, s)| s).collect();
        let (embd, n_vocab) = (b.embd, b.n_vocab);
        let embd = embd.context("the stages never embedded the token")?;
        let d = embd.cols();
        let ops = fuse_router_norms(fuse_norms(b.ops), d);
        let bufs = Bufs {
            x: gpu.stream.alloc_zeros(d)?,
            h: gpu.stream.alloc_zeros(d)?,
            mix: gpu.stream.alloc_zeros(d)?,
            logits: gpu.stream.alloc_zeros(n_vocab)?,
            pos: gpu.stream.alloc_zeros(2)?,
            hq: q8vec(&gpu, opts.int8, d)?,
            counters: gpu.stream.alloc_zeros(4 * n_moe.max(1))?,
        };
        gpu.sync()?;
        let side = gpu.side()?;
        let shared_side = gpu.side()?;
        let (free1, _) = cudarc::driver::result::mem_get_info()?;
        let mut dec = Self {
            gpu,
            ops,
            bufs,
            graphs: Vec::new(),
            host_points: Vec::new(),
            staging,
            row: vec![0f32; d],
            embd,
            pos: 0,
            ctx: opts.ctx,
            tick: 0,
            side,
            shared_side,
            cache: opts.expert_cache,
            tuning: opts.tuning.clone(),
            prefill_chunk: opts.prefill_chunk,
            device_bytes: free0.saturating_sub(free1),
            chunk: None,
            prefill_staging: None,
        };
        dec.capture()?;
        dec.alloc_prefill_scratch()?;
        Ok(dec)
    }

    /// Write `token`'s embedding row, the position and the token counter
    /// (the inputs every graph reads).
    fn write_token(&mut self, model: &Model, token: u32) -> Result<()> {
        ensure!(
            self.pos < self.ctx,
            "context of {} positions is full",
            self.ctx
        );
        let m = self.embd.matrix(model.file())?;
        ensure!(
            (token as usize) < m.rows,
            "token {token} outside the vocabulary"
        );
        m.dequantize_row(token as usize, &mut self.row)?;
        self.tick = self.tick.checked_add(1).context("token counter overflow")?;
        ensure!(self.tick <= i32::MAX as u32, "token counter overflow");
        let gpu = &self.gpu;
        gpu.stream.memcpy_htod(&self.row, &mut self.bufs.x)?;
        gpu.stream
            .memcpy_htod(&[self.pos as i32, self.tick as i32], &mut self.bufs.pos)?;
        Ok(())
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Kernel launches per token.
    pub fn n_ops(&self) -> usize {
        self.ops.len()
    }

    /// Positions run so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Positions the state holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// The sequence state's device buffers, in layer order: each attention
    /// layer's KV cache (`ctx` rows) and each DeltaNet layer's conv window
    /// and recurrent state. For checkpoints (`crate::sequence`); the
    /// graph keeps reading these same buffers.
    pub(crate) fn state_buffers(&mut self) -> StateBuffers<'_> {
        let mut kv = Vec::new();
        let mut gdn = Vec::new();
        for op in &mut self.ops {
            match op {
                Op::Attn(a) => kv.push(&mut a.kv),
                Op::Gdn(g) => gdn.push((&mut g.ring, &mut g.state)),
                _ => {}
            }
        }
        StateBuffers {
            gpu: &self.gpu,
            ctx: self.ctx,
            pos: &mut self.pos,
            kv,
            gdn,
        }
    }

    /// The shapes of the state [`state_buffers`](Self::state_buffers)
    /// returns, without borrowing it mutably: attention layers, and each
    /// DeltaNet layer's dimensions (conv kernel and channels size its
    /// window ring), in layer order.
    pub(crate) fn state_shapes(&self) -> (usize, Vec<crate::ops::GdnDims>) {
        let mut n_attn = 0;
        let mut gdn = Vec::new();
        for op in &self.ops {
            match op {
                Op::Attn(_) => n_attn += 1,
                Op::Gdn(g) => gdn.push(g.dims),
                _ => {}
            }
        }
        (n_attn, gdn)
    }

    /// Jump to position `pos` without running the tokens before it (the
    /// caches keep whatever they hold): for timing decode at a depth.
    pub fn set_pos(&mut self, pos: usize) -> Result<()> {
        ensure!(
            pos < self.ctx,
            "position {pos} outside the context of {}",
            self.ctx
        );
        self.pos = pos;
        Ok(())
    }

    /// Forget the sequence: position 0, zero DeltaNet windows and states
    /// (KV rows are overwritten before they are read).
    pub fn reset(&mut self) -> Result<()> {
        for op in &mut self.ops {
            if let Op::Gdn(g) = op {
                self.gpu.stream.memset_zeros(&mut g.ring)?;
                self.gpu.stream.memset_zeros(&mut g.state)?;
            }
        }
        self.gpu.sync()?;
        self.pos = 0;
        Ok(())
    }

    /// The experts the last token chose, per MoE layer in layer order
    /// (ascending ids, as the router kernel writes them).
    pub fn routes(&self) -> Result<Vec<Vec<u32>>> {
        self.gpu.sync()?;
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Moe(m) => Some(&m.experts),
                _ => None,
            })
            .map(|e| Ok(self.gpu.stream.clone_dtoh(e)?))
            .collect()
    }

    /// Expert cache counters per MoE layer since the decoder was built
    /// (None without a cache).
    pub fn cache_counters(&self) -> Result<Option<Vec<CacheCounters>>> {
        if self.cache.is_none() {
            return Ok(None);
        }
        Ok(Some(read_counters(&self.gpu, &self.bufs.counters)?))
    }

    /// Bytes of one expert (gate + up + down slot images) per MoE layer,
    /// in layer order: what one fetch copies.
    pub fn expert_bytes(&self) -> Vec<usize> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Moe(m) => Some(m.x.gate.stride + m.x.up.stride + m.x.down.stride),
                _ => None,
            })
            .collect()
    }

    /// Total expert cache counters and the bytes copied over PCIe: the
    /// decode's (graph steps) plus the batched prefill's, whose distinct
    /// experts per (chunk, MoE layer) count as hits when read from a slot
    /// and as misses when uploaded into the staging image (those uploaded
    /// ahead as prefetches too).
    pub fn cache_totals(&self) -> Result<Option<(CacheCounters, u64)>> {
        let Some(per) = self.cache_counters()? else {
            return Ok(None);
        };
        let mut t = CacheCounters::default();
        let mut bytes = 0u64;
        for (c, b) in per.iter().zip(self.expert_bytes()) {
            t.add(c);
            bytes += c.fetched() * b as u64;
        }
        let p = self.prefill_uploads();
        t.add(&CacheCounters {
            hits: p.resident,
            misses: p.uploaded - p.ahead,
            prefetched: p.ahead,
            prefetch_used: p.ahead_used,
        });
        Ok(Some((t, bytes + p.bytes)))
    }

    /// Run `token` at the current position; returns the logits.
    pub fn step(&mut self, model: &Model, token: u32) -> Result<Vec<f32>> {
        self.launch(model, token)?;
        self.gpu.sync()?;
        Ok(self.gpu.stream.clone_dtoh(&self.bufs.logits)?)
    }

    /// Run `token` without reading the logits back (they stay on the
    /// device; the host waits for the token). For timing.
    pub fn step_no_logits(&mut self, model: &Model, token: u32) -> Result<()> {
        self.launch(model, token)?;
        self.gpu.sync()
    }

    fn launch(&mut self, model: &Model, token: u32) -> Result<()> {
        self.write_token(model, token)?;
        for g in 0..self.graphs.len() {
            self.graphs[g].launch()?;
            if let Some(&i) = self.host_points.get(g) {
                self.serve_misses(i, model)?;
            }
        }
        self.pos += 1;
        Ok(())
    }
}
