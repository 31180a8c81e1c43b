//! Launches of `kernels/elementwise.cu`: SwiGLU, the residual add, and
//! the MoE combine (with the next block's RMSNorm fused in).

use super::norm::v8_block;
use super::q8ptrs;
use crate::device::{at_ptr, cfg, dptr, i32_of, At, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::CudaSlice;

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
        let (wp, hp) = (dptr(gpu, Some(n.w)), dptr(gpu, Some(n.h)));
        let (qp, qdp) = q8ptrs(gpu, n.q8);
        let (name, block) = match v8_block(d) {
            Some(b) => ("moe_combine_norm_v8", b),
            None => ("moe_combine_norm", 1024),
        };
        // moe_combine_norm_v8 takes one more argument: mix.
        let mut args: Vec<&dyn crate::device::KernelArg> = vec![
            &p[0], &p[1], &p[2], &k_i, &d_i, &p[3], &p[4], &wp, &n.eps, &hp, &qp, &qdp,
        ];
        if name == "moe_combine_norm_v8" {
            args.push(&mixp);
        }
        // SAFETY: moe_combine_norm(x, ys, w, k, d, sh, sh_logit, norm_w,
        // eps, h, q, qd), moe_combine_norm_v8 the same plus mix, with 8 *
        // block >= d and d % 8 == 0 (v8_block); x, h, norm_w hold d floats,
        // ys k*d, w k, q/qd d values with d % 32 == 0, mix (null when not
        // given; only the v8 kernel, checked above) d floats; one block.
        return unsafe { gpu.launch(name, cfg((1, 1), block), &args) };
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
