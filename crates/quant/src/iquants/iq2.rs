//! IQ2_XXS, IQ2_XS and IQ2_S: 2.06, 2.31 and 2.56 bits per weight.
//!
//! Each group of 8 weights is one entry of a grid of 8 unsigned magnitudes
//! (bytes 0x08, 0x19, 0x2b) plus 8 sign bits; a 4-bit scale `s` per 32 or 16
//! weights gives `w = d · (0.5 + s) / 4 · grid · sign`, i.e.
//! `d · (2s + 1) · grid · sign / 8`. The dot product therefore sums
//! `(2s + 1) · grid · sign · q` exactly in i32 and multiplies by
//! `d_w · d_a / 8` once per block.

use super::tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::QK_K;
use crate::block::{cast_blocks, f16_le, Block};
use crate::kquants::BlockQ8K;
use crate::Kernels;
use redlite_gguf::GgmlType;

/// IQ2_XXS block: f16 `d`, then 8 groups of 8 bytes per 32 weights: four
/// grid indices (one byte each) and a u32 holding four 7-bit sign codes
/// (bits 0..28) and the 4-bit scale (bits 28..32).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2Xxs {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
}
const _: () = assert!(core::mem::size_of::<BlockIq2Xxs>() == 66);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq2Xxs {}

/// IQ2_XS block: f16 `d`, 32 little-endian u16 (9-bit grid index, 7-bit sign
/// code), and 8 bytes of two 4-bit scales (one per 16 weights).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2Xs {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(core::mem::size_of::<BlockIq2Xs>() == 74);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq2Xs {}

/// IQ2_S block: f16 `d`, 32 low bytes of the 10-bit grid indices, 32 sign
/// bytes (one bit per weight), 8 bytes of high index bits (2 per group) and
/// 8 bytes of two 4-bit scales (one per 16 weights).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq2S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 8],
    pub signs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(core::mem::size_of::<BlockIq2S>() == 82);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq2S {}

pub(super) static IQ2_XXS: Kernels = Kernels {
    ty: GgmlType::IQ2_XXS,
    dequantize: dequantize_iq2_xxs,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq2_xxs_ref,
    dot_fast: dot_iq2_xxs,
    dot_multi: None,
    quantize: None,
};

pub(super) static IQ2_XS: Kernels = Kernels {
    ty: GgmlType::IQ2_XS,
    dequantize: dequantize_iq2_xs,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq2_xs_ref,
    dot_fast: dot_iq2_xs,
    dot_multi: None,
    quantize: None,
};

pub(super) static IQ2_S: Kernels = Kernels {
    ty: GgmlType::IQ2_S,
    dequantize: dequantize_iq2_s,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq2_s_ref,
    dot_fast: dot_iq2_s,
    dot_multi: None,
    quantize: None,
};

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Write `db · grid[j]`, negated where sign bit j is set, for 8 weights
/// (the `gguf` package computes `db * grid * ±1.0` in f32: the same bits).
#[inline(always)]
fn put8(y: &mut [f32], db: f32, grid: u64, signs: u8) {
    for (j, (o, g)) in y.iter_mut().zip(grid.to_le_bytes()).enumerate() {
        let v = db * g as f32;
        *o = if signs & KMASK_IQ2XS[j] != 0 { -v } else { v };
    }
}

/// Σ grid[j] · ±q[j] over 8 weights.
#[inline(always)]
fn dot8(grid: u64, signs: u8, q: &[i8]) -> i32 {
    let mut s = 0i32;
    for (j, (g, &q)) in grid.to_le_bytes().into_iter().zip(q).enumerate() {
        let p = g as i32 * q as i32;
        s += if signs & KMASK_IQ2XS[j] != 0 { -p } else { p };
    }
    s
}

// ---------------------------------------------------------------- IQ2_XXS

fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq2Xxs>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ2_XXS: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (g, y) in b.qs.chunks_exact(8).zip(y.chunks_exact_mut(32)) {
            let aux = u32_at(g, 4);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                put8(y, db, IQ2XXS_GRID[g[l] as usize], signs);
            }
        }
    }
}

fn dot_iq2_xxs_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq2Xxs>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ2_XXS: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (g, q) in b.qs.chunks_exact(8).zip(a.qs.chunks_exact(32)) {
            let aux = u32_at(g, 4);
            let mut s = 0i32;
            for (l, q) in q.chunks_exact(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                s += dot8(IQ2XXS_GRID[g[l] as usize], signs, q);
            }
            isum += (2 * (aux >> 28) as i32 + 1) * s;
        }
        sumf += d * isum as f32;
    }
    0.125 * sumf
}

fn dot_iq2_xxs(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq2_xxs(row, act) };
    }
    dot_iq2_xxs_ref(row, act)
}

// ----------------------------------------------------------------- IQ2_XS

fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq2Xs>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ2_XS: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let sc = (b.scales[l / 4] >> (4 * ((l / 2) % 2))) & 0xF;
            let db = d * (0.5 + sc as f32) * 0.25;
            let q = u16_at(&b.qs, 2 * l);
            put8(
                y,
                db,
                IQ2XS_GRID[(q & 511) as usize],
                KSIGNS_IQ2XS[(q >> 9) as usize],
            );
        }
    }
}

