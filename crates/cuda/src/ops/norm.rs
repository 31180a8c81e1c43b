//! Launches of `kernels/norm.cu`: RMSNorm (residual add fused, optional
//! int8 output), `rms_norm_v8` for rows the 8-values-a-thread kernel takes.

use crate::device::{cfg, dptr, i32_of, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::CudaSlice;

/// `out[r] = x[r] * s * w` per row of `d` (rows = x.len() / d); with `res`,
/// `x += res` first (written back). `out` None: in place. `q8`: the output
/// also quantized for the int8 kernels (one launch for both).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    res: Option<&CudaSlice<f32>>,
    w: &CudaSlice<f32>,
    out: Option<&CudaSlice<f32>>,
    q8: Option<&Q8Vec>,
    rows: usize,
    d: usize,
    eps: f32,
    add_one: bool,
) -> Result<()> {
    ensure!(rows >= 1 && d >= 1 && x.len() >= rows * d && w.len() >= d);
    ensure!(q8.is_none_or(|q| q.n >= rows * d && d.is_multiple_of(32)));
    ensure!(res.is_none_or(|r| r.len() >= rows * d));
    ensure!(out.is_none_or(|o| o.len() >= rows * d));
    let (xp, rp, wp) = (dptr(gpu, Some(x)), dptr(gpu, res), dptr(gpu, Some(w)));
    let op = out.map_or(xp, |o| dptr(gpu, Some(o)));
    let (d_i, one) = (i32_of(d)?, add_one as i32);
    let (qp, qdp) = (dptr(gpu, q8.map(|q| &q.q)), dptr(gpu, q8.map(|q| &q.d)));
    // 8 values a thread in registers where the shape allows (norm.cu).
    let (name, block) = match v8_block(d) {
        Some(b) => ("rms_norm_v8", b),
        None => ("rms_norm", if d >= 1024 { 1024 } else { 256 }),
    };
    // SAFETY: rms_norm(float* x, const float* res, const float* w, float*
    // out, i8* q, float* qd, int d, float eps, int add_one), rms_norm_v8
    // the same with 8 * block >= d and d % 8 == 0 (v8_block); x, res, out
    // hold rows*d floats, w d floats, q rows*d bytes and qd rows*d/32
    // floats with d % 32 == 0 (checked above).
    unsafe {
        gpu.launch(
            name,
            cfg((rows as u32, 1), block),
            &[&xp, &rp, &wp, &op, &qp, &qdp, &d_i, &eps, &one],
        )
    }
}

/// The block of the 8-values-a-thread kernels (`rms_norm_v8`,
/// `moe_combine_norm_v8`) for rows of `d`: whole warps covering d, when d
/// is whole 16-byte pairs and fits their launch bound (512 threads).
pub fn v8_block(d: usize) -> Option<u32> {
    (d.is_multiple_of(8) && d <= 8 * 512).then(|| (d / 8).div_ceil(32).max(1) as u32 * 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-values-a-thread kernels: whole warps covering d, only for
    /// d % 8 == 0 up to their 512-thread bound; the 1024-thread kernels
    /// otherwise.
    #[test]
    fn v8_block_shapes() {
        assert_eq!(v8_block(2048), Some(256));
        assert_eq!(v8_block(64), Some(32));
        assert_eq!(v8_block(264), Some(64)); // 33 threads -> two warps
        assert_eq!(v8_block(4096), Some(512));
        assert_eq!(v8_block(4104), None);
        assert_eq!(v8_block(100), None);
        for d in (8..=4096).step_by(8) {
            let b = v8_block(d).unwrap() as usize;
            assert!(
                b.is_multiple_of(32) && 8 * b >= d && 8 * (b - 32) < d,
                "{d}"
            );
        }
    }
}
