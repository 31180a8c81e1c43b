//! The bounded device expert cache against full residency on any GGUF
//! file (`redlite parity`'s cache sweep): a cache changes where an
//! expert's bytes sit, never the arithmetic, so every logit must be the
//! same bit for bit. (The CPU-vs-GPU comparison runs through the engine
//! API: `redlite_engine::parity`.)

use crate::decoder::{CudaDecoder, DecoderOptions, ExpertCacheOptions};
use crate::error::{ensure, Result};
use crate::expert_cache::CacheCounters;
use crate::ops::KvType;
use crate::tuning::CudaTuning;
use crate::Gpu;
use redlite_model::Model;

fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
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
        prefill_chunk: 0,
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
            let differing = rows_differing(&want, &got);
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

/// One batched prefill under a bounded cache against the batched prefill
/// at full residency ([`prefill_cache_sweep`]).
#[derive(Debug, Clone)]
pub struct PrefillCacheRun {
    pub slots_per_layer: usize,
    pub pregate: bool,
    pub chunk: usize,
    /// Prompt positions and greedy steps compared.
    pub steps: usize,
    /// Of those, the ones whose logits differ in any bit.
    pub steps_differing: usize,
    pub greedy_equal: bool,
    pub uploads: crate::prefill_experts::PrefillUploads,
}

impl PrefillCacheRun {
    pub fn ok(&self) -> bool {
        self.steps_differing == 0 && self.greedy_equal
    }
}

/// Every position's logits of one `prefill` of `prompt`, then `n_greedy`
/// greedy steps.
fn run_prefill(
    dec: &mut CudaDecoder,
    model: &Model,
    prompt: &[u32],
    n_greedy: usize,
    n_vocab: usize,
) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    ensure!(dec.batched_prefill(), "the decoder does not batch prompts");
    let flat = dec.prefill(model, prompt, true)?;
    let mut all: Vec<Vec<f32>> = flat.chunks(n_vocab).map(|r| r.to_vec()).collect();
    let mut ids = Vec::new();
    let mut last = all.last().cloned().unwrap_or_default();
    for _ in 0..n_greedy {
        let t = argmax(&last) as u32;
        ids.push(t);
        last = dec.step(model, t)?;
        all.push(last.clone());
    }
    Ok((all, ids))
}

/// The batched prefill (chunks of each of `chunks` tokens) with bounded
/// caches of `sizes` slots per layer, pre-gating off and on, against the
/// batched prefill with every expert resident: identical bit for bit at
/// every position and greedy step. A bounded cache changes only where the
/// routed GEMMs read an expert (a slot, or the staging image the chunk
/// uploaded it to), never the kernel, the tiles or the arithmetic; the
/// full-residency batched prefill is gated against token-by-token steps by
/// `redlite parity`'s prefill table.
#[allow(clippy::too_many_arguments)]
pub fn prefill_cache_sweep(
    gpu: &Gpu,
    model: &Model,
    prompt: &[u32],
    n_greedy: usize,
    int8: bool,
    sizes: &[usize],
    chunks: &[usize],
    tuning: &CudaTuning,
) -> Result<Vec<PrefillCacheRun>> {
    ensure!(!prompt.is_empty(), "empty prompt");
    let ctx = prompt.len() + n_greedy + 1;
    let n_vocab = model.n_vocab();
    let opts = |c: Option<ExpertCacheOptions>, chunk: usize| DecoderOptions {
        ctx,
        nsplit: None,
        int8,
        kv_type: KvType::default_for(int8),
        expert_cache: c,
        tuning: tuning.clone(),
        prefill_chunk: chunk,
    };
    let mut out = Vec::new();
    for &chunk in chunks {
        let mut full = CudaDecoder::new(gpu.side()?, model, &opts(None, chunk))?;
        let (want, want_ids) = run_prefill(&mut full, model, prompt, n_greedy, n_vocab)?;
        drop(full);
        for &slots in sizes {
            for pregate in [false, true] {
                let mut c = ExpertCacheOptions::new(slots);
                c.pregate = pregate;
                let mut dec = CudaDecoder::new(gpu.side()?, model, &opts(Some(c), chunk))?;
                let (got, ids) = run_prefill(&mut dec, model, prompt, n_greedy, n_vocab)?;
                let differing = rows_differing(&want, &got);
                out.push(PrefillCacheRun {
                    slots_per_layer: slots,
                    pregate,
                    chunk,
                    steps: want.len(),
                    steps_differing: differing,
                    greedy_equal: ids == want_ids,
                    uploads: dec.prefill_uploads(),
                });
            }
        }
    }
    Ok(out)
}

/// Logit rows of `got` that differ from `want`'s in any bit (a row of
/// another length counts, and so does each row one side lacks).
fn rows_differing(want: &[Vec<f32>], got: &[Vec<f32>]) -> usize {
    let differs = |(a, b): (&Vec<f32>, &Vec<f32>)| {
        a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
    };
    want.iter().zip(got).filter(|&p| differs(p)).count() + want.len().abs_diff(got.len())
}

#[cfg(test)]
mod tests {
    use super::rows_differing;

    #[test]
    fn rows_differ_by_any_bit_length_or_absence() {
        let want = vec![vec![1.0f32, 2.0], vec![3.0, 4.0], vec![5.0]];
        assert_eq!(rows_differing(&want, &want.clone()), 0);
        let mut got = want.clone();
        got[0][1] = f32::from_bits(2.0f32.to_bits() + 1);
        got[1].push(0.0);
        assert_eq!(rows_differing(&want, &got), 2);
        // -0.0 and 0.0 are equal as floats but not as bits.
        assert_eq!(rows_differing(&[vec![0.0]], &[vec![-0.0]]), 1);
        assert_eq!(rows_differing(&want, &want[..1]), 2);
    }
}
