//! MXFP4 quantization against the `gguf` package: `fixtures/iq/MXFP4.qin.f32`
//! and what `gguf.quants.quantize` makes of it (`MXFP4.qout.bin`, written by
//! `scripts/make_iq_fixtures.py`: 1024 blocks over 2^-20 .. 2^20 with exact
//! ties between codes). The bytes must be identical. The IQ types other
//! than MXFP4 have no quantizer (`quantize: None`).

use redlite_quant::{dequantize, kernels, quantize, GgmlType, QuantError};
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/iq")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn iq_mxfp4_quantize_matches_gguf_bytes() {
    let x: Vec<f32> = fixture("MXFP4.qin.f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want = fixture("MXFP4.qout.bin");
    let ty = GgmlType::MXFP4;
    assert_eq!(want.len(), x.len() / 32 * ty.type_size());
    // At an odd offset: the output blocks are written in place unaligned.
    let mut buf = vec![0u8; want.len() + 1];
    quantize(ty, &x, &mut buf[1..]).unwrap();
    for (i, (g, w)) in buf[1..]
        .chunks_exact(17)
        .zip(want.chunks_exact(17))
        .enumerate()
    {
        assert_eq!(g, w, "MXFP4 block {i}: input {:?}", &x[32 * i..32 * i + 32]);
    }
    // Round trip: every value within half a code step (at most 2 of the
    // doubled codes, times the half scale) of its input, except above the
    // largest code.
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &buf[1..], &mut y).unwrap();
    for (b, (xs, ys)) in buf[1..]
        .chunks_exact(17)
        .zip(x.chunks_exact(32).zip(y.chunks_exact(32)))
    {
        let d = f32::from_bits(if b[0] < 2 {
            0x0020_0000 << b[0]
        } else {
            (b[0] as u32 - 1) << 23
        });
        for (&a, &q) in xs.iter().zip(ys) {
            if a.abs() <= 12.0 * d {
                assert!((a - q).abs() <= 2.0 * d, "{a} -> {q} (half scale {d})");
            }
        }
    }
}

#[test]
fn iq_types_without_quantizer() {
    for ty in [
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        assert!(kernels(ty).unwrap().quantize.is_none());
        let mut out = vec![0u8; ty.type_size()];
        let x = vec![0f32; ty.block_size()];
        assert_eq!(quantize(ty, &x, &mut out), Err(QuantError::NoQuantizer(ty)));
    }
}
