//! Batched prefill: a chunk of prompt tokens through every op at once
//! (GEMMs on tensor cores for the projections and the routed experts, the
//! chunk kernels for attention, DeltaNet, routing and the combine), then
//! the head on the chunk's last token. The same ops as the decode graph
//! (their weights and their state: KV caches, conv windows, recurrent
//! states), walked in the same order, so the decode that follows reads
//! exactly the state token-by-token steps would have left, up to the
//! rounding of the f16 GEMM inputs.
//!
//! The fusions of the decode graph are undone here: a MoE op's input norm
//! (`in_norm`: the post-mixer residual add and RMSNorm) runs before it and
//! its next norm after its combine, each as one RMSNorm over the chunk.
//!
//! A chunk starts with its tokens' embedding rows, dequantized on host
//! threads into a reused page-locked buffer and copied up asynchronously
//! (`embed_rows`). Each MoE layer's routed experts run as grouped GEMMs
//! over a tile list: the chunk's (token, expert) pairs sorted by expert in
//! tiles of at most 64, with the gather list (each pair's token) and each
//! (token, choice)'s pair for the combine.
//!
//! At full expert residency every expert has its own slot, and the tile
//! list is built on the device from the top-k (`ops::route_tiles_device`),
//! its count left in device memory: the grouped GEMMs' grids cover the
//! most tiles the list can have and the blocks past the count return at
//! once, so the host issues the whole chunk without waiting for the
//! device. With a bounded cache (pinned host copies) the top-k comes to
//! the host, whose expert set decides the staging: the host builds the
//! same lists (`gemv::route_tiles`) and uploads them, and the experts a
//! chunk routes to are read from the cache's slots where resident and from
//! a staging image the chunk uploads once otherwise (`prefill_moe`,
//! `crate::prefill_experts`). With misses read from the file the sequence
//! runs prompts token by token.

pub(super) use super::chunk_bufs::ChunkBufs;
use super::ffn::FfnOp;
use super::prefill_moe::Staging;
use super::prefill_profile::Laps;
use super::proj::Proj;
use super::stages::{head_int8, Op};
use super::CudaDecoder;
use crate::device::Gpu;
use crate::error::{ensure, Context, Result};
use crate::gemv::{route_tiles, GemmIn, GemmOut, TileCount};
use crate::ops::{self, GdnChunkScratch, GdnForm, GdnWeights, Rows, SharedRows};
use crate::prefill_experts::{distinct, fit_chunk, upload_all_ahead};
use crate::sequence::MIN_BATCHED_PREFILL;
use cudarc::driver::CudaSlice;
use redlite_gguf::GgmlType;
use redlite_model::blocks::deltanet::L2_EPS;
use redlite_model::Model;

/// A projection's outputs for a chunk: per group, where its rows start in
/// the scratch and how wide they are.
struct ProjOut {
    groups: Vec<(usize, usize)>,
}

impl ProjOut {
    fn part<'a>(&self, p: &Proj, buf: &'a CudaSlice<f32>, i: usize) -> Rows<'a> {
        let (g, off) = p.at[i];
        let (base, ld) = self.groups[g];
        Rows::new(buf, base + off, ld)
    }
}

fn gemm_in(gpu: &Gpu, r: Rows, n: usize, cols: usize) -> Result<GemmIn> {
    Ok(GemmIn {
        x: r.ptr(gpu, n, cols)?,
        ldx: r.ld,
        gather: None,
        f16: false,
    })
}

/// The chunk's `n` rows of `r` converted to f16 into `xh` (compact rows of
/// `cols`), as the input of every tensor-core GEMM that reads them: once,
/// instead of once per tile of weight rows inside each GEMM.
fn half_in(gpu: &Gpu, r: Rows, n: usize, cols: usize, xh: &CudaSlice<u16>) -> Result<GemmIn> {
    Ok(GemmIn {
        x: ops::to_f16_rows(gpu, r, n, cols, xh)?,
        ldx: cols,
        gather: None,
        f16: true,
    })
}

fn gemm_out(gpu: &Gpu, r: Rows, n: usize, rows: usize) -> Result<GemmOut> {
    Ok(GemmOut {
        y: r.ptr(gpu, n, rows)?,
        ldy: r.ld,
    })
}

