//! Launches of the prefill kernels that take a chunk of tokens at once
//! (`attn_prep_chunk`, `kernels/deltanet_chunk.cu`,
//! `router_topk_chunk`, `add_bias_rows`, `moe_combine_chunk`). Activations
//! are rows of a device buffer ([`Rows`]); every wrapper checks that the
//! rows it hands a kernel lie inside their buffer.

use super::attention::{AttnDims, KvCache};
use super::attn_prep::AttnPrepArgs;
use super::deltanet::{GdnDims, GdnWeights};
use super::gdn_wy::{gdn_wy_recurrence, wy_state_kernel, WyInputs};
use super::router::ROUTER_MAX_N;
use crate::device::{cfg, dptr, i32_of, Gpu};
use crate::error::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Rows of floats in a device buffer: row t is `buf[off + t*ld..][..width]`.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub buf: &'a CudaSlice<f32>,
    pub off: usize,
    pub ld: usize,
}

impl<'a> Rows<'a> {
    pub fn new(buf: &'a CudaSlice<f32>, off: usize, ld: usize) -> Self {
        Self { buf, off, ld }
    }

    /// The device address of row 0, after checking that `n` rows of
    /// `width` floats fit in the buffer.
    pub fn ptr(&self, gpu: &Gpu, n: usize, width: usize) -> Result<u64> {
        ensure!(n >= 1, "rows: none");
        ensure!(
            n == 1 || width <= self.ld,
            "rows: {width} floats a row, {} apart",
            self.ld
        );
        let end = self.off + (n - 1) * self.ld + width;
        ensure!(
            end <= self.buf.len(),
            "rows: {n} rows of {width} floats ({} apart, from {}) overrun a buffer of {}",
            self.ld,
            self.off,
            self.buf.len()
        );
        Ok(dptr(gpu, Some(self.buf)) + 4 * self.off as u64)
    }
}

/// The argument struct of `gdn_recur_chunk_k*` (`GdnRecurArgs` in
/// `kernels/deltanet_chunk.cu`: same field order and types, device
/// addresses as u64; the `.cu` asserts the size). `w`: the columns a block
/// owns (`W`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GdnRecurArgs {
    pub conv: u64,
    pub ba: u64,
    pub ld_ba: i64,
    pub dt_bias: u64,
    pub ssm_a: u64,
    pub state: u64,
    pub raw: u64,
    pub n_k: i32,
    pub n_v: i32,
    pub dk: i32,
    pub dv: i32,
    pub w: i32,
    pub tokens: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers, passed to the kernels
// by value as the `GdnRecurArgs` it mirrors (offsets checked in the tests,
// the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for GdnRecurArgs {}

/// q/k norm, RoPE and the KV append of `tokens` tokens at positions
/// `pos0..`; the rotated queries into `q_out` (rows of n_head*hd).
#[allow(clippy::too_many_arguments)]
pub fn attn_prep_chunk(
    gpu: &Gpu,
    a: &AttnDims,
    q_full: Rows,
    k: Rows,
    v: Rows,
    norms: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    inv_freq: &CudaSlice<f64>,
    pos0: usize,
    tokens: usize,
    q_out: Rows,
    kv: &KvCache,
    eps: f32,
) -> Result<()> {
    a.check()?;
    let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
    ensure!(q_out.ld == nh * hd, "attn_prep_chunk: q_out rows");
    let qfp = q_full.ptr(gpu, tokens, nh * hd * (1 + a.gated as usize))?;
    let (kp, vp) = (k.ptr(gpu, tokens, nkv * hd)?, v.ptr(gpu, tokens, nkv * hd)?);
    let qop = q_out.ptr(gpu, tokens, nh * hd)?;
    ensure!(
        (pos0 + tokens) * nkv * hd <= kv.len(),
        "attn_prep_chunk: positions {pos0}..{} past the cache",
        pos0 + tokens
    );
    ensure!(inv_freq.len() >= a.n_rot / 2 && tokens <= 65535);
    ensure!(norms.is_none_or(|(q, k)| q.len() >= hd && k.len() >= hd));
    let (kcp, vcp) = kv.ptrs(gpu);
    let args = AttnPrepArgs {
        q_full: qfp,
        k: kp,
        v: vp,
        q_norm: dptr(gpu, norms.map(|n| n.0)),
        k_norm: dptr(gpu, norms.map(|n| n.1)),
        inv_freq: dptr(gpu, Some(inv_freq)),
        // null: the chunk kernels take positions pos0..
        pos: 0,
        q_out: qop,
        k_cache: kcp,
        v_cache: vcp,
        ld_q: q_full.ld as i64,
        ld_k: k.ld as i64,
        ld_v: v.ld as i64,
        n_rot: a.n_rot as i32,
        pos0: i32_of(pos0)?,
        n_head: nh as i32,
        n_kv: nkv as i32,
        hd: hd as i32,
        gated: a.gated as i32,
        eps,
        pad: 0,
    };
    let name = kv.ty().kernel("attn_prep_chunk", "");
    // SAFETY: attn_prep_chunk[_kvf16](AttnPrepArgs) by value (the struct
    // mirrors the kernel's); the rows of every token and the cache
    // positions it writes are checked above.
    unsafe {
        gpu.launch(
            &name,
            cfg(((nh + nkv) as u32, tokens as u32), 256),
            &[&args],
        )
    }
}

