//! IQ1_S and IQ1_M: 1.56 and 1.75 bits per weight.
//!
//! Each group of 8 weights is one entry of a grid of values in {-1, 0, 1},
//! shifted by `±δ` (δ = 1/8) and scaled by `d · (2s + 1)`:
//! `w = d · (2s + 1) · (g ± δ)`. IQ1_S has one 3-bit `s` and one shift sign
//! per 32 weights; IQ1_M one `s` per 16 weights, one shift sign per 8, and
//! its f16 `d` is spread over the top nibbles of its scale words.
//!
//! For the dot product, `8 · (g ± δ) = 8g ± 1` is a small integer, so each
//! block contributes `d_w · d_a / 8 · Σ (2s + 1) · (8g ± 1) · q` with the
//! sum exact in i32 (|8g ± 1| ≤ 9).

use super::tables::{IQ1S_GRID, IQ1_DELTA};
use super::QK_K;
use crate::block::{cast_blocks, f16_le, Block};
use crate::f16util::f16_to_f32;
use crate::kquants::BlockQ8K;
use crate::Kernels;
use redlite_gguf::GgmlType;

/// IQ1_S block: f16 `d`, 32 low bytes of the 11-bit grid indices, and one
/// little-endian u16 per 32 weights: four 3-bit high index parts (bits
/// 0..12), the 3-bit scale (bits 12..15) and the shift sign (bit 15).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq1S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
}
const _: () = assert!(core::mem::size_of::<BlockIq1S>() == 50);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq1S {}

/// IQ1_M block: 32 low bytes of the 11-bit grid indices, 16 bytes of two
/// nibbles (3 high index bits + shift sign per 8 weights), and four
/// little-endian u16 holding four 3-bit scales each (bits 0..12, one per 16
/// weights) and one nibble of the f16 `d` (bits 12..16).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(core::mem::size_of::<BlockIq1M>() == 56);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq1M {}

impl BlockIq1S {
    /// The u16 of 32-weight group `ib`.
    #[inline(always)]
    fn qh16(&self, ib: usize) -> u16 {
        u16::from_le_bytes([self.qh[2 * ib], self.qh[2 * ib + 1]])
    }

    /// Grid index of 8-weight group `l`.
    #[inline(always)]
    fn index(&self, l: usize) -> usize {
        self.qs[l] as usize | (((self.qh16(l / 4) >> (3 * (l % 4))) & 7) as usize) << 8
    }
}

impl BlockIq1M {
    #[inline(always)]
    fn sc(&self, i: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * i], self.scales[2 * i + 1]])
    }

    /// The bits of the f16 block scale, assembled from the top nibbles of
    /// the scale words.
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        (self.sc(0) >> 12)
            | ((self.sc(1) >> 8) & 0x00F0)
            | ((self.sc(2) >> 4) & 0x0F00)
            | (self.sc(3) & 0xF000)
    }

    /// The block scale.
    #[inline(always)]
    fn d(&self) -> f32 {
        f16_to_f32(self.d_bits())
    }

    /// 3-bit scale of 16-weight group `k`.
    #[inline(always)]
    fn scale(&self, k: usize) -> u16 {
        (self.sc(k / 4) >> (3 * (k % 4))) & 7
    }

    /// Nibble of 8-weight group `l`: high index bits (0..3), shift sign (3).
    #[inline(always)]
    fn nibble(&self, l: usize) -> u8 {
        (self.qh[l / 2] >> (4 * (l % 2))) & 0xF
    }

    #[inline(always)]
    fn index(&self, l: usize) -> usize {
        self.qs[l] as usize | ((self.nibble(l) & 7) as usize) << 8
    }
}

pub(super) static IQ1_S: Kernels = Kernels {
    ty: GgmlType::IQ1_S,
    dequantize: dequantize_iq1_s,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq1_s_ref,
    dot_fast: dot_iq1_s,
    dot_multi: None,
    quantize: None,
};

