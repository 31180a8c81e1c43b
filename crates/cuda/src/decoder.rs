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

use crate::device::Gpu;
use crate::error::{bail, ensure, Context, CudaError, Result};
use crate::expert_cache::{read_counters, CacheCounters, HostExperts, HostSet, LayerCache};
use crate::gemv::{expert_image, DeviceMatrix, ExpertStack, Q8Vec, DEFAULT_NR, Q8_TYPES};
use crate::ops::{self, AttnDims, AttnScratch, GdnDims, GdnWeights, KvCache, KvType};
pub use crate::tuning::CudaTuning;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice};
use rayon::prelude::*;
use redlite_gguf::GgmlType;
use redlite_gguf::GgufFile;
use redlite_model::blocks::attention::{AttnParams, AttnWeights};
use redlite_model::blocks::deltanet::{DeltaNetParams, DeltaNetWeights, InProj, L2_EPS};
use redlite_model::blocks::moe::{DenseFfn, ExpertsGateUp, MoeWeights};
use redlite_model::stages::TokenStages;
use redlite_model::weights::Weight;
use redlite_model::{Model, ModelError};
use std::sync::Arc;

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

/// What recording the graph needs besides the buffers: the side stream
/// that prefetches, the event of the prefetch the next MoE layer must
/// wait for, and every event recorded (alive until the graph is built).
struct Capture<'a> {
    side: &'a Gpu,
    /// The stream a MoE layer's shared expert runs on: a branch of the
    /// graph beside the router, top-k and routed experts (it needs only
    /// h), joined before the combine.
    shared: &'a Gpu,
    pending: Option<CudaEvent>,
    events: Vec<CudaEvent>,
    /// Profiling: a timing event recorded before each kernel class, with
    /// its label and the launch count at that point.
    marks: Option<Vec<(CudaEvent, &'static str, usize)>>,
    /// The GEMV configurations.
    tuning: &'a CudaTuning,
    /// Ablation (timing only): kernel classes whose launches are left out
    /// of the graph, by label substring ([`CudaTuning::ablate`]).
    ablate: &'a [String],
}

impl Capture<'_> {
    /// What runs from here until the next mark is kernel class `label`:
    /// timed when profiling, left out when ablated.
    fn mark(&mut self, gpu: &Gpu, label: &'static str) -> Result<()> {
        gpu.set_suppressed(self.ablate.iter().any(|a| label.contains(a.as_str())));
        if let Some(m) = &mut self.marks {
            let ev = gpu
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            // Recorded as an external event: inside a stream capture a
            // plain record only orders work within the capture, the
            // external flag makes it an event record node that timestamps.
            // SAFETY: both handles are live objects of this context (the
            // event is kept in `marks` until the graph is done with).
            unsafe {
                cudarc::driver::sys::cuEventRecordWithFlags(
                    ev.cu_event(),
                    gpu.stream.cu_stream(),
                    cudarc::driver::sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
                )
            }
            .result()?;
            m.push((ev, label, gpu.launch_count()));
        }
        Ok(())
    }
}

/// `y = W x`, through the int8 kernel when `xq` is given and W's format has
/// one.
fn mv(
    gpu: &Gpu,
    t: &CudaTuning,
    m: &DeviceMatrix,
    x: &CudaSlice<f32>,
    xq: Option<&Q8Vec>,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    match xq {
        Some(q) if Q8_TYPES.contains(&m.layout.ty) && q.n >= m.cols => {
            m.gemv_q8(gpu, q, y, t.q8_config(&m.layout, m.cols)?)
        }
        _ if m.layout.ty == GgmlType::F32 => m.gemv(gpu, x, y, t.f32_gemv),
        _ => m.gemv(gpu, x, y, DEFAULT_NR),
    }
}

/// Room for `n` int8 activations when `on` (and `n` is whole blocks of 32).
fn q8vec(gpu: &Gpu, on: bool, n: usize) -> Result<Option<Q8Vec>> {
    if on && n.is_multiple_of(32) {
        Ok(Some(Q8Vec::new(gpu, n)?))
    } else {
        Ok(None)
    }
}

fn quantize(gpu: &Gpu, q: &mut Option<Q8Vec>, x: &CudaSlice<f32>) -> Result<()> {
    if let Some(q) = q {
        q.quantize(gpu, x)?;
    }
    Ok(())
}

/// Several projections of one input (q|k|v; qkv|z|ba; router|shared
/// gate). Consecutive ones of one format and width are uploaded as one
/// matrix (their rows stacked) and run as one GEMV, so a layer launches
/// fewer kernels; part i's output is `part(i)`.
struct Proj {
    groups: Vec<(DeviceMatrix, CudaSlice<f32>)>,
    /// Per part: (group, offset in the group's output).
    at: Vec<(usize, usize)>,
}

impl Proj {
    fn new(gpu: &Gpu, f: &GgufFile, parts: &[&Weight]) -> Result<Self> {
        let mut groups: Vec<Vec<&Weight>> = Vec::new();
        for w in parts {
            match groups.last_mut() {
                Some(g) if g[0].ty == w.ty && g[0].cols() == w.cols() => g.push(w),
                _ => groups.push(vec![w]),
            }
        }
        let (mut out, mut at) = (Vec::new(), Vec::new());
        for (gi, g) in groups.iter().enumerate() {
            let rows: usize = g.iter().map(|w| w.rows()).sum();
            let bytes: Vec<u8> = g.iter().flat_map(|w| w.bytes(f).iter().copied()).collect();
            let names: Vec<&str> = g.iter().map(|w| w.name.as_str()).collect();
            let m = DeviceMatrix::from_gguf(gpu, g[0].ty, rows, g[0].cols(), &bytes)
                .with_context(|| format!("uploading {}", names.join(" + ")))?;
            let mut off = 0;
            for w in g {
                at.push((gi, off));
                off += w.rows();
            }
            out.push((m, gpu.stream.alloc_zeros(rows)?));
        }
        Ok(Self { groups: out, at })
    }

