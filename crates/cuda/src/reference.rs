//! Float64 references of the decode kernels in [`crate::ops`], written
//! from the equations (design notes, `crates/cpu`), not from the kernels:
//! the selftest compares each kernel with these. Inputs are f32 (what the
//! device sees), every intermediate is f64.

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// RMSNorm of rows of `d`: returns (x + res, normed).
pub fn rms_norm(
    x: &[f32],
    res: Option<&[f32]>,
    w: &[f32],
    d: usize,
    eps: f32,
    add_one: bool,
) -> (Vec<f64>, Vec<f64>) {
    let xs: Vec<f64> = match res {
        Some(r) => x
            .iter()
            .zip(r)
            .map(|(&a, &b)| a as f64 + b as f64)
            .collect(),
        None => x.iter().map(|&a| a as f64).collect(),
    };
    let mut out = vec![0f64; xs.len()];
    for (row, o) in xs.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        for j in 0..d {
            let wj = if add_one {
                1.0 + w[j] as f64
            } else {
                w[j] as f64
            };
            o[j] = row[j] * s * wj;
        }
    }
    (xs, out)
}

/// Per-head RMSNorm (optional weights) then NeoX RoPE over the first
/// `n_rot` dims of every `hd`-wide head of `x` at position `pos`.
pub fn norm_rope(
    x: &[f32],
    w: Option<&[f32]>,
    hd: usize,
    n_rot: usize,
    base: f64,
    pos: usize,
    eps: f32,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    let half = n_rot / 2;
    for head in x.chunks_exact(hd) {
        let h: Vec<f64> = match w {
            Some(w) => {
                let ms = head.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / hd as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                head.iter()
                    .zip(w)
                    .map(|(&v, &g)| v as f64 * s * g as f64)
                    .collect()
            }
            None => head.iter().map(|&v| v as f64).collect(),
        };
        let mut r = h.clone();
        for j in 0..half {
            let th = pos as f64 * base.powf(-(2.0 * j as f64) / n_rot as f64);
            let (c, s) = (th.cos(), th.sin());
            r[j] = h[j] * c - h[j + half] * s;
            r[j + half] = h[j + half] * c + h[j] * s;
        }
        out.extend(r);
    }
    out
}

/// Decode attention of one query (`n_head x hd`) over `n` positions of the
/// caches (`[pos][n_kv][hd]`), GQA (head h reads KV head h / (n_head /
/// n_kv)); `gate` (per head hd values): out *= sigmoid(gate).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
    scale: f32,
    gate: Option<&[f32]>,
) -> Vec<f64> {
    let group = n_head / n_kv;
    let mut out = vec![0f64; n_head * hd];
    let mut sc = vec![0f64; n];
    for h in 0..n_head {
        let kvh = h / group;
        let qh = &q[h * hd..][..hd];
        for (p, s) in sc.iter_mut().enumerate() {
            let kr = &k[(p * n_kv + kvh) * hd..][..hd];
            *s = qh
                .iter()
                .zip(kr)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale as f64;
        }
        let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut sum = 0f64;
        for s in sc.iter_mut() {
            *s = (*s - mx).exp();
            sum += *s;
        }
        let o = &mut out[h * hd..][..hd];
        for (p, &e) in sc.iter().enumerate() {
            let vr = &v[(p * n_kv + kvh) * hd..][..hd];
            for (x, &y) in o.iter_mut().zip(vr) {
                *x += e / sum * y as f64;
            }
        }
        if let Some(g) = gate {
            for (j, x) in o.iter_mut().enumerate() {
                *x *= sigmoid(g[h * hd + j] as f64);
            }
        }
    }
    out
}

/// Shapes of one DeltaNet step.
#[derive(Clone, Copy, Debug)]
pub struct GdnShape {
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv_kernel: usize,
}

/// The inputs of one DeltaNet step (f32 as the device gets them).
pub struct GdnStepInputs<'a> {
    pub qkv: &'a [f32],
    pub z: &'a [f32],
    pub ba: &'a [f32],
    /// `conv_dim x K`.
    pub conv_w: &'a [f32],
    pub dt_bias: &'a [f32],
    pub ssm_a: &'a [f32],
    pub norm_w: &'a [f32],
}

