//! Q4_K: 4-bit values in 8 sub-blocks of 32, each with a 6-bit scale and a
//! 6-bit minimum (packed in 12 bytes), times the f16 `d` and `dmin`.
//!
//! Sub-block `2c` is the low nibbles of `qs[32c..32c+32]`, sub-block `2c+1`
//! their high nibbles.

use super::q8_k::{BlockQ8K, QK_K};
use super::quant_util::{make_qkx2_quants, nearest_int, pack_scale_min_k4};
use crate::block::{cast_blocks, cast_blocks_mut, f16_le, f16_le_from, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ4K>() == 144);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ4K {}

/// Scale and minimum of sub-block `j` from the packed 12 bytes (shared
/// with Q5_K): bytes 0..4 hold scales 0..4 (+ high bits of scales 4..8),
/// bytes 4..8 minimums 0..4 (+ high bits of minimums 4..8), bytes 8..12 the
/// low nibbles of scales and minimums 4..8.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All 8 scales and 8 minimums.
#[inline]
pub fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

#[inline(always)]
fn q_at(b: &BlockQ4K, i: usize) -> u8 {
    let (s, l) = (i / 32, i % 32);
    let byte = b.qs[32 * (s / 2) + l];
    if s % 2 == 0 {
        byte & 0x0F
    } else {
        byte >> 4
    }
}

pub fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ4K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q4_K: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        let (sc, m) = scales_mins_k4(&b.scales);
        for (i, o) in y.iter_mut().enumerate() {
            let dl = d * sc[i / 32] as f32;
            let ml = dmin * m[i / 32] as f32;
            *o = dl * q_at(b, i) as f32 - ml;
        }
    }
}

/// Quantize like ggml's `quantize_row_q4_K_ref`: per sub-block an iterative
/// weighted (scale, min) search, then 6-bit scales and minimums relative to
/// the largest, then values re-rounded against the stored scales.
pub fn quantize_q4_k(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ4K>(dst);
    assert_eq!(src.len(), blocks.len() * QK_K, "Q4_K: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..8 {
            let xs = &x[32 * j..32 * j + 32];
            let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
            let av_x = (sum_x2 / 32.0).sqrt();
            let w: [f32; 32] = core::array::from_fn(|i| av_x + xs[i].abs());
            let (s, m) = make_qkx2_quants(15, xs, &w, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20);
            scales[j] = s;
            mins[j] = m;
            max_scale = max_scale.max(s);
            max_min = max_min.max(m);
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let ls: [u8; 8] =
            core::array::from_fn(|j| nearest_int(inv_scale * scales[j]).min(63) as u8);
        let lm: [u8; 8] = core::array::from_fn(|j| nearest_int(inv_min * mins[j]).min(63) as u8);
        b.scales = pack_scale_min_k4(&ls, &lm);
        b.d = f16_le_from(max_scale / 63.0);
        b.dmin = f16_le_from(max_min / 63.0);
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let dl = d * sc as f32;
            if dl == 0.0 {
                // Keep the search's values: ggml does the same.
                continue;
            }
            let dm = dmin * m as f32;
            for i in 32 * j..32 * j + 32 {
                l[i] = nearest_int((x[i] + dm) / dl).clamp(0, 15) as u8;
            }
        }
        for c in 0..4 {
            for i in 0..32 {
                b.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

pub fn dot_q4_k_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ4K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len(), "Q4_K dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (sc, m) = scales_mins_k4(&a.scales);
        let mut isum = 0i32;
        let mut summs = 0i32;
        for s in 0..8 {
            let ssum: i32 = (32 * s..32 * s + 32)
                .map(|i| q_at(a, i) as i32 * b.qs[i] as i32)
                .sum();
            isum += sc[s] as i32 * ssum;
            summs += m[s] as i32 * (b.bsum(2 * s) as i32 + b.bsum(2 * s + 1) as i32);
        }
        let dy = b.d();
        sum += f16_le(a.d) * dy * isum as f32 - f16_le(a.dmin) * dy * summs as f32;
    }
    sum
}

pub fn dot_q4_k_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q4_k(row, act) };
    }
    dot_q4_k_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    /// `Σ_s m[s]·(bsum[2s] + bsum[2s+1])` as 8 i32 lanes (lane s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn mins_dot(m: &[u8; 8], b: &BlockQ8K) -> __m256i {
        // SAFETY: `bsums` is 32 readable bytes, `m` 8.
        let (bs, m8) = unsafe { (load32(b.bsums.as_ptr()), _mm_loadl_epi64(m.as_ptr().cast())) };
        let pair = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
        _mm256_mullo_epi32(pair, _mm256_cvtepu8_epi32(m8))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q4_k(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ4K>(row);
        let y = cast_blocks::<BlockQ8K>(act);
        assert_eq!(x.len(), y.len(), "Q4_K dot: block counts");
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let (sc, m) = scales_mins_k4(&a.scales);
            let summs = mins_dot(&m, b);
            let mut isum = _mm256_setzero_si256();
            for c in 0..4 {
                // SAFETY: `a.qs` holds 128 bytes, read at 32c <= 96; `b.qs`
                // holds 256, read at 64c and 64c + 32 <= 224.
                let (qv, y0, y1) = unsafe {
                    (
                        load32(a.qs.as_ptr().add(32 * c)),
                        load32(b.qs.as_ptr().add(64 * c).cast()),
                        load32(b.qs.as_ptr().add(64 * c + 32).cast()),
                    )
                };
                let lo = _mm256_and_si256(qv, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qv), m4);
                let p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(lo, y0),
                    _mm256_set1_epi16(sc[2 * c] as i16),
                );
                let p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, y1),
                    _mm256_set1_epi16(sc[2 * c + 1] as i16),
                );
                isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
            }
            let dy = b.d();
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16c(a.d) * dy),
                _mm256_cvtepi32_ps(isum),
                acc,
            );
            accm = _mm256_fmadd_ps(
                _mm256_set1_ps(f16c(a.dmin) * dy),
                _mm256_cvtepi32_ps(summs),
                accm,
            );
        }
        hsum_ps(_mm256_sub_ps(acc, accm))
    }
}
