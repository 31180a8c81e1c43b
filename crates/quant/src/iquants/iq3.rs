//! IQ3_XXS and IQ3_S: 3.06 and 3.44 bits per weight.
//!
//! Each group of 4 weights is one entry of a grid of 4 unsigned magnitudes;
//! signs come one bit per weight. IQ3_XXS: `w = d · (0.5 + s) / 2 · grid ·
//! sign` (= `d · (2s + 1) · grid · sign / 4`); IQ3_S: `w = d · (1 + 2s) ·
//! grid · sign`, with one 4-bit `s` per 32 weights in both.

use super::tables::{IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::QK_K;
use crate::block::{cast_blocks, f16_le, Block};
use crate::kquants::BlockQ8K;
use crate::Kernels;
use redlite_gguf::GgmlType;

/// IQ3_XXS block: f16 `d`, 64 grid indices (one byte per 4 weights), then
/// one little-endian u32 per 32 weights: four 7-bit sign codes (bits 0..28)
/// and the 4-bit scale (bits 28..32).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq3Xxs {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub scales_signs: [u8; QK_K / 8],
}
const _: () = assert!(core::mem::size_of::<BlockIq3Xxs>() == 98);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq3Xxs {}

/// IQ3_S block: f16 `d`, 64 low bytes of the 9-bit grid indices, 8 bytes of
/// their high bits, 32 sign bytes (one bit per weight) and 4 bytes of two
/// 4-bit scales (one per 32 weights).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq3S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(core::mem::size_of::<BlockIq3S>() == 110);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq3S {}

pub(super) static IQ3_XXS: Kernels = Kernels {
    ty: GgmlType::IQ3_XXS,
    dequantize: dequantize_iq3_xxs,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq3_xxs_ref,
    dot_fast: dot_iq3_xxs,
    dot_multi: None,
    quantize: None,
};

pub(super) static IQ3_S: Kernels = Kernels {
    ty: GgmlType::IQ3_S,
    dequantize: dequantize_iq3_s,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq3_s_ref,
    dot_fast: dot_iq3_s,
    dot_multi: None,
    quantize: None,
};

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The 8 magnitudes of two 4-wide grid entries.
#[inline(always)]
fn grid8(g1: u32, g2: u32) -> [u8; 8] {
    (g1 as u64 | (g2 as u64) << 32).to_le_bytes()
}

/// Write `db · grid[j]`, negated where sign bit j is set, for 8 weights.
#[inline(always)]
fn put8(y: &mut [f32], db: f32, grid: [u8; 8], signs: u8) {
    for (j, (o, g)) in y.iter_mut().zip(grid).enumerate() {
        let v = db * g as f32;
        *o = if signs & KMASK_IQ2XS[j] != 0 { -v } else { v };
    }
}

/// Σ grid[j] · ±q[j] over 8 weights.
#[inline(always)]
fn dot8(grid: [u8; 8], signs: u8, q: &[i8]) -> i32 {
    let mut s = 0i32;
    for (j, (g, &q)) in grid.into_iter().zip(q).enumerate() {
        let p = g as i32 * q as i32;
        s += if signs & KMASK_IQ2XS[j] != 0 { -p } else { p };
    }
    s
}

// ---------------------------------------------------------------- IQ3_XXS

fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq3Xxs>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ3_XXS: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let aux = u32_at(&b.scales_signs, 4 * ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let k = 8 * ib + 2 * l;
                let grid = grid8(
                    IQ3XXS_GRID[b.qs[k] as usize],
                    IQ3XXS_GRID[b.qs[k + 1] as usize],
                );
                put8(y, db, grid, KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize]);
            }
        }
    }
}

fn dot_iq3_xxs_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq3Xxs>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ3_XXS: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (ib, q) in a.qs.chunks_exact(32).enumerate() {
            let aux = u32_at(&b.scales_signs, 4 * ib);
            let mut s = 0i32;
            for (l, q) in q.chunks_exact(8).enumerate() {
                let k = 8 * ib + 2 * l;
                let grid = grid8(
                    IQ3XXS_GRID[b.qs[k] as usize],
                    IQ3XXS_GRID[b.qs[k + 1] as usize],
                );
                s += dot8(grid, KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize], q);
            }
            isum += (2 * (aux >> 28) as i32 + 1) * s;
        }
        sumf += d * isum as f32;
    }
    0.25 * sumf
}