/// One Gated DeltaNet step. `window`: the last `K-1` conv inputs, oldest
/// first (`(K-1) x conv_dim`), updated; `state` (`n_v x dk x dv`) updated.
/// Returns the gated-normed output (`n_v x dv`).
pub fn gdn_step(
    s: &GdnShape,
    x: &GdnStepInputs,
    window: &mut [f64],
    state: &mut [f64],
    eps: f32,
    l2_eps: f32,
) -> Vec<f64> {
    let (kd, k) = (s.n_k * s.dk, s.conv_kernel);
    let cd = 2 * kd + s.n_v * s.dv;
    let mut conv = vec![0f64; cd];
    for (c, o) in conv.iter_mut().enumerate() {
        let mut acc = 0f64;
        for j in 0..k - 1 {
            acc += x.conv_w[c * k + j] as f64 * window[j * cd + c];
        }
        acc += x.conv_w[c * k + k - 1] as f64 * x.qkv[c] as f64;
        *o = silu(acc);
    }
    // Shift the window.
    window.copy_within(cd.., 0);
    for c in 0..cd {
        window[(k - 2) * cd + c] = x.qkv[c] as f64;
    }
    let l2 = |v: &mut [f64]| {
        let s = 1.0 / (v.iter().map(|a| a * a).sum::<f64>() + l2_eps as f64).sqrt();
        v.iter_mut().for_each(|a| *a *= s);
    };
    let (q, rest) = conv.split_at(kd);
    let (kk, vv) = rest.split_at(kd);
    let mut q = q.to_vec();
    let mut kk = kk.to_vec();
    for h in 0..s.n_k {
        l2(&mut q[h * s.dk..][..s.dk]);
        l2(&mut kk[h * s.dk..][..s.dk]);
    }
    let qs = 1.0 / (s.dk as f64).sqrt();
    q.iter_mut().for_each(|a| *a *= qs);
    let r = s.n_v / s.n_k;
    let mut out = vec![0f64; s.n_v * s.dv];
    for h in 0..s.n_v {
        let kh = h / r;
        let j0 = h % r;
        let beta = sigmoid(x.ba[kh * 2 * r + j0] as f64);
        let g =
            x.ssm_a[h] as f64 * softplus(x.ba[kh * 2 * r + r + j0] as f64 + x.dt_bias[h] as f64);
        let st = &mut state[h * s.dk * s.dv..][..s.dk * s.dv];
        let (qh, kh_) = (&q[kh * s.dk..][..s.dk], &kk[kh * s.dk..][..s.dk]);
        let vh = &vv[h * s.dv..][..s.dv];
        st.iter_mut().for_each(|e| *e *= g.exp());
        let o = &mut out[h * s.dv..][..s.dv];
        for j in 0..s.dv {
            let u: f64 = (0..s.dk).map(|i| st[i * s.dv + j] * kh_[i]).sum();
            let d = beta * (vh[j] - u);
            for i in 0..s.dk {
                st[i * s.dv + j] += kh_[i] * d;
            }
            o[j] = (0..s.dk).map(|i| st[i * s.dv + j] * qh[i]).sum();
        }
        let ms = o.iter().map(|a| a * a).sum::<f64>() / s.dv as f64;
        let sc = 1.0 / (ms + eps as f64).sqrt();
        for (j, oj) in o.iter_mut().enumerate() {
            *oj = *oj * sc * x.norm_w[j] as f64 * silu(x.z[h * s.dv + j] as f64);
        }
    }
    out
}

/// Router: softmax over `logits`, the top `k` (ties to the lower index),
/// renormalised when `norm`; in ascending expert order.
pub fn route(logits: &[f32], k: usize, norm: bool) -> Vec<(u32, f64)> {
    let mx = logits
        .iter()
        .map(|&v| v as f64)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&v| (v as f64 - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    let mut idx: Vec<usize> = (0..e.len()).collect();
    idx.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(u32, f64)> = idx[..k].iter().map(|&i| (i as u32, e[i] / sum)).collect();
    if norm {
        let s: f64 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= s);
    }
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// `SiLU(g) * u`.
pub fn swiglu(g: &[f32], u: &[f32]) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(&a, &b)| silu(a as f64) * b as f64)
        .collect()
}

