//! `redlite bench quant`: throughput of each block format's dot kernel, so
//! later work has a baseline. Weights are random bytes (the kernels' speed
//! does not depend on the values), activations a random vector quantized to
//! the format's activation type. Reports GB/s of weight bytes read, single
//! threaded and on all threads, as the median of several timed passes after
//! a warm-up pass.

use anyhow::Result;
use redlite_gguf::GgmlType;
use std::time::Instant;

/// One row of the benchmark table.
pub struct QuantBenchRow {
    pub ty: GgmlType,
    pub weight_bytes: usize,
    pub gbps_one_thread: f64,
    pub gbps_all_threads: f64,
    pub threads: usize,
}

/// A small xorshift generator: the benchmark needs cheap bytes, not quality.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random weight bytes with every 16-bit word's exponent bits held in the
/// normal range, so that f16 scales (wherever a format keeps them) are
/// finite normal numbers and no kernel runs into denormal slow paths.
fn weight_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift(seed | 1);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        let mut w = rng.next();
        // Clear bit 14 of each 16-bit half word: f16 exponent ≤ 0b01111 → |x| < 2, and set bit 12 so it is not subnormal.
        w &= 0xBFFF_BFFF_BFFF_BFFF;
        w |= 0x1000_1000_1000_1000;
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn run_pass(
    ty: GgmlType,
    weights: &[u8],
    row_bytes: usize,
    act: &[u8],
    threads: usize,
) -> Result<f64> {
    let n_rows = weights.len() / row_bytes;
    let per = n_rows.div_ceil(threads);
    // Sweep the matrix enough times that one pass reads >= 256 MiB, so the
    // pass takes tens of milliseconds and thread start-up does not dominate.
    let sweeps = ((256usize << 20) / weights.len().max(1)).max(1);
    let start = Instant::now();
    let sums: Vec<Result<f32, redlite_quant::QuantError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let rows = (t * per)..((t + 1) * per).min(n_rows);
                s.spawn(move || {
                    let mut acc = 0f32;
                    for r in (0..sweeps).flat_map(|_| rows.clone()) {
                        acc += redlite_quant::dot(
                            ty,
                            &weights[r * row_bytes..(r + 1) * row_bytes],
                            act,
                        )?;
                    }
                    Ok(acc)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    });
    for s in sums {
        std::hint::black_box(s?);
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((weights.len() * sweeps) as f64 / secs / 1e9)
}

/// Benchmark the dot kernel of each type in `types`.
pub fn bench(
    types: &[GgmlType],
    row_len: usize,
    n_rows: usize,
    passes: usize,
    threads: usize,
) -> Result<Vec<QuantBenchRow>> {
    let mut rows = Vec::new();
    for &ty in types {
        if redlite_quant::kernels(ty).is_err() {
            continue;
        }
        let row_bytes = ty
            .bytes_for(row_len as u64)
            .ok_or_else(|| anyhow::anyhow!("row length {row_len} is not whole {ty} blocks"))?
            as usize;
        let weights = weight_bytes(row_bytes * n_rows, 0x5EED ^ ty as u64);
        let mut rng = XorShift(42);
        let x: Vec<f32> = (0..row_len)
            .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let act = redlite_quant::quantize_activations(ty, &x)?;
        let mut one = Vec::new();
        let mut all = Vec::new();
        run_pass(ty, &weights, row_bytes, &act, 1)?;
        for _ in 0..passes {
            one.push(run_pass(ty, &weights, row_bytes, &act, 1)?);
            all.push(run_pass(ty, &weights, row_bytes, &act, threads)?);
        }
        rows.push(QuantBenchRow {
            ty,
            weight_bytes: weights.len(),
            gbps_one_thread: median(one),
            gbps_all_threads: median(all),
            threads,
        });
    }
    Ok(rows)
}
