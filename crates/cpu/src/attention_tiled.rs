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
}

/// Every KV head of one task: rows (token, query head of the group),
/// token-major; the output `o` holds the task's tokens (all heads).
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
            for r in 0..rows {
                let tok = t.t0 + r / group;
                let h = g * group + r % group;
                // Row `r` sees positions 0 ..= pos0 + tok.
                let n_pos = t.pos0 + tok + 1;
                if kb >= n_pos {
                    continue;
                }
                let end = ke.min(n_pos);
                let qr = &t.q[(tok * n_head + h) * hd..][..hd];
                // Scores of keys kb..end, four at a time (one combined
                // horizontal sum), -inf past `end`.
                let mut scores = [f32::NEG_INFINITY; TILE_KEYS];
                let mut j = kb;
                while j < end {
                    let m4 = (end - j).min(4);
                    let mut acc = [_mm256_setzero_ps(); 4];
                    for c in (0..hd).step_by(8) {
                        // SAFETY: `c + 8 <= hd`; key rows j..j+m4 are below
                        // n_keys <= pos0 + n_tok, inside the checked cache
                        // (rows past m4 re-read the last one).
                        let qv = _mm256_loadu_ps(qr.as_ptr().add(c));
                        for (u, a) in acc.iter_mut().enumerate() {
                            let p = j + u.min(m4 - 1);
                            *a = _mm256_fmadd_ps(
                                qv,
                                _mm256_loadu_ps(kg.as_ptr().add(p * stride + c)),
                                *a,
                            );
                        }
                    }
                    let hsum = _mm256_hadd_ps(
                        _mm256_hadd_ps(acc[0], acc[1]),
                        _mm256_hadd_ps(acc[2], acc[3]),
                    );
                    let s4 = _mm_mul_ps(
                        _mm_add_ps(
                            _mm256_castps256_ps128(hsum),
                            _mm256_extractf128_ps::<1>(hsum),
                        ),
                        _mm_set1_ps(t.scale),
                    );
                    let mut four = [0f32; 4];
                    _mm_storeu_ps(four.as_mut_ptr(), s4);
                    scores[j - kb..j - kb + m4].copy_from_slice(&four[..m4]);
                    j += m4;
                }
                let n = end - kb;
                let bmax = scores[..n]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                let m_old = sc.m[r];
                let m_new = m_old.max(bmax);
                // m_old = -inf before the row's first block: corr = 0.
                let corr = (m_old - m_new).exp();
                // p = exp(s - m_new) eight at a time (-inf gives 0).
                let mv = _mm256_set1_ps(m_new);
                let mut partv = _mm256_setzero_ps();
                for c in scores[..n.next_multiple_of(8)].chunks_exact_mut(8) {
                    let e = crate::vexp::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
                    _mm256_storeu_ps(c.as_mut_ptr(), e);
                    partv = _mm256_add_ps(partv, e);
                }
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), partv);
                sc.l[r] = sc.l[r] * corr + lanes.iter().sum::<f32>();
                sc.m[r] = m_new;
                // o = o * corr + sum_j p_j v_j, 64 dims (8 registers) at
                // a time.
                let orow = &mut sc.o[r * hd..][..hd];
                let cv = _mm256_set1_ps(corr);
                let mut c0 = 0;
                while c0 < hd {
                    let w = (hd - c0).min(64) / 8;
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for (i, a) in acc.iter_mut().enumerate().take(w) {
                        *a = _mm256_mul_ps(_mm256_loadu_ps(orow.as_ptr().add(c0 + 8 * i)), cv);
                    }
                    for (jj, &p) in scores[..n].iter().enumerate() {
                        let pv = _mm256_set1_ps(p);
                        let vrow = vg.as_ptr().add((kb + jj) * stride + c0);
                        for (i, a) in acc.iter_mut().enumerate().take(w) {
                            // SAFETY: value row kb + jj < n_keys, inside
                            // the checked cache; c0 + 8i + 8 <= hd.
                            *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vrow.add(8 * i)), *a);
                        }
                    }
                    for (i, a) in acc.iter().enumerate().take(w) {
                        _mm256_storeu_ps(orow.as_mut_ptr().add(c0 + 8 * i), *a);
                    }
                    c0 += 8 * w;
                }
            }
        }
        // Normalise into the output rows of this KV head's query heads.
        for r in 0..rows {
            let (tok, h) = (r / group, g * group + r % group);
            let inv = 1.0 / sc.l[r];
            let dst = &mut out[(tok * n_head + h) * hd..][..hd];
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
    /// dim 64), a 128-dim one and one head a KV head, chunks of 2 to 150
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
