//! The Gated DeltaNet scan: the step-by-step recurrence and the chunked
//! (WY / UT) form used for prompts, which must agree with it.
//!
//! Layouts: `q`, `k` are `T × n_k_heads × dk` (already L2-normalised, `q`
//! already scaled by 1/√dk); `v` is `T × n_v_heads × dv`; `g` (log decay)
//! and `beta` are `T × n_v_heads`; the state is `n_v_heads × dk × dv`
//! (`S[i][j]`, key index `i`, value index `j`); the output is
//! `T × n_v_heads × dv`. Value head `h` reads key head
//! `h / (n_v_heads / n_k_heads)`.
//!
//! Per token and value head: `S ← e^g·S; u = Sᵀk; δ = β(v − u);
//! S ← S + k δᵀ; o = Sᵀq`.

use crate::{CpuError, Pool};
use rayon::prelude::*;

/// Head counts and sizes of one DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnShape {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnShape {
    /// f32 values of the recurrent state of one layer.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.dk * self.dv
    }
}

/// The inputs of one scan over `t` tokens.
#[derive(Clone, Copy, Debug)]
pub struct GdnInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

fn check(s: &GdnShape, x: &GdnInputs, state: &[f32], out: &[f32]) -> Result<usize, CpuError> {
    let bad = |what, expected, found| {
        Err(CpuError::Shape {
            what,
            expected,
            found,
        })
    };
    if s.n_k_heads == 0 || !s.n_v_heads.is_multiple_of(s.n_k_heads) {
        return bad("value heads per key head", s.n_k_heads, s.n_v_heads);
    }
    let t = x.g.len() / s.n_v_heads.max(1);
    let checks = [
        ("deltanet g", t * s.n_v_heads, x.g.len()),
        ("deltanet beta", t * s.n_v_heads, x.beta.len()),
        ("deltanet q", t * s.n_k_heads * s.dk, x.q.len()),
        ("deltanet k", t * s.n_k_heads * s.dk, x.k.len()),
        ("deltanet v", t * s.n_v_heads * s.dv, x.v.len()),
        ("deltanet output", t * s.n_v_heads * s.dv, out.len()),
        ("deltanet state", s.state_len(), state.len()),
    ];
    for (what, e, f) in checks {
        if e != f {
            return bad(what, e, f);
        }
    }
    Ok(t)
}

/// Per-head views: gather one head's rows for all tokens.
struct HeadData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn gather(s: &GdnShape, x: &GdnInputs, t: usize, h: usize) -> HeadData {
    let kh = h / (s.n_v_heads / s.n_k_heads);
    let mut d = HeadData {
        q: Vec::with_capacity(t * s.dk),
        k: Vec::with_capacity(t * s.dk),
        v: Vec::with_capacity(t * s.dv),
        g: Vec::with_capacity(t),
        beta: Vec::with_capacity(t),
    };
    for i in 0..t {
        let ko = (i * s.n_k_heads + kh) * s.dk;
        d.q.extend_from_slice(&x.q[ko..ko + s.dk]);
        d.k.extend_from_slice(&x.k[ko..ko + s.dk]);
        let vo = (i * s.n_v_heads + h) * s.dv;
        d.v.extend_from_slice(&x.v[vo..vo + s.dv]);
        d.g.push(x.g[i * s.n_v_heads + h]);
        d.beta.push(x.beta[i * s.n_v_heads + h]);
    }
    d
}

fn scatter(s: &GdnShape, t: usize, outs: Vec<Vec<f32>>, out: &mut [f32]) {
    for (h, o) in outs.into_iter().enumerate() {
        for i in 0..t {
            out[(i * s.n_v_heads + h) * s.dv..][..s.dv]
                .copy_from_slice(&o[i * s.dv..(i + 1) * s.dv]);
        }
    }
}

/// One recurrence step of one head: `st` is `dk × dv`, `o` gets `dv` values.
#[allow(clippy::too_many_arguments)]
fn step_head(
    st: &mut [f32],
    dk: usize,
    dv: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
    u: &mut [f32],
) {
    let decay = g.exp();
    st.iter_mut().for_each(|x| *x *= decay);
    u.iter_mut().for_each(|x| *x = 0.0);
    for i in 0..dk {
        let ki = k[i];
        for (uj, &s) in u.iter_mut().zip(&st[i * dv..(i + 1) * dv]) {
            *uj += s * ki;
        }
    }
    for j in 0..dv {
        u[j] = beta * (v[j] - u[j]); // δ
    }
    o.iter_mut().for_each(|x| *x = 0.0);
    for i in 0..dk {
        let row = &mut st[i * dv..(i + 1) * dv];
        let (ki, qi) = (k[i], q[i]);
        for ((s, &d), oj) in row.iter_mut().zip(u.iter()).zip(o.iter_mut()) {
            *s += ki * d;
            *oj += *s * qi;
        }
    }
}

