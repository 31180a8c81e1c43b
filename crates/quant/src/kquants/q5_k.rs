//! Q5_K: Q4_K plus a fifth bit per value: bit `s` of `qh[l]` belongs to
//! element `32s + l`.

use super::q4_k::scales_mins_k4;
use super::q8_k::{BlockQ8K, QK_K};
use crate::block::{cast_blocks, f16_le, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ5K>() == 176);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ5K {}

#[inline(always)]
fn q_at(b: &BlockQ5K, i: usize) -> u8 {
    let (s, l) = (i / 32, i % 32);
    let byte = b.qs[32 * (s / 2) + l];
    let lo = if s % 2 == 0 { byte & 0x0F } else { byte >> 4 };
    lo | (((b.qh[l] >> s) & 1) << 4)
}

pub fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ5K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q5_K: element count");
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

pub fn dot_q5_k_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ5K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len(), "Q5_K dot: block counts");
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

pub fn dot_q5_k_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q5_k(row, act) };
    }
    dot_q5_k_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::kquants::q4_k::avx2::mins_dot;
    use crate::kquants::x86::srl16;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q5_k(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ5K>(row);
        let y = cast_blocks::<BlockQ8K>(act);
        assert_eq!(x.len(), y.len(), "Q5_K dot: block counts");
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let (sc, m) = scales_mins_k4(&a.scales);
            let summs = mins_dot(&m, b);
            // SAFETY: `qh` is 32 readable bytes.
            let hb = unsafe { load32(a.qh.as_ptr()) };
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
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(hb, 2 * c), one));
                let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(srl16(hb, 2 * c + 1), one));
                let lo = _mm256_or_si256(_mm256_and_si256(qv, m4), h0);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qv), m4), h1);
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
