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

    /// Records per block of the record loop of the GEMM kernels: each
    /// pair of weight rows is decoded once per 64 records.
    const RECORDS_PER_BLOCK: usize = 64;

    /// A Q4_K super-block decoded for reuse: the eight 32-value sub-blocks
    /// as unsigned bytes (`q[2c]` the low nibbles of chunk `c`, `q[2c+1]`
    /// the high ones), their scales broadcast to i16 lanes, the minimums,
    /// and `d`, `dmin` as f32.
    #[derive(Clone, Copy)]
    struct DecodedQ4K {
        q: [__m256i; 8],
        s: [__m256i; 8],
        m: [u8; 8],
        dx: f32,
        dmin: f32,
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode_q4_k(a: &BlockQ4K) -> DecodedQ4K {
        let m4 = _mm256_set1_epi8(0x0F);
        let (sc, m) = scales_mins_k4(&a.scales);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            // SAFETY: `a.qs` holds 128 bytes; 32 are read at 32c <= 96.
            let qv = unsafe { load32(a.qs.as_ptr().add(32 * c)) };
            q[2 * c] = _mm256_and_si256(qv, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(qv), m4);
        }
        DecodedQ4K {
            q,
            s: core::array::from_fn(|k| _mm256_set1_epi16(sc[k] as i16)),
            m,
            dx: f16c(a.d),
            dmin: f16c(a.dmin),
        }
    }

    /// A Q6_K super-block decoded for reuse: the eight 32-value groups as
    /// unsigned 6-bit bytes in `(h, j)` order, their pair scales (as
    /// `pair_scales` gives them), the 16 scales as i16 and `d` as f32.
    #[derive(Clone, Copy)]
    struct DecodedQ6K {
        q: [__m256i; 8],
        ps: [__m256i; 8],
        sc16: __m256i,
        dx: f32,
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode_q6_k(a: &BlockQ6K) -> DecodedQ6K {
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        // SAFETY: `scales` is 16 readable bytes.
        let sc16 = unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast())) };
        let mut q = [_mm256_setzero_si256(); 8];
        let mut ps = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            // SAFETY: `ql` holds 128 bytes (read at 64h and 64h + 32 <= 96),
            // `qh` 64 (read at 32h <= 32).
            let (ql0, ql1, qh) = unsafe {
                (
                    load32(a.ql.as_ptr().add(64 * h)),
                    load32(a.ql.as_ptr().add(64 * h + 32)),
                    load32(a.qh.as_ptr().add(32 * h)),
                )
            };
            q[4 * h] = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
            );
            q[4 * h + 1] = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
            );
            q[4 * h + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, m30),
            );
            q[4 * h + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
            );
            let sch = half_scales(sc16, h);
            for j in 0..4 {
                ps[4 * h + j] = pair_scales(sch, j);
            }
        }
        DecodedQ6K {
            q,
            ps,
            sc16,
            dx: f16c(a.d),
        }
    }

    /// `R` decoded Q4_K rows against one record, the arithmetic of
    /// `dot_q4_k` per row in the same order (bit-identical results).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pair_q4_k<const R: usize>(rows: [&[DecodedQ4K]; R], y: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut accm = [_mm256_setzero_ps(); R];
        for (i, b) in y.iter().enumerate() {
            let mut isum = [_mm256_setzero_si256(); R];
            for c in 0..4 {
                // SAFETY: `b.qs` holds 256 bytes; 32 are read at 64c and
                // 64c + 32 <= 224.
                let (y0, y1) = unsafe {
                    (
                        load32(b.qs.as_ptr().add(64 * c).cast()),
                        load32(b.qs.as_ptr().add(64 * c + 32).cast()),
                    )
                };
                for r in 0..R {
                    let a = &rows[r][i];
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(a.q[2 * c], y0), a.s[2 * c]);
                    let p1 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(a.q[2 * c + 1], y1), a.s[2 * c + 1]);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
                }
            }
            let dy = b.d();
            for r in 0..R {
                let a = &rows[r][i];
                let summs = mins_dot(&a.m, b);
                acc[r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(a.dx * dy),
                    _mm256_cvtepi32_ps(isum[r]),
                    acc[r],
                );
                accm[r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(a.dmin * dy),
                    _mm256_cvtepi32_ps(summs),
                    accm[r],
                );
            }
        }
        core::array::from_fn(|r| hsum_ps(_mm256_sub_ps(acc[r], accm[r])))
    }

    /// `R` decoded Q6_K rows against one record, the arithmetic of
    /// `dot_q6_k` per row in the same order (bit-identical results).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pair_q6_k<const R: usize>(rows: [&[DecodedQ6K]; R], y: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, b) in y.iter().enumerate() {
            // SAFETY: `bsums` is 32 readable bytes.
            let bs = unsafe { load32(b.bsums.as_ptr()) };
            let mut isum: [__m256i; R] = core::array::from_fn(|r| {
                let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(rows[r][i].sc16, bs));
                _mm256_sub_epi32(_mm256_setzero_si256(), off)
            });
            for k in 0..8 {
                // SAFETY: `qs` holds 256 bytes; 32 are read at 32k <= 224
                // (group (h, j) = k sits at 128h + 32j = 32k).
                let yv = unsafe { load32(b.qs.as_ptr().add(32 * k).cast()) };
                for r in 0..R {
                    let a = &rows[r][i];
                    let p = _mm256_maddubs_epi16(a.q[k], yv);
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, a.ps[k]));
                }
            }
            let dy = b.d();
            for r in 0..R {
                let dx = rows[r][i].dx;
                acc[r] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            }
        }
        core::array::from_fn(|r| hsum_ps(acc[r]))
    }

    macro_rules! gemm_k {
        ($name:ident, $blk:ty, $dec:ty, $decode:ident, $pair:ident) => {
            /// `nr` rows × `n` records (token-major: `out[t * nr + r]`): blocks of
            /// [`RECORDS_PER_BLOCK`] records outside; inside, rows are
            /// decoded two at a time (once per block of records) and each
            /// record's activation blocks are loaded once for both rows.
            /// Per (row, record) the arithmetic is the single-row dot's.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $name(
                rows: &[u8],
                row_bytes: usize,
                nr: usize,
                acts: &[u8],
                stride: usize,
                n: usize,
                out: &mut [f32],
            ) {
                let nb = row_bytes / core::mem::size_of::<$blk>();
                let act_len = nb * core::mem::size_of::<BlockQ8K>();
                assert!(rows.len() >= nr * row_bytes, "gemm: row bytes");
                assert!(out.len() >= nr * n, "gemm: output");
                assert!(
                    n == 0 || (stride >= act_len && acts.len() >= (n - 1) * stride + act_len),
                    "gemm: records"
                );
                let row = |r: usize| cast_blocks::<$blk>(&rows[r * row_bytes..(r + 1) * row_bytes]);
                let rec =
                    |t: usize| cast_blocks::<BlockQ8K>(&acts[t * stride..t * stride + act_len]);
                let mut d0: Vec<$dec> = Vec::with_capacity(nb);
                let mut d1: Vec<$dec> = Vec::with_capacity(nb);
                let mut t0 = 0;
                while t0 < n {
                    let t1 = (t0 + RECORDS_PER_BLOCK).min(n);
                    let mut r = 0;
                    while r < nr {
                        d0.clear();
                        d0.extend(row(r).iter().map(|a| $decode(a)));
                        if r + 1 < nr {
                            d1.clear();
                            d1.extend(row(r + 1).iter().map(|a| $decode(a)));
                            for t in t0..t1 {
                                let [a, b] = $pair::<2>([&d0, &d1], rec(t));
                                out[t * nr + r] = a;
                                out[t * nr + r + 1] = b;
                            }
                            r += 2;
                        } else {
                            for t in t0..t1 {
                                let [a] = $pair::<1>([&d0], rec(t));
                                out[t * nr + r] = a;
                            }
                            r += 1;
                        }
                    }
                    t0 = t1;
                }
            }
        };
    }

    gemm_k!(gemm_q4_k, BlockQ4K, DecodedQ4K, decode_q4_k, pair_q4_k);
    gemm_k!(gemm_q6_k, BlockQ6K, DecodedQ6K, decode_q6_k, pair_q6_k);
}

