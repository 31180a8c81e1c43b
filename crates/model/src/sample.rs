//! Choosing the next token from logits: greedy, temperature, top-k, top-p,
//! min-p, repeat / presence / frequency penalties and per-token logit bias,
//! with a seeded RNG. Independent of architecture.

/// A small seeded RNG (SplitMix64): the same seed gives the same tokens.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// The state to save (a state file), given back to [`Rng::new`] to
    /// continue the same stream.
    pub fn state(&self) -> u64 {
        self.0
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Sampling settings. `temperature <= 0` is greedy.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (llama.cpp's
    /// `penalty_last_n`, shared by the repeat, presence and frequency
    /// penalties).
    pub repeat_last_n: usize,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every
    /// token seen in the window. 0.0 disables.
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once per
    /// occurrence in the window. 0.0 disables.
    pub frequency_penalty: f32,
    /// Added to the logits of the listed token ids before anything else
    /// (OpenAI's `logit_bias`); ids outside the vocabulary are ignored here
    /// (the server refuses them).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// A sampler with its RNG.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: Rng,
}

/// The index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// llama.cpp's repeat penalty: positive logits divided, negative multiplied.
pub fn apply_repeat_penalty(logits: &mut [f32], recent: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = std::collections::HashSet::new();
    for &t in recent {
        if seen.insert(t) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

/// OpenAI's presence and frequency penalties (the formula of its API
/// reference, as llama.cpp's penalties sampler applies it):
/// `logit[j] -= count[j] * frequency + (count[j] > 0) * presence`, with the
/// counts taken over `recent`.
pub fn apply_presence_frequency(logits: &mut [f32], recent: &[u32], presence: f32, frequency: f32) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &t in recent {
        *counts.entry(t).or_insert(0) += 1;
    }
    for (t, c) in counts {
        if let Some(l) = logits.get_mut(t as usize) {
            *l -= c as f32 * frequency + presence;
        }
    }
}

/// Add each bias to its token's logit (ids outside `logits` are skipped).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(t, b) in bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

/// The log-probability of `chosen` and the `top` most likely tokens, from
/// the log-softmax of `logits` over the whole vocabulary (computed in f64;
/// ties keep the lower id first).
pub fn log_probs(logits: &[f32], chosen: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let chosen_lp = if (chosen as usize) < logits.len() {
        lp(chosen as usize)
    } else {
        f32::NEG_INFINITY
    };
    // A partial selection: the top k without sorting the vocabulary.
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = top.min(idx.len());
    let by = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by);
    }
    idx.truncate(k);
    idx.sort_by(by);
    (
        chosen_lp,
        idx.into_iter().map(|i| (i as u32, lp(i))).collect(),
    )
}

impl SamplerConfig {
    /// Whether anything changes the logits before the choice (when nothing
    /// does, greedy needs no copy of the vocabulary).
    fn adjusts_logits(&self) -> bool {
        self.repeat_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || !self.logit_bias.is_empty()
    }

