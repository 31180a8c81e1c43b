//! CUDA decoder against the CPU engine: the logits of every step (max
//! |Δlogit|, KL, argmax) and the greedy tokens, on any GGUF file
//! (`redlite parity`, and the GPU test on the tiny fixtures).

use crate::decoder::{CudaDecoder, DecoderOptions, ExpertCacheOptions};
use crate::error::{ensure, Result};
use crate::expert_cache::CacheCounters;
use crate::ops::KvType;
use crate::tuning::CudaTuning;
use crate::Gpu;
use redlite_model::{Logits, Model};

/// One step's comparison of two logit vectors.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogitCmp {
    pub max_abs: f64,
    pub kl: f64,
    pub argmax_equal: bool,
}

fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
}

/// max |a - b|, KL(softmax a || softmax b) in f64, argmax agreement.
pub fn compare_logits(a: &[f32], b: &[f32]) -> LogitCmp {
    let lse = |v: &[f32]| {
        let m = v
            .iter()
            .map(|&x| x as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        m + v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (la, lb) = (lse(a), lse(b));
    let mut kl = 0f64;
    let mut max_abs = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        let (pa, lpa, lpb) = ((x as f64 - la).exp(), x as f64 - la, y as f64 - lb);
        kl += pa * (lpa - lpb);
        max_abs = max_abs.max((x as f64 - y as f64).abs());
        if !y.is_finite() {
            max_abs = f64::INFINITY;
        }
    }
    LogitCmp {
        max_abs,
        kl: kl.max(0.0),
        argmax_equal: argmax(a) == argmax(b),
    }
}

/// The parity of one file: teacher-forced steps and the greedy run.
#[derive(Debug, Clone)]
pub struct Parity {
    pub steps: usize,
    pub worst: LogitCmp,
    pub argmax_agree: usize,
    /// (MoE layer, step) pairs whose chosen experts differ, of `router_checks`.
    pub router_mismatches: usize,
    pub router_checks: usize,
    pub greedy_cpu: Vec<u32>,
    pub greedy_gpu: Vec<u32>,
}

/// The chosen experts of the last token per MoE layer (ascending ids) from
/// the CPU session's routes, for comparison with [`CudaDecoder::routes`].
fn cpu_routes(s: &redlite_model::Session) -> Vec<Vec<u32>> {
    s.last_routes()
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut ids: Vec<u32> = l[l.len() - 1].iter().map(|&(e, _)| e as u32).collect();
            ids.sort_unstable();
            ids
        })
        .collect()
}

/// How many layers' expert sets differ.
fn route_diff(a: &[Vec<u32>], b: &[Vec<u32>]) -> (usize, usize) {
    let n = a.len().max(b.len());
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    (n - same, n)
}

impl Parity {
    pub fn greedy_equal(&self) -> bool {
        self.greedy_cpu == self.greedy_gpu
    }
    pub fn ok(&self, kl_max: f64) -> bool {
        self.argmax_agree == self.steps && self.worst.kl <= kl_max && self.greedy_equal()
    }
}

/// Run `prompt` token by token through the CPU engine (fast path, one
/// token per forward) and the GPU decoder, comparing the logits at every
/// step; then `n_greedy` greedy tokens on each from there. `int8`: the
/// decoder's int8-activation mode; `tuning`: its switches.
pub fn parity(
    gpu: Gpu,
    model: &Model,
    prompt: &[u32],
    n_greedy: usize,
    int8: bool,
    tuning: &CudaTuning,
) -> Result<Parity> {
    ensure!(!prompt.is_empty(), "empty prompt");
    let ctx = prompt.len() + n_greedy + 1;
    let mut dec = CudaDecoder::new(
        gpu,
        model,
        &DecoderOptions {
            ctx,
            nsplit: None,
            int8,
            kv_type: KvType::default_for(int8),
            expert_cache: None,
            tuning: tuning.clone(),
        },
    )?;
    let mut s = model.new_session(ctx);
    let mut worst = LogitCmp {
        argmax_equal: true,
        ..Default::default()
    };
    let (mut agree, mut steps) = (0, 0);
    let (mut r_bad, mut r_all) = (0, 0);
    let mut fold = |c: LogitCmp, routes: (usize, usize)| {
        worst.max_abs = worst.max_abs.max(c.max_abs);
        worst.kl = worst.kl.max(c.kl);
        worst.argmax_equal &= c.argmax_equal;
        agree += c.argmax_equal as usize;
        steps += 1;
        r_bad += routes.0;
        r_all += routes.1;
    };
    let (mut lc, mut lg) = (Vec::new(), Vec::new());
    for &t in prompt {
        lc = s.forward(model, &[t], Logits::Last)?;
        lg = dec.step(model, t)?;
        fold(
            compare_logits(&lc, &lg),
            route_diff(&cpu_routes(&s), &dec.routes()?),
        );
    }
    // Greedy on each engine; logits compared while the two agree.
    let (mut sc, mut sg) = (s.clone(), Vec::new());
    let mut gc = Vec::new();
    let mut same = true;
    for _ in 0..n_greedy {
        let (tc, tg) = (argmax(&lc) as u32, argmax(&lg) as u32);
        gc.push(tc);
        sg.push(tg);
        same &= tc == tg;
        lc = sc.forward(model, &[tc], Logits::Last)?;
        lg = dec.step(model, tg)?;
        if same {
            fold(
                compare_logits(&lc, &lg),
                route_diff(&cpu_routes(&sc), &dec.routes()?),
            );
        }
    }
    drop(s);
    Ok(Parity {
        steps,
        worst,
        argmax_agree: agree,
        router_mismatches: r_bad,
        router_checks: r_all,
        greedy_cpu: gc,
        greedy_gpu: sg,
    })
}

