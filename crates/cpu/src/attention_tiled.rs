//! Prompt attention in tiles: the queries of a block of tokens, for every
//! query head of one KV head at once, walk the keys in blocks with an
//! online softmax, so each block of K and V rows comes from memory once
//! for all of them.
//!
//! [`crate::attention::causal_attention`] takes one (token, head) at a
//! time and reads the whole cache for each: at an 8,192-token prompt of
//! the demo model (14 query heads on 2 KV heads, head dim 64) that is
//! ~1 MB of K and V per row and two hundred thousand rows a layer, and the
//! prompt ran 2.7x slower than llama.cpp's (bench/needle.sh, CPU). Here a
//! task is `TILE_TOKENS` tokens; per KV head its `TILE_TOKENS x group`
//! rows share every `TILE_KEYS`-position block of K and V (16 KiB each at
//! head dim 64), which stays in L1/L2 while they use it.
//!
//! Same layouts as `attention.rs`. The result differs from the per-row
//! kernel by f32 rounding (the softmax sums run per key block with the
//! running maximum rescaled, as flash attention does; tested against the
//! f64 reference), so a speculative verify pass, whose logits must be the
//! decode's bit for bit, keeps the per-row kernel.

use crate::attention::{causal_attention, AttnShape};
use crate::{CpuError, Pool};
use rayon::prelude::*;

/// Query tokens a task takes (with a group of 7 query heads: 56 rows).
const TILE_TOKENS: usize = 8;

/// Key positions a block (a multiple of 8: scores go 8 at a time through
/// `exp`).
const TILE_KEYS: usize = 64;

/// Causal attention of a prompt chunk: tiled where the CPU has AVX2/FMA
/// and the head dim is a multiple of 8 (every model here), else
/// [`causal_attention`].
#[allow(clippy::too_many_arguments)]
pub fn causal_attention_prefill(
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
    #[cfg(target_arch = "x86_64")]
    if n_tok > 1
        && s.head_dim.is_multiple_of(8)
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        // The per-row kernel's checks (shapes, cache long enough) first.
        crate::attention::check_shapes(s, q, k_cache, v_cache, pos0, n_tok, out)?;
        let row = s.n_head * s.head_dim;
        pool.install(|| {
            out.par_chunks_mut(TILE_TOKENS * row)
                .enumerate()
                .for_each_init(Scratch::default, |scratch, (b, o)| {
                    let t0 = b * TILE_TOKENS;
                    let nt = o.len() / row;
                    let task = Task {
                        s,
                        q,
                        k: k_cache,
                        v: v_cache,
                        pos0,
                        t0,
                        nt,
                        scale,
                    };
                    // SAFETY: the CPU supports AVX2 and FMA (checked
                    // above); the shapes and the cache length were checked
                    // by check_shapes, which is what `tile_avx2` indexes by.
                    unsafe { tile_avx2(&task, scratch, o) }
                });
        });
        return Ok(());
    }
    causal_attention(pool, s, q, k_cache, v_cache, pos0, n_tok, scale, out)
}

/// One task's inputs: tokens `t0..t0 + nt` of the chunk.
struct Task<'a> {
    s: &'a AttnShape,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    pos0: usize,
    t0: usize,
    nt: usize,
    scale: f32,
}

/// Per-task buffers, reused across the tasks a thread runs.
#[derive(Default)]
struct Scratch {
    /// Running maximum and sum of each row.
    m: Vec<f32>,
    l: Vec<f32>,
    /// Unnormalised output rows.
    o: Vec<f32>,
    /// The current key block, contiguous: `kt[j * hd + c]` is dimension c
    /// of key j (zero past the block's keys).
    kt: Vec<f32>,
    /// Scores, then probabilities, of the current block: `TILE_KEYS` a row.
    p: Vec<f32>,
    /// Each row's rescale factor for the current block.
    corr: Vec<f32>,
}

/// Rows the output update's micro-kernel takes (its accumulators: 4 rows
/// x 16 dimensions, 8 of the 16 AVX2 registers).
const MICRO_ROWS: usize = 4;

/// Rows the scores' micro-kernel takes: 2 rows x 4 keys of 8-lane sums,
/// 8 registers, with the 4 key vectors and a query vector.
const SCORE_ROWS: usize = 2;

