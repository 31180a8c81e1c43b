//! A host model of the chunkwise (WY) Gated DeltaNet prefill kernels
//! (`kernels/deltanet_wy.cu`: `gdn_wy_prep`, `gdn_wy_state`), step for
//! step in f32 with the kernels' summation orders, checked against the
//! token-by-token recurrence in f64. The algebra is tested here without a
//! GPU; `redlite selftest` tests the kernels themselves.
//!
//! For a sub-chunk of C tokens starting from state S (dk x dv), with
//! G_t = g_1 + .. + g_t (the log decays summed inside the sub-chunk) and
//! gamma_t = e^{G_t}, the token-by-token rule
//!     S_t = e^{g_t} S_{t-1} + k_t d_t^T,  d_t = b_t (v_t - e^{g_t} S_{t-1}^T k_t)
//! unrolls to a lower-triangular system for the rows d_t:
//!     d_t + b_t sum_{s<t} e^{G_t - G_s} (k_t . k_s) d_s = b_t v_t - b_t gamma_t S^T k_t,
//! so with A_ts = b_t e^{G_t - G_s} k_t . k_s (s < t) and T = (I + A)^-1:
//!     D = U - W S,  U = T (b v),  W = T (b gamma k)
//!     O = diag(gamma) Q S + P D,  P_ts = e^{G_t - G_s} q_t . k_s (s <= t)
//!     S' = gamma_C S + (diag(e^{G_C - G}) K)^T D.
//! `gdn_wy_prep` computes W, U, P (and Q, K scaled) for every sub-chunk
//! at once; `gdn_wy_state` runs the three products sub-chunk after
//! sub-chunk, the state the only thing carried.

/// Tokens a sub-chunk (`GDN_SUB` in the kernels).
pub const SUB: usize = 64;

/// One value head's inputs over `n` tokens: k and q L2-normed (q also
/// scaled by 1/sqrt(dk)), rows of dk; v rows of dv; the write strength b
/// (after the sigmoid) and the log decay g of every token.
pub struct HeadInputs<'a> {
    pub dk: usize,
    pub dv: usize,
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub v: &'a [f32],
    pub beta: &'a [f32],
    pub g: &'a [f32],
}

/// `gdn_wy_prep`'s outputs for one (head, sub-chunk), in its layouts:
/// `wt` W transposed (dk x C), `u` (C x dv), `pt` P transposed (C x C),
/// `qt` gamma-scaled Q transposed (dk x C), `ks` K scaled by
/// e^{G_C - G_t} (C x dk), `big_g` G.
pub struct Prepared {
    pub wt: Vec<f32>,
    pub u: Vec<f32>,
    pub pt: Vec<f32>,
    pub qt: Vec<f32>,
    pub ks: Vec<f32>,
    pub big_g: Vec<f32>,
}

