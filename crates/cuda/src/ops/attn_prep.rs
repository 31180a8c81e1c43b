//! Launches of `kernels/attn_prep.cu`: q/k RMSNorm, partial NeoX RoPE and
//! the KV append of one token.

use super::attention::{AttnDims, KvCache};
use crate::device::{at_ptr, cfg, dptr, At, Gpu};
use crate::error::{ensure, Result};
use cudarc::driver::CudaSlice;

/// Attention input for one token at position `*pos`: per head RMSNorm
/// (weights optional) and RoPE of q (from `q_full`, per head `hd` query
/// values then, gated, `hd` gate values) into `q_out`; k normed, rotated and
/// v appended to the caches at `pos` (`[ctx][n_kv][hd]`).
#[allow(clippy::too_many_arguments)]
pub fn attn_prep(
    gpu: &Gpu,
    a: &AttnDims,
    q_full: At,
    k: At,
    v: At,
    norms: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    inv_freq: &CudaSlice<f64>,
    pos: &CudaSlice<i32>,
    q_out: &CudaSlice<f32>,
    kv: &KvCache,
    eps: f32,
) -> Result<()> {
    a.check()?;
    let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
    ensure!(q_out.len() >= nh * hd);
    let (qfp, kp, vp) = (
        at_ptr(gpu, q_full, nh * hd * (1 + a.gated as usize))?,
        at_ptr(gpu, k, nkv * hd)?,
        at_ptr(gpu, v, nkv * hd)?,
    );
    ensure!(kv.len().is_multiple_of(nkv * hd));
    let (kcp, vcp) = kv.ptrs(gpu);
    ensure!(inv_freq.len() >= a.n_rot / 2 && !pos.is_empty());
    ensure!(norms.is_none_or(|(q, k)| q.len() >= hd && k.len() >= hd));
    let args: [u64; 10] = [
        qfp,
        kp,
        vp,
        dptr(gpu, norms.map(|n| n.0)),
        dptr(gpu, norms.map(|n| n.1)),
        dptr(gpu, Some(inv_freq)),
        dptr(gpu, Some(pos)),
        dptr(gpu, Some(q_out)),
        kcp,
        vcp,
    ];
    let (n_rot, nh_i, nkv_i, hd_i, gated) = (
        a.n_rot as i32,
        nh as i32,
        nkv as i32,
        hd as i32,
        a.gated as i32,
    );
    let name = kv.ty().kernel("attn_prep", "");
    // SAFETY: attn_prep[_kvf16](q_full, k, v, q_norm, k_norm, inv_freq,
    // n_rot, pos, q_out, k_cache, v_cache, n_head, n_kv, hd, gated, eps),
    // the variant of the caches' element type (KvCache keeps K and V of
    // one type); sizes checked above. The caller keeps *pos < ctx (the
    // cache's positions): the kernel writes position *pos of the caches.
    unsafe {
        gpu.launch(
            &name,
            cfg(((nh + nkv) as u32, 1), 256),
            &[
                &args[0], &args[1], &args[2], &args[3], &args[4], &args[5], &n_rot, &args[6],
                &args[7], &args[8], &args[9], &nh_i, &nkv_i, &hd_i, &gated, &eps,
            ],
        )
    }
}
