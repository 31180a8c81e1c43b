//! Qwen3-Next's MTP (NextN) head on `tests/fixtures/qwen3next-mtp/` (made by
//! `scripts/fixtures/qwen3next/make_mtp_fixture.sh`): a tiny random model
//! converted by llama.cpp's converter with its MTP block and with
//! `--no-mtp`, and llama.cpp's own trunk and MTP outputs on it (its
//! `LLM_GRAPH_TYPE_DECODER_MTP` graph, driven as its draft-mtp code does);
//! also the MTP block assembled from transformers' own modules.
//!
//! Bounds: every file is F32 and both engines compute in f32 with
//! different summation orders, so logits differ by float rounding only.
//! Measured on this fixture (docs/mtp.md has the command): max |Δlogit|
//! 2.4e-6 for the trunk, 2.4e-6 for the MTP head on llama.cpp's own hidden
//! rows and on ours, 1.9e-6 for the chained steps; max KL 3.8e-13; argmax
//! 64/64 everywhere. The gates below are 1e-4 in |Δlogit| (40× the worst
//! measured, 5e-6 of the logit range of ~20) and 1e-9 in KL, far below what
//! one wrong weight, a swapped concat or a missing norm gives (those move
//! logits by O(1): with the concat halves swapped, these tests fail on the
//! first argmax; the NextN block run as a fifth trunk layer moves the
//! trunk's logits by 1.7).
//! Argmax must agree wherever llama.cpp's top-2 margin exceeds the |Δ|
//! gate (the smallest MTP margin here is 4.1e-4).

mod common;

use common::npy::{read_npy, Array};
use redlite_gguf::{GgufFile, GgufWriter, MetadataArray, MetadataValue, ValueType};
use redlite_model::{LoadOptions, Logits, Model, ModelError, MtpState};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MTP_FILE: &str = "tiny-qwen3next-mtp-f32.gguf";
const NOMTP_FILE: &str = "tiny-qwen3next-nomtp-f32.gguf";
/// The |Δlogit| gate (see the module doc).
const MAX_ABS: f32 = 1e-4;
/// The KL gate per position.
const MAX_KL: f64 = 1e-9;

fn fixture_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next-mtp");
    if d.join("manifest.json").exists() {
        Some(d)
    } else {
        eprintln!("skipped: no {}/manifest.json", d.display());
        None
    }
}

fn manifest(d: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(d.join("manifest.json")).unwrap()).unwrap()
}

fn tokens(m: &Value) -> Vec<u32> {
    m["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn load_file(f: GgufFile) -> Result<Model, ModelError> {
    Model::load(
        Arc::new(f),
        LoadOptions {
            threads: 2,
            reference: false,
            ubatch: 512,
        },
    )
}

fn load(d: &Path, name: &str) -> Model {
    load_file(GgufFile::open(d.join(name)).unwrap()).unwrap()
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .unwrap()
        .0
}

fn margin(x: &[f32]) -> f32 {
    let mut s = x.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}

/// KL(p_ref || p_got) of two logit rows, in f64.
fn kl(r: &[f32], g: &[f32]) -> f64 {
    let lsm = |x: &[f32]| {
        let m = x.iter().fold(f64::MIN, |a, &v| a.max(v as f64));
        let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
        x.iter()
            .map(|&v| v as f64 - m - s.ln())
            .collect::<Vec<f64>>()
    };
    let (lp, lq) = (lsm(r), lsm(g));
    lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum()
}

/// Compare logit rows with llama.cpp's: prints the numbers, checks the
/// gates, returns the max |Δ|.
fn check_logits(what: &str, reference: &[f32], got: &[f32], vocab: usize) -> f32 {
    assert_eq!(reference.len(), got.len(), "{what}: row count");
    let (mut max_abs, mut max_kl, mut agree, mut n, mut n_checked) = (0f32, 0f64, 0, 0, 0);
    for (r, g) in reference.chunks(vocab).zip(got.chunks(vocab)) {
        n += 1;
        let d = r
            .iter()
            .zip(g)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
        max_abs = max_abs.max(d);
        max_kl = max_kl.max(kl(r, g));
        if argmax(r) == argmax(g) {
            agree += 1;
        } else {
            assert!(
                margin(r) <= MAX_ABS,
                "{what}: row {} argmax {} vs llama.cpp's {} with a margin of {}",
                n - 1,
                argmax(g),
                argmax(r),
                margin(r)
            );
        }
        if margin(r) > MAX_ABS {
            n_checked += 1;
        }
    }
    println!(
        "{what}: {n} rows, max |Δlogit| {max_abs:.3e}, max KL {max_kl:.3e}, argmax {agree}/{n} ({n_checked} rows with a margin above the gate)"
    );
    assert!(max_abs <= MAX_ABS, "{what}: max |Δlogit| {max_abs}");
    assert!(max_kl <= MAX_KL, "{what}: max KL {max_kl}");
    max_abs
}

/// The trunk's hidden rows shifted down one position: row p is the hidden
/// state of p-1, zeros at 0 (what the MTP head takes at position p).
fn shifted(h: &[f32], d: usize) -> Vec<f32> {
    let mut s = vec![0f32; h.len()];
    s[d..].copy_from_slice(&h[..h.len() - d]);
    s
}

#[test]
fn trunk_is_the_same_with_and_without_the_mtp_block() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m);
    let with = load(&d, MTP_FILE);
    let without = load(&d, NOMTP_FILE);
    // The MTP file's block_count counts the NextN block; the trunk does not.
    assert_eq!(with.arch().n_layer(), 4);
    assert_eq!(without.arch().n_layer(), 4);
    assert_eq!(with.mtp_heads().len(), 1);
    assert_eq!(with.mtp().unwrap().block, 4);
    assert!(without.mtp().is_none());
    assert_eq!(with.new_session(0).states().len(), 4);
    let (mut a, mut b) = (with.new_session(0), without.new_session(0));
    let la = a.forward(&with, &toks, Logits::All).unwrap();
    let lb = b.forward(&without, &toks, Logits::All).unwrap();
    // Same weights, same trunk: the same logits bit for bit.
    assert_eq!(la, lb, "the MTP block changed the trunk's logits");
    let reference: Array = read_npy(&d.join("llama_trunk_logits.npy"));
    check_logits(
        "trunk vs llama.cpp",
        &reference.data,
        &la,
        reference.shape[1],
    );
}