pub(super) static IQ1_M: Kernels = Kernels {
    ty: GgmlType::IQ1_M,
    dequantize: dequantize_iq1_m,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq1_m_ref,
    dot_fast: dot_iq1_m,
    dot_multi: None,
    quantize: None,
};

/// Write `dl · (g + delta)` for 8 weights (the `gguf` package's order).
#[inline(always)]
fn put8(y: &mut [f32], dl: f32, grid: u64, delta: f32) {
    for (o, g) in y.iter_mut().zip(grid.to_le_bytes()) {
        *o = dl * (g as i8 as f32 + delta);
    }
}

/// Σ (8g + sigma) · q over 8 weights (`sigma` = ±1).
#[inline(always)]
fn dot8(grid: u64, sigma: i32, q: &[i8]) -> i32 {
    grid.to_le_bytes()
        .into_iter()
        .zip(q)
        .map(|(g, &q)| (8 * g as i8 as i32 + sigma) * q as i32)
        .sum()
}

// ------------------------------------------------------------------ IQ1_S

fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq1S>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ1_S: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qh = b.qh16(ib);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                put8(y, dl, IQ1S_GRID[b.index(4 * ib + l)], delta);
            }
        }
    }
}

fn dot_iq1_s_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq1S>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ1_S: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (ib, q) in a.qs.chunks_exact(32).enumerate() {
            let qh = b.qh16(ib);
            let sigma = if qh & 0x8000 != 0 { -1 } else { 1 };
            let s: i32 = q
                .chunks_exact(8)
                .enumerate()
                .map(|(l, q)| dot8(IQ1S_GRID[b.index(4 * ib + l)], sigma, q))
                .sum();
            isum += (2 * ((qh >> 12) & 7) as i32 + 1) * s;
        }
        sumf += d * isum as f32;
    }
    0.125 * sumf
}

fn dot_iq1_s(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq1_s(row, act) };
    }
    dot_iq1_s_ref(row, act)
}

// ------------------------------------------------------------------ IQ1_M

fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq1M>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ1_M: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (k, y) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * (2 * b.scale(k) + 1) as f32;
            for (h, y) in y.chunks_exact_mut(8).enumerate() {
                let l = 2 * k + h;
                let delta = if b.nibble(l) & 8 != 0 {
                    -IQ1_DELTA
                } else {
                    IQ1_DELTA
                };
                put8(y, dl, IQ1S_GRID[b.index(l)], delta);
            }
        }
    }
}

fn dot_iq1_m_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq1M>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ1_M: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = b.d() * a.d();
        let mut isum = 0i32;
        for (k, q) in a.qs.chunks_exact(16).enumerate() {
            let mut s = 0i32;
            for (h, q) in q.chunks_exact(8).enumerate() {
                let l = 2 * k + h;
                let sigma = if b.nibble(l) & 8 != 0 { -1 } else { 1 };
                s += dot8(IQ1S_GRID[b.index(l)], sigma, q);
            }
            isum += (2 * b.scale(k) as i32 + 1) * s;
        }
        sumf += d * isum as f32;
    }
    0.125 * sumf
}