/// Every group of `p` over the chunk's `n` input rows (`input`, and the
/// same rows in f16 as `half`), into `buf` (group after group), biases
/// added; F32 groups exactly from the f32 rows (routers).
fn run_proj(
    gpu: &Gpu,
    p: &Proj,
    input: Rows,
    half: GemmIn,
    n: usize,
    buf: &CudaSlice<f32>,
) -> Result<ProjOut> {
    let mut groups = Vec::with_capacity(p.groups.len());
    let mut at = 0;
    for ((m, _), bias) in p.groups.iter().zip(&p.biases) {
        let out = Rows::new(buf, at, m.rows);
        let exact = m.layout.ty == GgmlType::F32;
        let gin = if exact {
            gemm_in(gpu, input, n, m.cols)?
        } else {
            ensure!(
                half.ldx == m.cols,
                "projection input of {} values, f16 rows of {}",
                m.cols,
                half.ldx
            );
            half
        };
        m.gemm(gpu, exact, n, gin, gemm_out(gpu, out, n, m.rows)?)?;
        if let Some(b) = bias {
            ops::add_bias_rows(gpu, out, b, n)?;
        }
        groups.push((at, m.rows));
        at += n * m.rows;
    }
    Ok(ProjOut { groups })
}

/// Where a MoE layer's routed tiles are for its grouped GEMMs.
enum Routes {
    /// Built on the host and split between the bounded cache's slots and
    /// the staging image.
    Staged(super::prefill_moe::Split),
    /// Built on the device ([`ops::route_tiles_device`]), the count in
    /// `ChunkBufs::n_tiles`, at most `bound`.
    Device { bound: usize },
}

/// The FFN scratch of a chunk.
struct FfnBufs<'a> {
    g: &'a CudaSlice<f32>,
    u: &'a CudaSlice<f32>,
    out: &'a CudaSlice<f32>,
    /// The SwiGLU output in f16 (the down projection's input).
    half: &'a CudaSlice<u16>,
}

/// `out = down(SiLU(gate h) * up h)` for the chunk's rows (`h`: the
/// input rows in f16).
fn run_ffn(gpu: &Gpu, f: &FfnOp, h: GemmIn, n: usize, cb: &FfnBufs) -> Result<()> {
    let ff = f.gate.rows;
    let d = f.down.rows;
    ensure!(
        h.ldx == f.gate.cols && h.ldx == f.up.cols,
        "FFN input of {} values",
        h.ldx
    );
    let (g, u) = (Rows::new(cb.g, 0, ff), Rows::new(cb.u, 0, ff));
    f.gate.gemm(gpu, false, n, h, gemm_out(gpu, g, n, ff)?)?;
    f.up.gemm(gpu, false, n, h, gemm_out(gpu, u, n, ff)?)?;
    ops::swiglu(gpu, (cb.g, 0), (cb.u, 0), cb.g, None, n * ff)?;
    let out = Rows::new(cb.out, 0, d);
    f.down.gemm(
        gpu,
        false,
        n,
        half_in(gpu, g, n, ff, cb.half)?,
        gemm_out(gpu, out, n, d)?,
    )
}

impl CudaDecoder {
    /// Whether prompts run in chunks on this decoder: a chunk size was
    /// given, and every expert is resident or a bounded cache's experts
    /// are pinned and the staging images are allocated (not with misses
    /// read from the file).
    pub fn batched_prefill(&self) -> bool {
        self.prefill_chunk > 0
            && self.ops.iter().all(|op| match op {
                Op::Moe(m) => {
                    m.file.is_none() && (m.x.cache.is_none() || self.prefill_staging.is_some())
                }
                _ => true,
            })
    }

