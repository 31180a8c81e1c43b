//! One weight row against several Q8_0 activation records (Q4_0, Q5_0,
//! Q8_0 weights): the tile kernel of prompt processing.
//!
//! Each weight block is decoded once into 32 signed bytes and reused for
//! every record; scales come from the f16 table. The single-row dot
//! products of these formats (`dot_*_fast`) are the same tile with one
//! record: blocks alternate between two accumulators (even and odd block
//! index) to break the FMA latency chain. Tiles of four records use one
//! accumulator per record (four chains are enough, and eight accumulators
//! would spill), so their results differ from `dot_fast` by f32 rounding
//! only (tested within the fast-kernel budget).

use super::q8_0::BlockQ80;
use crate::block::cast_blocks;
use crate::registry::MULTI_MAX;

/// The records `t0..t0+g` of `acts` as Q8_0 blocks (`nb` each); records past
/// the end repeat the last one (their results are dropped).
pub(crate) fn records<const G: usize>(
    acts: &[u8],
    stride: usize,
    t0: usize,
    g: usize,
    nb: usize,
) -> [&[BlockQ80]; G] {
    let len = nb * core::mem::size_of::<BlockQ80>();
    core::array::from_fn(|i| cast_blocks(&acts[(t0 + i.min(g - 1)) * stride..][..len]))
}