/// The recurrence, token by token (threaded over value heads).
pub fn gdn_recurrent(
    pool: &Pool,
    s: &GdnShape,
    x: &GdnInputs,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), CpuError> {
    let t = check(s, x, state, out)?;
    let (dk, dv) = (s.dk, s.dv);
    let outs: Vec<Vec<f32>> = pool.install(|| {
        state
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, st)| {
                let d = gather(s, x, t, h);
                let mut o = vec![0f32; t * dv];
                let mut u = vec![0f32; dv];
                for i in 0..t {
                    step_head(
                        st,
                        dk,
                        dv,
                        &d.q[i * dk..(i + 1) * dk],
                        &d.k[i * dk..(i + 1) * dk],
                        &d.v[i * dv..(i + 1) * dv],
                        d.g[i],
                        d.beta[i],
                        &mut o[i * dv..(i + 1) * dv],
                        &mut u,
                    );
                }
                o
            })
            .collect()
    });
    scatter(s, t, outs, out);
    Ok(())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    crate::matmul::dot_f32(a, b)
}

/// `acc += a · row` over a `dv`-wide row.
fn axpy(acc: &mut [f32], a: f32, row: &[f32]) {
    for (x, &y) in acc.iter_mut().zip(row) {
        *x += a * y;
    }
}

/// One chunk of `l` tokens of one head, starting at token `c0`.
fn chunk_head(
    st: &mut [f32],
    dk: usize,
    dv: usize,
    d: &HeadData,
    c0: usize,
    l: usize,
    o: &mut [f32],
) {
    let q = |i: usize| &d.q[(c0 + i) * dk..(c0 + i + 1) * dk];
    let k = |i: usize| &d.k[(c0 + i) * dk..(c0 + i + 1) * dk];
    let v = |i: usize| &d.v[(c0 + i) * dv..(c0 + i + 1) * dv];
    let beta = |i: usize| d.beta[c0 + i];
    // Cumulative log decay inside the chunk.
    let gc: Vec<f32> = d.g[c0..c0 + l]
        .iter()
        .scan(0f32, |acc, &g| {
            *acc += g;
            Some(*acc)
        })
        .collect();
    // A[i][j] = -β_i (k_i·k_j) e^{gc_i - gc_j} for j < i, then the
    // forward substitution that turns (I - A)⁻¹ into T = A' + I.
    let mut a = vec![0f32; l * l];
    for i in 0..l {
        for j in 0..i {
            a[i * l + j] = -beta(i) * dot(k(i), k(j)) * (gc[i] - gc[j]).exp();
        }
    }
    let mut row = vec![0f32; l];
    for i in 1..l {
        row[..i].copy_from_slice(&a[i * l..i * l + i]);
        for j in 0..i {
            let mut s = row[j];
            for m in j + 1..i {
                s += row[m] * a[m * l + j];
            }
            a[i * l + j] = s;
        }
    }
    for i in 0..l {
        a[i * l + i] = 1.0;
    }
    // U = T (β v), W = T (β k e^{gc}).
    let mut u = vec![0f32; l * dv];
    let mut w = vec![0f32; l * dk];
    for i in 0..l {
        for j in 0..=i {
            let tij = a[i * l + j];
            if tij == 0.0 {
                continue;
            }
            axpy(&mut u[i * dv..(i + 1) * dv], tij * beta(j), v(j));
            axpy(
                &mut w[i * dk..(i + 1) * dk],
                tij * beta(j) * gc[j].exp(),
                k(j),
            );
        }
    }
    // v_new = U - W S; inter = (q e^{gc}) S.
    let mut vnew = u;
    for i in 0..l {
        let (wi, vi) = (&w[i * dk..(i + 1) * dk], &mut vnew[i * dv..(i + 1) * dv]);
        for r in 0..dk {
            axpy(vi, -wi[r], &st[r * dv..(r + 1) * dv]);
        }
        let oi = &mut o[i * dv..(i + 1) * dv];
        oi.iter_mut().for_each(|x| *x = 0.0);
        let eg = gc[i].exp();
        let qi = q(i);
        for r in 0..dk {
            axpy(oi, qi[r] * eg, &st[r * dv..(r + 1) * dv]);
        }
    }
    // Intra-chunk: o_i += Σ_{j≤i} (q_i·k_j) e^{gc_i - gc_j} v_new_j.
    for i in 0..l {
        for j in 0..=i {
            let c = dot(q(i), k(j)) * (gc[i] - gc[j]).exp();
            let (vj, oi) = (j * dv, i * dv);
            for x in 0..dv {
                o[oi + x] += c * vnew[vj + x];
            }
        }
    }
    // S ← e^{gc_last} S + Σ_j (k_j e^{gc_last - gc_j}) ⊗ v_new_j.
    let last = gc[l - 1];
    let el = last.exp();
    st.iter_mut().for_each(|x| *x *= el);
    for j in 0..l {
        let f = (last - gc[j]).exp();
        let kj = k(j);
        for r in 0..dk {
            axpy(
                &mut st[r * dv..(r + 1) * dv],
                kj[r] * f,
                &vnew[j * dv..(j + 1) * dv],
            );
        }
    }
}

