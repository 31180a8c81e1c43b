//! Long-position parity on the tiny random Qwen3-Next (F32 file) against
//! llama.cpp: one 32,768-token sequence, the full logits of the last 4
//! positions of the 4,096, 16,384 and 32,768 prefixes
//! (`tests/fixtures/qwen3next/llama_f32_long_logits.npz`, made by
//! `scripts/fixtures/qwen3next/make_long_fixture.sh` with llama.cpp 0c1e570,
//! F32 KV cache, flash attention off). Short prompts cannot show a RoPE table,
//! a softmax sum or a recurrent state that drifts with the position; these
//! can.

mod common;

use common::npy::{read_npz, Array};
use redlite_gguf::{GgufFile, GgufWriter};
use redlite_model::{LoadOptions, Logits, Model};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MODEL_FILE: &str = "tiny-qwen3next-f32.gguf";
const FIXTURE_FILE: &str = "llama_f32_long_logits.npz";

/// Bound on max |Δlogit| per checked prefix, engine vs llama.cpp, over the
/// 4 rows x 512 logits kept for it (logits within ±8, std 2.0). Measured
/// (this test's output, 2026-12-03, 2 threads): 3.10e-6 at 4,096, 2.62e-6 at
/// 16,384, 2.74e-6 at 32,768; argmax 4/4 at each. The bound is about 6x the
/// largest of those, and 1/100 of what a 1% error in the RoPE base or one
/// token left out 3,068 positions back gives at 4,096 (2.2e-3 and 3.1e-3,
/// the two tests at the end).
const MAX_ABS: [(usize, f32); 3] = [(4096, 2e-5), (16384, 2e-5), (32768, 2e-5)];

/// The fixture folder. The long-position files are committed, so a missing
/// one fails the test rather than skipping it.
fn fixture_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next");
    for f in [MODEL_FILE, FIXTURE_FILE] {
        assert!(
            d.join(f).exists(),
            "missing {}/{f} (made by scripts/fixtures/qwen3next/make_long_fixture.sh)",
            d.display()
        );
    }
    d
}

struct Reference {
    tokens: Vec<u32>,
    positions: Vec<usize>,
    /// `positions.len() x vocab`, row-major.
    logits: Array,
}

fn reference(d: &Path) -> Reference {
    let mut z: HashMap<String, Array> = read_npz(&d.join(FIXTURE_FILE));
    let take = |z: &mut HashMap<String, Array>, k: &str| {
        z.remove(k)
            .unwrap_or_else(|| panic!("{FIXTURE_FILE}: no member {k}"))
    };
    let tokens = take(&mut z, "tokens")
        .data
        .iter()
        .map(|&t| t as u32)
        .collect();
    let positions = take(&mut z, "positions")
        .data
        .iter()
        .map(|&p| p as usize)
        .collect();
    let logits = take(&mut z, "logits");
    Reference {
        tokens,
        positions,
        logits,
    }
}

/// The generator `llama_long.cpp` documents; the test checks the stored ids
/// against it so the fixture and its script cannot drift apart unnoticed.
fn lcg_tokens(seed: u64, n: usize, vocab: u64) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab) as u32
        })
        .collect()
}

fn load(f: GgufFile) -> Model {
    Model::load(
        Arc::new(f),
        LoadOptions {
            threads: 2,
            reference: false,
            ubatch: 512,
        },
    )
    .unwrap()
}

/// Runs `tokens[..end]` through a fresh session and returns the logits of
/// every reference position below `end`, in order.
fn engine_rows(model: &Model, r: &Reference, end: usize) -> Vec<f32> {
    let mut s = model.new_session(end);
    let mut done = 0;
    let mut out = Vec::new();
    for &p in r.positions.iter().filter(|&&p| p < end) {
        if p > done {
            s.forward(model, &r.tokens[done..p], Logits::Last).unwrap();
        }
        out.extend(s.forward(model, &r.tokens[p..=p], Logits::Last).unwrap());
        done = p + 1;
    }
    out
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .unwrap()
        .0
}