    fn part(&self, i: usize) -> (&CudaSlice<f32>, usize) {
        let (g, off) = self.at[i];
        (&self.groups[g].1, off)
    }

    fn run(
        &mut self,
        gpu: &Gpu,
        t: &CudaTuning,
        x: &CudaSlice<f32>,
        xq: Option<&Q8Vec>,
    ) -> Result<()> {
        for (m, y) in &mut self.groups {
            mv(gpu, t, m, x, xq, y)?;
        }
        Ok(())
    }
}

struct AttnOp {
    dims: AttnDims,
    /// q_full | k | v.
    qkv: Proj,
    wo: DeviceMatrix,
    norms: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    inv_freq: CudaSlice<f64>,
    scale: f32,
    eps: f32,
    q: CudaSlice<f32>,
    o: CudaSlice<f32>,
    oq: Option<Q8Vec>,
    kv: KvCache,
    scratch: AttnScratch,
}

struct GdnOp {
    dims: GdnDims,
    /// qkv | z | ba.
    inp: Proj,
    w_out: DeviceMatrix,
    conv_w: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    ssm_a: CudaSlice<f32>,
    norm_w: CudaSlice<f32>,
    eps: f32,
    o: CudaSlice<f32>,
    oq: Option<Q8Vec>,
    ring: CudaSlice<f32>,
    state: CudaSlice<f32>,
}

struct FfnOp {
    gate: DeviceMatrix,
    up: DeviceMatrix,
    down: DeviceMatrix,
    g: CudaSlice<f32>,
    u: CudaSlice<f32>,
    gq: Option<Q8Vec>,
    /// int8 mode: gate|up in one launch.
    gu: Option<CudaSlice<f32>>,
    out: CudaSlice<f32>,
}

/// A layer's routed experts: slot stacks, and the cache that fills them
/// when the slots are fewer than the experts.
struct LayerExperts {
    gate: ExpertStack,
    up: ExpertStack,
    down: ExpertStack,
    cache: Option<LayerCache>,
    /// MoE layer index (counters).
    moe_index: usize,
    n_expert: usize,
    k: usize,
    norm_topk: bool,
}

/// Pre-gating: the next MoE layer's router applied to this layer's input
/// (its logits are one more part of this layer's router projection), its
/// top-k prefetched on the side stream.
struct Prefetch {
    next: Arc<LayerExperts>,
    part: usize,
    experts: CudaSlice<u32>,
    w: CudaSlice<f32>,
    slots: CudaSlice<u32>,
}

/// One projection of a layer's experts in the model file.
struct FilePart {
    w: Weight,
    rows_total: usize,
    row0: usize,
    rows: usize,
    n: usize,
    stride: usize,
}

/// A layer's experts in the file, and the staging buffers its misses go
/// through (an index into the decoder's staging sets).
struct FileExperts {
    parts: [FilePart; 3],
    staging: usize,
}

struct MoeOp {
    /// router logits | shared-expert gate logit (when there is one) | the
    /// next MoE layer's router logits (pre-gating).
    router: Proj,
    /// The weights of the parts of `router` (to restack it).
    router_parts: Vec<Weight>,
    x: Arc<LayerExperts>,
    prefetch: Option<Prefetch>,
    /// With misses read from the file: where the experts lie in it.
    file: Option<FileExperts>,
    fetch_blocks: (u32, u32),
    slots: CudaSlice<u32>,
    experts: CudaSlice<u32>,
    w: CudaSlice<f32>,
    yg: CudaSlice<f32>,
    yu: CudaSlice<f32>,
    yd: CudaSlice<f32>,
    /// int8 mode: gate|up of the routed experts in one launch, and the
    /// quantized SwiGLU output for down.
    ygu: Option<CudaSlice<f32>>,
    actq: Option<Q8Vec>,
    shared: Option<FfnOp>,
    has_shared_gate: bool,
    /// `router_gemv_topk`'s counter of finished blocks (0 between launches).
    topk_counter: CudaSlice<u32>,
    /// Whether the router GEMV and the top-k run as one launch
    /// (`router_gemv_topk`, where the router is an F32 matrix it takes:
    /// +1.4% decode on the H200 against the two launches, docs/cuda.md);
    /// otherwise the router GEMV, then `router_topk`.
    fused_router: bool,
    /// The post-mixer RMSNorm (weights, eps) computed inside the fused
    /// router launch ([`fuse_router_norms`]); the combine then adds the
    /// mixer's output to the residual.
    in_norm: Option<(CudaSlice<f32>, f32)>,
    /// The next stage's RMSNorm (weights, eps, whether h is also wanted as
    /// int8), fused into the combine: one launch instead of two.
    next_norm: Option<(CudaSlice<f32>, f32, bool)>,
}

/// Which part of an op to record: all of it, or (MoE) the half before
/// the host serves cache misses from the file, or the half after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    All,
    Head,
    Tail,
}

/// One recorded stage.
enum Op {
    Norm {
        w: CudaSlice<f32>,
        eps: f32,
        add_mix: bool,
    },
    Attn(Box<AttnOp>),
    Gdn(Box<GdnOp>),
    Moe(Box<MoeOp>),
    Dense(Box<FfnOp>),
    Head {
        /// None: the previous MoE op already wrote the normed h.
        norm: Option<CudaSlice<f32>>,
        eps: f32,
        w: DeviceMatrix,
    },
}

/// Fold each Norm (without a residual add) or Head norm that follows a MoE
/// op into that op's combine.
fn fuse_norms(ops: Vec<Op>) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops {
        let prev = match out.last_mut() {
            Some(Op::Moe(m)) if m.next_norm.is_none() => Some(m),
            _ => None,
        };
        match (prev, op) {
            (
                Some(m),
                Op::Norm {
                    w,
                    eps,
                    add_mix: false,
                },
            ) => m.next_norm = Some((w, eps, true)),
            (
                Some(m),
                Op::Head {
                    norm: Some(n),
                    eps,
                    w,
                },
            ) => {
                // h is quantized for the head only where the head has an
                // int8 kernel (and only in int8 mode: otherwise there is
                // no hq to write into).
                m.next_norm = Some((n, eps, head_int8(&w)));
                out.push(Op::Head { norm: None, eps, w });
            }
            (_, op) => out.push(op),
        }
    }
    out
}

