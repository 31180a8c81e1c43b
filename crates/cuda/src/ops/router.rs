//! Launches of `kernels/router.cu`: the router's softmax + top-k, and the
//! router GEMV with the top-k (and optionally the post-mixer RMSNorm) in
//! one launch.

use super::q8ptrs;
use crate::device::{at_ptr, cfg, dptr, i32_of, At, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Router softmax + top-k over `n` logits: chosen experts (ascending),
/// their slots (`slot_of` None: identity) and weights.
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    gpu: &Gpu,
    logits: At,
    n: usize,
    k: usize,
    norm: bool,
    slot_of: Option<&CudaSlice<u32>>,
    slots: &CudaSlice<u32>,
    experts: &CudaSlice<u32>,
    w: &CudaSlice<f32>,
) -> Result<()> {
    ensure!(
        (1..=ROUTER_MAX_N).contains(&n) && (1..=32).contains(&k) && k <= n,
        "router: {k} of {n} experts (device kernel: n <= {ROUTER_MAX_N}, k <= 32)"
    );
    ensure!(slots.len() >= k && experts.len() >= k && w.len() >= k);
    ensure!(slot_of.is_none_or(|s| s.len() >= n));
    let p: [u64; 5] = [
        at_ptr(gpu, logits, n)?,
        dptr(gpu, slot_of),
        dptr(gpu, Some(slots)),
        dptr(gpu, Some(experts)),
        dptr(gpu, Some(w)),
    ];
    let (n_i, k_i, norm_i) = (n as i32, k as i32, norm as i32);
    // One thread per logit, whole warps: the kernel's barriers cost less
    // with fewer warps, so no more than n needs.
    let threads = n.div_ceil(32) as u32 * 32;
    // SAFETY: router_topk(logits, n, k, norm, slot_of, slots_out,
    // experts_out, w_out); sizes checked above; the kernel needs
    // 32 * ceil(n / 32) threads (<= its launch bound of 1024, as n <= 1024).
    unsafe {
        gpu.launch(
            "router_topk",
            cfg((1, 1), threads),
            &[&p[0], &n_i, &k_i, &norm_i, &p[1], &p[2], &p[3], &p[4]],
        )
    }
}

/// Most logits the device top-k takes (`ROUTER_MAX_N` in router.cu).
pub const ROUTER_MAX_N: usize = 1024;

/// The argument struct of `router_gemv_topk` (`RouterGemvArgs` in
/// `kernels/router.cu`: same field order and types, device addresses as
/// u64; the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RouterGemvArgs {
    pub w: u64,
    pub x: u64,
    pub logits: u64,
    pub counter: u64,
    pub slot_of: u64,
    pub slots_out: u64,
    pub experts_out: u64,
    pub w_out: u64,
    pub resid: u64,
    pub mix: u64,
    pub norm_w: u64,
    pub hq: u64,
    pub hqd: u64,
    pub rows: i32,
    pub cols: i32,
    pub n: i32,
    pub k: i32,
    pub norm: i32,
    pub eps: f32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernel by value as the `RouterGemvArgs` it mirrors (offsets checked
// in the tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for RouterGemvArgs {}

/// The router GEMV and [`router_topk`] in one launch
/// (`router_gemv_topk`): `logits = W x` over all rows of the f32 matrix
/// `w` (the router's `n` rows first, then any stacked rows), then the
/// softmax + top-k of `logits[0..n)` in the grid's last block. `counter`:
/// a word that is 0 between launches (the kernel leaves it so). With
/// `in_norm`, x is not read but written: `x = RMSNorm(resid + mix)·w`
/// (and as int8 into `q8`), computed in the same launch; `resid` is left
/// as it was (the combine adds `mix`: [`crate::ops::moe_combine`]).
#[allow(clippy::too_many_arguments)]
pub fn router_gemv_topk(
    gpu: &Gpu,
    w: &crate::gemv::DeviceMatrix,
    x: &CudaSlice<f32>,
    in_norm: Option<InNorm>,
    logits: &CudaSlice<f32>,
    counter: &CudaSlice<u32>,
    route: Route,
    slots: &CudaSlice<u32>,
    experts: &CudaSlice<u32>,
    w_out: &CudaSlice<f32>,
) -> Result<()> {
    let Route { n, k, norm } = route;
    ensure!(
        router_gemv_topk_fits(w, n),
        "router_gemv_topk: a {}x{} {:?} matrix for {n} experts (needs F32, columns a multiple of 4, n <= rows, n <= {ROUTER_MAX_N})",
        w.rows,
        w.cols,
        w.layout.ty
    );
    ensure!(
        (1..=32).contains(&k) && k <= n,
        "router: {k} of {n} experts"
    );
    ensure!(w.buf.len() >= 4 * w.rows * w.cols && x.len() >= w.cols && logits.len() >= w.rows);
    ensure!(!counter.is_empty() && slots.len() >= k && experts.len() >= k && w_out.len() >= k);
    let threads = n.div_ceil(RG_THREADS_PER_ROW) * RG_THREADS_PER_ROW;
    let blocks = w.rows.div_ceil(threads / RG_THREADS_PER_ROW);
    let mut args = RouterGemvArgs {
        w: dptr(gpu, Some(&w.buf)),
        x: dptr(gpu, Some(x)),
        logits: dptr(gpu, Some(logits)),
        counter: dptr(gpu, Some(counter)),
        // no slot table: slot = expert
        slot_of: 0,
        slots_out: dptr(gpu, Some(slots)),
        experts_out: dptr(gpu, Some(experts)),
        w_out: dptr(gpu, Some(w_out)),
        rows: i32_of(w.rows)?,
        cols: i32_of(w.cols)?,
        n: n as i32,
        k: k as i32,
        norm: norm as i32,
        ..Default::default()
    };
    if let Some(nm) = &in_norm {
        ensure!(
            router_in_norm_fits(w.cols, n),
            "router_gemv_topk: no fused RMSNorm for {} columns and {n} experts",
            w.cols
        );
        ensure!(nm.resid.len() >= w.cols && nm.mix.len() >= w.cols && nm.w.len() >= w.cols);
        ensure!(nm.q8.is_none_or(|q| q.n >= w.cols));
        (args.hq, args.hqd) = q8ptrs(gpu, nm.q8);
        args.resid = dptr(gpu, Some(nm.resid));
        args.mix = dptr(gpu, Some(nm.mix));
        args.norm_w = dptr(gpu, Some(nm.w));
        args.eps = nm.eps;
    }
    // SAFETY: router_gemv_topk(RouterGemvArgs) by value (the struct
    // mirrors the kernel's): w holds rows x cols f32 (cols % 4 == 0:
    // 16-byte row starts), x cols floats, logits rows floats, counter a
    // word that every launch leaves at 0, the outputs k entries (checked
    // above); no slot table (slot = expert). The block has 128 *
    // ceil(n / 128) <= 1024 threads (its launch bound), at least one per
    // logit, and the grid covers every row. With the fused norm
    // (router_in_norm_fits: cols % 32 == 0, cols <= 8 * threads and <= the
    // kernel's 4096-float shared buffer) resid, mix and norm_w hold cols
    // floats and q8 (when given) cols values; else those pointers are null.
    unsafe {
        gpu.launch(
            "router_gemv_topk",
            cfg((blocks as u32, 1), threads as u32),
            &[&args],
        )
    }
}

/// The post-mixer RMSNorm that [`router_gemv_topk`] computes in front of
/// the router: `x = RMSNorm(resid + mix)·w`, also as int8 into `q8`.
pub struct InNorm<'a> {
    pub resid: &'a CudaSlice<f32>,
    pub mix: &'a CudaSlice<f32>,
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub q8: Option<&'a Q8Vec>,
}