fn dot_iq2_xs_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq2Xs>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ2_XS: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        // One scale per 16 weights = two grid entries.
        for (k, q) in a.qs.chunks_exact(16).enumerate() {
            let ls = 2 * ((b.scales[k / 2] >> (4 * (k % 2))) & 0xF) as i32 + 1;
            let mut s = 0i32;
            for (h, q) in q.chunks_exact(8).enumerate() {
                let v = u16_at(&b.qs, 2 * (2 * k + h));
                s += dot8(
                    IQ2XS_GRID[(v & 511) as usize],
                    KSIGNS_IQ2XS[(v >> 9) as usize],
                    q,
                );
            }
            isum += ls * s;
        }
        sumf += d * isum as f32;
    }
    0.125 * sumf
}

fn dot_iq2_xs(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq2_xs(row, act) };
    }
    dot_iq2_xs_ref(row, act)
}

// ------------------------------------------------------------------ IQ2_S

#[inline(always)]
fn iq2s_index(b: &BlockIq2S, l: usize) -> usize {
    b.qs[l] as usize | (((b.qh[l / 4] >> (2 * (l % 4))) & 3) as usize) << 8
}

fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq2S>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ2_S: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let sc = (b.scales[l / 4] >> (4 * ((l / 2) % 2))) & 0xF;
            let db = d * (0.5 + sc as f32) * 0.25;
            put8(y, db, IQ2S_GRID[iq2s_index(b, l)], b.signs[l]);
        }
    }
}

fn dot_iq2_s_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq2S>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ2_S: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (k, q) in a.qs.chunks_exact(16).enumerate() {
            let ls = 2 * ((b.scales[k / 2] >> (4 * (k % 2))) & 0xF) as i32 + 1;
            let mut s = 0i32;
            for (h, q) in q.chunks_exact(8).enumerate() {
                let l = 2 * k + h;
                s += dot8(IQ2S_GRID[iq2s_index(b, l)], b.signs[l], q);
            }
            isum += ls * s;
        }
        sumf += d * isum as f32;
    }
    0.125 * sumf
}

fn dot_iq2_s(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq2_s(row, act) };
    }
    dot_iq2_s_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 dot products. Each 32 weights become one vector of grid
    //! magnitudes (4 table entries), the signs are applied to the
    //! activations with `_mm256_sign_epi8` (exact: Q8_K values lie in
    //! -127..=127), `_mm256_maddubs_epi16` forms pair sums (at most
    //! 2·43·127 = 10922, no saturation) and `_mm256_madd_epi16` applies the
    //! odd scales `2s + 1` while widening to i32.
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

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq2_xxs(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq2Xxs>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ2_XXS: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let g: &[u8; 8] = b.qs[8 * ib..8 * ib + 8].try_into().unwrap();
                let aux = u64::from_le_bytes(*g) >> 32;
                let grid = set_u64x4(
                    IQ2XXS_GRID[g[0] as usize],
                    IQ2XXS_GRID[g[1] as usize],
                    IQ2XXS_GRID[g[2] as usize],
                    IQ2XXS_GRID[g[3] as usize],
                );
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
        0.125 * sumf
    }

    /// The scales `2s + 1` of 32 weights as i16 lanes: the low nibble of
    /// `byte` for the first 16 weights (lanes 0..8 of a maddubs result), the
    /// high nibble for the last 16 (lanes 8..16).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales16(byte: u8) -> __m256i {
        // Each 32-bit lane holds `byte` twice; shifting the upper half of
        // the vector right by 4 brings the high nibble down in both halves.
        let v = _mm256_set1_epi16(byte as i16);
        let v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        let v = _mm256_and_si256(v, _mm256_set1_epi16(0xF));
        _mm256_add_epi16(_mm256_add_epi16(v, v), _mm256_set1_epi16(1))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq2_xs(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq2Xs>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ2_XS: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let g: &[u8; 8] = b.qs[8 * ib..8 * ib + 8].try_into().unwrap();
                let w = u64::from_le_bytes(*g);
                let v: [u16; 4] = core::array::from_fn(|l| (w >> (16 * l)) as u16);
                let grid = set_u64x4(
                    IQ2XS_GRID[(v[0] & 511) as usize],
                    IQ2XS_GRID[(v[1] & 511) as usize],
                    IQ2XS_GRID[(v[2] & 511) as usize],
                    IQ2XS_GRID[(v[3] & 511) as usize],
                );
                let signs = set_u64x4(
                    KSIGN_BYTES[(v[0] >> 9) as usize],
                    KSIGN_BYTES[(v[1] >> 9) as usize],
                    KSIGN_BYTES[(v[2] >> 9) as usize],
                    KSIGN_BYTES[(v[3] >> 9) as usize],
                );
                let q = _mm256_sign_epi8(load32(q32(a, ib)), signs);
                let p = _mm256_maddubs_epi16(grid, q);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales16(b.scales[ib])));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        0.125 * sumf
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq2_s(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq2S>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ2_S: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let l = 4 * ib;
                let grid = set_u64x4(
                    IQ2S_GRID[iq2s_index(b, l)],
                    IQ2S_GRID[iq2s_index(b, l + 1)],
                    IQ2S_GRID[iq2s_index(b, l + 2)],
                    IQ2S_GRID[iq2s_index(b, l + 3)],
                );
                let signs = set_u64x4(
                    SIGN_BYTES[b.signs[l] as usize],
                    SIGN_BYTES[b.signs[l + 1] as usize],
                    SIGN_BYTES[b.signs[l + 2] as usize],
                    SIGN_BYTES[b.signs[l + 3] as usize],
                );
                let q = _mm256_sign_epi8(load32(q32(a, ib)), signs);
                let p = _mm256_maddubs_epi16(grid, q);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales16(b.scales[ib])));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        0.125 * sumf
    }
}
