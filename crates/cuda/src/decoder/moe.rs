//! MoE layers: the router (with the shared-expert gate and pre-gating
//! logits stacked), top-k, the expert cache's plan and fetch, the routed
//! experts' GEMVs, SwiGLU, the shared expert on a graph branch, and the
//! combine (with the next norm fused in).

use super::capture::{Capture, Phase};
use super::ffn::FfnOp;
use super::files::{FileExperts, FilePart};
use super::proj::{mv, q8vec, Proj};
use super::stages::{Builder, Op};
use super::Bufs;
use crate::device::Gpu;
use crate::error::{Context, CudaError, Result};
use crate::expert_cache::{HostExperts, HostSet, LayerCache};
use crate::gemv::{ExpertStack, Q8Vec, DEFAULT_NR, Q8_TYPES};
use crate::ops;
use cudarc::driver::{CudaEvent, CudaSlice};
use redlite_model::blocks::moe::{ExpertsGateUp, MoeWeights};
use redlite_model::weights::Weight;
use std::sync::Arc;

/// A layer's routed experts: slot stacks, and the cache that fills them
/// when the slots are fewer than the experts.
pub(super) struct LayerExperts {
    pub(super) gate: ExpertStack,
    pub(super) up: ExpertStack,
    pub(super) down: ExpertStack,
    pub(super) cache: Option<LayerCache>,
    /// MoE layer index (counters).
    pub(super) moe_index: usize,
    pub(super) n_expert: usize,
    pub(super) k: usize,
    pub(super) norm_topk: bool,
}

/// Pre-gating: the next MoE layer's router applied to this layer's input
/// (its logits are one more part of this layer's router projection), its
/// top-k prefetched on the side stream.
pub(super) struct Prefetch {
    pub(super) next: Arc<LayerExperts>,
    pub(super) part: usize,
    pub(super) experts: CudaSlice<u32>,
    pub(super) w: CudaSlice<f32>,
    pub(super) slots: CudaSlice<u32>,
}

pub(super) struct MoeOp {
    /// router logits | shared-expert gate logit (when there is one) | the
    /// next MoE layer's router logits (pre-gating).
    pub(super) router: Proj,
    /// The weights of the parts of `router` (to restack it).
    pub(super) router_parts: Vec<Weight>,
    pub(super) x: Arc<LayerExperts>,
    pub(super) prefetch: Option<Prefetch>,
    /// With misses read from the file: where the experts lie in it.
    pub(super) file: Option<FileExperts>,
    pub(super) fetch_blocks: (u32, u32),
    pub(super) slots: CudaSlice<u32>,
    pub(super) experts: CudaSlice<u32>,
    pub(super) w: CudaSlice<f32>,
    pub(super) yg: CudaSlice<f32>,
    pub(super) yu: CudaSlice<f32>,
    pub(super) yd: CudaSlice<f32>,
    /// int8 mode: gate|up of the routed experts in one launch, and the
    /// quantized SwiGLU output for down.
    pub(super) ygu: Option<CudaSlice<f32>>,
    pub(super) actq: Option<Q8Vec>,
    pub(super) shared: Option<FfnOp>,
    pub(super) has_shared_gate: bool,
    /// `router_gemv_topk`'s counter of finished blocks (0 between launches).
    pub(super) topk_counter: CudaSlice<u32>,
    /// Whether the router GEMV and the top-k run as one launch
    /// (`router_gemv_topk`, where the router is an F32 matrix it takes:
    /// +1.4% decode on the H200 against the two launches, docs/cuda.md);
    /// otherwise the router GEMV, then `router_topk`.
    pub(super) fused_router: bool,
    /// The post-mixer RMSNorm (weights, eps) computed inside the fused
    /// router launch (`fusion::fuse_router_norms`); the combine then adds the
    /// mixer's output to the residual.
    pub(super) in_norm: Option<(CudaSlice<f32>, f32)>,
    /// The next stage's RMSNorm (weights, eps, whether h is also wanted as
    /// int8), fused into the combine: one launch instead of two.
    pub(super) next_norm: Option<(CudaSlice<f32>, f32, bool)>,
}

impl MoeOp {
    /// Record the shared expert on its own stream, forked from the main
    /// one here (h is ready); the event to join it on. A branch of the
    /// graph beside the router and routed experts: 5.9 µs a layer faster
    /// on the H200 than in the main chain (docs/what-did-not-work.md).
    pub(super) fn fork_shared(
        &mut self,
        gpu: &Gpu,
        b: &Bufs,
        cap: &mut Capture,
    ) -> Result<Option<CudaEvent>> {
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
    pub(super) fn head(
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

    /// The whole op (`Phase::All`), or one of its halves around the host's
    /// service of file-read misses.
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        b: &mut Bufs,
        cap: &mut Capture,
        phase: Phase,
    ) -> Result<()> {
        let d = b.x.len();
        let m = self;
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
}

/// Whether routed experts of this stack have int8 kernels.
pub(super) fn int8_experts(s: &ExpertStack) -> bool {
    Q8_TYPES.contains(&s.layout.ty) && s.cols.is_multiple_of(32)
}

impl Builder<'_> {
    pub(super) fn moe(&mut self, w: &MoeWeights) -> Result<Op> {
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