/// The model of `gdn_wy_prep` for sub-chunk `c` (tokens past `n` padded
/// with b = g = 0 and zero vectors, which leave the state unchanged).
pub fn prep(x: &HeadInputs, n: usize, c: usize) -> Prepared {
    let (dk, dv) = (x.dk, x.dv);
    let tok = |t: usize| (c * SUB + t < n).then_some(c * SUB + t);
    let mut big_g = vec![0f32; SUB];
    let mut beta = vec![0f32; SUB];
    let mut acc = 0f32;
    for t in 0..SUB {
        if let Some(i) = tok(t) {
            acc += x.g[i];
            beta[t] = x.beta[i];
        }
        big_g[t] = acc;
    }
    let g_last = big_g[SUB - 1];
    let row = |m: &[f32], w: usize, t: usize| -> Vec<f32> {
        tok(t).map_or(vec![0f32; w], |i| m[i * w..][..w].to_vec())
    };
    let (kr, qr, vr): (Vec<_>, Vec<_>, Vec<_>) = (
        (0..SUB).map(|t| row(x.k, dk, t)).collect(),
        (0..SUB).map(|t| row(x.q, dk, t)).collect(),
        (0..SUB).map(|t| row(x.v, dv, t)).collect(),
    );
    // The dot products in slabs of 32 dimensions, each slab's sum added
    // to the running one in dimension order (the kernel's fmaf chain).
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |s, (p, q)| p.mul_add(*q, s));
    let mut a = vec![0f32; SUB * SUB];
    let mut pt = vec![0f32; SUB * SUB];
    for i in 0..SUB {
        for j in 0..SUB {
            let decay = (big_g[i] - big_g[j]).exp();
            if j < i {
                a[i * SUB + j] = beta[i] * decay * dot(&kr[i], &kr[j]);
            }
            if j <= i {
                pt[j * SUB + i] = decay * dot(&qr[i], &kr[j]);
            }
        }
    }
    // Forward substitution, one column of W | U a thread: x_t = rhs_t -
    // sum_{s<t} A_ts x_s, in s order.
    let solve = |rhs: &dyn Fn(usize) -> f32| -> Vec<f32> {
        let mut xs = vec![0f32; SUB];
        for t in 0..SUB {
            let mut s_acc = rhs(t);
            for s in 0..t {
                s_acc = (-a[t * SUB + s]).mul_add(xs[s], s_acc);
            }
            xs[t] = s_acc;
        }
        xs
    };
    let mut wt = vec![0f32; dk * SUB];
    let mut u = vec![0f32; SUB * dv];
    for e in 0..dk {
        let col = solve(&|t| beta[t] * big_g[t].exp() * kr[t][e]);
        wt[e * SUB..][..SUB].copy_from_slice(&col);
    }
    for j in 0..dv {
        let col = solve(&|t| beta[t] * vr[t][j]);
        for t in 0..SUB {
            u[t * dv + j] = col[t];
        }
    }
    let mut qt = vec![0f32; dk * SUB];
    let mut ks = vec![0f32; SUB * dk];
    for t in 0..SUB {
        let (gq, gk) = (big_g[t].exp(), (g_last - big_g[t]).exp());
        for e in 0..dk {
            qt[e * SUB + t] = gq * qr[t][e];
            ks[t * dk + e] = gk * kr[t][e];
        }
    }
    Prepared {
        wt,
        u,
        pt,
        qt,
        ks,
        big_g,
    }
}