/// The chunked form over chunks of `chunk` tokens (threaded over value heads).
pub fn gdn_chunked(
    pool: &Pool,
    s: &GdnShape,
    x: &GdnInputs,
    state: &mut [f32],
    out: &mut [f32],
    chunk: usize,
) -> Result<(), CpuError> {
    let t = check(s, x, state, out)?;
    let (dk, dv, chunk) = (s.dk, s.dv, chunk.max(1));
    let outs: Vec<Vec<f32>> = pool.install(|| {
        state
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, st)| {
                let d = gather(s, x, t, h);
                let mut o = vec![0f32; t * dv];
                let mut c0 = 0;
                while c0 < t {
                    let l = chunk.min(t - c0);
                    chunk_head(st, dk, dv, &d, c0, l, &mut o[c0 * dv..(c0 + l) * dv]);
                    c0 += l;
                }
                o
            })
            .collect()
    });
    scatter(s, t, outs, out);
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

    fn l2(x: &mut [f32], d: usize) {
        crate::ops::l2_norm(x, d, 1e-6);
    }

    /// The recurrence written out in f64, one head at a time.
    fn naive_f64(s: &GdnShape, x: &GdnInputs, state: &mut [f64], t: usize) -> Vec<f64> {
        let mut out = vec![0f64; t * s.n_v_heads * s.dv];
        let rep = s.n_v_heads / s.n_k_heads;
        for i in 0..t {
            for h in 0..s.n_v_heads {
                let kh = h / rep;
                let st = &mut state[h * s.dk * s.dv..(h + 1) * s.dk * s.dv];
                let g = (x.g[i * s.n_v_heads + h] as f64).exp();
                let b = x.beta[i * s.n_v_heads + h] as f64;
                let k = &x.k[(i * s.n_k_heads + kh) * s.dk..][..s.dk];
                let q = &x.q[(i * s.n_k_heads + kh) * s.dk..][..s.dk];
                let v = &x.v[(i * s.n_v_heads + h) * s.dv..][..s.dv];
                st.iter_mut().for_each(|e| *e *= g);
                for j in 0..s.dv {
                    let u: f64 = (0..s.dk).map(|r| st[r * s.dv + j] * k[r] as f64).sum();
                    let delta = b * (v[j] as f64 - u);
                    for r in 0..s.dk {
                        st[r * s.dv + j] += k[r] as f64 * delta;
                    }
                }
                for j in 0..s.dv {
                    out[(i * s.n_v_heads + h) * s.dv + j] =
                        (0..s.dk).map(|r| st[r * s.dv + j] * q[r] as f64).sum();
                }
            }
        }
        out
    }

    type Inputs5 = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    fn inputs(s: &GdnShape, t: usize, seed: &mut u64) -> Inputs5 {
        let mut q = rand(t * s.n_k_heads * s.dk, seed);
        let mut k = rand(t * s.n_k_heads * s.dk, seed);
        l2(&mut q, s.dk);
        l2(&mut k, s.dk);
        let sc = 1.0 / (s.dk as f32).sqrt();
        q.iter_mut().for_each(|x| *x *= sc);
        let v = rand(t * s.n_v_heads * s.dv, seed);
        // g in [-2, 0): strong decays as real layers have; β in (0, 1).
        let g: Vec<f32> = rand(t * s.n_v_heads, seed)
            .iter()
            .map(|x| -(x + 1.0))
            .collect();
        let beta: Vec<f32> = rand(t * s.n_v_heads, seed)
            .iter()
            .map(|x| crate::ops::sigmoid(2.0 * x))
            .collect();
        (q, k, v, g, beta)
    }

    #[test]
    fn recurrent_matches_f64_and_chunked_matches_recurrent() {
        let s = GdnShape {
            n_k_heads: 2,
            n_v_heads: 4,
            dk: 16,
            dv: 8,
        };
        let pool = Pool::new(2);
        let mut seed = 11;
        for &(t, chunk) in &[(1usize, 64usize), (5, 64), (64, 64), (150, 64), (37, 8)] {
            let (q, k, v, g, beta) = inputs(&s, t, &mut seed);
            let x = GdnInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            let init = rand(s.state_len(), &mut seed);
            let mut st_r = init.clone();
            let mut out_r = vec![0f32; t * s.n_v_heads * s.dv];
            gdn_recurrent(&pool, &s, &x, &mut st_r, &mut out_r).unwrap();
            let mut st64: Vec<f64> = init.iter().map(|&x| x as f64).collect();
            let exact = naive_f64(&s, &x, &mut st64, t);
            let worst = out_r
                .iter()
                .zip(&exact)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0.0, |w, d| if d.is_nan() || d > w { d } else { w });
            assert!(worst < 1e-5, "recurrent vs f64 t={t}: {worst}");
            let mut st_c = init.clone();
            let mut out_c = vec![0f32; out_r.len()];
            gdn_chunked(&pool, &s, &x, &mut st_c, &mut out_c, chunk).unwrap();
            let worst = out_c
                .iter()
                .zip(&exact)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0.0, |w, d| if d.is_nan() || d > w { d } else { w });
            assert!(worst < 1e-4, "chunked vs f64 t={t} chunk={chunk}: {worst}");
            let worst_s = st_c
                .iter()
                .zip(&st64)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0.0, |w, d| if d.is_nan() || d > w { d } else { w });
            assert!(worst_s < 1e-4, "chunked state t={t}: {worst_s}");
        }
    }

    #[test]
    fn split_scan_continues_state() {
        let s = GdnShape {
            n_k_heads: 1,
            n_v_heads: 2,
            dk: 8,
            dv: 8,
        };
        let pool = Pool::new(1);
        let mut seed = 5;
        let t = 20;
        let (q, k, v, g, beta) = inputs(&s, t, &mut seed);
        let x = GdnInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let mut st_all = vec![0f32; s.state_len()];
        let mut out_all = vec![0f32; t * 16];
        gdn_chunked(&pool, &s, &x, &mut st_all, &mut out_all, 64).unwrap();
        // First 12 tokens chunked, the rest step by step.
        let mut st = vec![0f32; s.state_len()];
        let mut out = vec![0f32; t * 16];
        let part = |a: usize, b: usize| GdnInputs {
            q: &q[a * 8..b * 8],
            k: &k[a * 8..b * 8],
            v: &v[a * 16..b * 16],
            g: &g[a * 2..b * 2],
            beta: &beta[a * 2..b * 2],
        };
        gdn_chunked(&pool, &s, &part(0, 12), &mut st, &mut out[..12 * 16], 64).unwrap();
        gdn_recurrent(&pool, &s, &part(12, 20), &mut st, &mut out[12 * 16..]).unwrap();
        let worst = out
            .iter()
            .zip(&out_all)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
        assert!(worst < 1e-5, "{worst}");
    }

    #[test]
    fn bad_shapes_are_errors() {
        let s = GdnShape {
            n_k_heads: 2,
            n_v_heads: 3,
            dk: 2,
            dv: 2,
        };
        let x = GdnInputs {
            q: &[],
            k: &[],
            v: &[],
            g: &[],
            beta: &[],
        };
        assert!(gdn_recurrent(&Pool::new(1), &s, &x, &mut [], &mut []).is_err());
    }
}
