//! With sampling, speculation must leave the output distribution alone.
//!
//! On the tiny Qwen3-Next fixture at temperature 1: the first token is
//! sampled, then a draft token d (the most likely one) is proposed for the second position and
//! accepted or replaced by the speculative-sampling rule. Over many seeds,
//! the second token's distribution given the most frequent first token is
//! compared (Pearson chi-square) with the exact conditional distribution
//! the sampler gives from the model's logits after that token. The same
//! counts are also tested against the distribution of the classic mistake
//! (on rejection, draw from p again instead of from p without d), which the
//! test must tell apart, or it would prove nothing.

use redlite_engine::{BackendOptions, Engine, Logits, MemoryRequest, Model};
use redlite_model::sample::{Sampler, SamplerConfig};
use redlite_spec::{Drafter, SpecOptions, Speculator};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

struct Fixed(u32);

impl Drafter for Fixed {
    fn draft(&mut self, _history: &[u32], max: usize) -> Vec<u32> {
        vec![self.0; max.min(1)]
    }
}

fn config(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        seed,
        ..Default::default()
    }
}

/// Pearson's statistic over cells of expected count ≥ 5 (the rest pooled),
/// and its degrees of freedom.
fn chi_square(counts: &HashMap<u32, u64>, expect: &[(u32, f64)], n: u64) -> (f64, usize) {
    let mut stat = 0.0;
    let mut cells = 0usize;
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for &(t, p) in expect {
        let e = p * n as f64;
        let o = *counts.get(&t).unwrap_or(&0) as f64;
        if e >= 5.0 {
            stat += (o - e).powi(2) / e;
            cells += 1;
        } else {
            pooled_obs += o;
            pooled_exp += e;
        }
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

/// The chi-square quantile for `df` degrees of freedom at z standard
/// deviations (Wilson–Hilferty).
fn critical(df: usize, z: f64) -> f64 {
    let k = df as f64;
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

#[test]
fn speculative_sampling_keeps_the_distribution() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf");
    let file = Arc::new(redlite_gguf::GgufFile::open(path).unwrap());
    let model = Model::load(file, Default::default()).unwrap();
    let mut e = Engine::open(
        model,
        &BackendOptions::default(),
        &MemoryRequest {
            ctx: 32,
            sessions: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut seq = e.open_sequence(0).unwrap();
    let prompt = [1u32, 17, 33, 5, 250, 7];
    let first = seq.prefill(&prompt, Logits::Last).unwrap();
    let start = seq.checkpoint().unwrap();

    // The exact distributions: the first token's, and the second's after
    // the most likely first token.
    let plain = Sampler::new(config(0));
    let p1 = plain.distribution(&first, &prompt);
    let t1 = p1[0].0;
    let mut h1 = prompt.to_vec();
    h1.push(t1);
    let after = seq.decode(t1).unwrap();
    let p2 = plain.distribution(&after, &h1);
    // Draft the most likely token: kept often, rejected often.
    let d = p2[0].0;
    let pd = p2[0].1;
    assert!(
        pd > 0.05 && pd < 0.95,
        "the draft must be both kept and rejected: p(d) {pd}"
    );

    let opts = SpecOptions {
        draft_max: 1,
        adaptive: false,
        ..Default::default()
    };
    let mut counts: HashMap<u32, u64> = HashMap::new();
    let mut n = 0u64;
    let (mut kept, mut replaced) = (0u64, 0u64);
    for seed in 0..6000u64 {
        seq.restore(&start).unwrap();
        let mut sampler = Sampler::new(config(seed * 7919 + 1));
        let mut spec = Speculator::new(Fixed(d), opts);
        let mut history = prompt.to_vec();
        let mut logits = first.clone();
        let step = spec
            .step(
                &mut *seq,
                &mut sampler,
                &mut history,
                &mut logits,
                2,
                &|_| false,
            )
            .unwrap();
        let was_kept = step.tokens.len() == 2;
        let second = if was_kept {
            step.tokens[1]
        } else {
            let s2 = spec
                .step(
                    &mut *seq,
                    &mut sampler,
                    &mut history,
                    &mut logits,
                    1,
                    &|_| false,
                )
                .unwrap();
            s2.tokens[0]
        };
        if step.tokens[0] == t1 {
            *counts.entry(second).or_default() += 1;
            n += 1;
            if was_kept {
                kept += 1;
            } else {
                replaced += 1;
            }
        }
    }
    assert!(
        kept > 50 && replaced > 50,
        "kept {kept}, replaced {replaced}"
    );
    assert!(n > 500, "only {n} runs began with the most likely token");
    let (stat, df) = chi_square(&counts, &p2, n);
    // z = 3.7: a false alarm about once in 10,000 runs of this test.
    let crit = critical(df, 3.7);
    assert!(
        stat < crit,
        "second-token distribution differs from the model's: chi2 {stat:.1} > {crit:.1} (df {df}, n {n})"
    );
    // The classic mistake's distribution: p(d)·[x = d] + (1 - p(d))·p(x).
    let wrong: Vec<(u32, f64)> = p2
        .iter()
        .map(|&(t, p)| {
            (
                t,
                if t == d {
                    pd + (1.0 - pd) * p
                } else {
                    (1.0 - pd) * p
                },
            )
        })
        .collect();
    let (stat_wrong, df_wrong) = chi_square(&counts, &wrong, n);
    eprintln!(
        "n {n}, p(d) {pd:.3}, kept {kept}, replaced {replaced}: chi2 {stat:.1} (df {df}, critical {crit:.1}); against the wrong rule {stat_wrong:.1} (df {df_wrong})"
    );
    assert!(
        stat_wrong > critical(df_wrong, 3.7),
        "the test cannot tell the right rule from the wrong one: chi2 {stat_wrong:.1} (df {df_wrong})"
    );
}
