//! Launches of `kernels/elementwise.cu`: SwiGLU, the residual add, and
//! the MoE combine (with the next block's RMSNorm fused in).

use super::norm::v8_block;
use super::q8ptrs;
use crate::device::{at_ptr, cfg, dptr, i32_of, At, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::{CudaSlice, DeviceRepr};

/// `out = SiLU(g) * u` over `n` values (out may be g); `q8`: out also as
/// int8 activations.
pub fn swiglu(
    gpu: &Gpu,
    g: (&CudaSlice<f32>, usize),
    u: (&CudaSlice<f32>, usize),
    out: &CudaSlice<f32>,
    q8: Option<&Q8Vec>,
    n: usize,
) -> Result<()> {
    ensure!(g.0.len() >= g.1 + n && u.0.len() >= u.1 + n && out.len() >= n && n >= 1);
    ensure!(q8.is_none_or(|q| q.n >= n && n.is_multiple_of(32)));
    let (qp, qdp) = q8ptrs(gpu, q8);
    let gp = dptr(gpu, Some(g.0)) + 4 * g.1 as u64;
    let up = dptr(gpu, Some(u.0)) + 4 * u.1 as u64;
    let op = dptr(gpu, Some(out));
    let n_i = i32_of(n)?;
    // SAFETY: swiglu(g, u, out, q, qd, n): g and u hold n floats from
    // their offsets, out n floats, q/qd (when given) n values with n % 32
    // == 0 (checked above).
    unsafe {
        gpu.launch(
            "swiglu",
            cfg(((n as u32).div_ceil(256), 1), 256),
            &[&gp, &up, &op, &qp, &qdp, &n_i],
        )
    }
}

/// `x += y` over `n` values.
pub fn add_inplace(gpu: &Gpu, x: &CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
    ensure!(x.len() >= n && y.len() >= n && n >= 1);
    let (xp, yp, n_i) = (dptr(gpu, Some(x)), dptr(gpu, Some(y)), i32_of(n)?);
    // SAFETY: add_inplace(x, y, n); both hold n floats (checked above).
    unsafe {
        gpu.launch(
            "add_inplace",
            cfg(((n as u32).div_ceil(256), 1), 256),
            &[&xp, &yp, &n_i],
        )
    }
}

/// The next block's RMSNorm fused into [`moe_combine`]: weights, eps, the
/// normed output and optionally its int8 form.
pub struct NextNorm<'a> {
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub h: &'a CudaSlice<f32>,
    pub q8: Option<&'a Q8Vec>,
}

/// The argument struct of `moe_combine_norm` and `moe_combine_norm_v8`
/// (`MoeCombineNormArgs` in `kernels/elementwise.cu`: same field order and
/// types, device addresses as u64; the `.cu` asserts the size). `mix` is
/// read by the v8 kernel only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeCombineNormArgs {
    pub x: u64,
    pub ys: u64,
    pub w: u64,
    pub sh: u64,
    pub sh_logit: u64,
    pub norm_w: u64,
    pub h: u64,
    pub q: u64,
    pub qd: u64,
    pub mix: u64,
    pub k: i32,
    pub d: i32,
    pub eps: f32,
    pub pad: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernels by value as the `MoeCombineNormArgs` it mirrors (offsets
// checked in the tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for MoeCombineNormArgs {}

/// `x += Σ_i w[i]·ys[i] + sh·sigmoid(sh_logit)` (`k` routed outputs of
/// `d` values; the shared expert and its gate optional); with `norm`, also
/// `h = RMSNorm(x)·norm.w` in the same launch. `mix` (with `norm`, d % 8
/// == 0 and d <= 4096 only): the mixer's output, added to x first, for a
/// layer whose post-mixer norm ran in [`crate::ops::router_gemv_topk`].
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ys: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    k: usize,
    d: usize,
    sh: Option<&CudaSlice<f32>>,
    sh_logit: Option<At>,
    norm: Option<NextNorm>,
    mix: Option<&CudaSlice<f32>>,
) -> Result<()> {
    ensure!(x.len() >= d && ys.len() >= k * d && w.len() >= k && d >= 1);
    ensure!(mix.is_none_or(|m| m.len() >= d));
    ensure!(
        mix.is_none() || (norm.is_some() && v8_block(d).is_some()),
        "moe_combine: a deferred residual add (mix) needs the fused next norm and d % 8 == 0, d <= 4096"
    );
    let mixp = dptr(gpu, mix);
    ensure!(sh.is_none_or(|s| s.len() >= d));
    let slp = match sh_logit {
        Some(a) => at_ptr(gpu, a, 1)?,
        None => 0,
    };
    let p: [u64; 5] = [
        dptr(gpu, Some(x)),
        dptr(gpu, Some(ys)),
        dptr(gpu, Some(w)),
        dptr(gpu, sh),
        slp,
    ];
    let (k_i, d_i) = (i32_of(k)?, i32_of(d)?);
    if let Some(n) = norm {
        ensure!(n.w.len() >= d && n.h.len() >= d);
        ensure!(n.q8.is_none_or(|q| q.n >= d && d.is_multiple_of(32)));
        let (q, qd) = q8ptrs(gpu, n.q8);
        let (name, block) = match v8_block(d) {
            Some(b) => ("moe_combine_norm_v8", b),
            None => ("moe_combine_norm", 1024),
        };
        let args = MoeCombineNormArgs {
            x: p[0],
            ys: p[1],
            w: p[2],
            sh: p[3],
            sh_logit: p[4],
            norm_w: dptr(gpu, Some(n.w)),
            h: dptr(gpu, Some(n.h)),
            q,
            qd,
            mix: mixp,
            k: k_i,
            d: d_i,
            eps: n.eps,
            pad: 0,
        };
        // SAFETY: moe_combine_norm[_v8](MoeCombineNormArgs) by value (the
        // struct mirrors the kernels'), the v8 kernel with 8 * block >= d
        // and d % 8 == 0 (v8_block); x, h, norm_w hold d floats, ys k*d, w
        // k, q/qd d values with d % 32 == 0, mix (null when not given; only
        // with the v8 kernel, checked above) d floats; one block.
        return unsafe { gpu.launch(name, cfg((1, 1), block), &[&args]) };
    }
    // SAFETY: moe_combine(x, ys, w, k, d, sh, sh_logit); sizes checked above.
    unsafe {
        gpu.launch(
            "moe_combine",
            cfg(((d as u32).div_ceil(256), 1), 256),
            &[&p[0], &p[1], &p[2], &k_i, &d_i, &p[3], &p[4]],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct the combine-and-norm kernels read by value: 10
    /// pointers, 2 i32, an f32 and the pad = 96 bytes (the `.cu` asserts
    /// the same size), each field at the offset C gives the same
    /// declaration.
    #[test]
    fn moe_combine_norm_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<MoeCombineNormArgs>(), 96);
        assert_eq!(align_of::<MoeCombineNormArgs>(), 8);
        assert_eq!(offset_of!(MoeCombineNormArgs, norm_w), 40);
        assert_eq!(offset_of!(MoeCombineNormArgs, mix), 72);
        assert_eq!(offset_of!(MoeCombineNormArgs, k), 80);
        assert_eq!(offset_of!(MoeCombineNormArgs, eps), 88);
        assert_eq!(offset_of!(MoeCombineNormArgs, pad), 92);
    }
}