/// Fold each post-mixer Norm (with the residual add) into the fused
/// router launch of the MoE op after it, where that launch runs and its
/// combine takes the deferred residual add (the fused next norm, d % 8 ==
/// 0, d <= 4096): one launch fewer per layer (+1.4% decode on the H200
/// against the norm as its own launch, docs/cuda.md).
fn fuse_router_norms(ops: Vec<Op>, d: usize) -> Vec<Op> {
    let fits = |m: &MoeOp| {
        m.fused_router
            && m.next_norm.is_some()
            && ops::v8_block(d).is_some()
            && ops::router_in_norm_fits(d, m.x.n_expert)
    };
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    let mut pending: Option<Op> = None;
    for op in ops {
        match (pending.take(), op) {
            (
                Some(Op::Norm {
                    w,
                    eps,
                    add_mix: true,
                }),
                Op::Moe(mut m),
            ) if fits(&m) => {
                m.in_norm = Some((w, eps));
                out.push(Op::Moe(m));
            }
            (p, op) => {
                out.extend(p);
                if matches!(op, Op::Norm { add_mix: true, .. }) {
                    pending = Some(op);
                } else {
                    out.push(op);
                }
            }
        }
    }
    out.extend(pending);
    out
}

impl FfnOp {
    fn new(gpu: &Gpu, f: &GgufFile, w: &DenseFfn, int8: bool) -> Result<Self> {
        let gate = upload(gpu, f, &w.gate)?;
        let up = upload(gpu, f, &w.up)?;
        let down = upload(gpu, f, &w.down)?;
        Ok(Self {
            g: gpu.stream.alloc_zeros(gate.rows)?,
            u: gpu.stream.alloc_zeros(up.rows)?,
            out: gpu.stream.alloc_zeros(down.rows)?,
            gq: q8vec(gpu, int8, gate.rows)?,
            gu: if int8
                && Q8_TYPES.contains(&gate.layout.ty)
                && gate.layout == up.layout
                && (gate.rows, gate.cols) == (up.rows, up.cols)
            {
                Some(gpu.stream.alloc_zeros(2 * gate.rows)?)
            } else {
                None
            },
            gate,
            up,
            down,
        })
    }

    /// `out = down(SiLU(gate h) * up h)`.
    fn run(
        &mut self,
        gpu: &Gpu,
        t: &CudaTuning,
        h: &CudaSlice<f32>,
        hq: Option<&Q8Vec>,
    ) -> Result<()> {
        let ff = self.gate.rows;
        match (&mut self.gu, hq) {
            (Some(gu), Some(hq)) if hq.n >= self.gate.cols => {
                let v = t.q8_config(&self.gate.layout, self.gate.cols)?;
                self.gate.gemv_q8_pair(&self.up, gpu, hq, gu, v)?;
                ops::swiglu(gpu, (gu, 0), (gu, ff), &self.g, self.gq.as_ref(), ff)?;
            }
            _ => {
                mv(gpu, t, &self.gate, h, hq, &mut self.g)?;
                mv(gpu, t, &self.up, h, hq, &mut self.u)?;
                ops::swiglu(gpu, (&self.g, 0), (&self.u, 0), &self.g, None, ff)?;
                quantize(gpu, &mut self.gq, &self.g)?;
            }
        }
        mv(gpu, t, &self.down, &self.g, self.gq.as_ref(), &mut self.out)
    }
}

impl MoeOp {
    /// Record the shared expert on its own stream, forked from the main
    /// one here (h is ready); the event to join it on. A branch of the
    /// graph beside the router and routed experts: 5.9 µs a layer faster
    /// on the H200 than in the main chain (docs/what-did-not-work.md).
    fn fork_shared(&mut self, gpu: &Gpu, b: &Bufs, cap: &mut Capture) -> Result<Option<CudaEvent>> {
        let Some(s) = &mut self.shared else {
            return Ok(None);
        };
        let side = cap.shared;
        let ev = gpu.stream.record_event(None)?;
        side.stream.wait(&ev)?;
        cap.events.push(ev);
        s.run(side, cap.tuning, &b.h, b.hq.as_ref())?;
        Ok(Some(side.stream.record_event(None)?))
    }