/// The model of `gdn_wy_state` for one head: the sub-chunks in order
/// from `state` (dk x dv, updated); returns the n x dv outputs.
pub fn state_pass(x: &HeadInputs, n: usize, state: &mut [f32]) -> Vec<f32> {
    let (dk, dv) = (x.dk, x.dv);
    let mut out = vec![0f32; n * dv];
    for c in 0..n.div_ceil(SUB) {
        let p = prep(x, n, c);
        // D = U - W S.
        let mut d = vec![0f32; SUB * dv];
        for t in 0..SUB {
            for j in 0..dv {
                let ws = (0..dk).fold(0f32, |s, e| p.wt[e * SUB + t].mul_add(state[e * dv + j], s));
                d[t * dv + j] = p.u[t * dv + j] - ws;
            }
        }
        // O = gamma Q S + P D (gamma folded into qt).
        for t in 0..SUB {
            let Some(i) = (c * SUB + t < n).then_some(c * SUB + t) else {
                continue;
            };
            for j in 0..dv {
                let qs = (0..dk).fold(0f32, |s, e| p.qt[e * SUB + t].mul_add(state[e * dv + j], s));
                let pd = (0..SUB).fold(qs, |s, r| p.pt[r * SUB + t].mul_add(d[r * dv + j], s));
                out[i * dv + j] = pd;
            }
        }
        // S' = gamma_C S + Ks^T D.
        let gc = p.big_g[SUB - 1].exp();
        for e in 0..dk {
            for j in 0..dv {
                let kd = (0..SUB).fold(0f32, |s, t| p.ks[t * dk + e].mul_add(d[t * dv + j], s));
                state[e * dv + j] = state[e * dv + j].mul_add(gc, kd);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::Rng;

    /// The token-by-token rule in f64 (the decode step's order:
    /// S <- e^g S; u = S^T k; d = b (v - u); S <- S + k d^T; o = S^T q).
    fn sequential(x: &HeadInputs, n: usize, state: &mut [f64]) -> Vec<f64> {
        let (dk, dv) = (x.dk, x.dv);
        let mut out = vec![0f64; n * dv];
        for t in 0..n {
            let (k, q) = (&x.k[t * dk..][..dk], &x.q[t * dk..][..dk]);
            let decay = (x.g[t] as f64).exp();
            state.iter_mut().for_each(|s| *s *= decay);
            for j in 0..dv {
                let u: f64 = (0..dk).map(|e| state[e * dv + j] * k[e] as f64).sum();
                let d = x.beta[t] as f64 * (x.v[t * dv + j] as f64 - u);
                for e in 0..dk {
                    state[e * dv + j] += k[e] as f64 * d;
                }
                out[t * dv + j] = (0..dk).map(|e| state[e * dv + j] * q[e] as f64).sum();
            }
        }
        out
    }

    fn unit_rows(rows: usize, w: usize, scale: f32, rng: &mut Rng) -> Vec<f32> {
        let mut m: Vec<f32> = (0..rows * w).map(|_| rng.uniform()).collect();
        for r in m.chunks_exact_mut(w) {
            let s = scale / r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v *= s);
        }
        m
    }

    /// Worst |model - f64| over max|f64| of the outputs and of the state.
    fn worst(n: usize, dk: usize, dv: usize, g_range: (f32, f32), seed: u64) -> (f64, f64) {
        let mut rng = Rng(seed);
        let k = unit_rows(n, dk, 1.0, &mut rng);
        let q = unit_rows(n, dk, 1.0 / (dk as f32).sqrt(), &mut rng);
        let v: Vec<f32> = (0..n * dv).map(|_| rng.uniform()).collect();
        let beta: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * rng.uniform()).collect();
        let (lo, hi) = g_range;
        let g: Vec<f32> = (0..n)
            .map(|_| lo + (hi - lo) * 0.5 * (rng.uniform() + 1.0))
            .collect();
        let s0: Vec<f32> = (0..dk * dv).map(|_| 0.5 * rng.uniform()).collect();
        let x = HeadInputs {
            dk,
            dv,
            k: &k,
            q: &q,
            v: &v,
            beta: &beta,
            g: &g,
        };
        let mut st = s0.clone();
        let got = state_pass(&x, n, &mut st);
        let mut st64: Vec<f64> = s0.iter().map(|&v| v as f64).collect();
        let want = sequential(&x, n, &mut st64);
        let rel = |a: &[f32], b: &[f64]| {
            let m = b.iter().fold(0f64, |m, v| m.max(v.abs()));
            let e = a
                .iter()
                .zip(b)
                .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()));
            e / m.max(1e-30)
        };
        (rel(&got, &want), rel(&st, &st64))
    }

    #[test]
    fn chunkwise_form_matches_the_token_by_token_rule() {
        // Whole, partial and several sub-chunks; the models' head sizes
        // and the fixtures'; decays from near 1 to e^-3 a token.
        for (i, &(n, dk, dv)) in [
            (1, 32, 32),
            (5, 64, 64),
            (64, 128, 128),
            (65, 64, 32),
            (200, 128, 128),
            (130, 32, 64),
        ]
        .iter()
        .enumerate()
        {
            for (r, g) in [(-0.05, 0.0), (-3.0, -0.5)].into_iter().enumerate() {
                let (o, s) = worst(n, dk, dv, g, 7 + 2 * i as u64 + r as u64);
                assert!(
                    o < 2e-5 && s < 2e-5,
                    "n {n} dk {dk} dv {dv} g {g:?}: outputs {o:.2e}, state {s:.2e}"
                );
            }
        }
    }
}
