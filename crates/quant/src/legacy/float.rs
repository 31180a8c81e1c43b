//! F32, F16 and BF16 weights; their dot products take F32 activations.
//!
//! Elements are read from little-endian bytes at any alignment.

use crate::f16util::{bf16_to_f32, f16_to_f32, f32_to_f16};

#[inline(always)]
fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

#[inline(always)]
fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 4, "F32: element count");
    for (o, v) in dst.iter_mut().zip(f32s(src)) {
        *o = v;
    }
}

pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 2, "F16: element count");
    for (o, v) in dst.iter_mut().zip(u16s(src)) {
        *o = f16_to_f32(v);
    }
}

pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len() * 2, "BF16: element count");
    for (o, v) in dst.iter_mut().zip(u16s(src)) {
        *o = bf16_to_f32(v);
    }
}

pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() * 4, "F32: element count");
    for (c, v) in dst.chunks_exact_mut(4).zip(src) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// Round to nearest even (as numpy's `astype(float16)`).
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() * 2, "F16: element count");
    for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
        c.copy_from_slice(&f32_to_f16(v).to_le_bytes());
    }
}

/// f32 → bf16 like ggml's `ggml_compute_fp32_to_bf16`: NaNs are quieted,
/// everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(v: f32) -> u16 {
    let n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 64) as u16;
    }
    ((n as u64 + (0x7fff + ((n >> 16) & 1)) as u64) >> 16) as u16
}

pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() * 2, "BF16: element count");
    for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
        c.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

/// Reference dots accumulate in f64, as ggml's generic float dots do.
pub fn dot_f32_ref(row: &[u8], act: &[u8]) -> f32 {
    assert_eq!(row.len(), act.len(), "F32 dot: lengths");
    f32s(row)
        .zip(f32s(act))
        .map(|(a, b)| a as f64 * b as f64)
        .sum::<f64>() as f32
}

pub fn dot_f16_ref(row: &[u8], act: &[u8]) -> f32 {
    assert_eq!(row.len() * 2, act.len(), "F16 dot: lengths");
    u16s(row)
        .zip(f32s(act))
        .map(|(a, b)| f16_to_f32(a) as f64 * b as f64)
        .sum::<f64>() as f32
}

pub fn dot_bf16_ref(row: &[u8], act: &[u8]) -> f32 {
    assert_eq!(row.len() * 2, act.len(), "BF16 dot: lengths");
    u16s(row)
        .zip(f32s(act))
        .map(|(a, b)| bf16_to_f32(a) as f64 * b as f64)
        .sum::<f64>() as f32
}

pub fn dot_f32_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_f32(row, act) };
    }
    dot_f32_ref(row, act)
}

pub fn dot_f16_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() && is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
        return unsafe { avx2::dot_f16(row, act) };
    }
    dot_f16_ref(row, act)
}

pub fn dot_bf16_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_bf16(row, act) };
    }
    dot_bf16_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::legacy::x86::hsum_ps;
    use core::arch::x86_64::*;

    /// Shared driver: `load(i)` gives weights `8i..8i+8` as f32 lanes.
    /// Four independent accumulators hide FMA latency.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_with(
        n: usize,
        act: &[u8],
        load: impl Fn(usize) -> __m256,
        tail: impl Fn(usize) -> f32,
    ) -> f32 {
        assert_eq!(act.len(), n * 4);
        let a = act.as_ptr();
        // SAFETY (for every `ya` call): `i * 8 + 8 <= n` and `act` holds
        // `n * 4` bytes, so 32 bytes are readable at `a + 32 i`.
        let ya = |i: usize| unsafe { _mm256_loadu_ps(a.add(32 * i).cast()) };
        let mut acc = [_mm256_setzero_ps(); 4];
        let n8 = n / 8;
        let mut i = 0;
        while i + 4 <= n8 {
            for (k, s) in acc.iter_mut().enumerate() {
                *s = _mm256_fmadd_ps(load(i + k), ya(i + k), *s);
            }
            i += 4;
        }
        while i < n8 {
            acc[0] = _mm256_fmadd_ps(load(i), ya(i), acc[0]);
            i += 1;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum_ps(v);
        for j in n8 * 8..n {
            let y = f32::from_le_bytes(act[4 * j..4 * j + 4].try_into().unwrap());
            s += tail(j) * y;
        }
        s
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_f32(row: &[u8], act: &[u8]) -> f32 {
        assert_eq!(row.len(), act.len(), "F32 dot: lengths");
        let n = row.len() / 4;
        let p = row.as_ptr();
        dot_with(
            n,
            act,
            // SAFETY: called with `i < n / 8`; `row` holds `4 n` bytes.
            |i| unsafe { _mm256_loadu_ps(p.add(32 * i).cast()) },
            |j| f32::from_le_bytes(row[4 * j..4 * j + 4].try_into().unwrap()),
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_f16(row: &[u8], act: &[u8]) -> f32 {
        assert_eq!(row.len() * 2, act.len(), "F16 dot: lengths");
        let n = row.len() / 2;
        let p = row.as_ptr();
        dot_with(
            n,
            act,
            // SAFETY: called with `i < n / 8`; `row` holds `2 n` bytes, so 16
            // bytes are readable at `p + 16 i`.
            |i| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * i).cast())) },
            |j| f16_to_f32(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])),
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_bf16(row: &[u8], act: &[u8]) -> f32 {
        assert_eq!(row.len() * 2, act.len(), "BF16 dot: lengths");
        let n = row.len() / 2;
        let p = row.as_ptr();
        dot_with(
            n,
            act,
            // SAFETY: called with `i < n / 8`; `row` holds `2 n` bytes, so 16
            // bytes are readable at `p + 16 i`.
            |i| unsafe {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16 * i).cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            },
            |j| bf16_to_f32(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])),
        )
    }
}