    /// The chunk scratch for `DecoderOptions::prefill_chunk` tokens, at
    /// build time, so a device that cannot hold it fails before the first
    /// prompt rather than in it. Under a bounded cache, first the staging
    /// images, then the largest chunk (halving from the requested one)
    /// whose scratch fits what the memory plan set aside beside them
    /// (`ExpertCacheOptions::prefill_bytes`; `fit_chunk` says why the
    /// largest); none fitting: prompts run token by token.
    pub(super) fn alloc_prefill_scratch(&mut self) -> Result<()> {
        let d = self.row.len();
        let cached = self.ops.iter().any(|op| match op {
            Op::Moe(m) => m.x.cache.is_some(),
            _ => false,
        });
        let pinned = self.ops.iter().all(|op| match op {
            Op::Moe(m) => m.file.is_none(),
            _ => true,
        });
        if cached && pinned && self.prefill_chunk > 0 {
            let allowance = self.cache.map_or(u64::MAX, |c| c.prefill_bytes);
            let staging = super::prefill_moe::staging_bytes(&self.ops) as u64;
            let ops = &self.ops;
            let left = allowance.saturating_sub(staging);
            let fits = allowance >= staging;
            self.prefill_chunk = fits
                .then(|| {
                    fit_chunk(self.prefill_chunk, MIN_BATCHED_PREFILL, left, |c| {
                        ChunkBufs::bytes_for(ops, d, c) as u64
                    })
                })
                .flatten()
                .unwrap_or(0);
            if self.prefill_chunk > 0 {
                self.prefill_staging = Staging::new(&self.gpu, &self.ops)
                    .context("allocating the prefill staging images")?;
            }
        }
        if self.batched_prefill() {
            let cb = ChunkBufs::new(&self.gpu, &self.ops, d, self.prefill_chunk)
                .context("allocating the prefill scratch (--ubatch)")?;
            self.chunk = Some(cb);
        }
        Ok(())
    }

    /// Prompt tokens per chunk (0: token by token).
    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Device bytes of the prefill scratch once allocated.
    pub fn prefill_scratch_bytes(&self) -> usize {
        self.chunk.as_ref().map_or(0, |c| c.bytes)
    }

    /// Device bytes of the staging images of a bounded cache's batched
    /// prefill (0 without).
    pub fn prefill_staging_bytes(&self) -> usize {
        self.prefill_staging.as_ref().map_or(0, |s| s.bytes)
    }

    /// What batched prefills uploaded under a bounded cache so far.
    pub fn prefill_uploads(&self) -> crate::prefill_experts::PrefillUploads {
        self.prefill_staging
            .as_ref()
            .map(|s| s.uploads)
            .unwrap_or_default()
    }

    /// Before a prefill's first chunk: the staging images learn where the
    /// experts sit in the cache's slots now.
    pub(super) fn begin_prefill(&mut self) -> Result<()> {
        if let Some(st) = self.prefill_staging.as_mut() {
            st.begin(&self.gpu, &self.ops)?;
        }
        Ok(())
    }

    /// After a prefill's last chunk: the copy stream is done too.
    pub(super) fn end_prefill(&self) -> Result<()> {
        self.gpu.sync()?;
        if let Some(st) = &self.prefill_staging {
            st.sync()?;
        }
        Ok(())
    }

    /// Run `tokens` from the current position in chunks of
    /// `DecoderOptions::prefill_chunk` tokens; returns the last token's
    /// logits, or with `all` every token's (row after row).
    pub fn prefill(&mut self, model: &Model, tokens: &[u32], all: bool) -> Result<Vec<f32>> {
        ensure!(!tokens.is_empty(), "prefill of no tokens");
        let chunk = self.prefill_chunk;
        ensure!(chunk >= 1, "prefill chunk of 0 tokens");
        ensure!(
            self.pos + tokens.len() <= self.ctx,
            "{} prompt tokens at position {} overrun the context of {}",
            tokens.len(),
            self.pos,
            self.ctx
        );
        let mut out = Vec::new();
        self.begin_prefill()?;
        // On an error the copy stream is still drained before returning:
        // its copies read pinned memory the decoder may free next.
        let mut res = Ok(());
        for part in tokens.chunks(chunk) {
            res = self.run_chunk(model, part, chunk, all.then_some(&mut out), &mut None);
            if res.is_err() {
                break;
            }
        }
        let end = self.end_prefill();
        res?;
        end?;
        if !all {
            out = self.gpu.stream.clone_dtoh(&self.bufs.logits)?;
        }
        Ok(out)
    }

