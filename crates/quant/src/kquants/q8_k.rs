//! Q8_K: the activation format of the 256-element (K and IQ) formats.
//!
//! One block holds 256 signed bytes, one f32 scale and the sums of each
//! group of 16 quantized values (`bsums`), which the K-quant dot products use
//! to apply per-sub-block minimums without touching the values again.
//! Quantized values always lie in `-127..=127` (never -128), which the SIMD
//! dot products rely on.

use crate::block::{cast_blocks, cast_blocks_mut, Block};

/// Elements per super-block of the 256-element formats.
pub const QK_K: usize = 256;

/// A Q8_K block: `d` (f32, LE), 256 × i8, 16 × i16 group sums (LE).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    pub bsums: [u8; QK_K / 8],
}
const _: () = assert!(core::mem::size_of::<BlockQ8K>() == 292);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ8K {}

impl BlockQ8K {
    /// The block scale.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of the quantized values `16*i .. 16*i+16`.
    #[inline(always)]
    pub fn bsum(&self, i: usize) -> i16 {
        i16::from_le_bytes([self.bsums[2 * i], self.bsums[2 * i + 1]])
    }

    /// All 16 group sums.
    #[inline(always)]
    pub fn bsums(&self) -> [i16; 16] {
        core::array::from_fn(|i| self.bsum(i))
    }

    /// View raw bytes (whole blocks, any alignment) as blocks.
    #[inline]
    pub fn slice(bytes: &[u8]) -> &[BlockQ8K] {
        cast_blocks(bytes)
    }
}

/// Quantize one block of 256 values (llama.cpp `quantize_row_q8_K_ref` math:
/// the value of largest magnitude maps to -127, rounding to nearest even).
pub fn quantize_block_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let mut out = BlockQ8K {
        d: [0; 4],
        qs: [0; QK_K],
        bsums: [0; QK_K / 8],
    };
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    if amax == 0.0 {
        return out;
    }
    let iscale = -127.0 / max;
    for (q, &v) in out.qs.iter_mut().zip(x) {
        // |iscale * v| <= 127 up to rounding, so the clamp only guards the
        // float edge; the result always fits i8 and is never -128.
        *q = ((iscale * v).round_ties_even() as i32).clamp(-127, 127) as i8;
    }
    for g in 0..QK_K / 16 {
        let s: i32 = out.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
        out.bsums[2 * g..2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
    }
    out.d = (1.0 / iscale).to_le_bytes();
    out
}

/// Quantize whole blocks of f32 into Q8_K bytes: the AVX2 quantizer when
/// the CPU has it (bit-identical to [`quantize_block_q8_k`] for finite
/// inputs; other blocks take the scalar path), else the scalar one.
/// `REDLITE_REFERENCE` forces the scalar one.
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ8K>(dst);
    assert_eq!(src.len(), blocks.len() * QK_K, "Q8_K: element count");
    #[cfg(target_arch = "x86_64")]
    let fast = crate::legacy::x86::has_avx2_fma() && !crate::registry::use_reference();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        let x: &[f32; QK_K] = x.try_into().expect("256 elements");
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above).
            if let Some(q) = unsafe { avx2::quantize_block(x) } {
                *b = q;
                continue;
            }
        }
        let _ = fast;
        *b = quantize_block_q8_k(x);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use core::arch::x86_64::*;

    /// [`quantize_block_q8_k`] with AVX2: the same scale (`-127 / max`, max
    /// the first value of largest magnitude), `iscale * v` rounded to
    /// nearest even by `_mm256_round_ps` (the scalar `round_ties_even`),
    /// clamped to −127..=127: the same bytes. `None` for non-finite input.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_block(x: &[f32; QK_K]) -> Option<BlockQ8K> {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        let mut nan = _mm256_setzero_ps();
        for k in 0..QK_K / 8 {
            // SAFETY: `x` has 256 readable f32, `8 * k + 8 <= 256`.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) };
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        // `_mm256_max_ps` may drop a NaN (it returns its second operand).
        if _mm256_movemask_ps(nan) != 0 {
            return None;
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if !amax.is_finite() {
            return None;
        }
        let mut out = BlockQ8K {
            d: [0; 4],
            qs: [0; QK_K],
            bsums: [0; QK_K / 8],
        };
        if amax == 0.0 {
            return Some(out);
        }
        // The first value whose magnitude is the maximum (the scalar loop
        // keeps the first one on ties).
        let max = *x.iter().find(|v| v.abs() == amax)?;
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let lo = _mm256_set1_epi32(-127);
        let hi = _mm256_set1_epi32(127);
        let q = |k: usize| {
            // SAFETY: `x` has 256 readable f32, `8 * k + 8 <= 256`.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) };
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(is, v),
            );
            _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(r), lo), hi)
        };
        for c in 0..QK_K / 32 {
            let p = crate::legacy::q8_0::avx2::pack_i32x32([
                q(4 * c),
                q(4 * c + 1),
                q(4 * c + 2),
                q(4 * c + 3),
            ]);
            // SAFETY: `out.qs` has 256 writable bytes, `32 * c + 32 <= 256`.
            unsafe { _mm256_storeu_si256(out.qs.as_mut_ptr().add(32 * c).cast(), p) };
        }
        for g in 0..QK_K / 16 {
            let s: i32 = out.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            out.bsums[2 * g..2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        out.d = (1.0 / iscale).to_le_bytes();
        Some(out)
    }
}