/// The columns a block of the sequential chunk recurrence takes (W: two
/// a warp) and its variant (`gdn_recur_chunk_k{dk}`: dk/32 state rows a
/// lane), for these shapes: 32 columns where dv is whole multiples of 32
/// (the models' dv 128: 4 blocks a head, 512 threads; 8 and 16 measured no
/// faster, docs/what-did-not-work.md), else all dv (<= 32, even) in one
/// block.
pub fn gdn_chunk_split(s: &GdnDims) -> Option<(usize, &'static str)> {
    let max_cols = 32;
    let w = if s.dv.is_multiple_of(max_cols) {
        max_cols
    } else if s.dv <= 32 && s.dv.is_multiple_of(2) {
        s.dv
    } else {
        return None;
    };
    let name = match s.dk {
        32 => "gdn_recur_chunk_k32",
        64 => "gdn_recur_chunk_k64",
        128 => "gdn_recur_chunk_k128",
        256 => "gdn_recur_chunk_k256",
        _ => return None,
    };
    // Each thread stages at most GDN_MAXE (4) of a token's 2dk + W + 1
    // values (k, q, v, gates).
    (2 * s.dk + w < 4 * 16 * w).then_some((w, name))
}

/// How [`gdn_chunk`] runs the DeltaNet state recurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnForm {
    /// The chunkwise (WY) form, sub-chunks of 64 tokens
    /// (`kernels/deltanet_wy.cu`), where the head sizes allow it
    /// ([`wy_state_kernel`]; else sequential). The prefill's: pp2048 on the
    /// iq2 synth file 7,909 against 6,687 tok/s sequential (H200,
    /// bench/RESULTS.md).
    Chunkwise,
    /// Token after token (`gdn_recur_chunk_k*`), every shape.
    Sequential,
}

/// Scratch of a DeltaNet chunk: the conv outputs and the unnormalised
/// recurrence outputs of every token, and for the WY form its blocks
/// ([`wy_scratch_floats`]; None: the sequential form).
pub struct GdnChunkScratch<'a> {
    pub conv: &'a CudaSlice<f32>,
    pub raw: &'a CudaSlice<f32>,
    pub wy: Option<&'a CudaSlice<f32>>,
}

