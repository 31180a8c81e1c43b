//! Small AVX2 helpers shared by the legacy and K-quant kernels.
#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

/// Whether the AVX2 kernels (which also use FMA and F16C) can run on this
/// machine (cached by std).
#[inline(always)]
pub fn has_avx2_fma() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// One f16 (LE bytes) to f32 with the F16C instruction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f16c(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(
        _mm_cvtsi32_si128(u16::from_le_bytes(b) as i32),
    ))
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Unsigned (`x` ≤ 127 per byte in pairs so i16 cannot saturate: callers
/// keep `x` ≤ 63) × signed byte dot into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    let p16 = _mm256_maddubs_epi16(x, y);
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// Expand the 32 bits of `bits` to 32 bytes: byte `j` is 0xFF when bit `j`
/// is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn bits_to_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte j takes source byte j / 8.
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask)
}

/// 16 packed nibble bytes to 32 bytes: low nibbles in bytes 0..16, high
/// nibbles in bytes 16..32.
///
/// # Safety
/// `p` must be valid for reading 16 bytes (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn nibbles_lo_hi(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes; loadu has no alignment need.
    let q = unsafe { _mm_loadu_si128(p.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Load 32 bytes from any address.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes; loadu has no alignment need.
    unsafe { _mm256_loadu_si256(p.cast()) }
}
