//! Dequantization against the `gguf` Python package, bit for bit.
//!
//! Fixtures come from `scripts/make_quant_fixtures.py`: `<TYPE>.bin` holds
//! random valid blocks and `<TYPE>.f32` what `gguf.quants.dequantize` made of
//! them. Every fixture present is checked for every type the registry
//! supports; a supported type without a fixture fails (unless the gguf
//! package cannot dequantize it at all).

mod common;

use common::{fixtures_dir, read_f32};
use redlite_quant::{dequantize, kernels, GgmlType};

/// Types the gguf package has no dequantizer for (activation formats).
const NOT_IN_GGUF: &[GgmlType] = &[GgmlType::Q8_K, GgmlType::Q8_1];

fn check(ty: GgmlType, raw: &[u8], expected: &[f32]) {
    let mut got = vec![f32::NAN; expected.len()];
    dequantize(ty, raw, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{ty}: element {i} (block {}): got {g:e}, gguf {e:e}",
            i / ty.block_size()
        );
    }
}

#[test]
fn dequant_matches_gguf_bit_exact() {
    let dir = fixtures_dir();
    let mut checked = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_str().unwrap();
        let Some(stem) = name.strip_suffix(".bin") else {
            continue;
        };
        if stem.contains('.') {
            continue; // quantize fixtures (<TYPE>.qout.bin)
        }
        let Some(ty) = GgmlType::from_name(stem) else {
            eprintln!("skip {name}: type unknown to redlite-gguf");
            continue;
        };
        if kernels(ty).is_err() {
            eprintln!("skip {name}: {ty} not supported by this build yet");
            continue;
        }
        let raw = std::fs::read(&path).unwrap();
        let expected = read_f32(&path.with_extension("f32"));
        check(ty, &raw, &expected);
        // Again from an odd address: block views must not need alignment.
        let mut shifted = vec![0u8; raw.len() + 1];
        shifted[1..].copy_from_slice(&raw);
        check(ty, &shifted[1..], &expected);
        checked.push(ty);
    }
    for &ty in GgmlType::ALL {
        if kernels(ty).is_ok() && !NOT_IN_GGUF.contains(&ty) {
            assert!(
                checked.contains(&ty),
                "{ty} is supported but has no fixture: run scripts/make_quant_fixtures.py {ty}"
            );
        }
    }
    eprintln!("checked: {checked:?}");
}