/// A Gated DeltaNet layer over `tokens` tokens at positions `pos0..`:
/// conv + SiLU, the ring update, the state recurrence, the gated norm
/// into `out` (rows of n_v*dv). The recurrence in `form` where the shape
/// and the scratch allow it, else sequential ([`gdn_chunk_split`]).
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunk(
    gpu: &Gpu,
    s: &GdnDims,
    w: &GdnWeights,
    qkv: Rows,
    z: Rows,
    ba: Rows,
    ring: &CudaSlice<f32>,
    state: &CudaSlice<f32>,
    scratch: &GdnChunkScratch,
    out: &CudaSlice<f32>,
    pos0: usize,
    tokens: usize,
    eps: f32,
    l2_eps: f32,
    form: GdnForm,
) -> Result<()> {
    s.check()?;
    let (cd, vd, kk) = (s.conv_dim(), s.n_v * s.dv, s.conv_kernel);
    let wy = scratch
        .wy
        .filter(|_| form == GdnForm::Chunkwise && wy_state_kernel(s).is_some());
    let (w_cols, recur) = gdn_chunk_split(s).ok_or_else(|| {
        crate::error::CudaError::Invalid(format!("DeltaNet chunk: no kernel for {s:?}"))
    })?;
    ensure!(
        s.dk <= 256 && s.dv <= 512 && s.dv <= 1024,
        "DeltaNet chunk: head sizes"
    );
    let (inp, zp, bap) = (
        qkv.ptr(gpu, tokens, cd)?,
        z.ptr(gpu, tokens, vd)?,
        ba.ptr(gpu, tokens, 2 * s.n_v)?,
    );
    ensure!(ring.len() >= kk * cd && state.len() >= s.state_len());
    ensure!(scratch.conv.len() >= tokens * cd && scratch.raw.len() >= tokens * vd);
    ensure!(out.len() >= tokens * vd && tokens <= 65535);
    ensure!(w.conv_w.len() >= cd * kk && w.norm_w.len() >= s.dv);
    ensure!(w.dt_bias.len() >= s.n_v && w.ssm_a.len() >= s.n_v);
    let (cd_i, k_i, p0, t_i) = (i32_of(cd)?, kk as i32, i32_of(pos0)?, i32_of(tokens)?);
    let ld_in = qkv.ld as i64;
    let (ringp, statep) = (dptr(gpu, Some(ring)), dptr(gpu, Some(state)));
    let (convp, rawp, outp) = (
        dptr(gpu, Some(scratch.conv)),
        dptr(gpu, Some(scratch.raw)),
        dptr(gpu, Some(out)),
    );
    let cw = dptr(gpu, Some(w.conv_w));
    let gx = (cd as u32).div_ceil(256);
    // SAFETY: gdn_conv_chunk(in, ld_in, ring, conv_w, y, cd, K, pos0): the
    // inputs' rows and the scratch (tokens x cd) checked above; the ring
    // holds K slots of cd.
    unsafe {
        gpu.launch(
            "gdn_conv_chunk",
            cfg((gx, tokens as u32), 256),
            &[&inp, &ld_in, &ringp, &cw, &convp, &cd_i, &k_i, &p0],
        )
    }?;
    // SAFETY: gdn_ring_chunk(in, ld_in, ring, cd, K, pos0, tokens): writes
    // slots of the ring (K x cd) from the checked input rows.
    unsafe {
        gpu.launch(
            "gdn_ring_chunk",
            cfg((gx, tokens.min(kk) as u32), 256),
            &[&inp, &ld_in, &ringp, &cd_i, &k_i, &p0, &t_i],
        )
    }?;
    let (cd_l, nk_i, dk_i) = (cd as i64, s.n_k as i32, s.dk as i32);
    // SAFETY: gdn_qk_chunk(conv, cd, n_k, dk, l2_eps): grid (n_k, tokens),
    // block 32*ceil(dk/32) <= 256 (dk <= 256: GdnDims::check); rewrites
    // the q and k parts of the checked conv rows in place.
    unsafe {
        gpu.launch(
            "gdn_qk_chunk",
            cfg(
                (s.n_k as u32, tokens as u32),
                (s.dk as u32).div_ceil(32) * 32,
            ),
            &[&convp, &cd_l, &nk_i, &dk_i, &l2_eps],
        )
    }?;
    if let Some(wy) = wy {
        let x = WyInputs {
            conv: convp,
            ba: bap,
            ld_ba: ba.ld,
            raw: rawp,
        };
        gdn_wy_recurrence(gpu, s, w, &x, state, wy, tokens)?;
    } else {
        gdn_sequential(
            gpu, s, w, convp, bap, ba.ld, statep, rawp, tokens, w_cols, recur,
        )?;
    }
    let ld_z = z.ld as i64;
    let nw = dptr(gpu, Some(w.norm_w));
    let threads = (s.dv as u32).div_ceil(32) * 32;
    let d = [s.n_v as i32, s.dv as i32];
    // SAFETY: gdn_norm_chunk(raw, z, ld_z, norm_w, out, n_v, dv, eps);
    // grid (n_v, tokens), a thread per value of the head (dv <= 1024), rows
    // checked above.
    unsafe {
        gpu.launch(
            "gdn_norm_chunk",
            cfg((s.n_v as u32, tokens as u32), threads),
            &[&rawp, &zp, &ld_z, &nw, &outp, &d[0], &d[1], &eps],
        )
    }
}

