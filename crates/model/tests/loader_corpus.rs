//! The loader fuzz target's corpus (`fuzz/corpus-loader/`) replayed through
//! the function the target runs, so the workspace's tests check what the
//! fuzzer found without a fuzzing toolchain. The parser's seeds
//! (`fuzz/seeds/`) go through it too.
//!
//! The seeds are written by the ignored test below:
//! `cargo test -p redlite-model --test loader_corpus -- --ignored`.

mod common;

use common::qwen2::Qwen2Tiny;
use common::Tiny;
use redlite_gguf::{GgufWriter, MetadataValue};
use redlite_model::check_model_bytes;
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(name)
}

fn files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn corpus_replays_without_a_panic() {
    let corpus = files(&dir("corpus-loader"));
    assert!(corpus.len() >= 20, "corpus has {} files", corpus.len());
    let mut ok = 0;
    for p in corpus.iter().chain(&files(&dir("seeds"))) {
        let bytes = std::fs::read(p).unwrap();
        if check_model_bytes(&bytes).is_ok() {
            ok += 1;
        }
    }
    // The valid seeds must pass: a checker that refused everything would
    // replay the corpus without a panic too.
    for name in ["qwen3next-small.gguf", "qwen2-small.gguf"] {
        let bytes = std::fs::read(dir("corpus-loader").join(name)).unwrap();
        check_model_bytes(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(ok >= 2);
}

/// Valid small models of both architectures, and variants with one
/// hostile value each (the cases of issue 17 and their neighbours).
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        (
            "qwen3next-small.gguf".to_string(),
            Tiny::small().bytes_with(|_| {}),
        ),
        (
            "qwen2-small.gguf".to_string(),
            Qwen2Tiny::default().bytes_edit(|_| {}),
        ),
    ];
    let cases: Vec<(&str, MetadataValue)> = vec![
        ("block_count", 1_000_000_000u64.into()),
        ("block_count", (1u64 << 62).into()),
        ("block_count", 0u32.into()),
        ("attention.key_length", ((1u64 << 62) + 1).into()),
        ("attention.head_count", 0u32.into()),
        ("attention.head_count_kv", 3u32.into()),
        ("rope.dimension_count", 6u32.into()),
        ("context_length", (1u64 << 62).into()),
        ("embedding_length", u64::MAX.into()),
        ("attention.layer_norm_rms_epsilon", f32::NAN.into()),
        ("ssm.state_size", 16384u32.into()),
        ("ssm.time_step_rank", 0u32.into()),
        ("expert_used_count", 3u32.into()),
        ("feed_forward_length", (1u64 << 40).into()),
    ];
    for (i, (key, v)) in cases.into_iter().enumerate() {
        let set = |arch: &str, w: &mut GgufWriter| w.add_kv(format!("{arch}.{key}"), v.clone());
        let slug = key.replace('.', "_");
        out.push((
            format!("qwen3next-{i:02}-{slug}.gguf"),
            Tiny::small().bytes_edit(|_| {}, |w| set("qwen3next", w)),
        ));
        out.push((
            format!("qwen2-{i:02}-{slug}.gguf"),
            Qwen2Tiny::default().bytes_edit(|w| set("qwen2", w)),
        ));
    }
    let nan_norm = Tiny::small().bytes_with(|w| {
        w.tensors.get_mut("blk.0.attn_norm.weight").unwrap().1[0] = f32::NAN;
    });
    out.push(("qwen3next-nan-norm.gguf".into(), nan_norm));
    let tokens: Vec<String> = (0..9).map(|i| format!("t{i}")).collect();
    out.push((
        "qwen3next-tokens-over-embedding.gguf".into(),
        Tiny::small().bytes_edit(
            |_| {},
            |w| w.add_kv("tokenizer.ggml.tokens", MetadataValue::string_array(tokens)),
        ),
    ));
    out
}

#[test]
#[ignore = "writes fuzz/corpus-loader/"]
fn write_seeds() {
    let d = dir("corpus-loader");
    std::fs::create_dir_all(&d).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(d.join(name), bytes).unwrap();
    }
}