#[test]
fn mtp_head_matches_llama_cpp() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m);
    let model = load(&d, MTP_FILE);
    let head = model.mtp().unwrap();
    let dim = model.arch().n_embd();
    let ref_h: Array = read_npy(&d.join("llama_trunk_hidden.npy"));
    let ref_mtp: Array = read_npy(&d.join("llama_mtp_logits.npy"));
    let ref_mtp_h: Array = read_npy(&d.join("llama_mtp_hidden.npy"));
    let vocab = ref_mtp.shape[1];

    // Our trunk's hidden rows are llama.cpp's h_nextn (after output_norm).
    let mut s = model.new_session(0);
    s.set_keep_hidden(true);
    s.forward(&model, &toks, Logits::Last).unwrap();
    let ours_h = s.last_hidden().to_vec();
    assert_eq!(ours_h.len(), toks.len() * dim);
    let dh = ours_h
        .iter()
        .zip(&ref_h.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
    println!("trunk hidden vs llama.cpp h_nextn: max |Δ| {dh:.3e}");
    assert!(dh <= MAX_ABS, "trunk hidden rows: max |Δ| {dh}");

    // The head alone, on llama.cpp's own hidden rows.
    let mut st = head.new_state(toks.len());
    let out = head
        .forward(
            &model,
            &mut st,
            &shifted(&ref_h.data, dim),
            &toks,
            Logits::All,
        )
        .unwrap();
    assert_eq!(st.pos(), toks.len());
    check_logits(
        "MTP head (llama.cpp's hidden rows) vs llama.cpp",
        &ref_mtp.data,
        &out.logits,
        vocab,
    );
    let dmh = out
        .hidden
        .iter()
        .zip(&ref_mtp_h.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
    println!("MTP output hidden vs llama.cpp: max |Δ| {dmh:.3e}");
    assert!(dmh <= MAX_ABS, "MTP output hidden: max |Δ| {dmh}");

    // End to end: our trunk's hidden rows into our head.
    let mut st = head.new_state(toks.len());
    let out = head
        .forward(&model, &mut st, &shifted(&ours_h, dim), &toks, Logits::All)
        .unwrap();
    check_logits(
        "MTP head (our trunk) vs llama.cpp",
        &ref_mtp.data,
        &out.logits,
        vocab,
    );
}

#[test]
fn chained_drafts_and_rollback_match_llama_cpp() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m);
    let p = m["chain_prefix"].as_u64().unwrap() as usize;
    let depth = m["chain_n"].as_u64().unwrap() as usize;
    let model = load(&d, MTP_FILE);
    let head = model.mtp().unwrap();
    let dim = model.arch().n_embd();
    let ref_h: Array = read_npy(&d.join("llama_trunk_hidden.npy"));
    let ref_chain: Array = read_npy(&d.join("llama_chain_logits.npy"));
    let vocab = ref_chain.shape[1];
    let h = shifted(&ref_h.data, dim);

    // Positions 0..p from the trunk's rows, then `depth` steps each fed the
    // previous step's own output hidden (step 0: the trunk's row p-1).
    let mut st: MtpState = head.new_state(toks.len());
    head.forward(&model, &mut st, &h[..p * dim], &toks[..p], Logits::Last)
        .unwrap();
    let checkpoint = st.clone();
    let chain = |st: &mut MtpState| {
        let mut prev = h[p * dim..(p + 1) * dim].to_vec();
        let mut logits = Vec::new();
        for j in 0..depth {
            let o = head
                .forward(&model, st, &prev, &toks[p + j..p + j + 1], Logits::Last)
                .unwrap();
            logits.extend_from_slice(&o.logits);
            prev = o.hidden;
        }
        logits
    };
    let first = chain(&mut st);
    check_logits(
        "MTP chained steps vs llama.cpp",
        &ref_chain.data,
        &first,
        vocab,
    );
    assert_eq!(st.pos(), p + depth);

    // Rolling back (truncate) and restoring a clone both give the same
    // drafts again, bit for bit.
    st.truncate(p);
    assert_eq!(st.pos(), p);
    assert_eq!(chain(&mut st), first, "after truncate");
    let mut restored = checkpoint.clone();
    assert_eq!(chain(&mut restored), first, "from the checkpoint");
    st.truncate(p + 100);
    assert_eq!(st.pos(), p + depth, "truncate past the end is a no-op");
    st.clear();
    assert_eq!((st.pos(), st.bytes()), (0, 0));
}