fn dot_iq1_m(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq1_m(row, act) };
    }
    dot_iq1_m_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 dot products. Per 32 weights, the weights `8g ± 1` as
    //! signed bytes: IQ1_S adds its one ±1 shift to four entries of
    //! [`IQ1S_GRID8`], IQ1_M looks them up in [`IQ1_W`] (shift included).
    //! `mul_signed` multiplies them with the activations into i16 pair sums
    //! (at most 2·9·128, exact for any i8), and `_mm256_madd_epi16` applies
    //! the odd scales while widening.
    //!
    //! # Safety
    //!
    //! Callers must have checked that AVX2, FMA and F16C are available.

    use super::super::x86::{f16c, hsum_i32, load32, mul_signed, set_u64x4};
    use super::*;
    use core::arch::x86_64::*;

    /// [`IQ1S_GRID`] with every byte multiplied by 8 (-8, 0 or 8).
    static IQ1S_GRID8: [u64; 2048] = {
        let mut t = [0u64; 2048];
        let mut i = 0;
        while i < 2048 {
            let mut v = 0u64;
            let mut j = 0;
            while j < 8 {
                let g = (IQ1S_GRID[i] >> (8 * j)) as u8 as i8;
                v |= ((g * 8) as u8 as u64) << (8 * j);
                j += 1;
            }
            t[i] = v;
            i += 1;
        }
        t
    };

    /// The weights `8g ± 1` of grid entry `i & 2047`, with the shift sign
    /// in bit 11 of `i` (set: -1). 32 KiB: one lookup replaces a lookup in
    /// the grid plus building and adding a ±1 vector, which measured ~15%
    /// faster for IQ1_M on the development machine (48 KiB L1d).
    static IQ1_W: [u64; 4096] = {
        let mut t = [0u64; 4096];
        let mut i = 0;
        while i < 4096 {
            let sigma: i8 = if i & 2048 != 0 { -1 } else { 1 };
            let mut v = 0u64;
            let mut j = 0;
            while j < 8 {
                let g = (IQ1S_GRID[i & 2047] >> (8 * j)) as u8 as i8;
                v |= ((g * 8 + sigma) as u8 as u64) << (8 * j);
                j += 1;
            }
            t[i] = v;
            i += 1;
        }
        t
    };

    #[inline(always)]
    fn q32(a: &BlockQ8K, ib: usize) -> &[i8; 32] {
        a.qs[32 * ib..32 * ib + 32].try_into().unwrap()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq1_s(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq1S>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ1_S: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let qh = b.qh16(ib);
                let l = 4 * ib;
                let grid = set_u64x4(
                    IQ1S_GRID8[b.index(l)],
                    IQ1S_GRID8[b.index(l + 1)],
                    IQ1S_GRID8[b.index(l + 2)],
                    IQ1S_GRID8[b.index(l + 3)],
                );
                let sigma = _mm256_set1_epi8(if qh & 0x8000 != 0 { -1 } else { 1 });
                let w = _mm256_add_epi8(grid, sigma);
                let p = mul_signed(load32(q32(a, ib)), w);
                let ls = _mm256_set1_epi16(2 * ((qh >> 12) & 7) as i16 + 1);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ls));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        0.125 * sumf
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq1_m(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq1M>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ1_M: row and activations differ in length"
        );
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d_bits().to_le_bytes()) * a.d();
            let sc = [b.sc(0), b.sc(1), b.sc(2), b.sc(3)];
            let one16 = _mm256_set1_epi16(1);
            let seven16 = _mm256_set1_epi16(7);
            let scale_shift = _mm256_setr_epi32(0, 0, 0, 0, 3, 3, 3, 3);
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let l = 4 * ib;
                let h0 = b.qh[2 * ib];
                let h1 = b.qh[2 * ib + 1];
                // 12-bit index: low byte, then the whole nibble (3 high
                // index bits and the shift sign).
                let idx = |lo: u8, nib: u8| lo as usize | ((nib & 0xF) as usize) << 8;
                let w = set_u64x4(
                    IQ1_W[idx(b.qs[l], h0)],
                    IQ1_W[idx(b.qs[l + 1], h0 >> 4)],
                    IQ1_W[idx(b.qs[l + 2], h1)],
                    IQ1_W[idx(b.qs[l + 3], h1 >> 4)],
                );
                let p = mul_signed(load32(q32(a, ib)), w);
                // Scales 2ib (first 16 weights) and 2ib + 1 (last 16): bits
                // 0..3 and 3..6 of `word`, brought down by a per-half shift.
                let word = sc[ib / 2] >> (6 * (ib % 2));
                let v = _mm256_srlv_epi32(_mm256_set1_epi16(word as i16), scale_shift);
                let v = _mm256_and_si256(v, seven16);
                let ls = _mm256_add_epi16(_mm256_add_epi16(v, v), one16);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ls));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        0.125 * sumf
    }
}
