//! Quantizers: bit-identical to the gguf package where it has one (Q8_0,
//! Q4_0, Q4_1, Q5_0, Q5_1), error bounds for the K-quant searches (Q4_K,
//! Q6_K) and the Q8_K activation quantizer, and the gguf package's
//! dequantization of our Q4_K/Q6_K output.

mod common;

use common::{fixtures_dir, read_f32, Rng};
use redlite_quant::{dequantize, quantize, GgmlType};

#[test]
fn legacy_quantize_matches_gguf_bit_exact() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let dir = fixtures_dir();
        let x = read_f32(&dir.join(format!("{ty}.qin.f32")));
        let expected = std::fs::read(dir.join(format!("{ty}.qout.bin"))).unwrap();
        let mut got = vec![0u8; expected.len()];
        quantize(ty, &x, &mut got).unwrap();
        let ts = ty.type_size();
        for (b, (g, e)) in got.chunks(ts).zip(expected.chunks(ts)).enumerate() {
            assert_eq!(g, e, "{ty} block {b}");
        }
        // Unaligned destination.
        let mut shifted = vec![0u8; expected.len() + 1];
        quantize(ty, &x, &mut shifted[1..]).unwrap();
        assert_eq!(&shifted[1..], &expected[..], "{ty} unaligned");
    }
}

fn test_data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x = Vec::with_capacity(n);
    for b in 0..n / 256 {
        let scale = 2f32.powf(rng.range(-6.0, 4.0));
        for i in 0..256 {
            let v = rng.normal() * scale;
            // A few blocks with outliers, one all-zero, one constant.
            x.push(match b {
                0 => 0.0,
                1 => 0.25,
                2 if i % 37 == 0 => v * 20.0,
                _ => v,
            });
        }
    }
    x
}

fn rel_rms(ty: GgmlType, x: &[f32]) -> f64 {
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| ((a - b) as f64).powi(2))
        .sum();
    let sig: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    (err / sig).sqrt()
}

/// Round-trip RMS error relative to the data's RMS, per 256-element block
/// (so one loud block cannot hide a bad quiet one), on Gaussian data.
///
/// Bounds: a uniform quantizer with step Δ has RMS error Δ/√12. For Q4_K
/// the 16 levels span about the block's range (≈ 5σ for 32 Gaussian
/// samples), Δ ≈ σ/3, so ≈ 0.1σ; the weighted search lands near 0.09. Q6_K
/// spends 64 levels on ± the group's max (≈ ±2σ for 16 samples): Δ ≈ σ/16,
/// ≈ 0.02σ. Q8_K: 255 levels on ± the block max (≈ ±3σ): ≈ 0.007σ. The
/// bounds below leave ~25% headroom over what these quantizers measure.
#[test]
fn k_quant_round_trip_error() {
    let cases = [
        (GgmlType::Q4_K, 0.09),
        (GgmlType::Q6_K, 0.023),
        (GgmlType::Q8_K, 0.009),
        // Sanity anchors: the simpler formats do worse than Q4_K/Q6_K.
        (GgmlType::Q4_0, 0.11),
        (GgmlType::Q8_0, 0.0066),
    ];
    let x = test_data(7, 256 * 64);
    for (ty, bound) in cases {
        let mut worst = 0f64;
        let mut total = 0f64;
        // Blocks 0..3 are the zero, constant and outlier blocks.
        let blocks = x.chunks(256).skip(3).collect::<Vec<_>>();
        for blk in &blocks {
            let e = rel_rms(ty, blk);
            worst = worst.max(e);
            total += e;
        }
        eprintln!(
            "{ty}: per-block relative RMS error: mean {:.4}, worst {worst:.4} (bound {bound})",
            total / blocks.len() as f64
        );
        assert!(worst < bound, "{ty}: relative RMS error {worst} ≥ {bound}");
        // Zero and constant blocks come back exactly or very close.
        let z = rel_rms(ty, &x[..256]);
        assert!(z.is_nan() || z == 0.0, "{ty}: zero block");
        assert!(rel_rms(ty, &x[256..512]) < 1e-3, "{ty}: constant block");
        // Outliers (×20 every 37th value) stretch the scale; the error is
        // still bounded relative to the (outlier-dominated) RMS.
        let o = rel_rms(ty, &x[512..768]);
        eprintln!("{ty}: outlier block relative RMS error {o:.4}");
        assert!(o < 4.0 * bound, "{ty}: outlier block {o}");
    }
    let q4k = rel_rms(GgmlType::Q4_K, &x[768..]);
    let q40 = rel_rms(GgmlType::Q4_0, &x[768..]);
    assert!(q4k < q40, "Q4_K ({q4k}) should beat Q4_0 ({q40})");
}

/// Our Q4_K/Q6_K output, dequantized by the gguf package
/// (`fixtures/roundtrip/<TYPE>.f32`), equals our own dequantization.
///
/// The `.bin` files are our quantizer's output on `test_data(11, 2048)`. If
/// the quantizer changes on purpose, regenerate with
/// `REDLITE_WRITE_FIXTURES=1 cargo test -p redlite-quant --test quantize`
/// then `.venv/bin/python scripts/make_quant_fixtures.py --dequant-dir
/// crates/quant/tests/fixtures/roundtrip`.
#[test]
fn k_quant_output_dequantized_by_gguf() {
    let dir = fixtures_dir().join("roundtrip");
    let x = test_data(11, 2048);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
        quantize(ty, &x, &mut q).unwrap();
        let bin = dir.join(format!("{ty}.bin"));
        if std::env::var_os("REDLITE_WRITE_FIXTURES").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&bin, &q).unwrap();
            eprintln!(
                "wrote {}; now run make_quant_fixtures.py --dequant-dir",
                bin.display()
            );
            continue;
        }
        let committed = std::fs::read(&bin).unwrap();
        assert!(
            committed == q,
            "{ty}: quantizer output changed; regenerate the round-trip fixtures (see doc comment)"
        );
        let expected = read_f32(&bin.with_extension("f32"));
        let mut y = vec![0f32; x.len()];
        dequantize(ty, &q, &mut y).unwrap();
        for (i, (a, b)) in y.iter().zip(&expected).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty} element {i}: ours {a}, gguf {b}"
            );
        }
    }
}
