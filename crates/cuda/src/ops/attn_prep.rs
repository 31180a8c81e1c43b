//! Launches of `kernels/attn_prep.cu`: q/k RMSNorm, partial NeoX RoPE and
//! the KV append of one token.

use super::attention::{AttnDims, KvCache};
use crate::device::{at_ptr, cfg, dptr, At, Gpu};
use crate::error::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// The argument struct of the four `attn_prep*` kernels (`AttnPrepArgs`
/// in `kernels/attn_prep.cu`: same field order and types, device addresses
/// as u64; the `.cu` asserts the size). One token: `pos` set, `ld_*` and
/// `pos0` 0; a chunk: `pos` 0 (null), the rows' strides and `pos0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnPrepArgs {
    pub q_full: u64,
    pub k: u64,
    pub v: u64,
    pub q_norm: u64,
    pub k_norm: u64,
    pub inv_freq: u64,
    pub pos: u64,
    pub q_out: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub ld_q: i64,
    pub ld_k: i64,
    pub ld_v: i64,
    pub n_rot: i32,
    pub pos0: i32,
    pub n_head: i32,
    pub n_kv: i32,
    pub hd: i32,
    pub gated: i32,
    pub eps: f32,
    pub pad: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernels by value as the `AttnPrepArgs` it mirrors (offsets checked
// in the tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for AttnPrepArgs {}

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
    let args = AttnPrepArgs {
        q_full: qfp,
        k: kp,
        v: vp,
        q_norm: dptr(gpu, norms.map(|n| n.0)),
        k_norm: dptr(gpu, norms.map(|n| n.1)),
        inv_freq: dptr(gpu, Some(inv_freq)),
        pos: dptr(gpu, Some(pos)),
        q_out: dptr(gpu, Some(q_out)),
        k_cache: kcp,
        v_cache: vcp,
        n_rot: a.n_rot as i32,
        n_head: nh as i32,
        n_kv: nkv as i32,
        hd: hd as i32,
        gated: a.gated as i32,
        eps,
        ..Default::default()
    };
    let name = kv.ty().kernel("attn_prep", "");
    // SAFETY: attn_prep[_kvf16](AttnPrepArgs) by value (the struct mirrors
    // the kernel's), the variant of the caches' element type (KvCache keeps
    // K and V of one type); sizes checked above. The caller keeps *pos <
    // ctx (the cache's positions): the kernel writes position *pos of the
    // caches.
    unsafe { gpu.launch(&name, cfg(((nh + nkv) as u32, 1), 256), &[&args]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct the kernels read by value: 10 pointers, 3 i64, 6 i32, an
    /// f32 and the pad = 136 bytes (the `.cu` asserts the same size), each
    /// field at the offset C gives the same declaration.
    #[test]
    fn attn_prep_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<AttnPrepArgs>(), 136);
        assert_eq!(align_of::<AttnPrepArgs>(), 8);
        assert_eq!(offset_of!(AttnPrepArgs, pos), 48);
        assert_eq!(offset_of!(AttnPrepArgs, v_cache), 72);
        assert_eq!(offset_of!(AttnPrepArgs, ld_q), 80);
        assert_eq!(offset_of!(AttnPrepArgs, n_rot), 104);
        assert_eq!(offset_of!(AttnPrepArgs, gated), 124);
        assert_eq!(offset_of!(AttnPrepArgs, eps), 128);
        assert_eq!(offset_of!(AttnPrepArgs, pad), 132);
    }
}
