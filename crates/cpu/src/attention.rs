//! Causal grouped-query attention over a KV cache.
//!
//! Layouts: queries `n_tok × n_head × head_dim`; the cache holds
//! `positions × n_kv_head × head_dim` for keys and values; query token `t`
//! sits at position `pos0 + t` and sees positions `0..=pos0 + t`. Query head
//! `h` reads KV head `h / (n_head / n_kv_head)`.

use crate::matmul::dot_f32;
use crate::{CpuError, Pool};
use rayon::prelude::*;

/// Shape of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// The shapes every attention kernel checks first: queries and output of
/// `n_tok` rows, a cache of at least `pos0 + n_tok` positions, whole query
/// groups.
pub(crate) fn check_shapes(
    s: &AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    n_tok: usize,
    out: &[f32],
) -> Result<(), CpuError> {
    let qn = n_tok * s.n_head * s.head_dim;
    let kvn = (pos0 + n_tok) * s.n_kv_head * s.head_dim;
    let bad = |what, expected, found| {
        Err(CpuError::Shape {
            what,
            expected,
            found,
        })
    };
    if s.n_kv_head == 0 || !s.n_head.is_multiple_of(s.n_kv_head) {
        return bad("query heads per KV head", s.n_kv_head, s.n_head);
    }
    if q.len() != qn {
        return bad("attention queries", qn, q.len());
    }
    if out.len() != qn {
        return bad("attention output", qn, out.len());
    }
    if k.len() < kvn || v.len() < kvn {
        return bad("KV cache values", kvn, k.len().min(v.len()));
    }
    Ok(())
}

/// Positions per partial sum of the softmax denominator and of the
/// weighted values: a long cache summed into one f32 accumulator loses
/// ~sqrt(n) roundings of the running total (6e-5 of the output at 65,536
/// positions with a few dominant keys, tests/long_attention.rs); summed per
/// block and then over blocks, the loss is that of 256 + n/256 additions.
const SUM_BLOCK: usize = 256;

/// Fast path, threaded: one task per token and group of query heads that
/// share a KV head (all of a KV head's heads when that leaves every
/// thread a task, else the largest divisor of the group that does), f32
/// scores. A task reads each cached row once for its heads: per head the
/// rows went through memory again, which at long contexts was most of a
/// decode step's time (Qwen2.5-0.5B at 30K positions, 2 threads: 386 ms a
/// token, docs/what-did-not-work.md has the numbers). Each head's
/// arithmetic is the same whatever the grouping, so a value is the same
/// bits in decode and in a verify pass.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    pool: &Pool,
    s: &AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    n_tok: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), CpuError> {
    check_shapes(s, q, k_cache, v_cache, pos0, n_tok, out)?;
    let (hd, group, kv_stride) = (s.head_dim, s.n_head / s.n_kv_head, s.n_kv_head * s.head_dim);
    let gs = heads_per_task(group, n_tok * s.n_kv_head, pool.threads());
    let avx2 = avx2_available();
    pool.install(|| {
        out.par_chunks_mut(gs * hd).enumerate().for_each_init(
            Vec::new,
            |scores: &mut Vec<f32>, (i, o)| {
                let (t, h0) = (i * gs / s.n_head, i * gs % s.n_head);
                let kvh = h0 / group;
                let qh = &q[(t * s.n_head + h0) * hd..][..gs * hd];
                let n_pos = pos0 + t + 1;
                let kv = (&k_cache[kvh * hd..], &v_cache[kvh * hd..], kv_stride);
                #[cfg(target_arch = "x86_64")]
                if avx2 && hd.is_multiple_of(64) {
                    // SAFETY: the CPU supports AVX2 and FMA (checked by
                    // `avx2_available`).
                    return unsafe { heads_avx2(qh, hd, kv, n_pos, scale, scores, o) };
                }
                let _ = avx2;
                for (qj, oj) in qh.chunks_exact(hd).zip(o.chunks_exact_mut(hd)) {
                    head(qj, kv, n_pos, scale, scores, oj);
                }
            },
        );
    });
    Ok(())
}

