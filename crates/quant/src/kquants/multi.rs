//! One weight row against several Q8_K activation records (Q4_K, Q6_K): the
//! tile kernel of prompt processing.
//!
//! Each super-block's weights (nibbles, high bits, scales) are decoded once
//! and reused for every record. Per record the arithmetic is exactly that of
//! the single-row AVX2 dot (`dot_*_fast`), in the same order, so a record's
//! result is bit-for-bit the same through either path (tested).

use super::q4_k::{dot_q4_k_ref, BlockQ4K};
use super::q6_k::{dot_q6_k_ref, BlockQ6K};
use super::q8_k::BlockQ8K;
use crate::block::cast_blocks;
use crate::legacy::multi::check_multi;

/// The records `t0..t0+g` of `acts` as Q8_K blocks (`nb` each); records past
/// `g` repeat the last one (their results are dropped).
fn records<const G: usize>(
    acts: &[u8],
    stride: usize,
    t0: usize,
    g: usize,
    nb: usize,
) -> [&[BlockQ8K]; G] {
    let len = nb * core::mem::size_of::<BlockQ8K>();
    core::array::from_fn(|i| cast_blocks(&acts[(t0 + i.min(g - 1)) * stride..][..len]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::kquants::q4_k::avx2::mins_dot;
    use crate::kquants::q4_k::scales_mins_k4;
    use crate::kquants::x86::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn tile_q4_k<const G: usize>(x: &[BlockQ4K], ys: [&[BlockQ8K]; G]) -> [f32; G] {
        for y in &ys {
            assert_eq!(y.len(), x.len(), "Q4_K dot: block counts");
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); G];
        let mut accm = [_mm256_setzero_ps(); G];
        for (i, a) in x.iter().enumerate() {
            let (sc, m) = scales_mins_k4(&a.scales);
            let mut isum = [_mm256_setzero_si256(); G];
            for c in 0..4 {
                // SAFETY: `a.qs` holds 128 bytes; 32 are read at 32c <= 96.
                let qv = unsafe { load32(a.qs.as_ptr().add(32 * c)) };
                let lo = _mm256_and_si256(qv, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qv), m4);
                let s0 = _mm256_set1_epi16(sc[2 * c] as i16);
                let s1 = _mm256_set1_epi16(sc[2 * c + 1] as i16);
                for t in 0..G {
                    let b = &ys[t][i];
                    // SAFETY: `b.qs` holds 256 bytes; 32 are read at 64c and
                    // 64c + 32 <= 224.
                    let (y0, y1) = unsafe {
                        (
                            load32(b.qs.as_ptr().add(64 * c).cast()),
                            load32(b.qs.as_ptr().add(64 * c + 32).cast()),
                        )
                    };
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s1);
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(p0, p1));
                }
            }
            let (dx, dmin) = (f16c(a.d), f16c(a.dmin));
            for t in 0..G {
                let b = &ys[t][i];
                let summs = mins_dot(&m, b);
                let dy = b.d();
                acc[t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(isum[t]), acc[t]);
                accm[t] = _mm256_fmadd_ps(
                    _mm256_set1_ps(dmin * dy),
                    _mm256_cvtepi32_ps(summs),
                    accm[t],
                );
            }
        }
        core::array::from_fn(|t| hsum_ps(_mm256_sub_ps(acc[t], accm[t])))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn tile_q6_k<const G: usize>(x: &[BlockQ6K], ys: [&[BlockQ8K]; G]) -> [f32; G] {
        for y in &ys {
            assert_eq!(y.len(), x.len(), "Q6_K dot: block counts");
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let mut acc = [_mm256_setzero_ps(); G];
        for (i, a) in x.iter().enumerate() {
            // SAFETY: `scales` is 16 readable bytes.
            let sc16 = unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast())) };
            // Σ_g sc_g·Σ(q - 32)·y = Σ_g sc_g·Σ q·y - 32·Σ_g sc_g·bsum_g.
            let mut isum: [__m256i; G] = core::array::from_fn(|t| {
                // SAFETY: `bsums` is 32 readable bytes.
                let bs = unsafe { load32(ys[t][i].bsums.as_ptr()) };
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
                _mm256_sub_epi32(_mm256_setzero_si256(), off)
            });
            for h in 0..2 {
                // SAFETY: `ql` holds 128 bytes (read at 64h and 64h + 32
                // <= 96), `qh` 64 (read at 32h <= 32).
                let (ql0, ql1, qh) = unsafe {
                    (
                        load32(a.ql.as_ptr().add(64 * h)),
                        load32(a.ql.as_ptr().add(64 * h + 32)),
                        load32(a.qh.as_ptr().add(32 * h)),
                    )
                };
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                    ),
                ];
                let sch = half_scales(sc16, h);
                for (j, &qj) in q.iter().enumerate() {
                    let ps = pair_scales(sch, j);
                    for t in 0..G {
                        // SAFETY: `qs` holds 256 bytes; 32 are read at
                        // 128h + 32j <= 224.
                        let yv =
                            unsafe { load32(ys[t][i].qs.as_ptr().add(128 * h + 32 * j).cast()) };
                        let p = _mm256_maddubs_epi16(qj, yv);
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ps));
                    }
                }
            }
            let dx = f16c(a.d);
            for t in 0..G {
                let dy = ys[t][i].d();
                acc[t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            }
        }
        core::array::from_fn(|t| hsum_ps(acc[t]))
    }

    macro_rules! multi {
        ($name:ident, $blk:ty, $tile:ident) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $name(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
                let x = cast_blocks::<$blk>(row);
                let nb = x.len();
                let n = out.len();
                check_multi(acts, stride, nb * core::mem::size_of::<BlockQ8K>(), n);
                let mut t0 = 0;
                while t0 < n {
                    let g = (n - t0).min(4);
                    let r: [f32; 4] = match g {
                        1 => {
                            let [a] = $tile::<1>(x, records(acts, stride, t0, 1, nb));
                            [a, 0.0, 0.0, 0.0]
                        }
                        2 => {
                            let [a, b] = $tile::<2>(x, records(acts, stride, t0, 2, nb));
                            [a, b, 0.0, 0.0]
                        }
                        _ => $tile::<4>(x, records(acts, stride, t0, g, nb)),
                    };
                    out[t0..t0 + g].copy_from_slice(&r[..g]);
                    t0 += g;
                }
            }
        };
    }

    multi!(multi_q4_k, BlockQ4K, tile_q4_k);
    multi!(multi_q6_k, BlockQ6K, tile_q6_k);
}

macro_rules! dispatch {
    ($multi:ident, $blk:ty, $reference:path) => {
        /// The AVX2 tile over all records, else the reference per record.
        pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if crate::legacy::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$multi(row, acts, stride, out) };
            }
            let len = row.len() / core::mem::size_of::<$blk>() * core::mem::size_of::<BlockQ8K>();
            check_multi(acts, stride, len, out.len());
            for (t, o) in out.iter_mut().enumerate() {
                *o = $reference(row, &acts[t * stride..t * stride + len]);
            }
        }
    };
}

dispatch!(multi_q4_k, BlockQ4K, dot_q4_k_ref);
dispatch!(multi_q6_k, BlockQ6K, dot_q6_k_ref);