/// max |Δ| and argmax agreements over the rows of one prefix.
fn compare(reference: &[f32], got: &[f32], vocab: usize) -> (f32, usize, usize) {
    assert_eq!(reference.len(), got.len());
    let max = reference
        .iter()
        .zip(got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
    let rows = reference.len() / vocab;
    let agree = reference
        .chunks(vocab)
        .zip(got.chunks(vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    (max, agree, rows)
}

/// Logit rows kept per prefix: its last `ROWS` positions.
const ROWS: usize = 4;

/// The positions `llama_long.cpp` keeps for `MAX_ABS`'s prefixes, in order.
fn expected_positions() -> Vec<usize> {
    MAX_ABS
        .iter()
        .flat_map(|&(prefix, _)| prefix - ROWS..prefix)
        .collect()
}

/// Reference rows of the `i`-th prefix of `MAX_ABS`.
fn prefix_rows(r: &Reference, i: usize, vocab: usize) -> &[f32] {
    &r.logits.data[i * ROWS * vocab..(i + 1) * ROWS * vocab]
}

#[test]
fn f32_logits_match_llama_cpp_at_4k_16k_32k() {
    let d = fixture_dir();
    let r = reference(&d);
    let vocab = r.logits.shape[1];
    assert_eq!(r.tokens, lcg_tokens(22, 32768, vocab as u64));
    assert_eq!(r.positions, expected_positions());
    let model = load(GgufFile::open(d.join(MODEL_FILE)).unwrap());
    assert_eq!(model.n_vocab(), vocab);
    let t0 = std::time::Instant::now();
    let got = engine_rows(&model, &r, r.tokens.len());
    println!(
        "engine: {} tokens in {:.1} s",
        r.tokens.len(),
        t0.elapsed().as_secs_f64()
    );
    let measured: Vec<(usize, f32, f32, usize, usize)> = MAX_ABS
        .iter()
        .enumerate()
        .map(|(i, &(prefix, bound))| {
            let want = prefix_rows(&r, i, vocab);
            let ours = &got[i * ROWS * vocab..(i + 1) * ROWS * vocab];
            let (max, agree, rows) = compare(want, ours, vocab);
            println!(
                "prefix {prefix}: max |Δlogit| {max:.3e} (bound {bound:.1e}); argmax {agree}/{rows}"
            );
            (prefix, bound, max, agree, rows)
        })
        .collect();
    for (prefix, bound, max, agree, rows) in measured {
        assert_eq!(agree, rows, "prefix {prefix}: argmax differs");
        assert!(
            max <= bound,
            "prefix {prefix}: max |Δlogit| {max} > {bound}"
        );
    }
}

/// The check can fail: the same model with its RoPE base 1% off (read from
/// the file, so the engine's tables follow it) is far outside the bound
/// already at the 4,096 prefix.
#[test]
fn perturbed_rope_base_is_caught_at_4k() {
    let d = fixture_dir();
    let r = reference(&d);
    let vocab = r.logits.shape[1];
    let f = GgufFile::open(d.join(MODEL_FILE)).unwrap();
    let key = "qwen3next.rope.freq_base";
    let base = f.metadata().get_f32(key).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add_kv(k, v.clone());
    }
    w.add_kv(key, base * 1.01);
    for t in f.tensors() {
        let data = f.tensor(&t.name).unwrap().data;
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, data)
            .unwrap();
    }
    let model = load(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap());
    let got = engine_rows(&model, &r, 4096);
    assert_eq!(r.positions, expected_positions());
    assert_eq!(MAX_ABS[0].0, 4096);
    let want = prefix_rows(&r, 0, vocab);
    let (max, agree, rows) = compare(want, &got, vocab);
    let bound = MAX_ABS[0].1;
    println!(
        "RoPE base {base} -> {}: prefix 4096 max |Δlogit| {max:.3e} (bound {bound:.1e}); argmax {agree}/{rows}",
        base * 1.01
    );
    assert!(max > 50.0 * bound, "{max}");
}

/// The check sees far-back context: the 4,096 prefix with the one token at
/// position 1,024 left out (3,068 positions before the checked rows; every
/// later token one position earlier) is far outside the bound.
#[test]
fn one_lost_token_3k_back_is_caught() {
    let d = fixture_dir();
    let r = reference(&d);
    let vocab = r.logits.shape[1];
    assert_eq!(r.positions, expected_positions());
    assert_eq!(MAX_ABS[0].0, 4096);
    let model = load(GgufFile::open(d.join(MODEL_FILE)).unwrap());
    let mut toks: Vec<u32> = r.tokens[..4096].to_vec();
    toks.remove(1024);
    let (head, checked) = toks.split_at(toks.len() - ROWS);
    let mut s = model.new_session(toks.len());
    s.forward(&model, head, Logits::Last).unwrap();
    let mut got = Vec::new();
    for &t in checked {
        got.extend(s.forward(&model, &[t], Logits::Last).unwrap());
    }
    let (max, agree, rows) = compare(prefix_rows(&r, 0, vocab), &got, vocab);
    let bound = MAX_ABS[0].1;
    println!(
        "token 1024 left out: prefix 4096 max |Δlogit| {max:.3e} (bound {bound:.1e}); argmax {agree}/{rows}"
    );
    assert!(max > 50.0 * bound, "{max}");
}
