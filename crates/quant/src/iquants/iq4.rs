//! IQ4_NL and IQ4_XS: 4.5 and 4.25 bits per weight, 4-bit indices into 16
//! non-linear values.
//!
//! IQ4_NL: blocks of 32 weights, `w = d · kvalues[q]`, Q8_0 activations.
//! IQ4_XS: super-blocks of 256 with a 6-bit signed scale per 32 weights,
//! `w = d · (ls − 32) · kvalues[q]`, Q8_K activations. In both, nibble `j`
//! of byte `i` of a 32-weight group holds weight `i + 16·j`.

use super::tables::KVALUES_IQ4NL;
use super::{ActQ8_0, QK_K};
use crate::block::{cast_blocks, f16_le, Block};
use crate::kquants::BlockQ8K;
use crate::Kernels;
use redlite_gguf::GgmlType;

/// IQ4_NL block: f16 `d` and 16 bytes of two 4-bit indices.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq4Nl {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockIq4Nl>() == 18);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq4Nl {}

/// IQ4_XS block: f16 `d`, the high 2 bits of the eight 6-bit scales
/// (little-endian u16), their low 4 bits (4 bytes), and 128 bytes of 4-bit
/// indices (16 per 32 weights).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockIq4Xs {
    pub d: [u8; 2],
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(core::mem::size_of::<BlockIq4Xs>() == 136);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every bit
// pattern valid.
unsafe impl Block for BlockIq4Xs {}

impl BlockIq4Xs {
    /// Signed scale (−32..=31) of 32-weight group `ib`.
    #[inline(always)]
    fn scale(&self, ib: usize) -> i32 {
        let h = u16::from_le_bytes(self.scales_h);
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        (lo | hi << 4) as i32 - 32
    }
}

pub(super) static IQ4_NL: Kernels = Kernels {
    ty: GgmlType::IQ4_NL,
    dequantize: dequantize_iq4_nl,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: dot_iq4_nl_ref,
    dot_fast: dot_iq4_nl,
    dot_multi: None,
    quantize: None,
};

pub(super) static IQ4_XS: Kernels = Kernels {
    ty: GgmlType::IQ4_XS,
    dequantize: dequantize_iq4_xs,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: dot_iq4_xs_ref,
    dot_fast: dot_iq4_xs,
    dot_multi: None,
    quantize: None,
};

/// Write `d · table[nibble]` for the 32 weights packed in `qs`.
#[inline(always)]
pub(super) fn put32(y: &mut [f32], d: f32, qs: &[u8], table: &[i8; 16]) {
    let (lo, hi) = y.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(qs) {
        *l = d * table[(q & 0xF) as usize] as f32;
        *h = d * table[(q >> 4) as usize] as f32;
    }
}

/// Σ table[nibble] · q over the 32 weights packed in `qs`.
#[inline(always)]
pub(super) fn dot32(qs: &[u8], q: &[i8], table: &[i8; 16]) -> i32 {
    let (lo, hi) = q.split_at(16);
    let mut s = 0i32;
    for ((&l, &h), &b) in lo.iter().zip(hi).zip(qs) {
        s += table[(b & 0xF) as usize] as i32 * l as i32;
        s += table[(b >> 4) as usize] as i32 * h as i32;
    }
    s
}

// ----------------------------------------------------------------- IQ4_NL

fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq4Nl>(src);
    assert_eq!(dst.len(), blocks.len() * 32, "IQ4_NL: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        put32(y, f16_le(b.d), &b.qs, &KVALUES_IQ4NL);
    }
}

fn dot_iq4_nl_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq4Nl>(row);
    let y = cast_blocks::<ActQ8_0>(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ4_NL: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * f16_le(a.d);
        sumf += d * dot32(&b.qs, &a.qs, &KVALUES_IQ4NL) as f32;
    }
    sumf
}

fn dot_iq4_nl(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq4_nl(row, act) };
    }
    dot_iq4_nl_ref(row, act)
}

// ----------------------------------------------------------------- IQ4_XS

fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockIq4Xs>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "IQ4_XS: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, (y, qs)) in y
            .chunks_exact_mut(32)
            .zip(b.qs.chunks_exact(16))
            .enumerate()
        {
            let dl = d * b.scale(ib) as f32;
            put32(y, dl, qs, &KVALUES_IQ4NL);
        }
    }
}