/// Shape checks shared by the multi kernels: `out.len() <= MULTI_MAX`
/// records of `act_len` bytes at `stride` fit in `acts`.
pub(crate) fn check_multi(acts: &[u8], stride: usize, act_len: usize, n: usize) {
    assert!(n <= MULTI_MAX, "dot_multi: {n} records > {MULTI_MAX}");
    assert!(
        n == 0 || (stride >= act_len && acts.len() >= (n - 1) * stride + act_len),
        "dot_multi: {n} records of {act_len} bytes at stride {stride} in {} bytes",
        acts.len()
    );
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use crate::legacy::q4::BlockQ40;
    use crate::legacy::q5::BlockQ50;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    /// `G` records at once: `decode` gives a weight block's 32 signed values
    /// (never -128) and its scale (f16 bytes).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tile<const G: usize, B, D>(x: &[B], ys: [&[BlockQ80]; G], decode: D) -> [f32; G]
    where
        D: Fn(&B) -> (__m256i, [u8; 2]),
    {
        let nb = x.len();
        for y in &ys {
            assert_eq!(y.len(), nb, "dot: block counts");
        }
        let mut acc0 = [_mm256_setzero_ps(); G];
        let mut acc1 = [_mm256_setzero_ps(); G];
        let ones = _mm256_set1_epi16(1);
        let f16 = crate::f16util::f16_table();
        let step = |acc: &mut [__m256; G], i: usize| {
            let (q, dx) = decode(&x[i]);
            let ax = _mm256_sign_epi8(q, q);
            let dx = _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize]);
            for t in 0..G {
                let b = &ys[t][i];
                // SAFETY: `b.qs` is 32 readable bytes.
                let v = unsafe { load32(b.qs.as_ptr().cast()) };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(v, q)), ones);
                let d = _mm256_mul_ps(dx, _mm256_set1_ps(f16[u16::from_le_bytes(b.d) as usize]));
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
            }
        };
        if G >= 4 {
            // Enough independent chains already; a second set of
            // accumulators would spill (AVX2 has 16 vector registers).
            for i in 0..nb {
                step(&mut acc0, i);
            }
            return core::array::from_fn(|t| hsum_ps(acc0[t]));
        }
        let mut i = 0;
        while i + 2 <= nb {
            step(&mut acc0, i);
            step(&mut acc1, i + 1);
            i += 2;
        }
        if i < nb {
            step(&mut acc0, i);
        }
        core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc0[t], acc1[t])))
    }

    /// Run `tile` over all records of a multi call, four at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn multi<B, D>(x: &[B], acts: &[u8], stride: usize, out: &mut [f32], decode: D)
    where
        D: Fn(&B) -> (__m256i, [u8; 2]) + Copy,
    {
        let nb = x.len();
        let n = out.len();
        check_multi(acts, stride, nb * core::mem::size_of::<BlockQ80>(), n);
        let mut t0 = 0;
        while t0 < n {
            let g = (n - t0).min(4);
            let r: [f32; 4] = match g {
                1 => {
                    let [a] = tile::<1, B, D>(x, records(acts, stride, t0, 1, nb), decode);
                    [a, 0.0, 0.0, 0.0]
                }
                2 => {
                    let [a, b] = tile::<2, B, D>(x, records(acts, stride, t0, 2, nb), decode);
                    [a, b, 0.0, 0.0]
                }
                _ => tile::<4, B, D>(x, records(acts, stride, t0, g, nb), decode),
            };
            out[t0..t0 + g].copy_from_slice(&r[..g]);
            t0 += g;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode_q8_0(a: &BlockQ80) -> (__m256i, [u8; 2]) {
        // SAFETY: `a.qs` is 32 readable bytes.
        (unsafe { load32(a.qs.as_ptr().cast()) }, a.d)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode_q5_0(a: &BlockQ50) -> (__m256i, [u8; 2]) {
        // SAFETY: `a.qs` is 16 readable bytes.
        let q = unsafe { nibbles_lo_hi(a.qs.as_ptr()) };
        // value - 16 = nibble when the fifth bit is set, else nibble | 0xF0
        // read as i8 (nibble - 16).
        let bits = bits_to_bytes(u32::from_le_bytes(a.qh));
        let hi = _mm256_set1_epi8(0xF0u8 as i8);
        (_mm256_or_si256(q, _mm256_andnot_si256(bits, hi)), a.d)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode_q4_0(a: &BlockQ40) -> (__m256i, [u8; 2]) {
        // SAFETY: `a.qs` is 16 readable bytes.
        let q = unsafe { nibbles_lo_hi(a.qs.as_ptr()) };
        (_mm256_sub_epi8(q, _mm256_set1_epi8(8)), a.d)
    }

    macro_rules! entry {
        ($dot:ident, $multi:ident, $blk:ty, $decode:ident) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $dot(row: &[u8], act: &[u8]) -> f32 {
                let x = cast_blocks::<$blk>(row);
                let y = cast_blocks::<BlockQ80>(act);
                let [r] = tile::<1, _, _>(x, [y], |a: &$blk| $decode(a));
                r
            }

            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
                multi(cast_blocks::<$blk>(row), acts, stride, out, |a: &$blk| {
                    $decode(a)
                })
            }
        };
    }

    entry!(dot_q8_0, multi_q8_0, BlockQ80, decode_q8_0);
    entry!(dot_q5_0, multi_q5_0, BlockQ50, decode_q5_0);
    entry!(dot_q4_0, multi_q4_0, BlockQ40, decode_q4_0);
}

macro_rules! dispatch {
    ($dot:ident, $avx_dot:ident, $multi:ident, $blk:ty, $reference:path) => {
        /// The AVX2 tile with one record, else the scalar reference.
        pub fn $dot(row: &[u8], act: &[u8]) -> f32 {
            #[cfg(target_arch = "x86_64")]
            if super::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$avx_dot(row, act) };
            }
            $reference(row, act)
        }

        /// The AVX2 tile over all records, else the reference per record.
        pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if super::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$multi(row, acts, stride, out) };
            }
            let len = row.len() / core::mem::size_of::<$blk>() * core::mem::size_of::<BlockQ80>();
            check_multi(acts, stride, len, out.len());
            for (t, o) in out.iter_mut().enumerate() {
                *o = $reference(row, &acts[t * stride..t * stride + len]);
            }
        }
    };
}

dispatch!(
    dot_q8_0_fast,
    dot_q8_0,
    multi_q8_0,
    BlockQ80,
    super::q8_0::dot_q8_0_ref
);
dispatch!(
    dot_q5_0_fast,
    dot_q5_0,
    multi_q5_0,
    super::q5::BlockQ50,
    super::q5::dot_q5_0_ref
);
dispatch!(
    dot_q4_0_fast,
    dot_q4_0,
    multi_q4_0,
    super::q4::BlockQ40,
    super::q4::dot_q4_0_ref
);