/// Query heads per task: the whole group (`group` heads share a KV head)
/// when `tasks` groups give each of `threads` threads one, else the
/// largest divisor of the group that leaves every thread a task (1 at
/// worst: one head a task).
fn heads_per_task(group: usize, tasks: usize, threads: usize) -> usize {
    let splits = threads.div_ceil(tasks.max(1)).max(1);
    (1..=group)
        .rev()
        .find(|d| group.is_multiple_of(*d) && group / d >= splits)
        .unwrap_or(1)
}

fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Query heads of one KV head (`qs`: `gs` rows of `hd`, `hd` a multiple
/// of 64) with AVX2/FMA, into `o` (`gs` rows). The same three steps as
/// [`head`] per head, shaped for the vector unit: scores four positions at
/// a time with one combined horizontal sum; `exp` on eight scores at a time
/// ([`exp_avx2`], within 2 ulp of libm's); the weighted sum of values kept
/// in eight registers per 64 output dims. The heads take turns over short
/// runs of positions, so a run's K rows (about 16 KB) and V rows (32
/// positions) come from memory once and from L1 for the other heads; each
/// head's operations and their order do not depend on `gs` (the
/// accumulators of the value sums wait in memory between runs, exactly).
/// Results differ from [`head`] by f32 rounding only (tested).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn heads_avx2(
    qs: &[f32],
    hd: usize,
    (k, v, stride): (&[f32], &[f32], usize),
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    use core::arch::x86_64::*;
    let gs = qs.len() / hd;
    assert!(
        hd.is_multiple_of(64) && qs.len() == gs * hd && o.len() == gs * hd,
        "attention heads"
    );
    if n_pos == 0 {
        return;
    }
    assert!(
        k.len() >= (n_pos - 1) * stride + hd && v.len() >= (n_pos - 1) * stride + hd,
        "attention head cache"
    );
    let npad = n_pos.next_multiple_of(8);
    scores.clear();
    scores.resize(gs * npad, f32::NEG_INFINITY);
    let kp = k.as_ptr();
    let vp = v.as_ptr();
    // Scores, four positions per pass, the heads in turn over runs of
    // positions whose K rows fill about 16 KB (a multiple of 4 positions:
    // every head meets the same passes as alone).
    let run = ((16384 / (4 * hd)).max(4)) / 4 * 4;
    let mut r0 = 0;
    while r0 < n_pos {
        let r1 = (r0 + run).min(n_pos);
        for (qh, row) in qs.chunks_exact(hd).zip(scores.chunks_exact_mut(npad)) {
            let qp = qh.as_ptr();
            let mut p = r0;
            while p < r1 {
                let m = (n_pos - p).min(4);
                let mut acc = [_mm256_setzero_ps(); 4];
                for c in (0..hd).step_by(8) {
                    // SAFETY: `c + 8 <= hd = qh.len()`; key rows `p + j <
                    // n_pos` hold `hd` values at `(p + j) * stride` (checked
                    // above). Rows past `n_pos` re-read the last one (`p +
                    // j.min(m - 1)`).
                    unsafe {
                        let qv = _mm256_loadu_ps(qp.add(c));
                        for (j, a) in acc.iter_mut().enumerate() {
                            let row = p + j.min(m - 1);
                            *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add(row * stride + c)), *a);
                        }
                    }
                }
                // lanes of the two hadds: [s0 s1 s2 s3] per 128-bit half.
                let h = _mm256_hadd_ps(
                    _mm256_hadd_ps(acc[0], acc[1]),
                    _mm256_hadd_ps(acc[2], acc[3]),
                );
                let s4 = _mm_mul_ps(
                    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h)),
                    _mm_set1_ps(scale),
                );
                let mut four = [0f32; 4];
                // SAFETY: `four` is 4 writable f32.
                unsafe { _mm_storeu_ps(four.as_mut_ptr(), s4) };
                row[p..p + m].copy_from_slice(&four[..m]);
                p += m;
            }
        }
        r0 = r1;
    }
    // Per head: exp(s - max) eight at a time (the padding, -inf, gives 0),
    // summed per block of positions, then the blocks (SUM_BLOCK).
    let mut inv = Vec::with_capacity(gs);
    for row in scores.chunks_exact_mut(npad) {
        let max = row[..n_pos]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let mut sumv = _mm256_setzero_ps();
        let maxv = _mm256_set1_ps(max);
        for block in row.chunks_mut(SUM_BLOCK) {
            let mut part = _mm256_setzero_ps();
            for chunk in block.chunks_exact_mut(8) {
                // SAFETY: `chunk` is 8 readable and writable f32.
                unsafe {
                    let e =
                        crate::vexp::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), maxv));
                    _mm256_storeu_ps(chunk.as_mut_ptr(), e);
                    part = _mm256_add_ps(part, e);
                }
            }
            sumv = _mm256_add_ps(sumv, part);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` is 8 writable f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sumv) };
        inv.push(1.0 / lanes.iter().sum::<f32>());
    }
    // Weighted values, 64 output dims (eight registers) per pass; within a
    // block of SUM_BLOCK positions the heads take turns over runs of 32
    // (their V rows, 32 x 64 values, stay in L1).
    const VRUN: usize = 32;
    let zero = _mm256_setzero_ps();
    let mut acc_mem = vec![zero; 8 * gs];
    let mut total = vec![zero; 8 * gs];
    for c in (0..hd).step_by(64) {
        total.fill(zero);
        let mut b0 = 0;
        while b0 < n_pos {
            let b1 = (b0 + SUM_BLOCK).min(n_pos);
            acc_mem.fill(zero);
            let mut s0 = b0;
            while s0 < b1 {
                let s1 = (s0 + VRUN).min(b1);
                for (j, am) in acc_mem.chunks_exact_mut(8).enumerate() {
                    let w = &scores[j * npad..];
                    let mut acc: [__m256; 8] = core::array::from_fn(|i| am[i]);
                    for (i, &wp) in w[s0..s1].iter().enumerate() {
                        let p = s0 + i;
                        let wv = _mm256_set1_ps(wp * inv[j]);
                        for (jj, a) in acc.iter_mut().enumerate() {
                            // SAFETY: value row `p < n_pos` holds `hd` values
                            // at `p * stride`, and `c + 8jj + 8 <= hd`.
                            *a = _mm256_fmadd_ps(
                                wv,
                                unsafe { _mm256_loadu_ps(vp.add(p * stride + c + 8 * jj)) },
                                *a,
                            );
                        }
                    }
                    am.copy_from_slice(&acc);
                }
                s0 = s1;
            }
            for (t, a) in total.iter_mut().zip(&acc_mem) {
                *t = _mm256_add_ps(*t, *a);
            }
            b0 = b1;
        }
        for (j, tj) in total.chunks_exact(8).enumerate() {
            for (jj, t) in tj.iter().enumerate() {
                // SAFETY: `j * hd + c + 8jj + 8 <= gs * hd = o.len()`.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(j * hd + c + 8 * jj), *t) };
            }
        }
    }
}

/// One query head over positions `0..n_pos`: `kv` holds the key and value
/// caches starting at this head's KV head, and the position stride.
#[inline(always)]
fn head(
    qh: &[f32],
    (k, v, stride): (&[f32], &[f32], usize),
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let hd = qh.len();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for p in 0..n_pos {
        let kr = &k[p * stride..][..hd];
        let sc = dot_f32(qh, kr) * scale;
        max = max.max(sc);
        scores.push(sc);
    }
    let mut sum = 0f32;
    for block in scores.chunks_mut(SUM_BLOCK) {
        let mut part = 0f32;
        for sc in block.iter_mut() {
            *sc = (*sc - max).exp();
            part += *sc;
        }
        sum += part;
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x = 0.0);
    let mut part = vec![0f32; hd];
    for (b, block) in scores.chunks(SUM_BLOCK).enumerate() {
        part.iter_mut().for_each(|x| *x = 0.0);
        for (i, &w) in block.iter().enumerate() {
            let vr = &v[(b * SUM_BLOCK + i) * stride..][..hd];
            let w = w * inv;
            for (x, &y) in part.iter_mut().zip(vr) {
                *x += w * y;
            }
        }
        for (x, &y) in o.iter_mut().zip(&part) {
            *x += y;
        }
    }
}

/// Reference: one thread, scores and sums in f64.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention_reference(
    s: &AttnShape,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    pos0: usize,
    n_tok: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), CpuError> {
    check_shapes(s, q, k_cache, v_cache, pos0, n_tok, out)?;
    let (hd, group, kv_stride) = (s.head_dim, s.n_head / s.n_kv_head, s.n_kv_head * s.head_dim);
    for t in 0..n_tok {
        for h in 0..s.n_head {
            let kvh = h / group;
            let qh = &q[(t * s.n_head + h) * hd..][..hd];
            let n_pos = pos0 + t + 1;
            let scores: Vec<f64> = (0..n_pos)
                .map(|p| {
                    let kr = &k_cache[p * kv_stride + kvh * hd..][..hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|&x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            // Positions outer, columns inner (each column still sums its
            // positions in order): one pass over the V rows.
            let mut acc = vec![0f64; hd];
            for (p, &ep) in e.iter().enumerate() {
                let w = ep / sum;
                let vr = &v_cache[p * kv_stride + kvh * hd..][..hd];
                for (a, &x) in acc.iter_mut().zip(vr) {
                    *a += w * x as f64;
                }
            }
            let o = &mut out[(t * s.n_head + h) * hd..][..hd];
            for (x, a) in o.iter_mut().zip(&acc) {
                *x = *a as f32;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Seeded uniform values in [-1, 1) (an LCG), shared by the attention
    /// kernels' tests.
    pub(crate) fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn fast_matches_reference_batched_and_single() {
        let s = AttnShape {
            n_head: 4,
            n_kv_head: 2,
            head_dim: 16,
        };
        let mut seed = 3;
        let (pos0, n_tok) = (5, 4);
        let n_pos = pos0 + n_tok;
        let k = rand(n_pos * 2 * 16, &mut seed);
        let v = rand(n_pos * 2 * 16, &mut seed);
        let q = rand(n_tok * 4 * 16, &mut seed);
        let pool = Pool::new(2);
        let mut a = vec![0f32; q.len()];
        let mut b = vec![0f32; q.len()];
        causal_attention(&pool, &s, &q, &k, &v, pos0, n_tok, 0.25, &mut a).unwrap();
        causal_attention_reference(&s, &q, &k, &v, pos0, n_tok, 0.25, &mut b).unwrap();
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
        assert!(worst < 1e-6, "worst {worst}");
        // Token-by-token gives the same as the batch.
        for t in 0..n_tok {
            let mut one = vec![0f32; 4 * 16];
            causal_attention(
                &pool,
                &s,
                &q[t * 64..(t + 1) * 64],
                &k,
                &v,
                pos0 + t,
                1,
                0.25,
                &mut one,
            )
            .unwrap();
            assert_eq!(&one[..], &a[t * 64..(t + 1) * 64]);
        }
        // The first position attends only to itself: output = its value.
        let mut first = vec![0f32; 4 * 16];
        causal_attention(&pool, &s, &q[..64], &k, &v, 0, 1, 0.25, &mut first).unwrap();
        for h in 0..4 {
            let kvh = h / 2;
            for j in 0..16 {
                assert!((first[h * 16 + j] - v[kvh * 16 + j]).abs() < 1e-6);
            }
        }
    }

    /// The AVX2 head against the portable one (f32 rounding only) at head
    /// dims 64 and 256 and several lengths, and its `exp` against libm's.
    #[test]
    fn avx2_head_matches_portable_head() {
        if !avx2_available() {
            return;
        }
        let mut seed = 9;
        for hd in [64usize, 256] {
            for n_pos in [1usize, 3, 7, 100, 513] {
                let q: Vec<f32> = rand(hd, &mut seed).iter().map(|x| x * 3.0).collect();
                let k = rand(n_pos * 2 * hd, &mut seed);
                let v = rand(n_pos * 2 * hd, &mut seed);
                let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                let mut sc = Vec::new();
                let kv = (&k[hd..], &v[hd..], 2 * hd);
                head(&q, kv, n_pos, 0.125, &mut sc, &mut a);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA checked above.
                unsafe {
                    heads_avx2(&q, hd, kv, n_pos, 0.125, &mut sc, &mut b)
                };
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
                assert!(worst < 2e-6, "hd {hd} n_pos {n_pos}: {worst}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::*;
            let mut x = -100.0f32;
            let mut worst = 0f32;
            while x < 88.0 {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 and FMA checked above; `got` is 8 writable f32.
                unsafe {
                    _mm256_storeu_ps(got.as_mut_ptr(), crate::vexp::exp_avx2(_mm256_set1_ps(x)))
                };
                let want = x.exp();
                if want > 1e-37 {
                    worst = worst.max(((got[0] - want) / want).abs());
                } else {
                    assert!(got[0] <= 1e-37, "exp({x}) = {}", got[0]);
                }
                x += 0.0137;
            }
            assert!(worst < 3e-7, "exp relative error {worst}");
            let mut got = [1f32; 8];
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(
                    got.as_mut_ptr(),
                    crate::vexp::exp_avx2(_mm256_set1_ps(f32::NEG_INFINITY)),
                )
            };
            assert_eq!(got[0], 0.0);
        }
    }

    /// A group of heads computed together gives each head the bits it gets
    /// alone (decode and a verify pass may group differently), at head dims
    /// 64 and 256, lengths past a SUM_BLOCK and runs cut short.
    #[test]
    fn grouped_heads_give_each_head_its_own_bits() {
        if !avx2_available() {
            return;
        }
        let mut seed = 17;
        for (hd, gs) in [(64usize, 7usize), (256, 8), (128, 3)] {
            for n_pos in [1usize, 5, 67, 300, 1031] {
                let q: Vec<f32> = rand(gs * hd, &mut seed).iter().map(|x| x * 3.0).collect();
                let k = rand(n_pos * 2 * hd, &mut seed);
                let v = rand(n_pos * 2 * hd, &mut seed);
                let kv = (&k[hd..], &v[hd..], 2 * hd);
                let (mut together, mut alone) = (vec![0f32; gs * hd], vec![0f32; gs * hd]);
                let mut sc = Vec::new();
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 and FMA checked above.
                unsafe {
                    heads_avx2(&q, hd, kv, n_pos, 0.125, &mut sc, &mut together);
                    for (qj, oj) in q.chunks_exact(hd).zip(alone.chunks_exact_mut(hd)) {
                        heads_avx2(qj, hd, kv, n_pos, 0.125, &mut sc, oj);
                    }
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&together),
                    bits(&alone),
                    "hd {hd} heads {gs} n_pos {n_pos}"
                );
            }
        }
    }

    #[test]
    fn tasks_group_heads_while_every_thread_has_one() {
        // Qwen2.5-0.5B (groups of 7, 2 KV heads): decode on 2 threads takes
        // whole groups; on 16 threads one head a task (7 has no other
        // divisor); Qwen3-Next's groups of 8 split in halves on 8 threads.
        assert_eq!(heads_per_task(7, 2, 2), 7);
        assert_eq!(heads_per_task(7, 2, 16), 1);
        assert_eq!(heads_per_task(8, 2, 8), 2);
        assert_eq!(heads_per_task(8, 2, 4), 4);
        // A prompt of many tokens: whole groups.
        assert_eq!(heads_per_task(8, 2 * 64, 16), 8);
        assert_eq!(heads_per_task(1, 1, 16), 1);
    }

    #[test]
    fn short_cache_is_an_error() {
        let s = AttnShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 4,
        };
        let mut out = vec![0f32; 8];
        let r = causal_attention(
            &Pool::new(1),
            &s,
            &[0.0; 8],
            &[0.0; 4],
            &[0.0; 4],
            1,
            1,
            1.0,
            &mut out,
        );
        assert!(r.is_err());
    }
}
