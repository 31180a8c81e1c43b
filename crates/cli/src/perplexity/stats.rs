//! The numbers of `redlite perplexity`, computed the way llama.cpp's
//! `llama-perplexity` computes them (`tools/perplexity/perplexity.cpp`):
//! the same float / double mix in the log-softmax, the same error
//! formulas, the same 16-bit log-probability rows in a KL base file, so
//! values printed by the two tools can be compared digit for digit.

/// The negative log-likelihood of `tok` under `logits`, as llama.cpp's
/// perplexity pass computes it: float max and differences, a double sum of
/// float exponentials.
pub fn nll(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    -(((logits[tok] - max) as f64) - sum.ln())
}

/// Running sums of the scored tokens' negative log-likelihoods.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ppl {
    pub nll: f64,
    pub nll2: f64,
    pub count: usize,
}

impl Ppl {
    pub fn add(&mut self, v: f64) {
        self.nll += v;
        self.nll2 += v * v;
        self.count += 1;
    }

    /// exp(mean negative log-likelihood).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The final estimate and its error: the standard error of the mean
    /// log-likelihood, `sqrt(var / (count - 1))`, times the perplexity
    /// (None when the variance is not positive, where llama.cpp prints an
    /// error instead).
    pub fn estimate(&self) -> (f64, Option<f64>) {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        let ppl = mean.exp();
        if var > 0.0 && self.count > 1 {
            (ppl, Some((var / (n - 1.0)).sqrt() * ppl))
        } else {
            (ppl, None)
        }
    }
}

/// u16 values per row of a KL base file: two floats (scale, minimum log
/// probability) then `n_vocab` values, padded to an even count.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Quantise one row of logits into `out` (`row_len(n_vocab)` values) as
/// llama.cpp's base file stores it, and return the negative
/// log-likelihood of `tok` (llama.cpp's float expression in that mode).
pub fn quantize_row(logits: &[f32], tok: usize, out: &mut [u16]) -> f64 {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        max = max.max(l);
        min = min.min(l);
    }
    // Log-probabilities more than 16 below the top one are not kept.
    min = min.max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let lse = sum.ln() as f32;
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    out[..2].copy_from_slice(&u16_pair(scale));
    out[2..4].copy_from_slice(&u16_pair(min_log_prob));
    let q = &mut out[4..];
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in q.iter_mut().zip(logits) {
            *o = if l > min {
                // llama.cpp rounds with the 1.5·2²³ trick: ties to even.
                (inv * (l - min)).round_ties_even() as u16
            } else {
                0
            };
        }
    } else {
        q.iter_mut().for_each(|o| *o = 0);
    }
    q[logits.len()..].iter_mut().for_each(|o| *o = 0);
    (max + lse - logits[tok]) as f64
}

/// A float as the two u16 a base row holds it in (little-endian halves).
fn u16_pair(x: f32) -> [u16; 2] {
    let b = x.to_le_bytes();
    [
        u16::from_le_bytes([b[0], b[1]]),
        u16::from_le_bytes([b[2], b[3]]),
    ]
}

fn f32_of(p: &[u16]) -> f32 {
    let (a, b) = (p[0].to_le_bytes(), p[1].to_le_bytes());
    f32::from_le_bytes([a[0], a[1], b[0], b[1]])
}

/// Running sums of the KL comparison (llama.cpp's `kl_divergence_result`).
#[derive(Clone, Debug, Default)]
pub struct Kld {
    pub sum_nll: f64,
    pub sum_nll2: f64,
    pub sum_nll_base: f64,
    pub sum_nll_base2: f64,
    pub sum_nll_nll_base: f64,
    pub sum_kld: f64,
    pub sum_kld2: f64,
    pub sum_p_diff: f64,
    pub sum_p_diff2: f64,
    pub sum_p_diff4: f64,
    pub max_p_diff: f32,
    pub n_same_top: usize,
    pub count: usize,
    /// Every token's KL divergence and Δp, for the percentiles.
    pub klds: Vec<f32>,
    pub p_diffs: Vec<f32>,
}

