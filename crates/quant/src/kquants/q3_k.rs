//! Q3_K: 3-bit values (2 low bits in `qs`, the high bit in `hmask`) in 16
//! groups of 16 with signed 6-bit scales, times the f16 `d`.
//!
//! Element `128h + 32j + l` has low bits `2j..2j+2` of `qs[32h + l]` and
//! high bit `4h + j` of `hmask[l]`; the value is `low - 4` when the high bit
//! is clear, else `low`.

use super::q8_k::{BlockQ8K, QK_K};
use crate::block::{cast_blocks, f16_le, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ3K>() == 110);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ3K {}

/// The 16 signed group scales (-32..=31).
#[inline]
pub fn scales_q3_k(s: &[u8; 12]) -> [i8; 16] {
    core::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        ((low | (high << 4)) as i32 - 32) as i8
    })
}

#[inline(always)]
fn q_at(b: &BlockQ3K, i: usize) -> i32 {
    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = ((b.qs[32 * h + l] >> (2 * j)) & 3) as i32;
    let high = (b.hmask[l] >> (4 * h + j)) & 1;
    if high == 0 {
        low - 4
    } else {
        low
    }
}

pub fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ3K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q3_K: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let sc = scales_q3_k(&b.scales);
        for (i, o) in y.iter_mut().enumerate() {
            let dl = d * sc[i / 16] as f32;
            *o = dl * q_at(b, i) as f32;
        }
    }
}

pub fn dot_q3_k_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ3K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len(), "Q3_K dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sc = scales_q3_k(&a.scales);
        let mut isum = 0i32;
        for (g, &s) in sc.iter().enumerate() {
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| q_at(a, i) * b.qs[i] as i32)
                .sum();
            isum += s as i32 * gsum;
        }
        sum += f16_le(a.d) * b.d() * isum as f32;
    }
    sum
}

pub fn dot_q3_k_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q3_k(row, act) };
    }
    dot_q3_k_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::kquants::x86::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q3_k(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ3K>(row);
        let y = cast_blocks::<BlockQ8K>(act);
        assert_eq!(x.len(), y.len(), "Q3_K dot: block counts");
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let zero = _mm256_setzero_si256();
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let sc = scales_q3_k(&a.scales);
            // SAFETY: `sc` is 16 readable bytes, `hmask` 32.
            let (sc16, hm) = unsafe {
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast())),
                    load32(a.hmask.as_ptr()),
                )
            };
            let mut isum = _mm256_setzero_si256();
            for h in 0..2 {
                // SAFETY: `qs` holds 64 bytes; 32 are read at 32h, h < 2.
                let qv = unsafe { load32(a.qs.as_ptr().add(32 * h)) };
                let sch = half_scales(sc16, h);
                for j in 0..4 {
                    let q = _mm256_and_si256(srl16(qv, 2 * j), m3);
                    let bit = _mm256_set1_epi8((1u8 << (4 * h + j)) as i8);
                    let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), zero);
                    let sub = _mm256_and_si256(clear, four);
                    // SAFETY: `b.qs` holds 256 bytes; 32 are read at
                    // 128h + 32j <= 224.
                    let yv = unsafe { load32(b.qs.as_ptr().add(128 * h + 32 * j).cast()) };
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q, yv),
                        _mm256_maddubs_epi16(sub, yv),
                    );
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales(sch, j)));
                }
            }
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16c(a.d) * b.d()),
                _mm256_cvtepi32_ps(isum),
                acc,
            );
        }
        hsum_ps(acc)
    }
}