fn dot_iq3_xxs(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq3_xxs(row, act) };
    }
    dot_iq3_xxs_ref(row, act)
}

// ------------------------------------------------------------------ IQ3_S

#[inline(always)]
fn iq3s_index(b: &BlockIq3S, l: usize) -> usize {
    b.qs[l] as usize | (((b.qh[l / 8] >> (l % 8)) & 1) as usize) << 8
}

#[inline(always)]
fn iq3s_scale(b: &BlockIq3S, ib: usize) -> u8 {
    (b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF
}

fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq3S>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ3_S: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (1 + 2 * iq3s_scale(b, ib)) as f32;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let k = 8 * ib + 2 * l;
                let grid = grid8(IQ3S_GRID[iq3s_index(b, k)], IQ3S_GRID[iq3s_index(b, k + 1)]);
                put8(y, db, grid, b.signs[4 * ib + l]);
            }
        }
    }
}

fn dot_iq3_s_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq3S>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ3_S: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (ib, q) in a.qs.chunks_exact(32).enumerate() {
            let mut s = 0i32;
            for (l, q) in q.chunks_exact(8).enumerate() {
                let k = 8 * ib + 2 * l;
                let grid = grid8(IQ3S_GRID[iq3s_index(b, k)], IQ3S_GRID[iq3s_index(b, k + 1)]);
                s += dot8(grid, b.signs[4 * ib + l], q);
            }
            isum += (1 + 2 * iq3s_scale(b, ib) as i32) * s;
        }
        sumf += d * isum as f32;
    }
    sumf
}

fn dot_iq3_s(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq3_s(row, act) };
    }
    dot_iq3_s_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 dot products: 8 grid entries of 4 magnitudes per 32
    //! weights, signs applied to the activations with `_mm256_sign_epi8`
    //! (exact: Q8_K values lie in -127..=127), pair sums by
    //! `_mm256_maddubs_epi16` (at most 2·62·127 = 15748, no saturation),
    //! scales and widening by `_mm256_madd_epi16`.
    //!
    //! # Safety
    //!
    //! Callers must have checked that AVX2, FMA and F16C are available.

    use super::super::x86::{f16c, hsum_i32, load32, set_u64x4};
    use super::super::{KSIGN_BYTES, SIGN_BYTES};
    use super::*;
    use core::arch::x86_64::*;

    #[inline(always)]
    fn q32(a: &BlockQ8K, ib: usize) -> &[i8; 32] {
        a.qs[32 * ib..32 * ib + 32].try_into().unwrap()
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn set_u32x8(g: [u32; 8]) -> __m256i {
        _mm256_setr_epi32(
            g[0] as i32,
            g[1] as i32,
            g[2] as i32,
            g[3] as i32,
            g[4] as i32,
            g[5] as i32,
            g[6] as i32,
            g[7] as i32,
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq3_xxs(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq3Xxs>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ3_XXS: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let grid = set_u32x8(core::array::from_fn(|j| {
                    IQ3XXS_GRID[b.qs[8 * ib + j] as usize]
                }));
                let aux = u32_at(&b.scales_signs, 4 * ib);
                let signs = set_u64x4(
                    KSIGN_BYTES[(aux & 127) as usize],
                    KSIGN_BYTES[((aux >> 7) & 127) as usize],
                    KSIGN_BYTES[((aux >> 14) & 127) as usize],
                    KSIGN_BYTES[((aux >> 21) & 127) as usize],
                );
                let q = _mm256_sign_epi8(load32(q32(a, ib)), signs);
                let p = _mm256_maddubs_epi16(grid, q);
                let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ls));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        0.25 * sumf
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq3_s(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq3S>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ3_S: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let grid = set_u32x8(core::array::from_fn(|j| {
                    IQ3S_GRID[iq3s_index(b, 8 * ib + j)]
                }));
                let s = &b.signs[4 * ib..4 * ib + 4];
                let signs = set_u64x4(
                    SIGN_BYTES[s[0] as usize],
                    SIGN_BYTES[s[1] as usize],
                    SIGN_BYTES[s[2] as usize],
                    SIGN_BYTES[s[3] as usize],
                );
                let q = _mm256_sign_epi8(load32(q32(a, ib)), signs);
                let p = _mm256_maddubs_epi16(grid, q);
                let ls = _mm256_set1_epi16(1 + 2 * iq3s_scale(b, ib) as i16);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ls));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        sumf
    }
}
