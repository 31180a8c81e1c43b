//! Element-wise and per-row operations. These are scalar and cheap beside
//! the matmuls; each is its own reference and is tested against float64.

/// RMSNorm of each `w.len()`-wide row of `x` in place: `x̂ = x / sqrt(mean(x²) + eps) · w`.
/// The sum of squares is taken in f64.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for row in x.chunks_exact_mut(d) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / d as f64 + eps as f64).sqrt()) as f32;
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// RMSNorm without a weight, rows of width `d`.
pub fn rms_norm_plain(x: &mut [f32], d: usize, eps: f32) {
    for row in x.chunks_exact_mut(d) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / d as f64 + eps as f64).sqrt()) as f32;
        row.iter_mut().for_each(|v| *v *= scale);
    }
}

/// L2-normalise each row of width `d` as flash-linear-attention does:
/// `x · 1/sqrt(Σx² + eps)`.
pub fn l2_norm(x: &mut [f32], d: usize, eps: f32) {
    for row in x.chunks_exact_mut(d) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss + eps as f64).sqrt()) as f32;
        row.iter_mut().for_each(|v| *v *= scale);
    }
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + eˣ)`, linear above 20 as torch's softplus is.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// SiLU in place.
pub fn silu_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

/// `a ← SiLU(a) ⊙ b` (the SwiGLU of an FFN).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// [`swiglu`] on the fast path: vectorised (`exp` within 2 ulp of libm's,
/// see `vexp`) and split over the pool's threads for long rows of tokens.
pub fn swiglu_fast(pool: &crate::Pool, gate: &mut [f32], up: &[f32]) {
    use rayon::prelude::*;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        const CHUNK: usize = 16 * 1024;
        if gate.len() <= CHUNK {
            // SAFETY: AVX2 and FMA checked just above.
            return unsafe { crate::vexp::swiglu_avx2(gate, up) };
        }
        return pool.install(|| {
            gate.par_chunks_mut(CHUNK)
                .zip(up.par_chunks(CHUNK))
                // SAFETY: AVX2 and FMA checked above.
                .for_each(|(g, u)| unsafe { crate::vexp::swiglu_avx2(g, u) })
        });
    }
    let _ = pool;
    swiglu(gate, up)
}

/// Softmax of `x` in place (max-subtracted).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `a += b`.
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Rotary tables for NeoX-style RoPE over the first `n_rot` dims of a head.
#[derive(Clone, Debug)]
pub struct Rope {
    n_rot: usize,
    inv_freq: Vec<f64>,
}

impl Rope {
    /// `inv_freq[i] = base^(-2i/n_rot)` for `i < n_rot/2`.
    pub fn new(n_rot: usize, base: f32) -> Rope {
        let inv_freq = (0..n_rot / 2)
            .map(|i| (base as f64).powf(-(2.0 * i as f64) / n_rot as f64))
            .collect();
        Rope { n_rot, inv_freq }
    }

    pub fn n_rot(&self) -> usize {
        self.n_rot
    }

    /// `base^(-2i/n_rot)` for `i < n_rot/2` (the table `apply` uses).
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Rotate every `head_dim`-wide head of `x` for position `pos`: pairs
    /// `(j, j + n_rot/2)` for `j < n_rot/2`; dims from `n_rot` on pass
    /// through.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.n_rot / 2;
        let cs: Vec<(f32, f32)> = self
            .inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .collect();
        for head in x.chunks_exact_mut(head_dim) {
            for (j, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = (head[j], head[j + half]);
                head[j] = a * c - b * s;
                head[j + half] = b * c + a * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_f64() {
        let x: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.37).collect();
        let w: Vec<f32> = (0..6).map(|i| 0.5 + i as f32 * 0.1).collect();
        let mut y = x.clone();
        rms_norm(&mut y, &w, 1e-6);
        for r in 0..2 {
            let row = &x[r * 6..r * 6 + 6];
            let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 6.0;
            for j in 0..6 {
                let e = row[j] as f64 / (ms + 1e-6).sqrt() * w[j] as f64;
                assert!((y[r * 6 + j] as f64 - e).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn l2_norm_unit_length() {
        let mut x = vec![3.0f32, 4.0, 0.0, 0.0];
        l2_norm(&mut x, 2, 1e-6);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0], "zero rows stay zero (eps)");
    }

    #[test]
    fn softmax_and_activations() {
        let mut x = vec![1.0f32, 2.0, 3.0];
        softmax(&mut x);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] as f64 - e[i] / s).abs() < 1e-7);
        }
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert_eq!(softplus(30.0), 30.0);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-7);
    }

    #[test]
    fn rope_partial_neox_matches_f64() {
        let (hd, n_rot, base, pos) = (8usize, 4usize, 10000f32, 7usize);
        let x: Vec<f32> = (0..2 * hd).map(|i| i as f32 * 0.1 - 0.4).collect();
        let mut y = x.clone();
        Rope::new(n_rot, base).apply(&mut y, hd, pos);
        for h in 0..2 {
            let xs = &x[h * hd..(h + 1) * hd];
            for j in 0..n_rot / 2 {
                let th = pos as f64 * (base as f64).powf(-2.0 * j as f64 / n_rot as f64);
                let (a, b) = (xs[j] as f64, xs[j + n_rot / 2] as f64);
                assert!((y[h * hd + j] as f64 - (a * th.cos() - b * th.sin())).abs() < 1e-6);
                assert!((y[h * hd + j + 2] as f64 - (b * th.cos() + a * th.sin())).abs() < 1e-6);
            }
            assert_eq!(
                &y[h * hd + n_rot..(h + 1) * hd],
                &xs[n_rot..],
                "pass-through dims"
            );
        }
    }
}