/// Whether the batched kernels of `ty` give the single dot's bits per
/// (row, record): true for the formats of this module (the tiles and the
/// GEMM keep `dot_*_fast`'s order, tested in `gemm_k_equals_single_row_dot`
/// and `tests/batch_exact.rs`).
pub fn batch_matches_decode(ty: redlite_gguf::GgmlType) -> bool {
    use redlite_gguf::GgmlType as T;
    matches!(ty, T::Q4_K | T::Q6_K)
}

use crate::legacy::multi::gemm_dispatch;

gemm_dispatch!(gemm_q4_k_fast, gemm_q4_k, multi_q4_k);
gemm_dispatch!(gemm_q6_k_fast, gemm_q6_k, multi_q6_k);

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

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_gguf::GgmlType;

    /// The GEMM kernels give, per (row, record), bit for bit what the
    /// single-row dot gives (same integer sums, same f32 order). Rows 1..=5
    /// cover the two-row pairs and the odd row; 1..=70 records cover the
    /// 64-record blocks and their remainder.
    #[test]
    fn gemm_k_equals_single_row_dot() {
        let mut seed = 41u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let cols = 256 * 3;
        for (ty, f) in [
            (
                GgmlType::Q4_K,
                gemm_q4_k_fast as crate::legacy::multi::GemmFn,
            ),
            (GgmlType::Q6_K, gemm_q6_k_fast),
        ] {
            let k = crate::kernels(ty).unwrap();
            for (nr, n) in [(1usize, 1usize), (2, 3), (5, 9), (3, 70)] {
                let w: Vec<f32> = (0..nr * cols).map(|_| next()).collect();
                let mut wb = vec![0u8; ty.bytes_for((nr * cols) as u64).unwrap() as usize];
                crate::quantize(ty, &w, &mut wb).unwrap();
                let rb = wb.len() / nr;
                let acts: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        let x: Vec<f32> = (0..cols).map(|_| next() * 2.0).collect();
                        crate::quantize_activations(ty, &x).unwrap()
                    })
                    .collect();
                let stride = acts[0].len() + 4;
                let mut flat = vec![0u8; n * stride];
                for (t, a) in acts.iter().enumerate() {
                    flat[t * stride..t * stride + a.len()].copy_from_slice(a);
                }
                let mut out = vec![0f32; nr * n];
                f(&wb, rb, nr, &flat, stride, n, &mut out);
                for r in 0..nr {
                    for (t, a) in acts.iter().enumerate() {
                        let want = (k.dot_fast)(&wb[r * rb..(r + 1) * rb], a);
                        assert_eq!(
                            out[t * nr + r].to_bits(),
                            want.to_bits(),
                            "{ty} {nr}x{n} ({r},{t})"
                        );
                    }
                }
            }
        }
    }
}
