//! `Batching::AsDecode` gives, for every weight format the registry has
//! kernels for, bit for bit the values of `n` single-token `matmul` calls:
//! the guarantee a speculative verify pass needs so that greedy speculation
//! returns plain decoding's tokens. The formats that `batch_matches_decode`
//! names run through the ordinary batched kernels, so for them the default
//! `Batching::Gemm` must match too.

use redlite_cpu::matmul::{matmul, matmul_batched, Batching};
use redlite_cpu::{Pool, QMatrix};
use redlite_gguf::GgmlType;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        (self.next() >> 24) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// `rows × cols` weights of `ty`: quantized random values where the format
/// has a quantizer; else random bytes, block by block, redrawn until the
/// block dequantizes to finite values (random f16 scale fields can be
/// infinities or NaNs, which no real file holds).
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    let bytes = ty.bytes_for(n as u64).unwrap() as usize;
    let k = redlite_quant::kernels(ty).unwrap();
    if ty == GgmlType::F32 {
        return (0..n).flat_map(|_| rng.f32().to_le_bytes()).collect();
    }
    if k.quantize.is_some() {
        let v: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        let mut out = vec![0u8; bytes];
        redlite_quant::quantize(ty, &v, &mut out).unwrap();
        return out;
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let mut out = Vec::with_capacity(bytes);
    let mut deq = vec![0f32; bs];
    for _ in 0..n / bs {
        loop {
            let b: Vec<u8> = (0..ts).map(|_| rng.next() as u8).collect();
            (k.dequantize)(&b, &mut deq);
            if deq.iter().all(|v| v.is_finite() && v.abs() < 1e4) {
                out.extend_from_slice(&b);
                break;
            }
        }
    }
    out
}

/// The formats with kernels that a weight matrix can use (activation-only
/// formats such as Q8_K are refused by the matmul, and skipped).
fn weight_formats() -> Vec<GgmlType> {
    GgmlType::ALL
        .iter()
        .copied()
        .filter(|&ty| redlite_quant::kernels(ty).is_ok())
        .collect()
}

#[test]
fn as_decode_equals_single_token_matmul_for_every_format() {
    let pool = Pool::new(2);
    let mut rng = Rng(5);
    let mut checked = Vec::new();
    for ty in weight_formats() {
        let cols = 512;
        // Not a multiple of the four-row panel or of the row chunks.
        let rows = 37;
        let data = weights(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, &data, rows, cols).unwrap();
        for n in [2usize, 3, 5, 8, 9, 17] {
            let xs: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut batch = vec![f32::NAN; n * rows];
            if matmul_batched(&pool, &w, &xs, n, &mut batch, Batching::AsDecode).is_err() {
                // A format the CPU matmul does not take as weights: the
                // single-token call must refuse it too.
                let mut one = vec![0f32; rows];
                assert!(matmul(&pool, &w, &xs[..cols], 1, &mut one).is_err(), "{ty}");
                continue;
            }
            for t in 0..n {
                let mut one = vec![f32::NAN; rows];
                matmul(&pool, &w, &xs[t * cols..(t + 1) * cols], 1, &mut one).unwrap();
                for r in 0..rows {
                    assert_eq!(
                        batch[t * rows + r].to_bits(),
                        one[r].to_bits(),
                        "{ty} n {n} token {t} row {r}: batch {} vs single {}",
                        batch[t * rows + r],
                        one[r]
                    );
                }
            }
            if !checked.contains(&ty) {
                checked.push(ty);
            }
        }
    }
    // The demo model's and the Qwen3-Next files' formats are among them.
    for ty in [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(checked.contains(&ty), "{ty} not checked ({checked:?})");
    }
}

/// For the formats whose batched kernels keep the decode order, the plain
/// batched matmul (prompt processing) equals single-token decoding too, at
/// the demo model's widths (896, 4864) and at batch sizes around the
/// kernels' four-record groups.
#[test]
fn batched_kernels_of_exact_formats_equal_decode() {
    let pool = Pool::new(2);
    let mut rng = Rng(6);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(redlite_quant::batch_matches_decode(ty), "{ty}");
        let widths: &[usize] = if ty.block_size() == 32 {
            &[896, 4864]
        } else {
            &[1024, 4864]
        };
        for &cols in widths {
            let rows = 45;
            let data = weights(&mut rng, ty, rows, cols);
            let w = QMatrix::new(ty, &data, rows, cols).unwrap();
            for n in [2usize, 4, 6, 7, 13, 19] {
                let xs: Vec<f32> = (0..n * cols).map(|_| rng.f32() * 3.0).collect();
                let mut batch = vec![f32::NAN; n * rows];
                matmul_batched(&pool, &w, &xs, n, &mut batch, Batching::Gemm).unwrap();
                for t in 0..n {
                    let mut one = vec![f32::NAN; rows];
                    matmul(&pool, &w, &xs[t * cols..(t + 1) * cols], 1, &mut one).unwrap();
                    for r in 0..rows {
                        assert_eq!(
                            batch[t * rows + r].to_bits(),
                            one[r].to_bits(),
                            "{ty} cols {cols} n {n} token {t} row {r}"
                        );
                    }
                }
            }
        }
    }
}