impl Kld {
    /// Compare one row of logits with its base row (`row_len` values).
    pub fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let mut max = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                max = l;
                imax = i;
            }
        }
        let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
        let lse = sum.ln() as f32;
        let scale = f32_of(&base[0..2]);
        let min_log_prob = f32_of(&base[2..4]);
        let q = &base[4..];
        let nll = max + lse - logits[tok];
        self.sum_nll += nll as f64;
        self.sum_nll2 += (nll * nll) as f64;
        let nll_base = -(scale * q[tok] as f32 + min_log_prob);
        self.sum_nll_base += nll_base as f64;
        self.sum_nll_base2 += (nll_base * nll_base) as f64;
        self.sum_nll_nll_base += (nll * nll_base) as f64;
        let top = max + lse;
        let mut kl = 0f64;
        let (mut imax_base, mut pmax_base) = (0usize, 0f32);
        for (i, &l) in logits.iter().enumerate() {
            let p_log_base = scale * q[i] as f32 + min_log_prob;
            if i == 0 || p_log_base > pmax_base {
                pmax_base = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                kl += (p_log_base.exp() * (p_log_base - l + top)) as f64;
            }
        }
        self.sum_kld += kl;
        self.sum_kld2 += kl * kl;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }
        let p_diff = (-nll).exp() - (-nll_base).exp();
        self.sum_p_diff += p_diff as f64;
        let d2 = (p_diff * p_diff) as f64;
        self.sum_p_diff2 += d2;
        self.sum_p_diff4 += d2 * d2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.klds.push(kl as f32);
        self.p_diffs.push(p_diff);
    }
}

/// Mean and its standard error (llama.cpp's `mean_and_uncertainty`).
pub fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// Covariance of the two means (llama.cpp's `covariance`).
pub fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sumab / n - (suma / n) * (sumb / n)) / (n - 1.0)
}

/// The `fraction` percentile of sorted `values`, interpolated as
/// llama.cpp does.
pub fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// The median of sorted `values`.
pub fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_logits_is_ln_n() {
        let l = vec![0.5f32; 1000];
        assert!((nll(&l, 3) - 1000f64.ln()).abs() < 1e-6);
        // Two tokens with logits 0 and ln 3: probabilities 1/4 and 3/4.
        let l = [0.0, 3f32.ln()];
        assert!((nll(&l, 1) - (4.0f64 / 3.0).ln()).abs() < 1e-6);
    }

    #[test]
    fn the_error_is_the_standard_error_of_the_mean_times_ppl() {
        let mut p = Ppl::default();
        for v in [1.0, 2.0, 3.0, 4.0] {
            p.add(v);
        }
        // mean 2.5, population variance 1.25, se sqrt(1.25 / 3).
        let (ppl, err) = p.estimate();
        assert!((ppl - 2.5f64.exp()).abs() < 1e-9);
        assert!((err.unwrap() - (1.25f64 / 3.0).sqrt() * 2.5f64.exp()).abs() < 1e-9);
    }

    #[test]
    fn a_quantised_row_gives_back_its_log_probabilities_and_a_self_kl_near_zero() {
        let logits: Vec<f32> = (0..1001)
            .map(|i| ((i * 37) % 101) as f32 * 0.1 - 3.0)
            .collect();
        let mut row = vec![0u16; row_len(logits.len())];
        assert_eq!(row.len(), 1006);
        let v = quantize_row(&logits, 17, &mut row);
        assert!((v - nll(&logits, 17)).abs() < 1e-5, "{v}");
        let mut k = Kld::default();
        for t in [0, 17, 500] {
            k.add(&logits, &row, t);
        }
        assert_eq!(k.n_same_top, 3);
        // 16 bits over this row's 10-nat range: a step of 1.5e-4 nats, so
        // each stored log-probability is within 7.6e-5 of the true one and
        // the self-KL (first order in those errors) within that too.
        assert!(k.sum_kld.abs() / 3.0 < 7.6e-5, "{}", k.sum_kld);
        assert!((k.sum_nll - k.sum_nll_base).abs() < 3e-4);
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 5.0);
        assert!((percentile(&v, 0.9) - 4.6).abs() < 1e-6);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
    }
}