/// One bounded-cache run against the full-residency run of the same
/// decoder: logits bit for bit at every step, greedy tokens identical.
#[derive(Debug, Clone)]
pub struct CacheRun {
    pub slots_per_layer: usize,
    pub pregate: bool,
    /// Misses read from the file by the host (else from pinned memory).
    pub from_file: bool,
    pub steps: usize,
    /// Steps whose logits differ in any bit.
    pub steps_differing: usize,
    pub greedy_equal: bool,
    pub counters: CacheCounters,
}

impl CacheRun {
    pub fn ok(&self) -> bool {
        self.steps_differing == 0 && self.greedy_equal
    }
}

/// Teacher-forced `prompt` then `n_greedy` greedy tokens; every step's
/// logits and the greedy ids.
fn run_decoder(
    dec: &mut CudaDecoder,
    model: &Model,
    prompt: &[u32],
    n_greedy: usize,
) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    let mut all = Vec::new();
    let mut last = Vec::new();
    for &t in prompt {
        last = dec.step(model, t)?;
        all.push(last.clone());
    }
    let mut ids = Vec::new();
    for _ in 0..n_greedy {
        let t = argmax(&last) as u32;
        ids.push(t);
        last = dec.step(model, t)?;
        all.push(last.clone());
    }
    Ok((all, ids))
}

/// The decoder with every expert resident against bounded caches of
/// `sizes` slots per layer, each with pre-gating off and on (misses from
/// pinned memory) and with misses read from the file: the output
/// must be identical bit for bit (a cache changes where an expert's bytes
/// sit, never the arithmetic).
pub fn cache_sweep(
    gpu: &Gpu,
    model: &Model,
    prompt: &[u32],
    n_greedy: usize,
    int8: bool,
    sizes: &[usize],
    tuning: &CudaTuning,
) -> Result<Vec<CacheRun>> {
    ensure!(!prompt.is_empty(), "empty prompt");
    let ctx = prompt.len() + n_greedy + 1;
    let opts = |c: Option<ExpertCacheOptions>| DecoderOptions {
        ctx,
        nsplit: None,
        int8,
        kv_type: KvType::default_for(int8),
        expert_cache: c,
        tuning: tuning.clone(),
    };
    let mut full = CudaDecoder::new(gpu.side()?, model, &opts(None))?;
    let (want, want_ids) = run_decoder(&mut full, model, prompt, n_greedy)?;
    drop(full);
    let mut out = Vec::new();
    for &slots in sizes {
        for (pregate, from_file) in [(false, false), (true, false), (false, true)] {
            let mut c = ExpertCacheOptions::new(slots);
            c.pregate = pregate;
            c.from_file = from_file;
            let mut dec = CudaDecoder::new(gpu.side()?, model, &opts(Some(c)))?;
            let (got, ids) = run_decoder(&mut dec, model, prompt, n_greedy)?;
            let differing = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| {
                    a.len() != b.len()
                        || a.iter()
                            .zip(b.iter())
                            .any(|(x, y)| x.to_bits() != y.to_bits())
                })
                .count();
            let counters = dec.cache_totals()?.map(|t| t.0).unwrap_or_default();
            out.push(CacheRun {
                slots_per_layer: slots,
                pregate,
                from_file,
                steps: want.len(),
                steps_differing: differing,
                greedy_equal: ids == want_ids,
                counters,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_comparison() {
        let a = vec![vec![1, 5], vec![2, 3]];
        assert_eq!(route_diff(&a, &a), (0, 2));
        assert_eq!(route_diff(&a, &[vec![1, 5], vec![2, 4]]), (1, 2));
        assert_eq!(route_diff(&a, &[vec![1, 5]]), (1, 2));
    }

    #[test]
    fn logit_comparison() {
        let c = compare_logits(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!((c.max_abs, c.argmax_equal), (0.0, true));
        assert!(c.kl.abs() < 1e-15);
        let c = compare_logits(&[1.0, 2.0, 3.0], &[1.0, 3.5, 3.0]);
        assert!(!c.argmax_equal && c.kl > 0.1 && (c.max_abs - 1.5).abs() < 1e-12);
    }
}
