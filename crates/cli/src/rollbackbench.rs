//! `redlite bench rollback`: what undoing rejected draft tokens costs a
//! DeltaNet layer on the CPU, for the two exact schemes.
//!
//! * snapshots: the verify pass copies the recurrent state before it and
//!   after each of its tokens but the last (k + 1 copies for k drafts), and
//!   a rollback copies
//!   the kept position's snapshot back;
//! * replay (what `Session::verify` does): the pass copies the state once,
//!   before it, and keeps the recurrence's per-token inputs; a rollback to
//!   `keep` tokens copies the start state back and runs the recurrence over
//!   the kept tokens only.
//!
//! Shapes default to Qwen3-Next-80B's (32 value heads of 128 × 128, 36
//! DeltaNet layers). Medians of `--passes` runs, all threads.

use anyhow::Result;
use redlite_cpu::deltanet::{gdn_recurrent, GdnInputs, GdnShape};
use redlite_cpu::Pool;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct RollbackBenchArgs {
    #[arg(long, default_value_t = 16)]
    pub k_heads: usize,
    #[arg(long, default_value_t = 32)]
    pub v_heads: usize,
    #[arg(long, default_value_t = 128)]
    pub dk: usize,
    #[arg(long, default_value_t = 128)]
    pub dv: usize,
    /// DeltaNet layers (the per-pass totals are per layer times this).
    #[arg(long, default_value_t = 36)]
    pub layers: usize,
    /// Draft lengths.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub k: Vec<usize>,
    #[arg(long, default_value_t = 20)]
    pub passes: usize,
    /// Worker threads (0: all cores).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(a: RollbackBenchArgs) -> Result<()> {
    let pool = Pool::new(a.threads);
    let s = GdnShape {
        n_k_heads: a.k_heads,
        n_v_heads: a.v_heads,
        dk: a.dk,
        dv: a.dv,
    };
    let kmax = a.k.iter().copied().max().unwrap_or(1) + 1;
    let mut seed = 1u64;
    let mut rnd = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let (kd, vd) = (s.n_v_heads * s.dk, s.n_v_heads * s.dv);
    let q = rnd(kmax * s.n_k_heads * s.dk, 0.1);
    let k = rnd(kmax * s.n_k_heads * s.dk, 0.1);
    let v = rnd(kmax * vd, 1.0);
    let g: Vec<f32> = rnd(kmax * s.n_v_heads, 0.1)
        .iter()
        .map(|x| -x.abs())
        .collect();
    let beta: Vec<f32> = rnd(kmax * s.n_v_heads, 1.0)
        .iter()
        .map(|x| x.abs())
        .collect();
    let _ = kd;
    let state0 = rnd(s.state_len(), 0.1);
    let mut live = state0.clone();
    let mut snaps: Vec<Vec<f32>> = vec![state0.clone(); kmax];
    let mut start = state0.clone();
    let mut out = vec![0f32; kmax * vd];
    let inputs = |n: usize| GdnInputs {
        q: &q[..n * s.n_k_heads * s.dk],
        k: &k[..n * s.n_k_heads * s.dk],
        v: &v[..n * vd],
        g: &g[..n * s.n_v_heads],
        beta: &beta[..n * s.n_v_heads],
    };
    let state_mib = s.state_len() as f64 * 4.0 / (1 << 20) as f64;
    println!(
        "DeltaNet state {state_mib:.2} MiB a layer, {} layers, {} threads; µs per verify pass and rollback, all layers",
        a.layers,
        pool.threads()
    );
    println!("| k drafts | kept | snapshots: copies in the pass | snapshots: rollback | replay: copy in the pass | replay: rollback (copy + recurrence over kept) | snapshots total | replay total |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &kk in &a.k {
        let mut keeps = vec![0, kk / 2, kk.saturating_sub(1)];
        keeps.dedup();
        for keep in keeps {
            let mut t_snap = Vec::new();
            let mut t_back = Vec::new();
            let mut t_copy = Vec::new();
            let mut t_replay = Vec::new();
            for _ in 0..a.passes {
                // Snapshots: k copies during the pass.
                let t0 = Instant::now();
                for snap in snaps.iter_mut().take(kk + 1) {
                    snap.copy_from_slice(&live);
                }
                t_snap.push(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                live.copy_from_slice(&snaps[keep]);
                t_back.push(t0.elapsed().as_secs_f64());
                // Replay: one copy before the pass, then the rollback.
                let t0 = Instant::now();
                start.copy_from_slice(&live);
                t_copy.push(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                live.copy_from_slice(&start);
                if keep > 0 {
                    gdn_recurrent(&pool, &s, &inputs(keep), &mut live, &mut out[..keep * vd])?;
                }
                t_replay.push(t0.elapsed().as_secs_f64());
                live.copy_from_slice(&state0);
            }
            let us = |v: Vec<f64>| median(v) * 1e6 * a.layers as f64;
            let (a1, a2, b1, b2) = (us(t_snap), us(t_back), us(t_copy), us(t_replay));
            println!(
                "| {kk} | {keep} | {a1:.0} | {a2:.0} | {b1:.0} | {b2:.0} | {:.0} | {:.0} |",
                a1 + a2,
                b1 + b2
            );
        }
    }
    Ok(())
}