/// The sequential recurrence (`gdn_recur_chunk_k*`, `w_cols` columns a
/// block) over checked rows.
#[allow(clippy::too_many_arguments)]
fn gdn_sequential(
    gpu: &Gpu,
    s: &GdnDims,
    w: &GdnWeights,
    convp: u64,
    bap: u64,
    ld_ba: usize,
    statep: u64,
    rawp: u64,
    tokens: usize,
    w_cols: usize,
    recur: &str,
) -> Result<()> {
    let d: [i32; 5] = [
        s.n_k as i32,
        s.n_v as i32,
        s.dk as i32,
        s.dv as i32,
        w_cols as i32,
    ];
    let args = GdnRecurArgs {
        conv: convp,
        ba: bap,
        ld_ba: ld_ba as i64,
        dt_bias: dptr(gpu, Some(w.dt_bias)),
        ssm_a: dptr(gpu, Some(w.ssm_a)),
        state: statep,
        raw: rawp,
        n_k: d[0],
        n_v: d[1],
        dk: d[2],
        dv: d[3],
        w: d[4],
        tokens: tokens as i32,
    };
    let blocks = s.n_v * (s.dv / w_cols);
    // SAFETY: gdn_recur_chunk_k{dk}(GdnRecurArgs) by value (the struct
    // mirrors the kernel's); grid n_v*dv/W blocks of 16*W threads (two
    // columns a warp, dk/32 rows a lane: the variant matches dk,
    // gdn_chunk_split); state n_v*dk*dv floats, conv tokens x cd, raw
    // tokens x n_v*dv (checked above).
    unsafe {
        gpu.launch(
            recur,
            cfg((blocks as u32, 1), (16 * w_cols) as u32),
            &[&args],
        )
    }
}

/// Softmax + top-k of every token's router logits; token t's choices at
/// `t*k..` of `slots`, `experts`, `w` (ascending expert order).
#[allow(clippy::too_many_arguments)]
pub fn router_topk_chunk(
    gpu: &Gpu,
    logits: Rows,
    n: usize,
    k: usize,
    norm: bool,
    tokens: usize,
    slots: &CudaSlice<u32>,
    experts: &CudaSlice<u32>,
    w: &CudaSlice<f32>,
) -> Result<()> {
    ensure!(
        (1..=ROUTER_MAX_N).contains(&n) && (1..=32).contains(&k) && k <= n,
        "router: {k} of {n} experts"
    );
    let lp = logits.ptr(gpu, tokens, n)?;
    ensure!(slots.len() >= tokens * k && experts.len() >= tokens * k && w.len() >= tokens * k);
    ensure!(tokens <= i32::MAX as usize);
    let p = [
        dptr(gpu, Some(slots)),
        dptr(gpu, Some(experts)),
        dptr(gpu, Some(w)),
    ];
    let (ld, n_i, k_i, norm_i) = (logits.ld as i64, n as i32, k as i32, norm as i32);
    let threads = n.div_ceil(32) as u32 * 32;
    // SAFETY: router_topk_chunk(logits, ld, n, k, norm, slots, experts, w);
    // a block of 32*ceil(n/32) <= 1024 threads per token; rows and outputs
    // checked above.
    unsafe {
        gpu.launch(
            "router_topk_chunk",
            cfg((tokens as u32, 1), threads),
            &[&lp, &ld, &n_i, &k_i, &norm_i, &p[0], &p[1], &p[2]],
        )
    }
}

/// `y[t][j] += b[j]` for the first `b.len()` values of every row.
pub fn add_bias_rows(gpu: &Gpu, y: Rows, b: &CudaSlice<f32>, tokens: usize) -> Result<()> {
    let n = b.len();
    let yp = y.ptr(gpu, tokens, n)?;
    ensure!(tokens <= 65535);
    let (ld, n_i, bp) = (y.ld as i64, i32_of(n)?, dptr(gpu, Some(b)));
    // SAFETY: add_bias_rows(y, ld, b, n); grid (ceil(n/256), tokens), rows
    // checked above, b holds n floats.
    unsafe {
        gpu.launch(
            "add_bias_rows",
            cfg(((n as u32).div_ceil(256), tokens as u32), 256),
            &[&yp, &ld, &bp, &n_i],
        )
    }
}

/// `y[t] = f16(x[t])`: `tokens` rows of `cols` floats (a multiple of 4,
/// rows 16-byte aligned) into `y` as compact f16 rows; returns y's device
/// address (a prefill GEMM reads it as `GemmIn { f16: true, ldx: cols }`).
pub fn to_f16_rows(
    gpu: &Gpu,
    x: Rows,
    tokens: usize,
    cols: usize,
    y: &CudaSlice<u16>,
) -> Result<u64> {
    let xp = x.ptr(gpu, tokens, cols)?;
    ensure!(
        cols.is_multiple_of(4) && x.ld.is_multiple_of(4) && xp.is_multiple_of(16),
        "to_f16_rows: rows of {cols} floats {} apart must be 16-byte aligned",
        x.ld
    );
    ensure!(
        tokens <= 65535 && y.len() >= tokens * cols,
        "to_f16_rows: {tokens} rows of {cols} into {}",
        y.len()
    );
    let (ld, cols_i, yp) = (x.ld as i64, i32_of(cols)?, dptr(gpu, Some(y)));
    // SAFETY: to_f16_rows(x, ld, y, cols); grid (ceil(cols/1024), tokens):
    // x holds `tokens` rows of `cols` floats `ld` apart (checked by `ptr`),
    // y at least tokens*cols halves (checked above); 16-byte aligned loads.
    unsafe {
        gpu.launch(
            "to_f16_rows",
            cfg(((cols as u32).div_ceil(1024), tokens as u32), 256),
            &[&xp, &ld, &yp, &cols_i],
        )?;
    }
    Ok(yp)
}

