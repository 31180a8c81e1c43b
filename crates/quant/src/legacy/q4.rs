//! Q4_0 (symmetric, 4-bit, scale) and Q4_1 (4-bit, scale and minimum).
//!
//! Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16`
//! in its high nibble.

use super::q8_0::{BlockQ80, QK8_0};
use crate::block::{cast_blocks, cast_blocks_mut, f16_le, f16_le_from, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ40 {
    pub d: [u8; 2],
    pub qs: [u8; QK8_0 / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ40>() == 18);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ40 {}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ41 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK8_0 / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ41>() == 20);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ41 {}

/// The 32 nibbles of a block in element order.
#[inline(always)]
fn unpack(qs: &[u8; 16]) -> [u8; 32] {
    core::array::from_fn(|i| {
        if i < 16 {
            qs[i] & 0x0F
        } else {
            qs[i - 16] >> 4
        }
    })
}

#[inline(always)]
fn pack(q: &[u8; 32]) -> [u8; 16] {
    core::array::from_fn(|j| (q[j] & 0x0F) | (q[j + 16] << 4))
}

/// The value of largest magnitude (first one on ties), sign kept.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ40>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0, "Q4_0: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let d = f16_le(b.d);
        for (o, q) in y.iter_mut().zip(unpack(&b.qs)) {
            *o = d * (q as i32 - 8) as f32;
        }
    }
}

pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ41>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0, "Q4_1: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for (o, q) in y.iter_mut().zip(unpack(&b.qs)) {
            *o = d * q as f32 + m;
        }
    }
}

/// ggml's `quantize_row_q4_0_ref` math (bit-identical to the gguf package).
pub fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ40>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q4_0: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] = core::array::from_fn(|j| ((x[j] * id + 8.5).trunc() as u8).min(15));
        b.d = f16_le_from(d);
        b.qs = pack(&q);
    }
}

/// ggml's `quantize_row_q4_1_ref` math (bit-identical to the gguf package).
pub fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ41>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q4_1: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] =
            core::array::from_fn(|j| (((x[j] - min) * id + 0.5).trunc() as u8).min(15));
        b.d = f16_le_from(d);
        b.m = f16_le_from(min);
        b.qs = pack(&q);
    }
}

/// Σ of a Q8_0 block's quantized values.
#[inline(always)]
pub(crate) fn sum_q8(y: &BlockQ80) -> i32 {
    y.qs.iter().map(|&q| q as i32).sum()
}

pub fn dot_q4_0_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ40>(row);
    let y = cast_blocks::<BlockQ80>(act);
    assert_eq!(x.len(), y.len(), "Q4_0 dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 = unpack(&a.qs)
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| (q as i32 - 8) * v as i32)
            .sum();
        sum += isum as f32 * (f16_le(a.d) * b.d());
    }
    sum
}

/// Q4_1 · Q8_0: `dx·dy·Σq·y + mx·dy·Σy` per block.
pub fn dot_q4_1_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ41>(row);
    let y = cast_blocks::<BlockQ80>(act);
    assert_eq!(x.len(), y.len(), "Q4_1 dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 = unpack(&a.qs)
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        let dy = b.d();
        sum += isum as f32 * (f16_le(a.d) * dy) + sum_q8(b) as f32 * (f16_le(a.m) * dy);
    }
    sum
}

pub fn dot_q4_1_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q4_1(row, act) };
    }
    dot_q4_1_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q4_1(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ41>(row);
        let y = cast_blocks::<BlockQ80>(act);
        assert_eq!(x.len(), y.len(), "Q4_1 dot: block counts");
        let ones = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            // SAFETY: `a.qs` is 16 readable bytes, `b.qs` 32.
            let (q, v) = unsafe { (nibbles_lo_hi(a.qs.as_ptr()), load32(b.qs.as_ptr().cast())) };
            let p = dot_u8_i8(q, v);
            let s = dot_u8_i8(ones, v);
            let dy = f16c(b.d);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(a.d) * dy), _mm256_cvtepi32_ps(p), acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(f16c(a.m) * dy), _mm256_cvtepi32_ps(s), accm);
        }
        hsum_ps(_mm256_add_ps(acc, accm))
    }
}
