//! AVX2 helpers of the K-quant dot products.
#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

/// From 16 i16 group scales (lane 0: groups 0..8, lane 1: groups 8..16),
/// the 8 scales of half `h` in both lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn half_scales(sc16: __m256i, h: usize) -> __m256i {
    if h == 0 {
        _mm256_permute2x128_si256::<0x00>(sc16, sc16)
    } else {
        _mm256_permute2x128_si256::<0x11>(sc16, sc16)
    }
}

/// With the 8 scales of a half in both lanes, the scales of the group pair
/// `(2j, 2j+1)`: lane 0 all `s[2j]`, lane 1 all `s[2j+1]` (as i16), ready
/// for `madd` against the `maddubs` output of 32 elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn pair_scales(half: __m256i, j: usize) -> __m256i {
    let base = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    );
    let mask = _mm256_add_epi8(base, _mm256_set1_epi8(4 * j as i8));
    _mm256_shuffle_epi8(half, mask)
}

/// Shift every 16-bit lane right by `n` bits (run-time count).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn srl16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}
