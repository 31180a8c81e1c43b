//! Q5_0 (symmetric, 5-bit, scale) and Q5_1 (5-bit, scale and minimum).
//!
//! Low nibbles as in Q4_0; bit `j` of the little-endian u32 `qh` is the
//! fifth bit of element `j`.

use super::q4::{signed_absmax, sum_q8};
use super::q8_0::{BlockQ80, QK8_0};
use crate::block::{cast_blocks, cast_blocks_mut, f16_le, f16_le_from, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ50 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK8_0 / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ50>() == 22);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ50 {}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ51 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK8_0 / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ51>() == 24);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ51 {}

/// The 32 five-bit values (0..=31) of a block in element order.
#[inline(always)]
fn unpack(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    core::array::from_fn(|i| {
        let lo = if i < 16 {
            qs[i] & 0x0F
        } else {
            qs[i - 16] >> 4
        };
        lo | (((h >> i) & 1) as u8) << 4
    })
}

#[inline(always)]
fn pack(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let qs = core::array::from_fn(|j| (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    let h = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (((v >> 4) as u32 & 1) << j));
    (h.to_le_bytes(), qs)
}

pub fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ50>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0, "Q5_0: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let d = f16_le(b.d);
        for (o, q) in y.iter_mut().zip(unpack(b.qh, &b.qs)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

pub fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ51>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0, "Q5_1: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for (o, q) in y.iter_mut().zip(unpack(b.qh, &b.qs)) {
            *o = d * q as f32 + m;
        }
    }
}

/// ggml's `quantize_row_q5_0_ref` math (bit-identical to the gguf package).
pub fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ50>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q5_0: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] = core::array::from_fn(|j| ((x[j] * id + 16.5).trunc() as u8).min(31));
        b.d = f16_le_from(d);
        (b.qh, b.qs) = pack(&q);
    }
}

/// ggml's `quantize_row_q5_1_ref` math (bit-identical to the gguf package).
pub fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ51>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q5_1: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] =
            core::array::from_fn(|j| (((x[j] - min) * id + 0.5).trunc() as u8).min(31));
        b.d = f16_le_from(d);
        b.m = f16_le_from(min);
        (b.qh, b.qs) = pack(&q);
    }
}

pub fn dot_q5_0_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ50>(row);
    let y = cast_blocks::<BlockQ80>(act);
    assert_eq!(x.len(), y.len(), "Q5_0 dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 = unpack(a.qh, &a.qs)
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| (q as i32 - 16) * v as i32)
            .sum();
        sum += isum as f32 * (f16_le(a.d) * b.d());
    }
    sum
}

pub fn dot_q5_1_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ51>(row);
    let y = cast_blocks::<BlockQ80>(act);
    assert_eq!(x.len(), y.len(), "Q5_1 dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 = unpack(a.qh, &a.qs)
            .iter()
            .zip(&b.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        let dy = b.d();
        sum += isum as f32 * (f16_le(a.d) * dy) + sum_q8(b) as f32 * (f16_le(a.m) * dy);
    }
    sum
}

pub fn dot_q5_1_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q5_1(row, act) };
    }
    dot_q5_1_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q5_1(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ51>(row);
        let y = cast_blocks::<BlockQ80>(act);
        assert_eq!(x.len(), y.len(), "Q5_1 dot: block counts");
        let ones = _mm256_set1_epi8(1);
        let b4 = _mm256_set1_epi8(0x10);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            // SAFETY: `a.qs` is 16 readable bytes, `b.qs` 32.
            let (q, v) = unsafe { (nibbles_lo_hi(a.qs.as_ptr()), load32(b.qs.as_ptr().cast())) };
            let bits = bits_to_bytes(u32::from_le_bytes(a.qh));
            let q = _mm256_or_si256(q, _mm256_and_si256(bits, b4));
            let p = dot_u8_i8(q, v);
            let s = dot_u8_i8(ones, v);
            let dy = f16c(b.d);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(a.d) * dy), _mm256_cvtepi32_ps(p), acc);
            accm = _mm256_fmadd_ps(_mm256_set1_ps(f16c(a.m) * dy), _mm256_cvtepi32_ps(s), accm);
        }
        hsum_ps(_mm256_add_ps(acc, accm))
    }
}
