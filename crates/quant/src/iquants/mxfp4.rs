//! MXFP4 (OCP microscaling FP4): blocks of 32 e2m1 values with one shared
//! e8m0 power-of-two scale, `w = 2^(e − 127) · e2m1[q]`. Like ggml, we keep
//! the e2m1 values doubled (integers −12..=12) and halve the scale. Nibble
//! layout as IQ4_NL. Activations are Q8_0.

use super::iq4::{dot32, put32};
use super::tables::KVALUES_MXFP4;
use super::ActQ8_0;
use crate::block::{cast_blocks, cast_blocks_mut, f16_le, Block};
use crate::Kernels;
use redlite_gguf::GgmlType;

/// MXFP4 block: the e8m0 exponent byte and 16 bytes of two 4-bit codes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: [u8; 1],
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockMxfp4>() == 17);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockMxfp4 {}

/// Half of the e8m0 scale `2^(e − 127)`, i.e. `2^(e − 128)`, built from
/// its bits (subnormal for e < 2), exactly as ggml and the `gguf` package.
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(super) static MXFP4: Kernels = Kernels {
    ty: GgmlType::MXFP4,
    dequantize: dequantize_mxfp4,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: dot_mxfp4_ref,
    dot_fast: dot_mxfp4,
    dot_multi: None,
    quantize: Some(quantize_mxfp4),
};

/// Quantize whole blocks of 32 values, as the `gguf` package does (and
/// byte-identical to it, checked by `tests/iq_quantize.rs`): the exponent
/// is `floor(log2(max|x|)) − 2 + 127` (so the largest value lands near the
/// top e2m1 magnitude 6), and every value takes the nearest of the 16
/// scaled codes, the lowest code on ties.
fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockMxfp4>(dst);
    assert_eq!(src.len(), blocks.len() * 32, "MXFP4: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(32)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // In f32 like numpy; the clamp only guards amax < 2^-125 (and +inf),
        // where numpy's cast to uint8 is not defined.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let code = |v: f32| -> u8 {
            let mut best = 0usize;
            let mut best_err = f32::INFINITY;
            for (k, &kv) in KVALUES_MXFP4.iter().enumerate() {
                let err = (d * kv as f32 - v).abs();
                if err < best_err {
                    best = k;
                    best_err = err;
                }
            }
            best as u8
        };
        b.e = [e];
        for j in 0..16 {
            b.qs[j] = code(x[j]) | code(x[j + 16]) << 4;
        }
    }
}

fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockMxfp4>(src);
    assert_eq!(dst.len(), blocks.len() * 32, "MXFP4: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        put32(y, e8m0_to_f32_half(b.e[0]), &b.qs, &KVALUES_MXFP4);
    }
}

fn dot_mxfp4_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockMxfp4>(row);
    let y = cast_blocks::<ActQ8_0>(act);
    assert_eq!(
        x.len(),
        y.len(),
        "MXFP4: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = e8m0_to_f32_half(b.e[0]) * f16_le(a.d);
        sumf += d * dot32(&b.qs, &a.qs, &KVALUES_MXFP4) as f32;
    }
    sumf
}

fn dot_mxfp4(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_mxfp4(row, act) };
    }
    dot_mxfp4_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! As IQ4_NL's AVX2 dot product, with the MXFP4 table (pair sums at
    //! most 2·128·12).
    //!
    //! # Safety
    //!
    //! Callers must have checked that AVX2, FMA and F16C are available.

    use super::super::iq4::avx2::{lookup32, table16};
    use super::super::x86::{f16c, hsum4_i32, hsum_i32, load32, mul_signed};
    use super::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_mxfp4(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockMxfp4>(row);
        let y = cast_blocks::<ActQ8_0>(act);
        assert_eq!(
            x.len(),
            y.len(),
            "MXFP4: row and activations differ in length"
        );
        let table = table16(&KVALUES_MXFP4);
        let ones = _mm256_set1_epi16(1);
        // Σ table[q]·a over one block as i32 lanes.
        let lanes = |b: &BlockMxfp4, a: &ActQ8_0| {
            let p = mul_signed(load32(&a.qs), lookup32(&b.qs, table));
            _mm256_madd_epi16(p, ones)
        };
        let mut sumf = 0f32;
        // Four blocks per horizontal reduction; the f32 steps stay in
        // block order, as in the reference.
        let (x4, xr) = x.split_at(x.len() / 4 * 4);
        let (y4, yr) = y.split_at(x4.len());
        for (b, a) in x4.chunks_exact(4).zip(y4.chunks_exact(4)) {
            let s = hsum4_i32(
                lanes(&b[0], &a[0]),
                lanes(&b[1], &a[1]),
                lanes(&b[2], &a[2]),
                lanes(&b[3], &a[3]),
            );
            for ((b, a), s) in b.iter().zip(a).zip(s) {
                let d = e8m0_to_f32_half(b.e[0]) * f16c(a.d);
                sumf += d * s as f32;
            }
        }
        for (b, a) in xr.iter().zip(yr) {
            let d = e8m0_to_f32_half(b.e[0]) * f16c(a.d);
            sumf += d * hsum_i32(lanes(b, a)) as f32;
        }
        sumf
    }
}