    /// The logits after bias and penalties, in llama.cpp's order (logit bias,
    /// then the penalties over the last `repeat_last_n` tokens of `history`).
    pub fn adjusted_logits(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let mut l = logits.to_vec();
        apply_logit_bias(&mut l, &self.logit_bias);
        let start = history.len().saturating_sub(self.repeat_last_n);
        let recent = &history[start..];
        apply_repeat_penalty(&mut l, recent, self.repeat_penalty);
        apply_presence_frequency(
            &mut l,
            recent,
            self.presence_penalty,
            self.frequency_penalty,
        );
        l
    }
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng::new(cfg.seed);
        Sampler { cfg, rng }
    }

    /// The RNG's state (see [`Rng::state`]).
    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    /// Continue from a saved RNG state.
    pub fn set_rng_state(&mut self, state: u64) {
        self.rng = Rng::new(state);
    }

    pub fn greedy() -> Sampler {
        Sampler::new(SamplerConfig::default())
    }

    /// Pick a token. `history` is the sequence so far (for the penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = &self.cfg;
        if c.temperature <= 0.0 && !c.adjusts_logits() {
            // Greedy with nothing to adjust: no copy of the vocabulary.
            return argmax(logits) as u32;
        }
        let l = c.adjusted_logits(logits, history);
        self.choose(&l)
    }

    /// Pick a token after `mask` has edited the adjusted logits (constrained
    /// decoding sets the logits of disallowed tokens to -inf); the same
    /// choice as [`sample`](Self::sample) otherwise, greedy or sampled.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        history: &[u32],
        mask: impl FnOnce(&mut [f32]),
    ) -> u32 {
        let mut l = self.cfg.adjusted_logits(logits, history);
        mask(&mut l);
        self.choose(&l)
    }

    /// The choice from adjusted logits: greedy, or temperature with top-k,
    /// min-p and top-p.
    fn choose(&mut self, l: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 || l.len() <= 1 {
            return argmax(l) as u32;
        }
        let dist = self.cfg.distribution_of(l);
        self.pick(&dist)
    }

    /// The distribution a token is drawn from after `logits` and `history`
    /// (bias, penalties, temperature, top-k, min-p, top-p): candidates and
    /// their probabilities, summing to 1, most likely first. Greedy is the
    /// one-hot distribution of the argmax.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
        let l = self.cfg.adjusted_logits(logits, history);
        self.cfg.distribution_of(&l)
    }

    /// Draw from a distribution (see [`Sampler::distribution`]) with one
    /// RNG draw.
    pub fn pick(&mut self, dist: &[(u32, f64)]) -> u32 {
        if dist.is_empty() {
            return 0;
        }
        let total: f64 = dist.iter().map(|d| d.1).sum();
        let mut r = self.rng.next_f64() * total;
        for &(t, p) in dist {
            if r < p {
                return t;
            }
            r -= p;
        }
        dist[dist.len() - 1].0
    }

    /// A uniform draw in [0, 1) from the sampler's RNG (the acceptance test
    /// of speculative sampling).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }
}

