//! Expert usage implied by the router weights of a plan.
//!
//! The router math of Qwen3-Next (softmax over 512 logits, top 10) is run
//! on simulated hidden states: an AR(1) sequence `x_t = ρ·x_{t−1} +
//! √(1−ρ²)·ε_t` with isotropic unit-variance ε, RMS-normalised and scaled
//! by the layer's `post_attention_norm` weight, as the router sees it. ρ
//! stands in for the context the real model carries from token to token;
//! the weights themselves decide the skew (router row scales, see
//! [`crate::router_row_scale`]).

use crate::rng::BlockRng;
use crate::{Plan, SynthError};
use std::fmt::Write as _;

/// Usage of one layer's experts over the simulated tokens.
#[derive(Clone, Debug)]
pub struct LayerUsage {
    pub layer: usize,
    /// Picks per expert (expert index order).
    pub counts: Vec<u64>,
    /// Mean fraction of a token's chosen experts also chosen by the previous token.
    pub overlap: f64,
}

impl LayerUsage {
    pub fn picks(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Counts sorted from most to least used.
    pub fn sorted(&self) -> Vec<u64> {
        let mut c = self.counts.clone();
        c.sort_unstable_by(|a, b| b.cmp(a));
        c
    }

    /// Share of all picks taken by the `k` most used experts.
    pub fn top_share(&self, k: usize) -> f64 {
        let s = self.sorted();
        s.iter().take(k).sum::<u64>() as f64 / self.picks().max(1) as f64
    }

    /// exp(entropy) of the usage distribution: 512 when uniform.
    pub fn effective_experts(&self) -> f64 {
        let n = self.picks().max(1) as f64;
        let h: f64 = self
            .counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum();
        h.exp()
    }

    pub fn unused(&self) -> usize {
        self.counts.iter().filter(|&&c| c == 0).count()
    }
}

/// Run the routers of every layer of `plan` on `tokens` simulated hidden
/// states with token-to-token correlation `rho`.
pub fn simulate(plan: &Plan, tokens: usize, rho: f64) -> Result<Vec<LayerUsage>, SynthError> {
    let s = &plan.shapes;
    let (d, e, k) = (
        s.n_embd as usize,
        s.n_expert as usize,
        s.n_expert_used as usize,
    );
    let rho = rho.clamp(0.0, 0.999_999);
    let mut out = Vec::with_capacity(s.n_layer);
    for layer in 0..s.n_layer {
        let ri = plan.index_of(&format!("blk.{layer}.ffn_gate_inp.weight"))?;
        let w = f32s(&plan.tensor_bytes(ri)?);
        let ni = plan.index_of(&format!("blk.{layer}.post_attention_norm.weight"))?;
        let norm = f32s(&plan.tensor_bytes(ni)?);
        let mut rng = BlockRng::new(plan.seed ^ 0x7265_706f_7274, layer as u64);
        let mut x: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
        let mut counts = vec![0u64; e];
        let mut prev: Vec<usize> = Vec::new();
        let mut overlap_sum = 0.0;
        let mut logits = vec![0f64; e];
        for t in 0..tokens {
            if t > 0 {
                let c = (1.0 - rho * rho).sqrt();
                for v in x.iter_mut() {
                    *v = rho * *v + c * rng.normal();
                }
            }
            let rms = (x.iter().map(|v| v * v).sum::<f64>() / d as f64).sqrt();
            let h: Vec<f64> = x
                .iter()
                .zip(&norm)
                .map(|(v, &g)| v / rms * f64::from(g))
                .collect();
            for (j, l) in logits.iter_mut().enumerate() {
                *l = w[j * d..(j + 1) * d]
                    .iter()
                    .zip(&h)
                    .map(|(&a, &b)| f64::from(a) * b)
                    .sum();
            }
            // Softmax is monotone: the top k of the logits are the top k of the probabilities.
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let chosen = &idx[..k.min(e)];
            for &c in chosen {
                counts[c] += 1;
            }
            if t > 0 {
                let same = chosen.iter().filter(|c| prev.contains(c)).count();
                overlap_sum += same as f64 / k.max(1) as f64;
            }
            prev = chosen.to_vec();
        }
        out.push(LayerUsage {
            layer,
            counts,
            overlap: overlap_sum / (tokens.max(2) - 1) as f64,
        });
    }
    Ok(out)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Rank buckets of the histogram (1-based, inclusive).
pub const BUCKETS: &[(usize, usize)] = &[
    (1, 1),
    (2, 4),
    (5, 16),
    (17, 64),
    (65, 128),
    (129, 256),
    (257, 512),
];

/// A text report: one line per layer and a histogram of pick share by
/// usage rank, averaged over layers.
pub fn format(usage: &[LayerUsage], tokens: usize, rho: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "router usage: {tokens} simulated tokens per layer, AR(1) hidden states rho = {rho}"
    );
    let _ = writeln!(
        s,
        "| layer | hottest expert | top-10 experts | top-10% experts | max/mean | effective experts | unused | overlap with previous token |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for u in usage {
        let n_e = u.counts.len().max(1);
        let mean = u.picks() as f64 / n_e as f64;
        let max = u.sorted().first().copied().unwrap_or(0) as f64;
        let _ = writeln!(
            s,
            "| {} | {:.1}% | {:.1}% | {:.1}% | {:.1} | {:.0} | {} | {:.0}% |",
            u.layer,
            100.0 * u.top_share(1),
            100.0 * u.top_share(10),
            100.0 * u.top_share(n_e.div_ceil(10)),
            max / mean.max(1e-9),
            u.effective_experts(),
            u.unused(),
            100.0 * u.overlap
        );
    }
    let _ = writeln!(
        s,
        "\npick share by usage rank (mean over layers; uniform routing would give the last column):"
    );
    let _ = writeln!(s, "| ranks | share of picks | histogram | uniform share |");
    let _ = writeln!(s, "|---|---:|---|---:|");
    let n_e = usage.first().map_or(0, |u| u.counts.len());
    for &(lo, hi) in BUCKETS {
        if lo > n_e {
            break;
        }
        let hi = hi.min(n_e);
        let share: f64 = usage
            .iter()
            .map(|u| {
                let c = u.sorted();
                c[lo - 1..hi].iter().sum::<u64>() as f64 / u.picks().max(1) as f64
            })
            .sum::<f64>()
            / usage.len().max(1) as f64;
        let bar = "#".repeat((share * 100.0).round() as usize);
        let _ = writeln!(
            s,
            "| {lo}-{hi} | {:.1}% | {bar} | {:.1}% |",
            100.0 * share,
            100.0 * (hi - lo + 1) as f64 / n_e.max(1) as f64
        );
    }
    s
}