    /// The first half of the MoE op: router (and the next layer's
    /// pre-gating logits), the prefetch branch, top-k, and the cache plan of
    /// the routed experts. What follows the plan (the fetch of its misses,
    /// the expert GEMVs, the combine) is the second half; with experts read
    /// from the file the host serves the misses between the two.
    fn head(
        &mut self,
        gpu: &Gpu,
        b: &Bufs,
        cap: &mut Capture,
        x: &Arc<LayerExperts>,
    ) -> Result<()> {
        let m = self;
        let hq = b.hq.as_ref();
        let route = ops::Route {
            n: x.n_expert,
            k: x.k,
            norm: x.norm_topk,
        };
        // The router's part 0 starts its group's matrix (Proj stacks parts
        // in order), so the fused kernel's logits[0..n) are the router's.
        // (Pre-gating may restack the router later, behind part 0: still
        // an F32 group 0 that router_gemv_topk takes; it checks again.)
        let fused = m.fused_router;
        if fused {
            cap.mark(
                gpu,
                if m.in_norm.is_some() {
                    "MoE: RMSNorm + router GEMV + top-k (+ shared-expert gate, pre-gating)"
                } else {
                    "MoE: router GEMV + top-k (+ shared-expert gate, pre-gating)"
                },
            )?;
            let (mat, logits) = &m.router.groups[0];
            let in_norm = m.in_norm.as_ref().map(|(w, eps)| ops::InNorm {
                resid: &b.x,
                mix: &b.mix,
                w,
                eps: *eps,
                q8: hq,
            });
            ops::router_gemv_topk(
                gpu,
                mat,
                &b.h,
                in_norm,
                logits,
                &m.topk_counter,
                route,
                &m.slots,
                &m.experts,
                &m.w,
            )?;
            for (mat, y) in m.router.groups.iter_mut().skip(1) {
                mv(gpu, cap.tuning, mat, &b.h, hq, y)?;
            }
        } else {
            cap.mark(gpu, "MoE: router (+ shared-expert gate, pre-gating) GEMV")?;
            m.router.run(gpu, cap.tuning, &b.h, hq)?;
        }
        // The previous layer's prefetch into this layer's slots.
        let wait = cap.pending.take();
        if let Some(p) = &m.prefetch {
            let side = cap.side;
            let ev = gpu.stream.record_event(None)?;
            side.stream.wait(&ev)?;
            cap.events.push(ev);
            let nx = &p.next;
            ops::router_topk(
                side,
                m.router.part(p.part),
                nx.n_expert,
                nx.k,
                nx.norm_topk,
                None,
                &p.slots,
                &p.experts,
                &p.w,
            )?;
            let c = nx
                .cache
                .as_ref()
                .context("prefetch into a layer without a cache")?;
            c.plan(
                side,
                &p.experts,
                nx.k,
                &b.pos,
                true,
                &p.slots,
                (&b.counters, 4 * nx.moe_index),
            )?;
            c.fetch(side, true, [&nx.gate, &nx.up, &nx.down], m.fetch_blocks.1)?;
            cap.pending = Some(side.stream.record_event(None)?);
        }
        if !fused {
            cap.mark(gpu, "MoE: top-k (+ cache plan)")?;
            ops::router_topk(
                gpu,
                m.router.part(0),
                x.n_expert,
                x.k,
                x.norm_topk,
                None,
                &m.slots,
                &m.experts,
                &m.w,
            )?;
        } else if x.cache.is_some() {
            cap.mark(gpu, "MoE: cache plan")?;
        }
        if let Some(c) = &x.cache {
            if let Some(ev) = wait {
                gpu.stream.wait(&ev)?;
                cap.events.push(ev);
            }
            c.plan(
                gpu,
                &m.experts,
                x.k,
                &b.pos,
                false,
                &m.slots,
                (&b.counters, 4 * x.moe_index),
            )?;
        }
        Ok(())
    }
}

impl Op {
    fn run(&mut self, gpu: &Gpu, b: &mut Bufs, cap: &mut Capture, phase: Phase) -> Result<()> {
        let d = b.x.len();
        ensure!(
            phase == Phase::All || matches!(self, Op::Moe(_)),
            "only a MoE op runs in two halves"
        );
        match self {
            Op::Norm { w, eps, add_mix } => {
                cap.mark(gpu, "RMSNorm (+ residual add)")?;
                let res = add_mix.then_some(&b.mix);
                ops::rms_norm(
                    gpu,
                    &b.x,
                    res,
                    w,
                    Some(&b.h),
                    b.hq.as_ref(),
                    1,
                    d,
                    *eps,
                    false,
                )
            }
            Op::Attn(a) => {
                cap.mark(gpu, "attention: q|k|v GEMV")?;
                a.qkv.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
                cap.mark(
                    gpu,
                    "attention: q/k norm + RoPE + KV append, split-K attention, merge",
                )?;
                let norms = a.norms.as_ref().map(|(q, k)| (q, k));
                let (qf, k, v) = (a.qkv.part(0), a.qkv.part(1), a.qkv.part(2));
                ops::attn_prep(
                    gpu,
                    &a.dims,
                    qf,
                    k,
                    v,
                    norms,
                    &a.inv_freq,
                    &b.pos,
                    &a.q,
                    &a.kv,
                    a.eps,
                )?;
                let gate = a.dims.gated.then_some(qf);
                ops::attention(
                    gpu,
                    &a.dims,
                    &a.q,
                    &a.kv,
                    &b.pos,
                    &a.scratch,
                    gate,
                    &a.o,
                    a.oq.as_ref(),
                    a.scale,
                )?;
                cap.mark(gpu, "attention: output GEMV")?;
                mv(gpu, cap.tuning, &a.wo, &a.o, a.oq.as_ref(), &mut b.mix)
            }
            Op::Gdn(g) => {
                cap.mark(gpu, "DeltaNet: qkv|z|ba GEMV")?;
                g.inp.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
                cap.mark(
                    gpu,
                    "DeltaNet: fused step (conv, norms, gates, state, gated norm)",
                )?;
                let w = GdnWeights {
                    conv_w: &g.conv_w,
                    dt_bias: &g.dt_bias,
                    ssm_a: &g.ssm_a,
                    norm_w: &g.norm_w,
                };
                ops::gdn_step(
                    gpu,
                    &g.dims,
                    &w,
                    g.inp.part(0),
                    g.inp.part(1),
                    g.inp.part(2),
                    &g.ring,
                    &g.state,
                    &g.o,
                    g.oq.as_ref(),
                    &b.pos,
                    g.eps,
                    L2_EPS,
                )?;
                cap.mark(gpu, "DeltaNet: output GEMV")?;
                mv(gpu, cap.tuning, &g.w_out, &g.o, g.oq.as_ref(), &mut b.mix)
            }
            Op::Moe(m) => {
                let hq = b.hq.as_ref();
                let x = m.x.clone();
                // The shared expert's branch forks and joins within one
                // graph: here with the whole op, in the tail when the
                // graph is cut after the plan.
                // With the input norm in the router launch, h is ready
                // only after it.
                let mut shared_done = None;
                if phase == Phase::All && m.in_norm.is_none() {
                    shared_done = m.fork_shared(gpu, b, cap)?;
                }
                if phase != Phase::Tail {
                    m.head(gpu, b, cap, &x)?;
                }
                if phase == Phase::All && m.in_norm.is_some() {
                    shared_done = m.fork_shared(gpu, b, cap)?;
                }
                if phase == Phase::Head {
                    return Ok(());
                }
                if phase == Phase::Tail {
                    shared_done = m.fork_shared(gpu, b, cap)?;
                }
                if let Some(c) = &x.cache {
                    cap.mark(gpu, "MoE: cache fetch of misses")?;
                    c.fetch(gpu, false, [&x.gate, &x.up, &x.down], m.fetch_blocks.0)?;
                }
                cap.mark(gpu, "MoE: routed experts gate|up GEMV")?;
                let k = x.k;
                let ff = x.gate.rows;
                let kf = k * ff;
                match (&mut m.ygu, hq) {
                    (Some(ygu), Some(hq)) => {
                        let v = cap.tuning.q8_config(&x.gate.layout, x.gate.cols)?;
                        ExpertStack::gemv_gate_up_q8(&x.gate, &x.up, gpu, &m.slots, k, hq, ygu, v)?;
                        cap.mark(gpu, "MoE: routed experts SwiGLU")?;
                        ops::swiglu(gpu, (ygu, 0), (ygu, kf), &m.yg, m.actq.as_ref(), kf)?;
                    }
                    _ => {
                        x.gate
                            .gemv(gpu, &m.slots, k, &b.h, 0, &mut m.yg, DEFAULT_NR)?;
                        x.up.gemv(gpu, &m.slots, k, &b.h, 0, &mut m.yu, DEFAULT_NR)?;
                        cap.mark(gpu, "MoE: routed experts SwiGLU")?;
                        ops::swiglu(gpu, (&m.yg, 0), (&m.yu, 0), &m.yg, m.actq.as_ref(), kf)?;
                    }
                }
                cap.mark(gpu, "MoE: routed experts down GEMV")?;
                match &m.actq {
                    Some(q) => {
                        x.down.gemv_q8(
                            gpu,
                            &m.slots,
                            k,
                            q,
                            ff,
                            &mut m.yd,
                            cap.tuning.q8_config(&x.down.layout, ff)?,
                        )?;
                    }
                    None => x
                        .down
                        .gemv(gpu, &m.slots, k, &m.yg, ff, &mut m.yd, DEFAULT_NR)?,
                }
                if let Some(ev) = shared_done {
                    gpu.stream.wait(&ev)?;
                    cap.events.push(ev);
                }
                cap.mark(gpu, "MoE: combine (+ next RMSNorm)")?;

                let norm = m.next_norm.as_ref().map(|(w, eps, q)| ops::NextNorm {
                    w,
                    eps: *eps,
                    h: &b.h,
                    q8: if *q { b.hq.as_ref() } else { None },
                });
                ops::moe_combine(
                    gpu,
                    &b.x,
                    &m.yd,
                    &m.w,
                    x.k,
                    d,
                    m.shared.as_ref().map(|s| &s.out),
                    m.has_shared_gate.then(|| m.router.part(1)),
                    norm,
                    m.in_norm.is_some().then_some(&b.mix),
                )
            }
            Op::Dense(f) => {
                cap.mark(gpu, "dense FFN")?;
                f.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
                ops::add_inplace(gpu, &b.x, &f.out, d)
            }
            Op::Head { norm, eps, w } => {
                cap.mark(gpu, "head: RMSNorm + output GEMV")?;
                let hq = if head_int8(w) { b.hq.as_ref() } else { None };
                if let Some(n) = norm {
                    ops::rms_norm(gpu, &b.x, None, n, Some(&b.h), hq, 1, d, *eps, false)?;
                }
                mv(gpu, cap.tuning, w, &b.h, hq, &mut b.logits)
            }
        }
    }
}

