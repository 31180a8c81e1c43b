//! Q2_K: 2-bit values in 16 groups of 16, each group with a 4-bit scale and
//! a 4-bit minimum, both scaled by the f16 super-block `d` and `dmin`.
//!
//! Element `128h + 32j + l` (h < 2, j < 4, l < 32) is bits `2j..2j+2` of
//! `qs[32h + l]`; its group is the element index / 16.

use super::q8_k::{BlockQ8K, QK_K};
use crate::block::{cast_blocks, f16_le, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: minimum, per group of 16.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ2K>() == 84);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ2K {}

#[inline(always)]
fn q_at(b: &BlockQ2K, i: usize) -> u8 {
    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
    (b.qs[32 * h + l] >> (2 * j)) & 3
}

pub fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ2K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q2_K: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for (i, o) in y.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            *o = dl * q_at(b, i) as f32 - ml;
        }
    }
}

pub fn dot_q2_k_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ2K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len(), "Q2_K dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut isum = 0i32;
        let mut summs = 0i32;
        for g in 0..16 {
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| q_at(a, i) as i32 * b.qs[i] as i32)
                .sum();
            isum += (a.scales[g] & 0x0F) as i32 * gsum;
            summs += (a.scales[g] >> 4) as i32 * b.bsum(g) as i32;
        }
        let dall = b.d() * f16_le(a.d);
        let dmin = b.d() * f16_le(a.dmin);
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}

pub fn dot_q2_k_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q2_k(row, act) };
    }
    dot_q2_k_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::kquants::x86::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q2_k(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ2K>(row);
        let y = cast_blocks::<BlockQ8K>(act);
        assert_eq!(x.len(), y.len(), "Q2_K dot: block counts");
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            // SAFETY: `scales` is 16 readable bytes, `bsums` 32.
            let (scb, bsums) = unsafe {
                (
                    _mm_loadu_si128(a.scales.as_ptr().cast()),
                    load32(b.bsums.as_ptr()),
                )
            };
            let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(scb, m4));
            let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(scb), m4));
            let summs = _mm256_madd_epi16(mins16, bsums);
            let mut isum = _mm256_setzero_si256();
            for h in 0..2 {
                // SAFETY: `qs` holds 64 bytes; 32 are read at 32h, h < 2.
                let qv = unsafe { load32(a.qs.as_ptr().add(32 * h)) };
                let sch = half_scales(sc16, h);
                for j in 0..4 {
                    let q = _mm256_and_si256(srl16(qv, 2 * j), m3);
                    // SAFETY: `b.qs` holds 256 bytes; 32 are read at
                    // 128h + 32j <= 224.
                    let yv = unsafe { load32(b.qs.as_ptr().add(128 * h + 32 * j).cast()) };
                    let p = _mm256_maddubs_epi16(q, yv);
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales(sch, j)));
                }
            }
            let dy = b.d();
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(dy * f16c(a.d)),
                _mm256_cvtepi32_ps(isum),
                acc,
            );
            accm = _mm256_fmadd_ps(
                _mm256_set1_ps(dy * f16c(a.dmin)),
                _mm256_cvtepi32_ps(summs),
                accm,
            );
        }
        hsum_ps(_mm256_sub_ps(acc, accm))
    }
}