/// The MTP fixture rewritten: `tensors` edits the tensor list (name, dims,
/// type, bytes), `meta` the key/values.
fn rewritten(
    d: &Path,
    tensors: impl Fn(&str, &[u64]) -> Option<Vec<u64>>,
    meta: impl FnOnce(&mut GgufWriter),
) -> GgufFile {
    let f = GgufFile::open(d.join(MTP_FILE)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add_kv(k, v.clone());
    }
    meta(&mut w);
    for t in f.tensors() {
        let Some(dims) = tensors(&t.name, &t.dims) else {
            continue;
        };
        let data = f.tensor(&t.name).unwrap().data;
        let n: u64 = dims.iter().product();
        let mut bytes = data.to_vec();
        bytes.resize(n as usize * 4, 0);
        w.add_tensor(t.name.clone(), dims, t.ty, bytes).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn load_err(f: GgufFile) -> String {
    match load_file(f) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_broken_mtp_block_is_refused_naming_the_tensor_or_key() {
    let Some(d) = fixture_dir() else { return };
    let keep = |_: &str, dims: &[u64]| Some(dims.to_vec());

    for name in [
        "blk.4.nextn.eh_proj.weight",
        "blk.4.nextn.enorm.weight",
        "blk.4.nextn.hnorm.weight",
        "blk.4.attn_q.weight",
        "blk.4.ffn_gate_inp.weight",
    ] {
        let f = rewritten(&d, |n, dims| (n != name).then(|| dims.to_vec()), |_| {});
        let e = load_err(f);
        println!("without {name}: {e}");
        // A missing router makes the block a dense FFN, whose tensors are
        // then the missing ones.
        let named = if name == "blk.4.ffn_gate_inp.weight" {
            "blk.4.ffn_gate.weight"
        } else {
            name
        };
        assert!(e.contains(named) && e.contains("missing"), "{e}");
    }
    // Wrong shapes: the concat projection as if it took one row, not two.
    let f = rewritten(
        &d,
        |n, dims| {
            Some(if n == "blk.4.nextn.eh_proj.weight" {
                vec![128, 128]
            } else {
                dims.to_vec()
            })
        },
        |_| {},
    );
    let e = load_err(f);
    println!("eh_proj [128, 128]: {e}");
    assert!(
        e.contains("blk.4.nextn.eh_proj.weight") && e.contains("[256, 128]"),
        "{e}"
    );
    let f = rewritten(
        &d,
        |n, dims| {
            Some(
                if n == "blk.4.nextn.shared_head_head.weight" || n == "blk.4.attn_k.weight" {
                    vec![128, 32]
                } else {
                    dims.to_vec()
                },
            )
        },
        |_| {},
    );
    let e = load_err(f);
    assert!(e.contains("blk.4.attn_k.weight"), "{e}");

    // Metadata: no trunk left, and a NextN block marked recurrent.
    let f = rewritten(&d, keep, |w| {
        w.add_kv("qwen3next.nextn_predict_layers", MetadataValue::U32(5))
    });
    let e = load_err(f);
    println!("nextn_predict_layers 5 of 5: {e}");
    assert!(e.contains("qwen3next.nextn_predict_layers"), "{e}");
    let f = rewritten(&d, keep, |w| {
        w.add_kv(
            "qwen3next.attention.recurrent_layers",
            MetadataArray::new(
                ValueType::Bool,
                [true, true, true, false, true]
                    .into_iter()
                    .map(MetadataValue::Bool)
                    .collect(),
            ),
        )
    });
    let e = load_err(f);
    println!("block 4 recurrent: {e}");
    assert!(
        e.contains("qwen3next.attention.recurrent_layers") && e.contains("block 4"),
        "{e}"
    );
    // Without the key the NextN block is a fifth trunk layer, as it was
    // before llama.cpp wrote the key: still loads (the trunk is then wrong,
    // which is why the key is read).
    let f = rewritten(&d, keep, |w| {
        w.metadata_mut().remove("qwen3next.nextn_predict_layers");
    });
    let model = load_file(f).unwrap();
    assert_eq!((model.arch().n_layer(), model.mtp_heads().len()), (5, 0));
    let toks = tokens(&manifest(&d));
    let got = model
        .new_session(0)
        .forward(&model, &toks, Logits::All)
        .unwrap();
    let reference: Array = read_npy(&d.join("llama_trunk_logits.npy"));
    let dmax = reference
        .data
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
    println!("the NextN block run as a fifth layer: max |Δlogit| {dmax:.2} from llama.cpp's trunk");
    assert!(dmax > 100.0 * MAX_ABS, "{dmax}");
}

#[test]
fn bad_mtp_inputs_are_errors() {
    let Some(d) = fixture_dir() else { return };
    let model = load(&d, MTP_FILE);
    let head = model.mtp().unwrap();
    let dim = model.arch().n_embd();
    let mut st = head.new_state(4);
    let e = head
        .forward(&model, &mut st, &vec![0.0; dim + 1], &[1], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("MTP input") && e.contains("129"), "{e}");
    let e = head
        .forward(&model, &mut st, &[], &[], Logits::Last)
        .unwrap_err();
    assert!(matches!(e, ModelError::NoTokens), "{e}");
    let e = head
        .forward(&model, &mut st, &vec![0.0; dim], &[100_000], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("100000"), "{e}");
    let e = head
        .forward(&model, &mut st, &vec![0.0; 5 * dim], &[1; 5], Logits::Last)
        .unwrap_err();
    assert!(matches!(e, ModelError::ContextOverflow { .. }), "{e}");
    assert_eq!(st.pos(), 0, "a refused forward leaves the state as it was");
}

/// With an expert cache (it holds the trunk's experts only), the head
/// reads its experts from the mapped file: the same drafts bit for bit.
#[test]
fn the_head_runs_beside_an_expert_cache() {
    let Some(d) = fixture_dir() else { return };
    let toks = tokens(&manifest(&d));
    let run = |model: &Model| {
        let mut s = model.new_session(0);
        s.set_keep_hidden(true);
        s.forward(model, &toks, Logits::Last).unwrap();
        let dim = model.arch().n_embd();
        let head = model.mtp().unwrap();
        let mut st = head.new_state(toks.len());
        head.forward(
            model,
            &mut st,
            &shifted(s.last_hidden(), dim),
            &toks,
            Logits::All,
        )
        .unwrap()
        .logits
    };
    let plain = run(&load(&d, MTP_FILE));
    let mut cached = load(&d, MTP_FILE);
    cached
        .set_expert_cache(redlite_model::ExpertCacheOptions {
            slots: 3,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(run(&cached), plain);
    let c = cached.expert_cache().unwrap().stats();
    assert!(c.misses > 0, "the cache was not used: {c:?}");
}

/// A second reference nobody here wrote the layers of: the MTP block built
/// from transformers' own Qwen3NextDecoderLayer and RMSNorm with the
/// checkpoint's `mtp.*` tensors (`hf_mtp_ref.py`; it agrees with llama.cpp
/// to 4.3e-6). Red Lite from the GGUF, end to end, against it.
#[test]
fn mtp_head_matches_transformers_modules() {
    let Some(d) = fixture_dir() else { return };
    let toks = tokens(&manifest(&d));
    let model = load(&d, MTP_FILE);
    let dim = model.arch().n_embd();
    let mut s = model.new_session(0);
    s.set_keep_hidden(true);
    let trunk = s.forward(&model, &toks, Logits::All).unwrap();
    let hf_trunk: Array = read_npy(&d.join("hf_trunk_logits.npy"));
    check_logits(
        "trunk vs transformers",
        &hf_trunk.data,
        &trunk,
        hf_trunk.shape[1],
    );
    let head = model.mtp().unwrap();
    let mut st = head.new_state(toks.len());
    let out = head
        .forward(
            &model,
            &mut st,
            &shifted(s.last_hidden(), dim),
            &toks,
            Logits::All,
        )
        .unwrap();
    let hf: Array = read_npy(&d.join("hf_mtp_logits.npy"));
    check_logits(
        "MTP head vs transformers' modules",
        &hf.data,
        &out.logits,
        hf.shape[1],
    );
}