/// The shared expert's part of a chunk's combine: its outputs (rows of d)
/// and its gate logits (one per token, `Rows` of width 1).
pub struct SharedRows<'a> {
    pub out: &'a CudaSlice<f32>,
    pub logit: Option<Rows<'a>>,
}

/// `x[t] += sum_i w[t,i] * ys[pair[t,i]] (+ sigmoid(logit[t]) * sh[t])`.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine_chunk(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ys: &CudaSlice<f32>,
    pair: &CudaSlice<i32>,
    n_pairs: usize,
    w: &CudaSlice<f32>,
    k: usize,
    d: usize,
    tokens: usize,
    shared: Option<SharedRows>,
) -> Result<()> {
    ensure!(x.len() >= tokens * d && ys.len() >= n_pairs * d && n_pairs == tokens * k);
    ensure!(pair.len() >= tokens * k && w.len() >= tokens * k && tokens <= 65535);
    let (shp, slp, sld) = match &shared {
        Some(s) => {
            ensure!(s.out.len() >= tokens * d);
            let (lp, ld) = match s.logit {
                Some(l) => (l.ptr(gpu, tokens, 1)?, l.ld as i64),
                None => (0, 0),
            };
            (dptr(gpu, Some(s.out)), lp, ld)
        }
        None => (0, 0, 0),
    };
    let args = MoeCombineChunkArgs {
        x: dptr(gpu, Some(x)),
        ys: dptr(gpu, Some(ys)),
        pair: dptr(gpu, Some(pair)),
        w: dptr(gpu, Some(w)),
        sh: shp,
        sh_logit: slp,
        sh_ld: sld,
        k: k as i32,
        d: i32_of(d)?,
    };
    // SAFETY: moe_combine_chunk(MoeCombineChunkArgs) by value (the struct
    // mirrors the kernel's); pair holds indices < n_pairs (built on the
    // host by route_tiles, or on the device by route_tiles.cu, whose every
    // write of pair_of is below n_pairs), the rest checked above.
    unsafe {
        gpu.launch(
            "moe_combine_chunk",
            cfg(((d as u32).div_ceil(256), tokens as u32), 256),
            &[&args],
        )
    }
}

/// The argument struct of `moe_combine_chunk` (`MoeCombineChunkArgs` in
/// `kernels/elementwise.cu`: same field order and types, device addresses
/// as u64; the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeCombineChunkArgs {
    pub x: u64,
    pub ys: u64,
    pub pair: u64,
    pub w: u64,
    pub sh: u64,
    pub sh_logit: u64,
    pub sh_ld: i64,
    pub k: i32,
    pub d: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers, passed to the kernel by
// value as the `MoeCombineChunkArgs` it mirrors (offsets checked in the
// tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for MoeCombineChunkArgs {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The structs the chunk kernels read by value, at the sizes the `.cu`
    /// asserts and the offsets C gives the same declarations.
    #[test]
    fn chunk_args_layouts_match_the_kernel_structs() {
        // 6 pointers and an i64, 6 i32 = 80 bytes
        assert_eq!(size_of::<GdnRecurArgs>(), 80);
        assert_eq!(align_of::<GdnRecurArgs>(), 8);
        assert_eq!(offset_of!(GdnRecurArgs, ld_ba), 16);
        assert_eq!(offset_of!(GdnRecurArgs, raw), 48);
        assert_eq!(offset_of!(GdnRecurArgs, n_k), 56);
        assert_eq!(offset_of!(GdnRecurArgs, tokens), 76);
        // 6 pointers and an i64, 2 i32 = 64 bytes
        assert_eq!(size_of::<MoeCombineChunkArgs>(), 64);
        assert_eq!(offset_of!(MoeCombineChunkArgs, sh_ld), 48);
        assert_eq!(offset_of!(MoeCombineChunkArgs, k), 56);
        assert_eq!(offset_of!(MoeCombineChunkArgs, d), 60);
    }
}
