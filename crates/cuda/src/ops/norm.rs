//! Launches of `kernels/norm.cu`: RMSNorm (residual add fused, optional
//! int8 output), `rms_norm_v8` for rows the 8-values-a-thread kernel takes.

use crate::device::{cfg, dptr, i32_of, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::{CudaSlice, DeviceRepr};

/// The argument struct of `rms_norm` and `rms_norm_v8` (`RmsNormArgs` in
/// `kernels/norm.cu`: same field order and types, device addresses as u64;
/// the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RmsNormArgs {
    pub x: u64,
    pub res: u64,
    pub w: u64,
    pub out: u64,
    pub q: u64,
    pub qd: u64,
    pub d: i32,
    pub eps: f32,
    pub add_one: i32,
    pub pad: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernels by value as the `RmsNormArgs` it mirrors (offsets checked in
// the tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for RmsNormArgs {}

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
    let xp = dptr(gpu, Some(x));
    let args = RmsNormArgs {
        x: xp,
        res: dptr(gpu, res),
        w: dptr(gpu, Some(w)),
        out: out.map_or(xp, |o| dptr(gpu, Some(o))),
        q: dptr(gpu, q8.map(|q| &q.q)),
        qd: dptr(gpu, q8.map(|q| &q.d)),
        d: i32_of(d)?,
        eps,
        add_one: add_one as i32,
        pad: 0,
    };
    // 8 values a thread in registers where the shape allows (norm.cu).
    let (name, block) = match v8_block(d) {
        Some(b) => ("rms_norm_v8", b),
        None => ("rms_norm", if d >= 1024 { 1024 } else { 256 }),
    };
    // SAFETY: rms_norm[_v8](RmsNormArgs) by value (the struct mirrors the
    // kernels'), rms_norm_v8 with 8 * block >= d and d % 8 == 0
    // (v8_block); x, res, out hold rows*d floats, w d floats, q rows*d
    // bytes and qd rows*d/32 floats with d % 32 == 0 (checked above).
    unsafe { gpu.launch(name, cfg((rows as u32, 1), block), &[&args]) }
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

    /// The struct the RMSNorm kernels read by value: 6 pointers, 2 i32, an
    /// f32 and the pad = 64 bytes (the `.cu` asserts the same size), each
    /// field at the offset C gives the same declaration.
    #[test]
    fn rms_norm_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<RmsNormArgs>(), 64);
        assert_eq!(align_of::<RmsNormArgs>(), 8);
        assert_eq!(offset_of!(RmsNormArgs, qd), 40);
        assert_eq!(offset_of!(RmsNormArgs, d), 48);
        assert_eq!(offset_of!(RmsNormArgs, eps), 52);
        assert_eq!(offset_of!(RmsNormArgs, add_one), 56);
    }

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
