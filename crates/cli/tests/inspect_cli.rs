//! `redlite inspect` end to end: the report names what a file holds, and
//! `--dump` writes exactly what the `gguf` Python package's dequantizer
//! gives for the same blocks (the fixtures under crates/quant/tests/fixtures
//! were produced by that package: `scripts/make_quant_fixtures.py`).

use redlite_gguf::{GgmlType, GgufWriter, MetadataValue};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../quant/tests/fixtures")
        .join(name)
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("redlite-inspect-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn redlite(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(args)
        .output()
        .expect("running redlite")
}

/// A GGUF holding the gguf-package fixture blocks of each type as one tensor.
fn write_model(dir: &Path, types: &[GgmlType]) -> PathBuf {
    let mut w = GgufWriter::new();
    w.add_kv(
        "general.architecture",
        MetadataValue::String("qwen3next".into()),
    );
    w.add_kv("qwen3next.block_count", MetadataValue::U32(1));
    for &ty in types {
        let bytes = std::fs::read(fixture(&format!("{}.bin", ty.name()))).unwrap();
        let n = bytes.len() / ty.type_size() * ty.block_size();
        w.add_tensor(
            format!("blk.0.{}.weight", ty.name().to_lowercase()),
            vec![n as u64],
            ty,
            bytes,
        )
        .unwrap();
    }
    let path = dir.join("model.gguf");
    w.write(&path).unwrap();
    path
}

#[test]
fn dump_matches_the_gguf_package_for_every_fixture_type() {
    let dir = scratch("dump");
    let types: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|t| fixture(&format!("{}.bin", t.name())).exists())
        .collect();
    assert!(
        types.len() >= 20,
        "expected fixtures for at least 20 types, found {}",
        types.len()
    );
    let model = write_model(&dir, &types);
    for ty in types {
        let out = dir.join(format!("{}.f32", ty.name()));
        let name = format!("blk.0.{}.weight", ty.name().to_lowercase());
        let o = redlite(&[
            "inspect",
            model.to_str().unwrap(),
            "--tensor",
            &name,
            "--dump",
            out.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{ty}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = std::fs::read(&out).unwrap();
        let want = std::fs::read(fixture(&format!("{}.f32", ty.name()))).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}: dump length");
        // Bit-exact, except that NaN payloads need not match.
        for (i, (g, w)) in got.chunks(4).zip(want.chunks(4)).enumerate() {
            let g = f32::from_le_bytes(g.try_into().unwrap());
            let w = f32::from_le_bytes(w.try_into().unwrap());
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{ty}: element {i}: {g} vs {w}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn report_names_types_roles_and_missing_tensors() {
    let dir = scratch("report");
    let model = write_model(&dir, &[GgmlType::Q4_K, GgmlType::Q8_0]);
    let o = redlite(&["inspect", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("architecture:  qwen3next"), "{text}");
    assert!(text.contains("block_count"), "{text}");
    assert!(text.contains("Q4_K") && text.contains("Q8_0"), "{text}");

    let o = redlite(&[
        "inspect",
        model.to_str().unwrap(),
        "--tensor",
        "no.such.tensor",
        "--dump",
        dir.join("x.f32").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no.such.tensor"),
        "error must name the tensor: {err}"
    );
    assert!(!dir.join("x.f32").exists(), "no output file on failure");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn malformed_file_is_a_named_error_not_a_crash() {
    let dir = scratch("bad");
    let path = dir.join("bad.gguf");
    std::fs::write(
        &path,
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    .unwrap();
    let o = redlite(&["inspect", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "clean error exit, not a panic");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.gguf"), "error names the file: {err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The MTP fixture (llama.cpp's converter without `--no-mtp`): inspect
/// names the NextN block apart from the trunk, with as many tensors as the
/// fixture's manifest lists for it (from the `gguf` package's reader).
#[test]
fn inspect_names_the_nextn_block() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next-mtp");
    let Ok(manifest) = std::fs::read_to_string(dir.join("manifest.json")) else {
        eprintln!("skipped: no MTP fixture");
        return;
    };
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    let n_tensors = m["gguf"]["with_mtp"]["nextn_block_tensors"]
        .as_object()
        .unwrap()
        .len();
    let file = dir.join("tiny-qwen3next-mtp-f32.gguf");
    let out = redlite(&["inspect", file.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("mtp: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("1 NextN block(s) (blk.4, ")
            && line.contains(&format!("{n_tensors} tensors"))
            && line.contains("the trunk runs 4 of 5 blocks"),
        "{line}"
    );
    assert!(text.contains("mtp (nextn)"), "{text}");
    // Without the block: no such line.
    let out = redlite(&[
        "inspect",
        dir.join("tiny-qwen3next-nomtp-f32.gguf").to_str().unwrap(),
    ]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\nmtp: "));
}
