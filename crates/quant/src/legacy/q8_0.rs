//! Q8_0: 32 signed bytes and one f16 scale. Both a weight format and the
//! activation format of every 32-element format.

use crate::block::{cast_blocks, cast_blocks_mut, f16_le, f16_le_from, Block};

/// Elements per block of the 32-element formats.
pub const QK8_0: usize = 32;

/// A Q8_0 block: `d` (f16, LE) then 32 × i8.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ80 {
    pub d: [u8; 2],
    pub qs: [i8; QK8_0],
}
const _: () = assert!(core::mem::size_of::<BlockQ80>() == 34);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ80 {}

impl BlockQ80 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

/// Quantize one block like ggml's `quantize_row_q8_0_ref` (and the gguf
/// package): scale = amax / 127, values rounded half away from zero.
/// Values are always in `-127..=127`.
#[inline]
pub fn quantize_block_q8_0(x: &[f32]) -> BlockQ80 {
    debug_assert_eq!(x.len(), QK8_0);
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_0];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    BlockQ80 {
        d: f16_le_from(d),
        qs,
    }
}

/// Quantize whole blocks of f32 into Q8_0 bytes: the AVX2 quantizer when
/// the CPU has it (bit-identical to [`quantize_block_q8_0`] for finite
/// inputs; blocks with a non-finite value take the scalar path), else the
/// scalar one. `REDLITE_REFERENCE` forces the scalar one.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ80>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q8_0: element count");
    #[cfg(target_arch = "x86_64")]
    if super::x86::has_avx2_fma() && !crate::registry::use_reference() {
        for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
            let x: &[f32; QK8_0] = x.try_into().expect("32 elements");
            // SAFETY: the CPU supports AVX2, FMA and F16C (checked above).
            *b = unsafe { avx2::quantize_block(x) }.unwrap_or_else(|| quantize_block_q8_0(x));
        }
        return;
    }
    quantize_q8_0_scalar(src, blocks);
}

fn quantize_q8_0_scalar(src: &[f32], blocks: &mut [BlockQ80]) {
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        *b = quantize_block_q8_0(x);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use core::arch::x86_64::*;

    /// Round half away from zero, exactly as `f32::round`: `t = trunc(|v|)`
    /// and `|v| - t` are exact, so `t + (frac >= 0.5)` is the scalar result;
    /// the sign is put back last (−0 converts to 0 either way).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn round_half_away(v: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let a = _mm256_andnot_ps(sign, v);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5));
        let r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0)));
        _mm256_or_ps(r, _mm256_and_ps(sign, v))
    }

    /// Four vectors of 8 i32 (each in −128..=127) to 32 i8 in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn pack_i32x32(i: [__m256i; 4]) -> __m256i {
        let a = _mm256_packs_epi32(i[0], i[1]);
        let b = _mm256_packs_epi32(i[2], i[3]);
        let p = _mm256_packs_epi16(a, b);
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// [`quantize_block_q8_0`] with AVX2: the same operations (absolute
    /// maximum, `d = amax / 127`, `id = 1 / d`, `v * id` rounded half away
    /// from zero), so the same bytes. `None` when the block holds a
    /// non-finite value (the scalar `max` skips NaN, `_mm256_max_ps` does not).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_block(x: &[f32; QK8_0]) -> Option<BlockQ80> {
        let sign = _mm256_set1_ps(-0.0);
        // SAFETY: `x` is 32 readable f32; loadu has no alignment need.
        let v: [__m256; 4] =
            core::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) });
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        let amax = _mm_cvtss_f32(m);
        // `_mm256_max_ps` may drop a NaN (it returns its second operand), so
        // look for one explicitly.
        let nan = _mm256_or_ps(
            _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
            ),
            _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[2]),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[3], v[3]),
            ),
        );
        if !amax.is_finite() || _mm256_movemask_ps(nan) != 0 {
            return None;
        }
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let q = pack_i32x32(core::array::from_fn(|k| {
            _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], id)))
        }));
        let mut qs = [0i8; QK8_0];
        // SAFETY: `qs` is 32 writable bytes; storeu has no alignment need.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), q) };
        Some(BlockQ80 {
            d: f16_le_from(d),
            qs,
        })
    }
}

pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ80>(src);
    assert_eq!(dst.len(), blocks.len() * QK8_0, "Q8_0: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK8_0)) {
        let d = b.d();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Scalar reference: integer dot per block, then scale by `dx * dy`.
pub fn dot_q8_0_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ80>(row);
    let y = cast_blocks::<BlockQ80>(act);
    assert_eq!(x.len(), y.len(), "Q8_0 dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let isum: i32 =
            a.qs.iter()
                .zip(&b.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum += isum as f32 * (a.d() * b.d());
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks_of(x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / QK8_0 * 34];
        quantize_q8_0(x, &mut out);
        out
    }

    fn scalar(x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / QK8_0 * 34];
        quantize_q8_0_scalar(x, cast_blocks_mut(&mut out));
        out
    }

    /// The AVX2 quantizer gives the scalar reference's bytes exactly:
    /// random blocks over many magnitudes, and blocks whose scaled values
    /// sit on and next to the .5 ties (amax 127 makes `id` exactly 1).
    #[test]
    fn fast_quantizer_is_bit_identical() {
        let mut seed = 5u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let mut x: Vec<f32> = Vec::new();
        for k in 0..400 {
            let scale = 10f32.powi(k % 9 - 4);
            x.extend((0..QK8_0).map(|_| next() * scale));
        }
        let ties = [
            0.5f32,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            126.5,
            -126.5,
            0.49999997,
            -0.49999997,
            0.50000006,
            3.4999998,
            0.0,
            -0.0,
            64.5,
            -64.5,
        ];
        for shift in 0..4 {
            let mut b = [0f32; QK8_0];
            b[0] = 127.0;
            for (j, v) in b[1..].iter_mut().enumerate() {
                *v = ties[(j + shift) % ties.len()];
            }
            x.extend_from_slice(&b);
        }
        x.extend([0f32; QK8_0]);
        assert_eq!(blocks_of(&x), scalar(&x));
    }

    #[test]
    fn non_finite_block_takes_the_scalar_path() {
        let mut x = [0.25f32; QK8_0];
        x[3] = f32::NAN;
        x[7] = 1.0;
        assert_eq!(blocks_of(&x), scalar(&x));
    }
}
