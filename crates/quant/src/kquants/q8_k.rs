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

/// Quantize whole blocks of f32 into Q8_K bytes.
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ8K>(dst);
    assert_eq!(src.len(), blocks.len() * QK_K, "Q8_K: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        *b = quantize_block_q8_k(x.try_into().expect("256 elements"));
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

    #[test]
    fn q8_k_zero_block() {
        let b = quantize_block_q8_k(&[0.0; QK_K]);
        assert_eq!(b.d(), 0.0);
        assert!(b.qs.iter().all(|&q| q == 0));
    }
}
