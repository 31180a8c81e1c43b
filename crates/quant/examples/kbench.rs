//! Kernel micro-benchmark: ns per weight row for `dot_fast` (one record)
//! and per row×record for `dot_multi` (8 records), L2-resident data, single
//! thread. Reports the minimum over passes (robust to a busy machine).
//! `cargo run --release -p redlite-quant --example kbench [cols]`

use redlite_quant::{kernels, quantize, quantize_activations, GgmlType};
use std::hint::black_box;
use std::time::Instant;

fn rand_f32(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn min_time(passes: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..passes)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cols_legacy: usize = args.get(1).map_or(896, |s| s.parse().unwrap());
    let rows = 256;
    let mut seed = 0x9E3779B97F4A7C15u64;
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let cols = if ty.block_size() == 256 {
            4864
        } else {
            cols_legacy
        };
        let k = kernels(ty).unwrap();
        let w = rand_f32(rows * cols, &mut seed);
        let mut wb = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
        quantize(ty, &w, &mut wb).unwrap();
        let rb = wb.len() / rows;
        let acts: Vec<u8> = (0..8)
            .flat_map(|_| quantize_activations(ty, &rand_f32(cols, &mut seed)).unwrap())
            .collect();
        let stride = acts.len() / 8;
        // 64 records: the prompt-processing shape (a block of a long prompt).
        let acts64: Vec<u8> = (0..64)
            .flat_map(|_| quantize_activations(ty, &rand_f32(cols, &mut seed)).unwrap())
            .collect();
        let single = min_time(40, || {
            for r in 0..rows {
                black_box((k.dot_fast)(&wb[r * rb..(r + 1) * rb], &acts[..stride]));
            }
        }) / rows as f64;
        let mut out = [0f32; 8];
        let multi = min_time(40, || {
            for r in 0..rows {
                redlite_quant::dot_multi(ty, &wb[r * rb..(r + 1) * rb], &acts, stride, &mut out)
                    .unwrap();
                black_box(&out);
            }
        }) / (rows * 8) as f64;
        let rows4 = redlite_quant::dot_rows_fn(ty).map(|f| {
            let mut out = vec![0f32; rows];
            min_time(40, || {
                f(&wb, rb, &acts[..stride], &mut out);
                black_box(&out);
            }) / rows as f64
        });
        let gemm8 = redlite_quant::gemm_fn(ty).map(|f| {
            let mut out = vec![0f32; rows * 8];
            min_time(40, || {
                f(&wb, rb, rows, &acts, stride, 8, &mut out);
                black_box(&out);
            }) / (rows * 8) as f64
        });
        let gemm64 = redlite_quant::gemm_fn(ty).map(|f| {
            let mut out = vec![0f32; rows * 64];
            min_time(10, || {
                f(&wb, rb, rows, &acts64, stride, 64, &mut out);
                black_box(&out);
            }) / (rows * 64) as f64
        });
        let blocks = (cols / ty.block_size()) as f64;
        if let Some(t) = gemm64 {
            println!(
                "{ty:>5} cols {cols}: gemm x64 {:.1} ns/row·tok ({:.2} ns/block)",
                t * 1e9,
                t * 1e9 / blocks
            );
        }
        if let Some(t) = gemm8 {
            println!(
                "{ty:>5} cols {cols}: gemm x8 {:.1} ns/row·tok ({:.2} ns/block)",
                t * 1e9,
                t * 1e9 / blocks
            );
        }
        if let Some(t) = rows4 {
            println!(
                "{ty:>5} cols {cols}: dot_rows {:.1} ns/row ({:.2} ns/block, {:.1} GB/s)",
                t * 1e9,
                t * 1e9 / blocks,
                rb as f64 / t / 1e9
            );
        }
        println!(
            "{ty:>5} cols {cols}: single {:.1} ns/row ({:.2} ns/block, {:.1} GB/s)  multi8 {:.1} ns/row·tok ({:.2} ns/block)  x{:.2}",
            single * 1e9,
            single * 1e9 / blocks,
            rb as f64 / single / 1e9,
            multi * 1e9,
            multi * 1e9 / blocks,
            single / multi
        );
    }
}