/// Every KV head of one task: rows (token, query head of the group),
/// token-major; the output `o` holds the task's tokens (all heads).
///
/// Per key block the scores go 2 rows x 4 keys at a time over the block's
/// keys copied contiguous (2 rows share every key load), and the output
/// update is a small matrix product, rows x head dim, over the block's
/// value rows (broadcast probabilities times 16 dimensions; 4 rows share
/// every value load).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(t: &Task, sc: &mut Scratch, out: &mut [f32]) {
    use core::arch::x86_64::*;
    let s = t.s;
    let (hd, n_head) = (s.head_dim, s.n_head);
    let group = n_head / s.n_kv_head;
    let stride = s.n_kv_head * hd;
    let rows = t.nt * group;
    // Keys 0 .. the position of the task's last token.
    let n_keys = t.pos0 + t.t0 + t.nt;
    // Query row r: token t0 + r / group, head g * group + r % group; the
    // rows of one token are consecutive heads, so row r of KV head g
    // starts at ((t0 + r / group) * n_head + g * group + r % group) * hd.
    let q_at = |g: usize, r: usize| ((t.t0 + r / group) * n_head + g * group + r % group) * hd;
    sc.kt.clear();
    sc.kt.resize(hd * TILE_KEYS, 0.0);
    sc.p.clear();
    sc.p.resize(rows * TILE_KEYS, 0.0);
    sc.corr.clear();
    sc.corr.resize(rows, 1.0);
    for g in 0..s.n_kv_head {
        sc.m.clear();
        sc.m.resize(rows, f32::NEG_INFINITY);
        sc.l.clear();
        sc.l.resize(rows, 0.0);
        sc.o.clear();
        sc.o.resize(rows * hd, 0.0);
        let kg = &t.k[g * hd..];
        let vg = &t.v[g * hd..];
        for kb in (0..n_keys).step_by(TILE_KEYS) {
            let ke = (kb + TILE_KEYS).min(n_keys);
            let n = ke - kb;
            let n16 = n.next_multiple_of(16);
            // The block's keys, contiguous (zeros past n: their scores are
            // masked below).
            for j in 0..n16 {
                let dst = &mut sc.kt[j * hd..][..hd];
                if j < n {
                    dst.copy_from_slice(&kg[(kb + j) * stride..][..hd]);
                } else {
                    dst.fill(0.0);
                }
            }
            // Scores, SCORE_ROWS rows x 4 keys at a time: each key row is
            // loaded once for the rows, each dot product summed in 8 lanes
            // (dimensions c, c + 8, ...) and then across them, the per-row
            // kernel's order. (One chain of hd FMAs a score, 16 keys to a
            // register pair, lost too much to a few large products:
            // Qwen2's outlier dimensions took the demo model's worst KL to
            // the f64 path from 2.8e-3 to 1.1e-2.)
            let mut r0 = 0;
            while r0 < rows {
                let rr = (rows - r0).min(SCORE_ROWS);
                let mut qp = [0usize; SCORE_ROWS];
                for (i, x) in qp.iter_mut().enumerate() {
                    *x = q_at(g, r0 + i.min(rr - 1));
                }
                for j in (0..n16).step_by(4) {
                    // SAFETY: q rows are whole rows of the checked q (c + 8
                    // <= hd); kt holds hd x TILE_KEYS values and j + 4 <=
                    // n16 <= TILE_KEYS; p holds rows x TILE_KEYS.
                    let mut acc = [[_mm256_setzero_ps(); 4]; SCORE_ROWS];
                    for c in (0..hd).step_by(8) {
                        let mut kv = [_mm256_setzero_ps(); 4];
                        for (u, x) in kv.iter_mut().enumerate() {
                            *x = _mm256_loadu_ps(sc.kt.as_ptr().add((j + u) * hd + c));
                        }
                        for (a, &qr) in acc.iter_mut().zip(&qp) {
                            let qv = _mm256_loadu_ps(t.q.as_ptr().add(qr + c));
                            for (x, k) in a.iter_mut().zip(&kv) {
                                *x = _mm256_fmadd_ps(qv, *k, *x);
                            }
                        }
                    }
                    let sv = _mm_set1_ps(t.scale);
                    for (i, a) in acc.iter().enumerate().take(rr) {
                        let hsum =
                            _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
                        let s4 = _mm_mul_ps(
                            _mm_add_ps(
                                _mm256_castps256_ps128(hsum),
                                _mm256_extractf128_ps::<1>(hsum),
                            ),
                            sv,
                        );
                        _mm_storeu_ps(sc.p.as_mut_ptr().add((r0 + i) * TILE_KEYS + j), s4);
                    }
                }
                r0 += rr;
            }
            // Online softmax, row by row: scores past what the row sees
            // are -inf, a row that sees none of the block keeps its sums
            // (corr 1, probabilities 0).
            for r in 0..rows {
                let n_pos = t.pos0 + t.t0 + r / group + 1;
                let pr = &mut sc.p[r * TILE_KEYS..][..n16];
                if kb >= n_pos {
                    pr.fill(0.0);
                    sc.corr[r] = 1.0;
                    continue;
                }
                let vis = ke.min(n_pos) - kb;
                pr[vis..].fill(f32::NEG_INFINITY);
                let bmax = pr[..vis].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let m_old = sc.m[r];
                let m_new = m_old.max(bmax);
                // m_old = -inf before the row's first block: corr = 0.
                let corr = (m_old - m_new).exp();
                // p = exp(s - m_new) eight at a time (-inf gives 0).
                let mv = _mm256_set1_ps(m_new);
                let mut partv = _mm256_setzero_ps();
                for c in pr.chunks_exact_mut(8) {
                    let e = crate::vexp::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
                    _mm256_storeu_ps(c.as_mut_ptr(), e);
                    partv = _mm256_add_ps(partv, e);
                }
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), partv);
                sc.l[r] = sc.l[r] * corr + lanes.iter().sum::<f32>();
                sc.m[r] = m_new;
                sc.corr[r] = corr;
            }
            // o = o * corr + sum_j p_j v_j: MICRO_ROWS rows x 16
            // dimensions at a time (8 for a last odd group of 8).
            let mut r0 = 0;
            while r0 < rows {
                let rr = (rows - r0).min(MICRO_ROWS);
                let mut d0 = 0;
                while d0 < hd {
                    let two = hd - d0 >= 16;
                    let mut acc = [[_mm256_setzero_ps(); 2]; MICRO_ROWS];
                    for (i, a) in acc.iter_mut().enumerate().take(rr) {
                        // SAFETY: o holds rows x hd; d0 + 8 (+ 8 when
                        // `two`) <= hd.
                        let or = sc.o.as_ptr().add((r0 + i) * hd + d0);
                        let cv = _mm256_set1_ps(sc.corr[r0 + i]);
                        a[0] = _mm256_mul_ps(_mm256_loadu_ps(or), cv);
                        if two {
                            a[1] = _mm256_mul_ps(_mm256_loadu_ps(or.add(8)), cv);
                        }
                    }
                    for j in 0..n {
                        // SAFETY: value row kb + j < n_keys, inside the
                        // checked cache; p holds rows x TILE_KEYS, j < n.
                        let vr = vg.as_ptr().add((kb + j) * stride + d0);
                        let v0 = _mm256_loadu_ps(vr);
                        let v1 = if two { _mm256_loadu_ps(vr.add(8)) } else { v0 };
                        for (i, a) in acc.iter_mut().enumerate().take(rr) {
                            let b =
                                _mm256_broadcast_ss(&*sc.p.as_ptr().add((r0 + i) * TILE_KEYS + j));
                            a[0] = _mm256_fmadd_ps(b, v0, a[0]);
                            a[1] = _mm256_fmadd_ps(b, v1, a[1]);
                        }
                    }
                    for (i, a) in acc.iter().enumerate().take(rr) {
                        let or = sc.o.as_mut_ptr().add((r0 + i) * hd + d0);
                        _mm256_storeu_ps(or, a[0]);
                        if two {
                            _mm256_storeu_ps(or.add(8), a[1]);
                        }
                    }
                    d0 += if two { 16 } else { 8 };
                }
                r0 += rr;
            }
        }
        // Normalise into the output rows of this KV head's query heads.
        for r in 0..rows {
            let inv = 1.0 / sc.l[r];
            let dst = &mut out[q_at(g, r) - t.t0 * n_head * hd..][..hd];
            for (d, &x) in dst.iter_mut().zip(&sc.o[r * hd..][..hd]) {
                *d = x * inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::causal_attention_reference;
    use crate::attention::tests::rand;

    /// Against the f64 reference: the demo model's shape (14 on 2, head
    /// dim 64), a 128-dim one, one head a KV head and a 24-dim one, chunks of 2 to 150
    /// tokens over 0 to 700 cached positions (key blocks cut anywhere,
    /// tasks of fewer than 8 tokens), and planted keys that dominate.
    #[test]
    fn tiled_prefill_matches_the_f64_reference() {
        let pool = Pool::new(2);
        let mut seed = 17;
        let shapes = [
            AttnShape {
                n_head: 14,
                n_kv_head: 2,
                head_dim: 64,
            },
            AttnShape {
                n_head: 8,
                n_kv_head: 2,
                head_dim: 128,
            },
            AttnShape {
                n_head: 2,
                n_kv_head: 2,
                head_dim: 16,
            },
            // A head dim of an odd number of 8s (the output update's last
            // 8-wide group) and 3 rows a token (row groups cut across
            // tokens).
            AttnShape {
                n_head: 6,
                n_kv_head: 2,
                head_dim: 24,
            },
        ];
        for s in shapes {
            // planted: None, or keys scaled up early (the first block holds
            // the maximum) or late (the maximum rises block after block, so
            // the running sums must be rescaled).
            for (pos0, n_tok, planted) in [
                (0, 2, None),
                (0, 37, None),
                (63, 65, None),
                (300, 40, Some(false)),
                (700, 150, Some(true)),
            ] {
                let n_pos = pos0 + n_tok;
                let kv = n_pos * s.n_kv_head * s.head_dim;
                let mut k = rand(kv, &mut seed);
                let v = rand(kv, &mut seed);
                let q = rand(n_tok * s.n_head * s.head_dim, &mut seed);
                if let Some(late) = planted {
                    let at = if late {
                        [n_pos / 3, n_pos / 2, n_pos - 1]
                    } else {
                        [1, 2, 3]
                    };
                    let row = s.n_kv_head * s.head_dim;
                    for p in at {
                        for x in &mut k[p * row..][..row] {
                            *x *= 8.0;
                        }
                    }
                }
                let scale = 1.0 / (s.head_dim as f32).sqrt();
                let mut got = vec![f32::NAN; q.len()];
                let mut want = vec![0f32; q.len()];
                causal_attention_prefill(&pool, &s, &q, &k, &v, pos0, n_tok, scale, &mut got)
                    .unwrap();
                causal_attention_reference(&s, &q, &k, &v, pos0, n_tok, scale, &mut want).unwrap();
                // NaN counts as the worst (f32::max would skip it).
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
                assert!(
                    worst < 2e-6,
                    "{s:?} pos0 {pos0} n_tok {n_tok}: worst {worst}"
                );
            }
        }
    }

    /// Qwen2-style outlier dimensions: a few q and k dims two orders of
    /// magnitude above the rest, so every score is a large sum of terms of
    /// mixed sign and its rounding depends on the summation order. The
    /// per-row kernel's order (8 lanes, then across) keeps the worst error
    /// to the f64 reference at 1.4e-5 here; one running sum over the head
    /// dim (commit 52fbae3, see docs/what-did-not-work.md) reached 5.0e-5,
    /// twice the bound, and failed the demo model's KL gate.
    #[test]
    fn outlier_dimensions_keep_the_summation_order() {
        let pool = Pool::new(2);
        let mut seed = 29;
        let s = AttnShape {
            n_head: 14,
            n_kv_head: 2,
            head_dim: 64,
        };
        let (pos0, n_tok) = (400, 64);
        let n_pos = pos0 + n_tok;
        let mut k = rand(n_pos * s.n_kv_head * s.head_dim, &mut seed);
        let v = rand(n_pos * s.n_kv_head * s.head_dim, &mut seed);
        let mut q = rand(n_tok * s.n_head * s.head_dim, &mut seed);
        let outliers = [3usize, 17, 40, 41];
        for (x, i) in k.iter_mut().zip(0..) {
            if outliers.contains(&(i % s.head_dim)) {
                *x *= OUTLIER_SCALE;
            }
        }
        for (x, i) in q.iter_mut().zip(0..) {
            if outliers.contains(&(i % s.head_dim)) {
                *x *= OUTLIER_SCALE;
            }
        }
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let mut got = vec![f32::NAN; q.len()];
        let mut want = vec![0f32; q.len()];
        causal_attention_prefill(&pool, &s, &q, &k, &v, pos0, n_tok, scale, &mut got).unwrap();
        causal_attention_reference(&s, &q, &k, &v, pos0, n_tok, scale, &mut want).unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
        assert!(worst < 2.5e-5, "worst {worst}");
    }

    const OUTLIER_SCALE: f32 = 30.0;

    /// A cache shorter than the chunk is the per-row kernel's error, not a
    /// wild read.
    #[test]
    fn a_short_cache_is_an_error() {
        let pool = Pool::new(1);
        let s = AttnShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: 8,
        };
        let q = vec![0.5f32; 4 * 16];
        let k = vec![0.5f32; 3 * 8];
        let mut out = vec![0f32; 4 * 16];
        assert!(causal_attention_prefill(&pool, &s, &q, &k, &k, 0, 4, 1.0, &mut out).is_err());
    }
}