/// Dequantize Q8_K bytes.
pub fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ8K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q8_K: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

/// Q8_K · Q8_K (for completeness; weights are never Q8_K in practice).
pub fn dot_q8_k_q8_k(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ8K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len());
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 =
            a.qs.iter()
                .zip(&b.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum += a.d() * b.d() * isum as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_round_trip_and_bsums() {
        let x: Vec<f32> = (0..2 * QK_K)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut bytes = vec![0u8; 2 * 292 + 1];
        // Offset by one byte: exercises the unaligned cast.
        quantize_q8_k(&x, &mut bytes[1..]);
        let blocks = BlockQ8K::slice(&bytes[1..]);
        for b in blocks {
            assert!(b.qs.iter().all(|&q| q != -128));
            assert!(b.qs.iter().any(|&q| q.abs() == 127));
            for g in 0..16 {
                let s: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
                assert_eq!(b.bsum(g) as i32, s);
            }
        }
        let mut y = vec![0f32; 2 * QK_K];
        dequantize_q8_k(&bytes[1..], &mut y);
        for (a, b) in x.iter().zip(&y) {
            // Step is max/127 ≈ 0.65/127; rounding error at most half a step.
            assert!((a - b).abs() <= 0.65 / 127.0 * 0.5 + 1e-6, "{a} vs {b}");
        }
    }

    /// The AVX2 quantizer gives the scalar bytes exactly: random blocks over
    /// many magnitudes, ties at .5 (max −127 makes `iscale` exactly 1), a
    /// repeated maximum of both signs, a zero block.
    #[test]
    fn fast_quantizer_is_bit_identical() {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let mut x: Vec<f32> = Vec::new();
        for k in 0..60 {
            let scale = 10f32.powi(k % 9 - 4);
            x.extend((0..QK_K).map(|_| next() * scale));
        }
        let mut b = [0f32; QK_K];
        for (j, v) in b.iter_mut().enumerate() {
            *v = (j as f32 - 128.0) + 0.5;
        }
        b[0] = 1.5;
        b[255] = -0.5;
        b[5] = -127.0;
        x.extend_from_slice(&b);
        b[9] = 127.0;
        b[5] = 3.0;
        b[20] = -127.0;
        x.extend_from_slice(&b);
        x.extend([0f32; QK_K]);
        b[77] = f32::NAN;
        x.extend_from_slice(&b);
        let mut fast = vec![0u8; x.len() / QK_K * 292];
        quantize_q8_k(&x, &mut fast);
        let slow: Vec<u8> = x
            .chunks_exact(QK_K)
            .flat_map(|c| {
                let b = quantize_block_q8_k(c.try_into().unwrap());
                let mut v = b.d.to_vec();
                v.extend(b.qs.iter().map(|&q| q as u8));
                v.extend(b.bsums);
                v
            })
            .collect();
        assert_eq!(fast, slow);
    }

    #[test]
    fn q8_k_zero_block() {
        let b = quantize_block_q8_k(&[0.0; QK_K]);
        assert_eq!(b.d(), 0.0);
        assert!(b.qs.iter().all(|&q| q == 0));
    }
}