/// Whether [`router_gemv_topk`] can compute its input's RMSNorm for a
/// `cols`-wide input and `n` experts (its block of 128·ceil(n/128) threads
/// holds 8 values a thread; a 4096-float shared buffer).
pub fn router_in_norm_fits(cols: usize, n: usize) -> bool {
    let threads = n.div_ceil(RG_THREADS_PER_ROW) * RG_THREADS_PER_ROW;
    cols.is_multiple_of(32) && cols >= 32 && cols <= 8 * threads && cols <= 4096
}

/// Threads per row of `router_gemv_topk` (`RG_TPR` in router.cu).
const RG_THREADS_PER_ROW: usize = 128;

/// Whether [`router_gemv_topk`] takes this router matrix for `n` experts.
pub fn router_gemv_topk_fits(w: &crate::gemv::DeviceMatrix, n: usize) -> bool {
    w.layout.ty == redlite_gguf::GgmlType::F32
        && w.cols.is_multiple_of(4)
        && w.cols >= 4
        && (1..=ROUTER_MAX_N).contains(&n)
        && n <= w.rows
}

/// What a router selects: `k` of `n` experts, renormalised when `norm`.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub n: usize,
    pub k: usize,
    pub norm: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct router_gemv_topk reads by value: 13 pointers, 5 i32 and
    /// an f32 = 128 bytes (the `.cu` asserts the same size), each field at
    /// the offset C gives the same declaration.
    #[test]
    fn router_gemv_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<RouterGemvArgs>(), 128);
        assert_eq!(align_of::<RouterGemvArgs>(), 8);
        assert_eq!(offset_of!(RouterGemvArgs, slot_of), 32);
        assert_eq!(offset_of!(RouterGemvArgs, hqd), 96);
        assert_eq!(offset_of!(RouterGemvArgs, rows), 104);
        assert_eq!(offset_of!(RouterGemvArgs, norm), 120);
        assert_eq!(offset_of!(RouterGemvArgs, eps), 124);
    }

    /// router_gemv_topk's fused input norm: 8 values a thread of its
    /// 128·ceil(n/128)-thread block, whole 32-value groups, at most its
    /// 4096-float shared buffer.
    #[test]
    fn router_in_norm_shapes() {
        assert!(router_in_norm_fits(2048, 512)); // Qwen3-Next
        assert!(router_in_norm_fits(4096, 512));
        assert!(router_in_norm_fits(256, 16)); // the tiny fixtures
        assert!(router_in_norm_fits(1024, 100));
        assert!(!router_in_norm_fits(2048, 100)); // 128 threads hold 1024
        assert!(!router_in_norm_fits(2050, 512));
        assert!(!router_in_norm_fits(8192, 1024)); // the shared buffer
        assert!(!router_in_norm_fits(0, 16));
    }
}