impl SamplerConfig {
    /// Whether every choice is the argmax (no RNG involved).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    fn distribution_of(&self, l: &[f32]) -> Vec<(u32, f64)> {
        let c = self;
        if c.temperature <= 0.0 || l.len() <= 1 {
            return vec![(argmax(l) as u32, 1.0)];
        }
        // Candidates sorted by logit, descending.
        let mut cand: Vec<(usize, f32)> = l.iter().copied().enumerate().collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if c.top_k > 0 {
            cand.truncate(c.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand
            .iter()
            .map(|&(_, v)| (((v - max) / c.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // min-p: keep tokens with p >= min_p · p_max.
        if c.min_p > 0.0 {
            let thr = c.min_p as f64 * probs[0];
            let keep = probs.iter().take_while(|&&p| p >= thr).count().max(1);
            probs.truncate(keep);
        }
        // top-p: the smallest prefix whose mass reaches top_p.
        if c.top_p < 1.0 {
            let total: f64 = probs.iter().sum();
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p / total;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep.max(1));
        }
        let total: f64 = probs.iter().sum();
        cand.iter()
            .zip(probs)
            .map(|(&(t, _), p)| (t as u32, p / total))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded() {
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        assert_eq!(Sampler::greedy().sample(&logits, &[]), 1);
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(cfg.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(cfg);
            (0..20).map(|_| s.sample(&logits, &[])).collect()
        };
        assert_eq!(a, b, "same seed, same tokens");
        assert!(a.contains(&2), "temperature 1 explores");
    }

    #[test]
    fn top_k_one_is_greedy_and_filters_hold() {
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            seed: 1,
            ..Default::default()
        });
        assert!((0..50).all(|_| s.sample(&logits, &[]) == 1));
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        });
        assert!((0..200).all(|_| matches!(s.sample(&logits, &[]), 1 | 2)));
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_p: 0.3,
            seed: 1,
            ..Default::default()
        });
        assert!((0..50).all(|_| s.sample(&logits, &[]) == 1));
    }

    #[test]
    fn repeat_penalty_flips_the_choice() {
        let logits = [0.0f32, 2.0, 1.5];
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[1]), 2);
        let mut l = vec![-1.0f32, 1.0];
        apply_repeat_penalty(&mut l, &[0, 1, 1], 2.0);
        assert_eq!(l, vec![-2.0, 0.5]);
    }

    #[test]
    fn logit_bias_of_minus_100_is_never_picked() {
        // Token 1 wins greedily; a -100 bias removes it, a +100 bias on
        // token 3 makes it win even though its logit is the lowest.
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(1, -100.0)],
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[]), 2);
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(3, 100.0)],
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[]), 3);
        // Sampled at temperature 1 as well: token 1 never comes out.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            logit_bias: vec![(1, -100.0), (99, 5.0)],
            seed: 7,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits, &[]) != 1));
    }

    #[test]
    fn presence_and_frequency_follow_the_openai_formula() {
        // logit[j] -= count[j] * frequency + (count[j] > 0) * presence
        // (OpenAI API reference, "Frequency and presence penalties").
        let mut l = vec![1.0f32, 1.0, 1.0];
        apply_presence_frequency(&mut l, &[0, 0, 0, 2], 0.5, 0.25);
        assert_eq!(l, vec![1.0 - 0.75 - 0.5, 1.0, 1.0 - 0.25 - 0.5]);
        // A repeated token stops winning under a frequency penalty, and
        // only the last `repeat_last_n` tokens count.
        let logits = [0.0f32, 2.0, 1.5];
        let history = [1u32, 1, 1];
        assert_eq!(Sampler::greedy().sample(&logits, &history), 1);
        let mut s = Sampler::new(SamplerConfig {
            frequency_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &history), 2);
        let mut s = Sampler::new(SamplerConfig {
            presence_penalty: 1.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &history), 2);
        let mut s = Sampler::new(SamplerConfig {
            frequency_penalty: 2.0,
            repeat_last_n: 1,
            ..Default::default()
        });
        // One occurrence in the window: 2.0 - 2.0 = 0.0 < 1.5.
        assert_eq!(s.sample(&logits, &[1, 2, 2, 1]), 2);
        let mut s = Sampler::new(SamplerConfig {
            frequency_penalty: 2.0,
            repeat_last_n: 1,
            ..Default::default()
        });
        // Token 1 outside the window: it wins.
        assert_eq!(s.sample(&logits, &[1, 1, 1, 2]), 1);
    }

    #[test]
    fn a_mask_of_minus_infinity_is_never_picked_greedy_or_sampled() {
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        let mask = |l: &mut [f32]| {
            l[1] = f32::NEG_INFINITY;
            l[2] = f32::NEG_INFINITY;
        };
        assert_eq!(Sampler::greedy().sample_masked(&logits, &[], mask), 0);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.5,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        });
        let picks: Vec<u32> = (0..300)
            .map(|_| s.sample_masked(&logits, &[], mask))
            .collect();
        assert!(picks.iter().all(|&t| t == 0 || t == 3), "{picks:?}");
        assert!(picks.contains(&3) && picks.contains(&0));
        // Without a mask the same sampler still explores all four.
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.5,
            seed: 3,
            ..Default::default()
        });
        assert!((0..300).any(|_| s.sample_masked(&logits, &[], |_| {}) == 1));
    }

    #[test]
    fn log_probs_are_the_log_softmax() {
        // logits [0, ln 3, ln 4] are probabilities 1/8, 3/8, 4/8 (softmax
        // by definition).
        let l = [0.0f32, 3f32.ln(), 4f32.ln(), f32::NEG_INFINITY];
        let (c, top) = log_probs(&l, 1, 2);
        assert!((c - (3.0f32 / 8.0).ln()).abs() < 1e-6, "{c}");
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].0, top[1].0), (2, 1));
        assert!((top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert!((top[1].1 - c).abs() < 1e-7);
        let (c, top) = log_probs(&l, 3, 0);
        assert_eq!(c, f32::NEG_INFINITY);
        assert!(top.is_empty());
        assert_eq!(log_probs(&l, 0, 10).1.len(), 4);
    }
}