/// Whether the output head runs on int8 activations in int8 mode: when its
/// format has an int8 kernel (Q6_K in the synthetic layouts), as the CPU
/// fast path quantizes the activations of its head too. The norm before the
/// head then also writes the quantized h.
fn head_int8(w: &DeviceMatrix) -> bool {
    Q8_TYPES.contains(&w.layout.ty) && w.cols.is_multiple_of(32)
}

/// Whether routed experts of this stack have int8 kernels.
fn int8_experts(s: &ExpertStack) -> bool {
    Q8_TYPES.contains(&s.layout.ty) && s.cols.is_multiple_of(32)
}

fn upload(gpu: &Gpu, f: &GgufFile, w: &Weight) -> Result<DeviceMatrix> {
    DeviceMatrix::from_gguf(gpu, w.ty, w.rows(), w.cols(), w.bytes(f))
        .with_context(|| format!("uploading {}", w.name))
}

fn f32s(gpu: &Gpu, v: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(gpu.stream.clone_htod(v)?)
}

/// Builds the ops from the architecture's stages.
struct Builder<'a> {
    gpu: &'a Gpu,
    file: &'a GgufFile,
    ctx: usize,
    nsplit: Option<usize>,
    int8: bool,
    kv: KvType,
    cache: Option<ExpertCacheOptions>,
    n_moe: usize,
    /// Pinned staging sets for misses read from the file, one per distinct
    /// (gate, up, down) stride triple.
    staging: Vec<([usize; 3], [HostExperts; 3])>,
    ops: Vec<Op>,
    embd: Option<Weight>,
    n_vocab: usize,
}

fn be(e: CudaError) -> ModelError {
    ModelError::Backend {
        backend: "cuda",
        what: format!("{e:#}"),
    }
}