    pub(super) fn run_chunk(
        &mut self,
        model: &Model,
        tokens: &[u32],
        cap: usize,
        all: Option<&mut Vec<f32>>,
        laps: &mut Option<Laps>,
    ) -> Result<()> {
        ensure!(
            self.batched_prefill(),
            "batched prefill needs every expert resident or pinned (and a chunk size)"
        );
        let n = tokens.len();
        let d = self.row.len();
        if self.chunk.as_ref().is_none_or(|c| c.cap < n) {
            self.chunk = None;
            self.chunk = Some(ChunkBufs::new(&self.gpu, &self.ops, d, cap.max(n))?);
        }
        // Embeddings: dequantized on the host as the decode does (the same
        // rows), on several threads, and copied up asynchronously.
        let m = self.embd.matrix(model.file())?;
        let gpu = &self.gpu;
        let cb = self.chunk.as_mut().context("chunk buffers")?;
        cb.embed.upload(gpu, &m, tokens, &cb.x)?;
        let pos0 = self.pos;
        let ChunkBufs {
            x: cx,
            h: ch,
            mix: cmix,
            proj,
            q: cq,
            o: co,
            conv,
            raw,
            ffn_g,
            ffn_u,
            ffn_out,
            slots,
            experts: cexperts,
            weights,
            pair_g,
            pair_u,
            pair_d,
            gather,
            pair_of,
            tiles,
            tiles_staged,
            n_tiles,
            pre_slots,
            pre_experts,
            pre_weights,
            xh_in,
            xh_tmp,
            ..
        } = cb;
        // Under a bounded cache the first cached MoE layer has no layer
        // before it to pre-gate it: where the chunk is long enough to touch
        // nearly all of its experts, its non-resident ones go up now, beside
        // the embedding upload and the first mixer.
        let mut staging = self.prefill_staging.as_mut();
        let first = self.ops.iter().find_map(|op| match op {
            Op::Moe(m) if m.x.cache.is_some() => Some(m.x.clone()),
            _ => None,
        });
        if let (Some(st), Some(x)) = (staging.as_deref_mut(), first) {
            if upload_all_ahead(n, x.k, x.n_expert) {
                st.upload(&x, &vec![true; x.n_expert], true)?;
            }
        }
        let (xh_in, xh_tmp) = (&*xh_in, &*xh_tmp);
        let (cx, ch, cmix, proj) = (&*cx, &*ch, &*cmix, &*proj);
        let ffn_bufs = FfnBufs {
            g: ffn_g,
            u: ffn_u,
            out: ffn_out,
            half: xh_tmp,
        };
        let hr = Rows::new(ch, 0, d);
        let mixr = Rows::new(cmix, 0, d);
        let mut head = None;
        macro_rules! lap {
            ($label:expr, $n:expr) => {
                if let Some(l) = laps.as_mut() {
                    l.lap(gpu, $label, $n)?;
                }
            };
        }
        lap!("embedding rows (host threads) + upload", 0);
        for (i, op) in self.ops.iter().enumerate() {
            match op {
                Op::Norm { w, eps, add_mix } => {
                    let res = add_mix.then_some(cmix);
                    ops::rms_norm(gpu, cx, res, w, Some(ch), None, n, d, *eps, false)?;
                    lap!("RMSNorm (+ residual add)", 1);
                }
                Op::Attn(a) => {
                    let h16 = half_in(gpu, hr, n, d, xh_in)?;
                    let po = run_proj(gpu, &a.qkv, hr, h16, n, proj)?;
                    lap!("attention: q|k|v GEMM", a.qkv.groups.len());
                    let (qf, k, v) = (
                        po.part(&a.qkv, proj, 0),
                        po.part(&a.qkv, proj, 1),
                        po.part(&a.qkv, proj, 2),
                    );
                    let qd = a.dims.n_head * a.dims.hd;
                    let (q, o) = (Rows::new(&*cq, 0, qd), Rows::new(&*co, 0, qd));
                    let norms = a.norms.as_ref().map(|(q, k)| (q, k));
                    ops::attn_prep_chunk(
                        gpu,
                        &a.dims,
                        qf,
                        k,
                        v,
                        norms,
                        &a.inv_freq,
                        pos0,
                        n,
                        q,
                        &a.kv,
                        a.eps,
                    )?;
                    let gate = a.dims.gated.then_some(qf);
                    // Tensor cores where a block's 64 query rows fill up
                    // (pp2048 on the iq2 file: 4,949 tok/s against 4,552
                    // with the warp kernel; pp512 at depth 32K 2.2x).
                    let kernel = if n * (a.dims.n_head / a.dims.n_kv) >= ops::FLASH_ROWS {
                        // Partials of a split in the routed experts' pair
                        // buffer, free until this layer's MoE.
                        let part = &*pair_g;
                        let split = ops::flash_splits(&a.dims, pos0, n, gpu.sms, part.len());
                        ops::AttnKernel::Flash {
                            split,
                            part: Some(part),
                        }
                    } else {
                        ops::AttnKernel::Warp
                    };
                    ops::attn_chunk(gpu, &a.dims, q, &a.kv, gate, o, pos0, n, a.scale, kernel)?;
                    lap!("attention: prep + causal attention", 2);
                    a.wo.gemm(
                        gpu,
                        false,
                        n,
                        half_in(gpu, o, n, qd, xh_tmp)?,
                        gemm_out(gpu, mixr, n, d)?,
                    )?;
                    lap!("attention: output GEMM", 1);
                }
                Op::Gdn(g) => {
                    let h16 = half_in(gpu, hr, n, d, xh_in)?;
                    let po = run_proj(gpu, &g.inp, hr, h16, n, proj)?;
                    lap!("DeltaNet: qkv|z|ba GEMM", g.inp.groups.len());
                    let w = GdnWeights {
                        conv_w: &g.conv_w,
                        dt_bias: &g.dt_bias,
                        ssm_a: &g.ssm_a,
                        norm_w: &g.norm_w,
                    };
                    let scratch = GdnChunkScratch {
                        conv: &*conv,
                        raw: &*raw,
                        wy: Some(&*pair_d),
                    };
                    ops::gdn_chunk(
                        gpu,
                        &g.dims,
                        &w,
                        po.part(&g.inp, proj, 0),
                        po.part(&g.inp, proj, 1),
                        po.part(&g.inp, proj, 2),
                        &g.ring,
                        &g.state,
                        &scratch,
                        &*co,
                        pos0,
                        n,
                        g.eps,
                        L2_EPS,
                        GdnForm::Chunkwise,
                    )?;
                    let wy_form = ops::wy_state_kernel(&g.dims).is_some();
                    lap!(
                        "DeltaNet: conv, norms, recurrence, gated norm",
                        if wy_form { 6 } else { 5 }
                    );
                    let vd = g.dims.n_v * g.dims.dv;
                    let o = Rows::new(&*co, 0, vd);
                    g.w_out.gemm(
                        gpu,
                        false,
                        n,
                        half_in(gpu, o, n, vd, xh_tmp)?,
                        gemm_out(gpu, mixr, n, d)?,
                    )?;
                    lap!("DeltaNet: output GEMM", 1);
                }
                Op::Moe(m) => {
                    if let Some((w, eps)) = &m.in_norm {
                        ops::rms_norm(gpu, cx, Some(cmix), w, Some(ch), None, n, d, *eps, false)?;
                        lap!("RMSNorm (+ residual add)", 1);
                    }
                    let x = &m.x;
                    let h16 = half_in(gpu, hr, n, d, xh_in)?;
                    let po = run_proj(gpu, &m.router, hr, h16, n, proj)?;
                    let logits = po.part(&m.router, proj, 0);
                    ops::router_topk_chunk(
                        gpu,
                        logits,
                        x.n_expert,
                        x.k,
                        x.norm_topk,
                        n,
                        &*slots,
                        &*cexperts,
                        &*weights,
                    )?;
                    // Pre-gating under a bounded cache: the next MoE layer's
                    // top-k on this layer's input, its predicted experts.
                    let pre = match (&m.prefetch, staging.is_some()) {
                        (Some(p), true) if p.next.cache.is_some() => {
                            let nx = &p.next;
                            ops::router_topk_chunk(
                                gpu,
                                po.part(&m.router, proj, p.part),
                                nx.n_expert,
                                nx.k,
                                nx.norm_topk,
                                n,
                                &*pre_slots,
                                &*pre_experts,
                                &*pre_weights,
                            )?;
                            Some((nx.clone(), n * nx.k))
                        }
                        _ => None,
                    };
                    lap!("MoE: router GEMM (f32) + top-k", 1 + m.router.groups.len());
                    let np = n * x.k;
                    let bounded = x.cache.is_some();
                    let routes = if bounded {
                        // The staging needs the chunk's expert set on the
                        // host: the routing comes down, the tiles go back.
                        let st = staging
                            .as_deref_mut()
                            .context("a bounded cache's prefill without staging")?;
                        gpu.sync()?;
                        let experts = gpu.stream.clone_dtoh(&cexperts.slice(0..np))?;
                        let rt = route_tiles(&experts, x.k, x.n_expert)?;
                        gpu.stream
                            .memcpy_htod(&rt.gather, &mut gather.slice_mut(0..np))?;
                        gpu.stream
                            .memcpy_htod(&rt.pair_of, &mut pair_of.slice_mut(0..np))?;
                        let want = distinct(&experts, x.n_expert)?;
                        let split = st.prepare(
                            gpu,
                            x,
                            &want,
                            &rt.tiles,
                            [&mut *tiles, &mut *tiles_staged],
                        )?;
                        Routes::Staged(split)
                    } else {
                        // Every expert in its slot: the tile list is built
                        // on the device, and the host goes on issuing the
                        // layer without waiting for the routing.
                        let out = ops::DeviceRoutes {
                            tiles: &*tiles,
                            gather: &*gather,
                            pair_of: &*pair_of,
                            count: &*n_tiles,
                        };
                        let bound =
                            ops::route_tiles_device(gpu, cexperts, np, x.k, x.n_expert, &out)?;
                        Routes::Device { bound }
                    };
                    // Pre-gating's predictions, for the uploads after this
                    // layer's GEMMs.
                    let predicted = match &pre {
                        Some((_, len)) => Some(gpu.stream.clone_dtoh(&pre_experts.slice(0..*len))?),
                        None => None,
                    };
                    lap!(
                        if bounded {
                            "MoE: routes to the host, tiles back + staging"
                        } else {
                            "MoE: route tiles on the device"
                        },
                        (!bounded) as usize
                    );
                    let ff = x.gate.rows;
                    let gather_in = GemmIn {
                        gather: Some(crate::device::dptr(gpu, Some(&*gather))),
                        ..h16
                    };
                    let (pg, pu, pd) = (
                        Rows::new(&*pair_g, 0, ff),
                        Rows::new(&*pair_u, 0, ff),
                        Rows::new(&*pair_d, 0, d),
                    );
                    let st_ref = staging.as_deref();
                    // One projection of the routed experts over the chunk's
                    // pairs: at full residency one launch over the tile
                    // list (its count on the device); under a bounded cache
                    // one over the resident tiles and one over the staged
                    // (disjoint pair rows).
                    let routed = |p: usize, input: GemmIn, out: GemmOut| -> Result<()> {
                        let stack = [&x.gate, &x.up, &x.down][p];
                        match &routes {
                            Routes::Staged(sp) => {
                                let st = st_ref.context("staging")?;
                                for (at, t, nt) in
                                    st.sources(x, sp, p, [&*tiles, &*tiles_staged])?
                                {
                                    at.gemm(gpu, stack, t, nt, np, input, out)?;
                                }
                                Ok(())
                            }
                            Routes::Device { bound } => stack.gemm_grouped(
                                gpu,
                                tiles,
                                TileCount::Device {
                                    count: n_tiles,
                                    bound: *bound,
                                },
                                x.n_expert - 1,
                                np,
                                input,
                                out,
                            ),
                        }
                    };
                    routed(0, gather_in, gemm_out(gpu, pg, np, ff)?)?;
                    routed(1, gather_in, gemm_out(gpu, pu, np, ff)?)?;
                    ops::swiglu(gpu, (&*pair_g, 0), (&*pair_u, 0), &*pair_g, None, np * ff)?;
                    routed(
                        2,
                        half_in(gpu, pg, np, ff, xh_tmp)?,
                        gemm_out(gpu, pd, np, d)?,
                    )?;
                    lap!(
                        "MoE: routed experts gate, up, SwiGLU, down (grouped GEMMs)",
                        4
                    );
                    // The next cached MoE layer's experts go up on the copy
                    // stream while this layer's GEMMs and the next mixer
                    // run: those pre-gating predicts, or all of them where
                    // the chunk touches nearly all (no predictor).
                    if let Some(st) = staging.as_deref_mut() {
                        let next = self.ops[i + 1..].iter().find_map(|op| match op {
                            Op::Moe(m2) => Some(m2.x.clone()),
                            _ => None,
                        });
                        if let Some(nx) = next.filter(|nx| nx.cache.is_some()) {
                            match &predicted {
                                Some(pe) => st.upload(&nx, &distinct(pe, nx.n_expert)?, true)?,
                                None if upload_all_ahead(n, nx.k, nx.n_expert) => {
                                    st.upload(&nx, &vec![true; nx.n_expert], true)?
                                }
                                None => {}
                            }
                        }
                    }
                    let shared = match &m.shared {
                        Some(s) => {
                            run_ffn(gpu, s, h16, n, &ffn_bufs)?;
                            Some(SharedRows {
                                out: ffn_bufs.out,
                                logit: m.has_shared_gate.then(|| po.part(&m.router, proj, 1)),
                            })
                        }
                        None => None,
                    };
                    lap!("MoE: shared expert (GEMMs)", 4);
                    ops::moe_combine_chunk(
                        gpu, cx, &*pair_d, pair_of, np, &*weights, x.k, d, n, shared,
                    )?;
                    if let Some((w, eps, _)) = &m.next_norm {
                        ops::rms_norm(gpu, cx, None, w, Some(ch), None, n, d, *eps, false)?;
                    }
                    // Under a bounded cache the host reads these lists again
                    // for the next layer: the copies above must be done
                    // before they change. At full residency nothing the
                    // host holds is in flight.
                    if bounded {
                        gpu.sync()?;
                    }
                    lap!("MoE: combine + next RMSNorm", 2);
                }
                Op::Dense(f) => {
                    let h16 = half_in(gpu, hr, n, d, xh_in)?;
                    run_ffn(gpu, f, h16, n, &ffn_bufs)?;
                    ops::add_inplace(gpu, cx, ffn_bufs.out, n * d)?;
                    lap!("dense FFN (GEMMs)", 5);
                }
                Op::Head { .. } => head = Some(i),
            }
        }
        // The last token's x and h into the decode buffers, then the head.
        let last = (n - 1) * d..n * d;
        gpu.stream
            .memcpy_dtod(&cx.slice(last.clone()), &mut self.bufs.x)?;
        gpu.stream.memcpy_dtod(&ch.slice(last), &mut self.bufs.h)?;
        let i = head.context("the stages have no head")?;
        let Op::Head { norm, eps, w } = &self.ops[i] else {
            unreachable!("head index points at the head")
        };
        if let Some(all) = all {
            // Every row's logits: the head's norm over the chunk (where the
            // last MoE op did not fuse it), then the head as a GEMM.
            if let Some(nw) = norm {
                ops::rms_norm(gpu, cx, None, nw, Some(ch), None, n, d, *eps, false)?;
            }
            let lg = gpu.stream.alloc_zeros::<f32>(n * w.rows)?;
            let lr = Rows::new(&lg, 0, w.rows);
            w.gemm(
                gpu,
                false,
                n,
                gemm_in(gpu, hr, n, d)?,
                gemm_out(gpu, lr, n, w.rows)?,
            )?;
            gpu.sync()?;
            all.extend(gpu.stream.clone_dtoh(&lg)?);
        }
        let b = &mut self.bufs;
        let int8 = head_int8(w);
        match norm {
            Some(nw) => {
                let hq = if int8 { b.hq.as_ref() } else { None };
                ops::rms_norm(gpu, &b.x, None, nw, Some(&b.h), hq, 1, d, *eps, false)?;
            }
            None => {
                if let (true, Some(q)) = (int8, b.hq.as_mut()) {
                    q.quantize(gpu, &b.h)?;
                }
            }
        }
        let hq = if int8 { b.hq.as_ref() } else { None };
        super::proj::mv(gpu, &self.tuning, w, &b.h, hq, &mut b.logits)?;
        lap!("head (last token)", 2);
        self.pos += n;
        self.tick = self
            .tick
            .checked_add(n as u32)
            .context("token counter overflow")?;
        Ok(())
    }
}
