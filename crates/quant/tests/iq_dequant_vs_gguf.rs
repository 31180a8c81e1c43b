//! Dequantization of the i-quant formats and MXFP4 against the `gguf`
//! Python package: `tests/fixtures/<TYPE>.bin` holds random valid blocks and
//! `<TYPE>.f32` what `gguf.quants.dequantize` makes of them (both written by
//! `scripts/make_quant_fixtures.py`). Every value must match bit for bit.

use redlite_quant::{dequantize, GgmlType};
use std::path::PathBuf;

const TYPES: &[GgmlType] = &[
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn iq_dequantize_matches_gguf_bit_for_bit() {
    for &ty in TYPES {
        let raw = fixture(&format!("{}.bin", ty.name()));
        let want: Vec<f32> = fixture(&format!("{}.f32", ty.name()))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(
            raw.len() / ty.type_size() * ty.block_size(),
            want.len(),
            "{ty}: fixture sizes disagree"
        );
        assert!(raw.len() / ty.type_size() >= 16, "{ty}: too few blocks");
        // At offset 0 and at an odd offset: blocks are read in place at any
        // alignment (the unaligned view of `cast_blocks`).
        for off in [0usize, 1, 3] {
            let mut buf = vec![0u8; raw.len() + off];
            buf[off..].copy_from_slice(&raw);
            let mut got = vec![0f32; want.len()];
            dequantize(ty, &buf[off..], &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} element {i} (block {}): got {g:e}, gguf {w:e}",
                    i / ty.block_size()
                );
            }
        }
    }
}