impl Builder<'_> {
    fn attention(&mut self, w: &AttnWeights, p: &AttnParams) -> Result<Op> {
        let gpu = self.gpu;
        if w.bq.is_some() || w.bk.is_some() || w.bv.is_some() {
            bail!("attention biases are not supported on the device yet");
        }
        let s = p.shape;
        let dims = AttnDims {
            n_head: s.n_head,
            n_kv: s.n_kv_head,
            hd: s.head_dim,
            n_rot: p.rope.n_rot(),
            gated: w.gated,
        };
        dims.check()?;
        let norms = match (&w.q_norm, &w.k_norm) {
            (Some(q), Some(k)) => Some((f32s(gpu, q)?, f32s(gpu, k)?)),
            (None, None) => None,
            _ => bail!("only one of the q/k norms is present"),
        };
        let (nh, nkv, hd) = (dims.n_head, dims.n_kv, dims.hd);
        let nsplit = self
            .nsplit
            .unwrap_or_else(|| ops::default_nsplit(&dims, gpu.sms));
        Ok(Op::Attn(Box::new(AttnOp {
            qkv: Proj::new(gpu, self.file, &[&w.wq, &w.wk, &w.wv])?,
            wo: upload(gpu, self.file, &w.wo)?,
            norms,
            inv_freq: gpu.stream.clone_htod(p.rope.inv_freq())?,
            scale: p.scale,
            eps: p.eps,
            q: gpu.stream.alloc_zeros(nh * hd)?,
            o: gpu.stream.alloc_zeros(nh * hd)?,
            oq: q8vec(gpu, self.int8, nh * hd)?,
            kv: KvCache::new(gpu, self.kv, self.ctx * nkv * hd)?,
            scratch: AttnScratch::new(gpu, &dims, nsplit)?,
            dims,
        })))
    }

    fn deltanet(&mut self, w: &DeltaNetWeights, p: &DeltaNetParams) -> Result<Op> {
        let gpu = self.gpu;
        let s = p.shape;
        let dims = GdnDims {
            n_k: s.n_k_heads,
            n_v: s.n_v_heads,
            dk: s.dk,
            dv: s.dv,
            conv_kernel: p.conv_kernel,
        };
        dims.check()?;
        let InProj::Split { qkv, gate } = &w.in_proj else {
            bail!("the legacy fused ssm_in projection is not supported on the device yet");
        };
        let vd = dims.n_v * dims.dv;
        Ok(Op::Gdn(Box::new(GdnOp {
            inp: Proj::new(gpu, self.file, &[qkv, gate, &w.ba])?,
            w_out: upload(gpu, self.file, &w.out)?,
            conv_w: f32s(gpu, &w.conv)?,
            dt_bias: f32s(gpu, &w.dt_bias)?,
            ssm_a: f32s(gpu, &w.ssm_a)?,
            norm_w: f32s(gpu, &w.norm)?,
            eps: p.eps,
            o: gpu.stream.alloc_zeros(vd)?,
            oq: q8vec(gpu, self.int8 && dims.dv.is_multiple_of(32), vd)?,
            ring: gpu.stream.alloc_zeros(dims.conv_kernel * dims.conv_dim())?,
            state: gpu.stream.alloc_zeros(dims.state_len())?,
            dims,
        })))
    }

    fn moe(&mut self, w: &MoeWeights) -> Result<Op> {
        let (gpu, f) = (self.gpu, self.file);
        let (e, ff, k) = (w.n_expert, w.ff, w.n_used);
        let cache = self.cache.filter(|c| c.slots_per_layer < e);
        let slots = cache.map_or(e, |c| c.slots_per_layer);
        let from_file = cache.is_some_and(|c| c.from_file);
        let mut hosts = Vec::new();
        let mut fparts = Vec::new();
        let mut stack = |t: &Weight, rows_total: usize, row0: usize, rows: usize| {
            let ctx = || format!("uploading {}", t.name);
            let (cols, bytes) = (t.cols(), t.bytes(f));
            // Pinned cache: every expert into pinned memory, the first
            // `slots` into the stack; file cache or full residency: the
            // first `slots` (all of them at full residency) from the file.
            let st = if cache.is_some() && !from_file {
                let (st, h) =
                    ExpertStack::cached(gpu, t.ty, rows_total, row0, rows, cols, e, bytes, slots)
                        .with_context(ctx)?;
                hosts.push(h);
                st
            } else {
                ExpertStack::preloaded(gpu, t.ty, rows_total, row0, rows, cols, e, bytes, slots)
                    .with_context(ctx)?
            };
            if from_file {
                fparts.push(FilePart {
                    w: t.clone(),
                    rows_total,
                    row0,
                    rows,
                    n: e,
                    stride: st.stride,
                });
            }
            Ok::<_, CudaError>(st)
        };
        let (gate, up) = match &w.gate_up {
            ExpertsGateUp::Separate { gate, up } => {
                (stack(gate, ff, 0, ff)?, stack(up, ff, 0, ff)?)
            }
            ExpertsGateUp::Merged(gu) => (stack(gu, 2 * ff, 0, ff)?, stack(gu, 2 * ff, ff, ff)?),
        };
        let down = stack(&w.down, w.down.rows() / e, 0, w.down.rows() / e)?;
        let strides = [gate.stride, up.stride, down.stride];
        let mut file = None;
        let layer_cache = match cache {
            None => None,
            Some(_) if from_file => {
                let at = match self.staging.iter().position(|(st, _)| *st == strides) {
                    Some(i) => i,
                    None => {
                        let mk = |st: usize| {
                            HostExperts::new(gpu, st, k, |_, d| {
                                d.fill(0);
                                Ok(())
                            })
                        };
                        let set = [mk(strides[0])?, mk(strides[1])?, mk(strides[2])?];
                        self.staging.push((strides, set));
                        self.staging.len() - 1
                    }
                };
                let set = &self.staging[at].1;
                let ptrs = [
                    (set[0].dev_ptr(), k),
                    (set[1].dev_ptr(), k),
                    (set[2].dev_ptr(), k),
                ];
                let parts: [FilePart; 3] = fparts
                    .try_into()
                    .map_err(|_| CudaError::Invalid("three expert projections expected".into()))?;
                file = Some(FileExperts { parts, staging: at });
                Some(LayerCache::new(
                    gpu,
                    e,
                    slots,
                    k,
                    strides,
                    HostSet::Staged(ptrs),
                )?)
            }
            Some(_) => {
                let h: [HostExperts; 3] = hosts
                    .try_into()
                    .map_err(|_| CudaError::Invalid("three host copies expected".into()))?;
                Some(LayerCache::new(
                    gpu,
                    e,
                    slots,
                    k,
                    strides,
                    HostSet::Pinned(h),
                )?)
            }
        };
        let d = down.rows;
        let shared = w
            .shared
            .as_ref()
            .map(|s| FfnOp::new(gpu, f, s, self.int8))
            .transpose()?;
        let mut parts = vec![w.router.clone()];
        parts.extend(w.shared_gate.clone());
        let x = Arc::new(LayerExperts {
            gate,
            up,
            down,
            cache: layer_cache,
            moe_index: self.n_moe,
            n_expert: e,
            k,
            norm_topk: w.norm_topk,
        });
        self.n_moe += 1;
        // Pre-gating: the previous MoE layer computes this layer's router
        // logits too (one more part of its router projection).
        if let (Some(c), true) = (cache, x.cache.is_some()) {
            if c.pregate && !c.from_file {
                let prev = self.ops.iter_mut().rev().find_map(|op| match op {
                    Op::Moe(m) => Some(m),
                    _ => None,
                });
                if let Some(prev) = prev {
                    prev.router_parts.push(w.router.clone());
                    let refs: Vec<&Weight> = prev.router_parts.iter().collect();
                    prev.router = Proj::new(gpu, f, &refs)?;
                    prev.prefetch = Some(Prefetch {
                        next: x.clone(),
                        part: refs.len() - 1,
                        experts: gpu.stream.alloc_zeros(k)?,
                        w: gpu.stream.alloc_zeros(k)?,
                        slots: gpu.stream.alloc_zeros(k)?,
                    });
                }
            }
        }
        let refs: Vec<&Weight> = parts.iter().collect();
        let router = Proj::new(gpu, f, &refs)?;
        let fused_router = ops::router_gemv_topk_fits(&router.groups[0].0, e);
        Ok(Op::Moe(Box::new(MoeOp {
            router,
            router_parts: parts,
            has_shared_gate: w.shared_gate.is_some(),
            topk_counter: gpu.stream.alloc_zeros(1)?,
            fused_router,
            in_norm: None,
            fetch_blocks: cache.map_or((0, 0), |c| {
                let per_sm = if c.fetch_blocks == 0 {
                    gpu.sms as u32
                } else {
                    c.fetch_blocks
                };
                (per_sm, c.prefetch_blocks)
            }),
            prefetch: None,
            file,
            slots: gpu.stream.alloc_zeros(k)?,
            experts: gpu.stream.alloc_zeros(k)?,
            w: gpu.stream.alloc_zeros(k)?,
            yg: gpu.stream.alloc_zeros(k * ff)?,
            yu: gpu.stream.alloc_zeros(k * ff)?,
            yd: gpu.stream.alloc_zeros(k * d)?,
            ygu: if self.int8 && int8_experts(&x.gate) && x.gate.layout == x.up.layout {
                Some(gpu.stream.alloc_zeros(2 * k * ff)?)
            } else {
                None
            },
            actq: if int8_experts(&x.down) {
                q8vec(gpu, self.int8, k * ff)?
            } else {
                None
            },
            x,
            shared,
            next_norm: None,
        })))
    }
}

