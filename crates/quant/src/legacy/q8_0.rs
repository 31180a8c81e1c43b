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

/// Quantize whole blocks of f32 into Q8_0 bytes.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ80>(dst);
    assert_eq!(src.len(), blocks.len() * QK8_0, "Q8_0: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
        *b = quantize_block_q8_0(x);
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