fn dot_iq4_xs_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockIq4Xs>(row);
    let y = BlockQ8K::slice(act);
    assert_eq!(
        x.len(),
        y.len(),
        "IQ4_XS: row and activations differ in length"
    );
    let mut sumf = 0f32;
    for (b, a) in x.iter().zip(y) {
        let d = f16_le(b.d) * a.d();
        let mut isum = 0i32;
        for (ib, (qs, q)) in b.qs.chunks_exact(16).zip(a.qs.chunks_exact(32)).enumerate() {
            isum += b.scale(ib) * dot32(qs, q, &KVALUES_IQ4NL);
        }
        sumf += d * isum as f32;
    }
    sumf
}

fn dot_iq4_xs(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2, FMA and F16C were detected at run time just above.
        return unsafe { avx2::dot_iq4_xs(row, act) };
    }
    dot_iq4_xs_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! The AVX2 dot products: `_mm_shuffle_epi8` looks the 32 nibbles up
    //! in the 16-value table, `mul_signed` multiplies with the activations
    //! into i16 pair sums (at most 2·128·127 = 32512 < 32767, exact for any
    //! i8), and `_mm256_madd_epi16` widens (applying IQ4_XS's scales).
    //!
    //! # Safety
    //!
    //! Callers must have checked that AVX2, FMA and F16C are available.

    use super::super::x86::{f16c, hsum4_i32, hsum_i32, load32, mul_signed};
    use super::*;
    use core::arch::x86_64::*;

    /// The 16 values of `table` in a register, for `_mm_shuffle_epi8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in super::super) unsafe fn table16(table: &[i8; 16]) -> __m128i {
        // SAFETY: `table` is 16 readable bytes; unaligned load.
        _mm_loadu_si128(table.as_ptr().cast())
    }

    /// The 32 table values of the nibbles in `qs` (16 bytes): low nibbles
    /// in the low 128 bits, high nibbles in the high 128 bits.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in super::super) unsafe fn lookup32(qs: &[u8; 16], table: __m128i) -> __m256i {
        // SAFETY: `qs` is 16 readable bytes; unaligned load.
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m));
        _mm256_set_m128i(hi, lo)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq4_nl(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq4Nl>(row);
        let y = cast_blocks::<ActQ8_0>(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ4_NL: row and activations differ in length"
        );
        let table = table16(&KVALUES_IQ4NL);
        let ones = _mm256_set1_epi16(1);
        // Σ table[q]·a over one block as i32 lanes.
        let lanes = |b: &BlockIq4Nl, a: &ActQ8_0| {
            let p = mul_signed(load32(&a.qs), lookup32(&b.qs, table));
            _mm256_madd_epi16(p, ones)
        };
        let mut sumf = 0f32;
        // Four blocks per horizontal reduction; the f32 steps stay in
        // block order, as in the reference.
        let (x4, xr) = x.split_at(x.len() / 4 * 4);
        let (y4, yr) = y.split_at(x4.len());
        for (b, a) in x4.chunks_exact(4).zip(y4.chunks_exact(4)) {
            let s = hsum4_i32(
                lanes(&b[0], &a[0]),
                lanes(&b[1], &a[1]),
                lanes(&b[2], &a[2]),
                lanes(&b[3], &a[3]),
            );
            for ((b, a), s) in b.iter().zip(a).zip(s) {
                let d = f16c(b.d) * f16c(a.d);
                sumf += d * s as f32;
            }
        }
        for (b, a) in xr.iter().zip(yr) {
            let d = f16c(b.d) * f16c(a.d);
            sumf += d * hsum_i32(lanes(b, a)) as f32;
        }
        sumf
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_iq4_xs(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockIq4Xs>(row);
        let y = BlockQ8K::slice(act);
        assert_eq!(
            x.len(),
            y.len(),
            "IQ4_XS: row and activations differ in length"
        );
        let table = table16(&KVALUES_IQ4NL);
        let mut sumf = 0f32;
        for (b, a) in x.iter().zip(y) {
            let d = f16c(b.d) * a.d();
            let mut acc = _mm256_setzero_si256();
            for ib in 0..QK_K / 32 {
                let qs: &[u8; 16] = b.qs[16 * ib..16 * ib + 16].try_into().unwrap();
                let q: &[i8; 32] = a.qs[32 * ib..32 * ib + 32].try_into().unwrap();
                let p = mul_signed(load32(q), lookup32(qs, table));
                let ls = _mm256_set1_epi16(b.scale(ib) as i16);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ls));
            }
            sumf += d * hsum_i32(acc) as f32;
        }
        sumf
    }
}