impl TokenStages for Builder<'_> {
    fn embed(&mut self, w: &Weight) -> Result<(), ModelError> {
        self.embd = Some(w.clone());
        Ok(())
    }

    fn norm(&mut self, w: &[f32], eps: f32, add_mix: bool) -> Result<(), ModelError> {
        let w = f32s(self.gpu, w).map_err(be)?;
        self.ops.push(Op::Norm { w, eps, add_mix });
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        w: &AttnWeights,
        p: &AttnParams,
    ) -> Result<(), ModelError> {
        let op =
            Builder::attention(self, w, p).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn deltanet(
        &mut self,
        layer: usize,
        w: &DeltaNetWeights,
        p: &DeltaNetParams,
    ) -> Result<(), ModelError> {
        let op =
            Builder::deltanet(self, w, p).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn moe(&mut self, layer: usize, w: &MoeWeights) -> Result<(), ModelError> {
        let op = Builder::moe(self, w).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn dense_ffn(&mut self, layer: usize, w: &DenseFfn) -> Result<(), ModelError> {
        let op = FfnOp::new(self.gpu, self.file, w, self.int8)
            .map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(Op::Dense(Box::new(op)));
        Ok(())
    }

    fn head(&mut self, norm: &[f32], eps: f32, w: &Weight) -> Result<(), ModelError> {
        let norm = f32s(self.gpu, norm).map_err(be)?;
        let w = upload(self.gpu, self.file, w).map_err(be)?;
        self.n_vocab = w.rows;
        self.ops.push(Op::Head {
            norm: Some(norm),
            eps,
            w,
        });
        Ok(())
    }
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
}

impl ExpertCacheOptions {
    pub fn new(slots_per_layer: usize) -> Self {
        Self {
            slots_per_layer,
            pregate: true,
            fetch_blocks: 0,
            prefetch_blocks: 16,
            from_file: false,
        }
    }
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
    /// Device bytes of the uploaded weights and state.
    pub device_bytes: usize,
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
            device_bytes: free0.saturating_sub(free1),
        };
        dec.capture()?;
        Ok(dec)
    }

    fn capture(&mut self) -> Result<()> {
        let gpu = &self.gpu;
        gpu.sync()?;
        if !self.tuning.ablate.is_empty() {
            // On stderr whatever the log level: these outputs must not be
            // mistaken for real ones.
            eprintln!(
                "warning: REDLITE_CUDA_ABLATE: kernels of {:?} left out: timing only, outputs are wrong",
                self.tuning.ablate
            );
        }
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let flags = CUgraphInstantiate_flags(0);
        let mut cap = Capture {
            side: &self.side,
            shared: &self.shared_side,
            pending: None,
            events: Vec::new(),
            marks: None,
            tuning: &self.tuning,
            ablate: &self.tuning.ablate,
        };
        let (mut graphs, mut points) = (Vec::new(), Vec::new());
        gpu.stream.begin_capture(mode)?;
        let mut res = Ok(());
        for (i, op) in self.ops.iter_mut().enumerate() {
            let split = matches!(op, Op::Moe(m) if m.file.is_some());
            if !split {
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::All);
            } else {
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::Head);
                if res.is_err() {
                    break;
                }
                // The capture ends here whatever happens: a failure above
                // left it open.
                graphs.push(
                    gpu.stream
                        .end_capture(flags)?
                        .context("captured an empty graph")?,
                );
                points.push(i);
                gpu.stream.begin_capture(mode)?;
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::Tail);
            }
            if res.is_err() {
                break;
            }
        }
        if res.is_ok() && cap.pending.is_some() {
            res = Err(CudaError::Invalid(
                "a prefetch was never joined (no MoE layer after it)".into(),
            ));
        }
        let graph = gpu.stream.end_capture(flags);
        gpu.set_suppressed(false);
        drop(cap);
        res?;
        graphs.push(graph?.context("captured an empty graph")?);
        self.graphs = graphs;
        self.host_points = points;
        Ok(())
    }

    /// Serve the misses of op `i`'s routed plan from the file: each missed
    /// expert's images into the staging entries, the miss list pointed at
    /// them (the stream is idle: the graph before this ended with the plan).
    fn serve_misses(&mut self, i: usize, model: &Model) -> Result<()> {
        let Self {
            ops, staging, gpu, ..
        } = self;
        let Some(Op::Moe(m)) = ops.get_mut(i) else {
            bail!("host point {i} is not a MoE op");
        };
        let fx = m.file.as_ref().context("no file experts")?;
        let set = staging.get_mut(fx.staging).context("staging set")?;
        let x = Arc::get_mut(&mut m.x).context("experts shared while serving misses")?;
        let cache = x.cache.as_mut().context("no cache")?;
        let misses = cache.misses(gpu, false)?;
        if misses.is_empty() {
            return Ok(());
        }
        // One task per (miss, projection), spread over threads: the reads
        // (page cache or disk) and the repacking are the host's whole cost.
        let file = model.file();
        let mut tasks = Vec::new();
        for (p, (part, st)) in fx.parts.iter().zip(set.iter_mut()).enumerate() {
            for (i, dst) in st
                .entries_mut(misses.len(), part.stride)?
                .into_iter()
                .enumerate()
            {
                tasks.push((p, misses[i].0, dst));
            }
        }
        let parts = &fx.parts;
        tasks.par_iter_mut().try_for_each(|(p, e, dst)| {
            let part = &parts[*p];
            expert_image(
                part.w.ty,
                part.rows_total,
                part.row0,
                part.rows,
                part.w.cols(),
                part.n,
                part.w.bytes(file),
                *e as usize,
                dst,
            )
            .with_context(|| format!("reading expert {e} of {}", part.w.name))
        })?;
        cache.point_misses_at_staging(gpu, &misses)
    }

    /// Where a token's time goes: a second graph of the same ops with a
    /// timing event before each kernel class, replayed `reps` times at the
    /// current position (after one warm-up token); the GPU time between
    /// consecutive events is summed per class. Returns the rows (class,
    /// µs per token, kernels per token), the profiled token's total and a
    /// plain graph replay's time for the same token (the events' own cost
    /// is the difference). Single-graph decoders only.
    pub fn profile(&mut self, model: &Model, token: u32, reps: usize) -> Result<TokenProfile> {
        ensure!(
            self.host_points.is_empty(),
            "profile: the token is cut into several graphs (experts read from the file)"
        );
        let gpu = &self.gpu;
        gpu.sync()?;
        let mut cap = Capture {
            side: &self.side,
            shared: &self.shared_side,
            pending: None,
            events: Vec::new(),
            marks: Some(Vec::new()),
            tuning: &self.tuning,
            ablate: &[],
        };
        gpu.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let mut res = Ok(());
        for op in &mut self.ops {
            res = op.run(gpu, &mut self.bufs, &mut cap, Phase::All);
            if res.is_err() {
                break;
            }
        }
        if res.is_ok() {
            res = cap.mark(gpu, "end");
        }
        let graph = gpu.stream.end_capture(CUgraphInstantiate_flags(0));
        res?;
        let graph = graph?.context("captured an empty graph")?;
        let marks = cap.marks.take().unwrap_or_default();
        drop(cap);
        let pos = self.pos;
        let timing = || {
            self.gpu
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        let (t0, t1) = (timing()?, timing()?);
        let mut per: Vec<f64> = vec![0.0; marks.len().saturating_sub(1)];
        let (mut total, mut plain) = (0.0f64, 0.0f64);
        for rep in 0..=reps {
            // The profiled graph, then the plain one, at the same position.
            self.pos = pos;
            self.write_token(model, token)?;
            graph.launch()?;
            self.gpu.sync()?;
            if rep > 0 {
                for (i, w) in marks.windows(2).enumerate() {
                    per[i] += w[0].0.elapsed_ms(&w[1].0)? as f64 * 1e3;
                }
                total += marks[0].0.elapsed_ms(&marks[marks.len() - 1].0)? as f64 * 1e3;
            }
            self.write_token(model, token)?;
            t0.record(&self.gpu.stream)?;
            self.graphs[0].launch()?;
            t1.record(&self.gpu.stream)?;
            self.gpu.sync()?;
            if rep > 0 {
                plain += t0.elapsed_ms(&t1)? as f64 * 1e3;
            }
        }
        self.pos = pos;
        let n = reps.max(1) as f64;
        let mut rows: Vec<(&'static str, f64, usize)> = Vec::new();
        for (i, w) in marks.windows(2).enumerate() {
            let kernels = w[1].2 - w[0].2;
            match rows.iter_mut().find(|r| r.0 == w[0].1) {
                Some(r) => {
                    r.1 += per[i] / n;
                    r.2 += kernels;
                }
                None => rows.push((w[0].1, per[i] / n, kernels)),
            }
        }
        Ok(TokenProfile {
            rows,
            total_us: total / n,
            plain_us: plain / n,
        })
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

    /// Total expert cache counters and the bytes copied over PCIe.
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
        Ok(Some((t, bytes)))
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
