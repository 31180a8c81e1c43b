//! The steps of `redlite bench model`'s tests on one sequence: bringing it
//! to a depth, timing decode and prompt runs, and what the runs print
//! (cache counters, the per-kernel profile).

use super::DepthFill;
use anyhow::{Context, Result};
use redlite_engine::{CacheCounters, Sequence};
use redlite_model::Logits;
use std::io::Write;
use std::time::{Duration, Instant};

/// Small, fast, seeded generator of token ids (wyrand).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) ^ t) as u64
    }

    pub(super) fn tokens(&mut self, n: usize, n_vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() % n_vocab as u64) as u32)
            .collect()
    }
}

/// Bring `seq` to `depth`: reset, then prefill `depth` random ids in
/// batches with progress on stderr (compute), or set the position (skip).
pub(super) fn fill(
    seq: &mut dyn Sequence,
    ubatch: usize,
    n_vocab: usize,
    depth: usize,
    how: DepthFill,
    rng: &mut Rng,
) -> Result<()> {
    seq.reset()?;
    if depth == 0 {
        return Ok(());
    }
    if how == DepthFill::Skip {
        seq.skip_to(depth)
            .context("--depth-fill skip on this backend")?;
        return Ok(());
    }
    let ids = rng.tokens(depth, n_vocab);
    let t0 = Instant::now();
    let mut last = Instant::now();
    for chunk in ids.chunks(ubatch.max(1)) {
        seq.prefill(chunk, Logits::Last)?;
        if last.elapsed() > Duration::from_secs(5) || seq.pos() == depth {
            let secs = t0.elapsed().as_secs_f64();
            let rate = seq.pos() as f64 / secs.max(1e-9);
            eprintln!(
                "redlite bench: fill d{depth}: {}/{depth} tokens, {secs:.0} s, {rate:.1} tok/s, eta {:.0} s",
                seq.pos(),
                (depth - seq.pos()) as f64 / rate.max(1e-9),
            );
            last = Instant::now();
        }
    }
    Ok(())
}

/// Time `n` single-token steps on `seq` (random ids). Steps slower than a
/// second are reported on stderr one by one (`LABEL step i/n: S s`), so a
/// run stopped from outside still shows how far it got.
pub(super) fn decode(
    seq: &mut dyn Sequence,
    n_vocab: usize,
    n: usize,
    rng: &mut Rng,
    label: &str,
    mut routes: Option<&mut dyn std::io::Write>,
) -> Result<f64> {
    let ids = rng.tokens(n, n_vocab);
    let t0 = Instant::now();
    let mut spent = 0f64;
    for (i, &id) in ids.iter().enumerate() {
        let ts = Instant::now();
        let l = seq.decode(id)?;
        std::hint::black_box(l);
        let step = ts.elapsed().as_secs_f64();
        if let Some(w) = routes.as_mut() {
            let t = Instant::now();
            let layers = seq.last_routes()?;
            writeln!(
                w,
                "{}",
                redlite_model::expertcache::sim::format_token(&layers)
            )?;
            spent += t.elapsed().as_secs_f64();
        }
        if step > 1.0 {
            eprintln!("redlite bench: {label} step {}/{n}: {step:.2} s", i + 1);
        }
    }
    Ok(t0.elapsed().as_secs_f64() - spent)
}

/// Time one prompt of `p` ids from position 0.
pub(super) fn prompt(
    seq: &mut dyn Sequence,
    n_vocab: usize,
    p: usize,
    rng: &mut Rng,
) -> Result<f64> {
    let ids = rng.tokens(p, n_vocab);
    seq.reset()?;
    let t0 = Instant::now();
    let l = seq.prefill(&ids, Logits::Last)?;
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(l);
    Ok(secs)
}

/// The counters' change over one run, in words (a device cache).
pub(super) fn cache_delta(
    before: Option<CacheCounters>,
    after: Option<CacheCounters>,
    tokens: usize,
) -> String {
    match (before, after) {
        (Some(b), Some(a)) => {
            let (hits, misses) = (a.hits - b.hits, a.misses - b.misses);
            format!(
                " | cache: {:.1}% hits ({hits} hits, {misses} misses), prefetched {} ({} used), {:.1} MiB/token copied",
                100.0 * hits as f64 / (hits + misses).max(1) as f64,
                a.prefetched - b.prefetched,
                a.prefetch_used - b.prefetch_used,
                (a.bytes_moved - b.bytes_moved) as f64 / tokens.max(1) as f64 / (1u64 << 20) as f64
            )
        }
        _ => String::new(),
    }
}

/// The profile as a markdown table (stdout).
pub(super) fn print_profile(p: &redlite_model::TokenProfile, depth: usize) {
    println!();
    println!(
        "where one decode token's time goes, depth {depth}: {:.1} µs with the profiling events, {:.1} µs without ({:.1} tok/s)",
        p.total_us,
        p.plain_us,
        1e6 / p.plain_us.max(1e-9)
    );
    println!();
    println!("| kernel class | µs per token | share | kernels per token | µs per kernel |");
    println!("|---|---:|---:|---:|---:|");
    let sum: f64 = p.rows.iter().map(|r| r.1).sum();
    let kernels: usize = p.rows.iter().map(|r| r.2).sum();
    for (label, us, k) in &p.rows {
        println!(
            "| {label} | {us:.1} | {:.1}% | {k} | {:.2} |",
            100.0 * us / sum.max(1e-9),
            us / (*k).max(1) as f64
        );
    }
    println!(
        "| all | {sum:.1} | 100% | {kernels} | {:.2} |",
        sum / kernels.max(1) as f64
    );
}

/// The prefill profile as a markdown table (stdout).
pub(super) fn print_prefill_profile(p: &redlite_model::TokenProfile, n: usize) {
    println!();
    println!(
        "where a {n}-token prompt's time goes: {:.1} µs a token with the stream drained after each step, {:.1} µs without ({:.1} tok/s)",
        p.total_us,
        p.plain_us,
        1e6 / p.plain_us.max(1e-9)
    );
    println!();
    println!("| step class | µs per prompt token | share | launches per prompt |");
    println!("|---|---:|---:|---:|");
    let sum: f64 = p.rows.iter().map(|r| r.1).sum();
    for (label, us, k) in &p.rows {
        println!(
            "| {label} | {us:.2} | {:.1}% | {k} |",
            100.0 * us / sum.max(1e-9)
        );
    }
    println!("| all | {sum:.2} | 100% | |");
}