/// `x + Σ_i w_i ys_i + sh·sigmoid(sh_logit)`.
pub fn moe_combine(
    x: &[f32],
    ys: &[f32],
    w: &[f32],
    sh: Option<&[f32]>,
    sh_logit: Option<f32>,
) -> Vec<f64> {
    let d = x.len();
    (0..d)
        .map(|j| {
            let mut a = x[j] as f64;
            for (i, &wi) in w.iter().enumerate() {
                a += wi as f64 * ys[i * d + j] as f64;
            }
            if let Some(sh) = sh {
                a += sh[j] as f64 * sh_logit.map_or(1.0, |l| sigmoid(l as f64));
            }
            a
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The references against the CPU crate's f32 kernels (an independent
    /// implementation of the same equations).
    #[test]
    fn references_agree_with_the_cpu_crate() {
        // RMSNorm and RoPE.
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let w: Vec<f32> = (0..64).map(|i| 0.5 + i as f32 * 0.01).collect();
        let (_, r) = rms_norm(&x, None, &w, 64, 1e-6, false);
        let mut c = x.clone();
        redlite_cpu::ops::rms_norm(&mut c, &w, 1e-6);
        for (a, b) in c.iter().zip(&r) {
            assert!((*a as f64 - b).abs() < 1e-6);
        }
        let r = norm_rope(&x, Some(&w), 64, 16, 1e7, 1234, 1e-6);
        redlite_cpu::ops::Rope::new(16, 1e7).apply(&mut c, 64, 1234);
        for (a, b) in c.iter().zip(&r) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} {b}");
        }
        // Attention: 2 KV heads, 4 query heads, 9 positions.
        let (nh, nkv, hd, n) = (4, 2, 8, 9);
        let q: Vec<f32> = (0..nh * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..n * nkv * hd).map(|i| (i as f32 * 0.11).cos()).collect();
        let v: Vec<f32> = (0..n * nkv * hd).map(|i| (i as f32 * 0.23).sin()).collect();
        let r = attention(&q, &k, &v, n, nh, nkv, hd, 0.35, None);
        let mut o = vec![0f32; nh * hd];
        let shape = redlite_cpu::attention::AttnShape {
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
        };
        redlite_cpu::attention::causal_attention_reference(
            &shape,
            &q,
            &k,
            &v,
            n - 1,
            1,
            0.35,
            &mut o,
        )
        .unwrap();
        for (a, b) in o.iter().zip(&r) {
            assert!((*a as f64 - b).abs() < 1e-6);
        }
        // Router against the model's route().
        let logits: Vec<f32> = (0..16).map(|i| ((i * 7 % 16) as f32) * 0.3).collect();
        let r = route(&logits, 4, true);
        let mut p = logits.clone();
        redlite_cpu::ops::softmax(&mut p);
        let mut idx: Vec<usize> = (0..16).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let mut top: Vec<u32> = idx[..4].iter().map(|&i| i as u32).collect();
        top.sort();
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), top);
        assert!((r.iter().map(|c| c.1).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn deltanet_step_matches_the_cpu_recurrence() {
        use redlite_cpu::deltanet::{gdn_recurrent, GdnInputs, GdnShape as CpuShape};
        let s = GdnShape {
            n_k: 2,
            n_v: 4,
            dk: 8,
            dv: 4,
            conv_kernel: 4,
        };
        let (kd, vd) = (16, 16);
        let cd = 2 * kd + vd;
        let f = |n: usize, m: f32| -> Vec<f32> {
            (0..n).map(|i| ((i as f32 + m) * 0.71).sin()).collect()
        };
        let (qkv, z, ba, conv_w) = (f(cd, 1.0), f(vd, 2.0), f(2 * s.n_v, 3.0), f(cd * 4, 4.0));
        let dt_bias = f(s.n_v, 5.0);
        let ssm_a: Vec<f32> = f(s.n_v, 6.0).iter().map(|v| -v.abs() - 0.1).collect();
        let norm_w = f(s.dv, 7.0);
        let win0 = f(3 * cd, 8.0);
        let st0 = f(s.n_v * s.dk * s.dv, 9.0);
        let x = GdnStepInputs {
            qkv: &qkv,
            z: &z,
            ba: &ba,
            conv_w: &conv_w,
            dt_bias: &dt_bias,
            ssm_a: &ssm_a,
            norm_w: &norm_w,
        };
        let mut win: Vec<f64> = win0.iter().map(|&v| v as f64).collect();
        let mut st: Vec<f64> = st0.iter().map(|&v| v as f64).collect();
        let out = gdn_step(&s, &x, &mut win, &mut st, 1e-6, 1e-6);
        // The same step with the CPU crate's pieces (f32).
        let mut cwin = win0.clone();
        let mut conv = vec![0f32; cd];
        redlite_cpu::conv::conv1d_causal(&mut cwin, &conv_w, 4, &qkv, &mut conv).unwrap();
        redlite_cpu::ops::silu_inplace(&mut conv);
        let (mut q, mut k, v) = (
            conv[..kd].to_vec(),
            conv[kd..2 * kd].to_vec(),
            conv[2 * kd..].to_vec(),
        );
        redlite_cpu::ops::l2_norm(&mut q, 8, 1e-6);
        redlite_cpu::ops::l2_norm(&mut k, 8, 1e-6);
        let sc = 1.0 / 8f32.sqrt();
        q.iter_mut().for_each(|a| *a *= sc);
        let (mut beta, mut g) = (vec![0f32; 4], vec![0f32; 4]);
        for h in 0..4 {
            let (kh, j) = (h / 2, h % 2);
            beta[h] = redlite_cpu::ops::sigmoid(ba[kh * 4 + j]);
            g[h] = ssm_a[h] * redlite_cpu::ops::softplus(ba[kh * 4 + 2 + j] + dt_bias[h]);
        }
        let mut cst = st0.clone();
        let mut o = vec![0f32; vd];
        let shape = CpuShape {
            n_k_heads: 2,
            n_v_heads: 4,
            dk: 8,
            dv: 4,
        };
        let inp = GdnInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        gdn_recurrent(&redlite_cpu::Pool::new(1), &shape, &inp, &mut cst, &mut o).unwrap();
        redlite_cpu::ops::rms_norm(&mut o, &norm_w, 1e-6);
        for (a, &zv) in o.iter_mut().zip(&z) {
            *a *= redlite_cpu::ops::silu(zv);
        }
        for (a, b) in o.iter().zip(&out) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} {b}");
        }
        for (a, b) in cst.iter().zip(&st) {
            assert!((*a as f64 - b).abs() < 1e-5);
        }
        for (a, b) in cwin.iter().zip(&win) {
            assert_eq!(*a as f64, *b);
        }
    }
}
