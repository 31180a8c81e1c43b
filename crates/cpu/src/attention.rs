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

fn check(
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

/// Fast path: one task per (token, head), f32 scores, threaded.
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
    check(s, q, k_cache, v_cache, pos0, n_tok, out)?;
    let (hd, group, kv_stride) = (s.head_dim, s.n_head / s.n_kv_head, s.n_kv_head * s.head_dim);
    let avx2 = avx2_available();
    pool.install(|| {
        out.par_chunks_mut(hd).enumerate().for_each_init(
            Vec::new,
            |scores: &mut Vec<f32>, (i, o)| {
                let (t, h) = (i / s.n_head, i % s.n_head);
                let kvh = h / group;
                let qh = &q[i * hd..(i + 1) * hd];
                let n_pos = pos0 + t + 1;
                let kv = (&k_cache[kvh * hd..], &v_cache[kvh * hd..], kv_stride);
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the CPU supports AVX2 (checked by `avx2_available`).
                    return unsafe { head_avx2(qh, kv, n_pos, scale, scores, o) };
                }
                let _ = avx2;
                head(qh, kv, n_pos, scale, scores, o)
            },
        );
    });
    Ok(())
}

fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`head`] compiled for AVX2: the same operations in the same order
/// (eight-lane dot accumulators, element-wise axpy, no FMA contraction),
/// on 256-bit vectors instead of SSE2's 128: bit-identical results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn head_avx2(
    qh: &[f32],
    kv: (&[f32], &[f32], usize),
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    head(qh, kv, n_pos, scale, scores, o)
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
    for sc in scores.iter_mut() {
        *sc = (*sc - max).exp();
        sum += *sc;
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x = 0.0);
    for (p, &w) in scores.iter().enumerate() {
        let vr = &v[p * stride..][..hd];
        let w = w * inv;
        for (x, &y) in o.iter_mut().zip(vr) {
            *x += w * y;
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
    check(s, q, k_cache, v_cache, pos0, n_tok, out)?;
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
            let o = &mut out[(t * s.n_head + h) * hd..][..hd];
            for (j, x) in o.iter_mut().enumerate() {
                *x = (0..n_pos)
                    .map(|p| e[p] / sum * v_cache[p * kv_stride + kvh * hd + j] as f64)
                    .sum::<f64>() as f32;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
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
            .fold(0f32, f32::max);
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

    /// The AVX2 build of the head loop gives the portable build's bits.
    #[test]
    fn avx2_head_is_bit_identical() {
        if !avx2_available() {
            return;
        }
        let mut seed = 9;
        let hd = 64;
        for n_pos in [1usize, 7, 100] {
            let q = rand(hd, &mut seed);
            let k = rand(n_pos * 2 * hd, &mut seed);
            let v = rand(n_pos * 2 * hd, &mut seed);
            let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
            let mut sc = Vec::new();
            head(
                &q,
                (&k[hd..], &v[hd..], 2 * hd),
                n_pos,
                0.125,
                &mut sc,
                &mut a,
            );
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 checked above.
            unsafe {
                head_avx2(
                    &q,
                    (&k[hd..], &v[hd..], 2 * hd),
                    n_pos,
                    0.125,
                    &mut sc,
                    &mut b,
                )
            };
            assert_eq!(a, b, "n_pos {n_pos}");
        }
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
