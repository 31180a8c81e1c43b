//! Consistency of the Qwen3-Next forward on tiny random models built in the
//! test: batched vs token by token, reference vs fast, chunked DeltaNet
//! across chunk borders, legacy fused `ssm_in` vs split projections, load
//! errors, session handling.

mod common;

use common::{max_abs_diff, prompt, Tiny};
use redlite_gguf::{GgmlType, GgufFile};
use redlite_model::{LoadOptions, Logits, Model, ModelError};
use std::sync::Arc;

fn load(file: Arc<GgufFile>, reference: bool) -> Model {
    Model::load(
        file,
        LoadOptions {
            threads: 2,
            reference,
            ubatch: 512,
        },
    )
    .unwrap()
}

fn token_by_token(m: &Model, toks: &[u32]) -> Vec<f32> {
    let mut s = m.new_session(0);
    toks.iter()
        .flat_map(|&t| s.forward(m, &[t], Logits::Last).unwrap())
        .collect()
}

fn range(x: &[f32]) -> f32 {
    let (lo, hi) = x
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    hi - lo
}

#[test]
fn batched_prefill_matches_token_by_token() {
    let t = Tiny::default();
    let m = load(t.file(), false);
    // 150 tokens: three DeltaNet chunks (64, 64, 22).
    let toks = prompt(150, t.vocab, 9);
    let mut s = m.new_session(0);
    let all = s.forward(&m, &toks, Logits::All).unwrap();
    let step = token_by_token(&m, &toks);
    let d = max_abs_diff(&all, &step);
    println!(
        "batched vs token-by-token: max |Δlogit| = {d:.3e} (logit range {:.2})",
        range(&all)
    );
    assert!(d < 1e-3 * range(&all), "{d}");
    // Mixed: a prompt batch then single tokens continues the same sequence.
    let mut s = m.new_session(0);
    let mut mixed = s.forward(&m, &toks[..100], Logits::All).unwrap();
    for &tk in &toks[100..] {
        mixed.extend(s.forward(&m, &[tk], Logits::Last).unwrap());
    }
    assert!(max_abs_diff(&mixed, &all) < 1e-3 * range(&all));
    // Small ubatches give the same as one batch.
    let mut m2 = load(t.file(), false);
    m2.set_ubatch(7);
    let mut s = m2.new_session(0);
    let small = s.forward(&m2, &toks, Logits::All).unwrap();
    assert!(max_abs_diff(&small, &all) < 1e-3 * range(&all));
    // Last = the last row of All.
    let mut s = m.new_session(0);
    let last = s.forward(&m, &toks, Logits::Last).unwrap();
    assert!(max_abs_diff(&last, &all[149 * t.vocab..]) < 1e-5 * range(&all));
}

#[test]
fn reference_path_matches_fast_path_f32() {
    let t = Tiny::default();
    let toks = prompt(80, t.vocab, 3);
    let fast = load(t.file(), false)
        .new_session(0)
        .forward(&load(t.file(), false), &toks, Logits::All)
        .unwrap();
    let rm = load(t.file(), true);
    assert!(rm.is_reference());
    let refr = rm.new_session(0).forward(&rm, &toks, Logits::All).unwrap();
    let d = max_abs_diff(&fast, &refr);
    println!(
        "reference vs fast (F32): max |Δlogit| = {d:.3e}, range {:.2}",
        range(&refr)
    );
    assert!(d < 1e-4 * range(&refr), "{d}");
    let argmax = |x: &[f32]| {
        x.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0
    };
    for (a, b) in fast.chunks(t.vocab).zip(refr.chunks(t.vocab)) {
        assert_eq!(argmax(a), argmax(b));
    }
}

#[test]
fn reference_path_matches_fast_path_q8_0() {
    if redlite_quant::kernels(GgmlType::Q8_0).is_err() {
        eprintln!("skipped: no Q8_0 kernels in this build of redlite-quant");
        return;
    }
    let t = Tiny {
        ty: GgmlType::Q8_0,
        ..Tiny::default()
    };
    let file = t.file();
    assert!(file.tensors().iter().any(|i| i.ty == GgmlType::Q8_0));
    let toks = prompt(40, t.vocab, 4);
    let fm = load(file.clone(), false);
    let fast = fm.new_session(0).forward(&fm, &toks, Logits::All).unwrap();
    let rm = load(file, true);
    let refr = rm.new_session(0).forward(&rm, &toks, Logits::All).unwrap();
    let d = max_abs_diff(&fast, &refr);
    // The fast path rounds activations to Q8_0, the reference does not: the
    // difference should be of the order of what rounding the weights to
    // Q8_0 does (reference Q8_0 vs the F32 model), not more.
    let f32m = load(Tiny::default().file(), true);
    let exact = f32m
        .new_session(0)
        .forward(&f32m, &toks, Logits::All)
        .unwrap();
    let dw = max_abs_diff(&refr, &exact);
    println!("Q8_0 reference vs fast: max |Δlogit| = {d:.3e}; weight rounding alone (Q8_0 vs F32, reference): {dw:.3e}; range {:.2}", range(&refr));
    assert!(d < 2.0 * dw + 1e-3, "{d} vs {dw}");
}

#[test]
fn legacy_fused_ssm_in_matches_split_projections() {
    let t = Tiny::default();
    let (kd, vd, r) = (t.nk * t.dk, t.nv * t.dv, t.nv / t.nk);
    let split = t.file();
    // Build ssm_in from the same attn_qkv/attn_gate rows, grouped per key head.
    let fused_bytes = t.bytes_with(|w| {
        for (i, &rec) in t.recurrent.iter().enumerate() {
            if !rec {
                continue;
            }
            let (_, qkv) = w
                .tensors
                .remove(&format!("blk.{i}.attn_qkv.weight"))
                .unwrap();
            let (_, z) = w
                .tensors
                .remove(&format!("blk.{i}.attn_gate.weight"))
                .unwrap();
            let row = |m: &Vec<f32>, j: usize| m[j * t.d..(j + 1) * t.d].to_vec();
            let mut fused = Vec::new();
            for g in 0..t.nk {
                for j in 0..t.dk {
                    fused.extend(row(&qkv, g * t.dk + j));
                }
                for j in 0..t.dk {
                    fused.extend(row(&qkv, kd + g * t.dk + j));
                }
                for j in 0..r * t.dv {
                    fused.extend(row(&qkv, 2 * kd + g * r * t.dv + j));
                }
                for j in 0..r * t.dv {
                    fused.extend(row(&z, g * r * t.dv + j));
                }
            }
            w.tensors.insert(
                format!("blk.{i}.ssm_in.weight"),
                (vec![t.d as u64, (2 * kd + 2 * vd) as u64], fused),
            );
        }
    });
    let fused = Arc::new(GgufFile::from_bytes(fused_bytes).unwrap());
    assert!(fused.tensor_info("blk.0.ssm_in.weight").is_some());
    let toks = prompt(20, t.vocab, 5);
    let a = load(split.clone(), false);
    let b = load(fused, false);
    let la = a.new_session(0).forward(&a, &toks, Logits::All).unwrap();
    let lb = b.new_session(0).forward(&b, &toks, Logits::All).unwrap();
    assert!(max_abs_diff(&la, &lb) < 1e-5 * range(&la));
}

#[test]
fn layer_kinds_fall_back_to_the_interval() {
    // Without the array, interval 4 → layers 3 and 7 are attention.
    let t = Tiny {
        recurrent: vec![true, true, true, false],
        write_recurrent_array: false,
        ..Tiny::default()
    };
    let m = load(t.file(), false);
    let redlite_model::arch::Arch::Qwen3Next(q) = m.arch() else {
        panic!("not qwen3next")
    };
    assert_eq!(q.cfg.recurrent, vec![true, true, true, false]);
    let t = Tiny::default();
    let m = load(t.file(), false);
    let redlite_model::arch::Arch::Qwen3Next(q) = m.arch() else {
        panic!("not qwen3next")
    };
    assert_eq!(
        q.cfg.recurrent, t.recurrent,
        "the array wins over the interval"
    );
}

#[test]
fn load_errors_name_the_tensor() {
    let t = Tiny::default();
    let bytes = t.bytes_with(|w| {
        w.tensors.remove("blk.1.ssm_ba.weight");
    });
    let err = Model::load(
        Arc::new(GgufFile::from_bytes(bytes).unwrap()),
        LoadOptions::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{msg}");
    assert!(msg.contains("blk.1.ssm_ba.weight"), "{msg}");
    let bytes = t.bytes_with(|w| {
        let e = w.tensors.get_mut("blk.3.attn_k.weight").unwrap();
        e.0 = vec![t.d as u64, (t.hd * t.n_kv / 2) as u64];
        e.1.truncate(t.d * t.hd * t.n_kv / 2);
    });
    let err = Model::load(
        Arc::new(GgufFile::from_bytes(bytes).unwrap()),
        LoadOptions::default(),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("blk.3.attn_k.weight") && msg.contains("expected dims [64, 64]"),
        "{msg}"
    );
}

#[test]
fn session_context_overflow_clear_and_bad_tokens() {
    let t = Tiny::default();
    let m = load(t.file(), false);
    let mut s = m.new_session(10);
    let toks = prompt(8, t.vocab, 1);
    let first = s.forward(&m, &toks, Logits::Last).unwrap();
    let err = s.forward(&m, &toks[..3], Logits::Last).unwrap_err();
    assert_eq!(
        err.to_string(),
        "context overflow: 8 positions used + 3 new tokens > context length 10"
    );
    s.clear();
    assert_eq!(s.pos(), 0);
    let again = s.forward(&m, &toks, Logits::Last).unwrap();
    assert_eq!(first, again, "clear gives a fresh sequence");
    assert!(matches!(
        s.forward(&m, &[t.vocab as u32], Logits::Last),
        Err(ModelError::BadToken { .. })
    ));
    assert!(matches!(
        s.forward(&m, &[], Logits::Last),
        Err(ModelError::NoTokens)
    ));
}

#[test]
fn trace_records_named_stages_per_layer() {
    let t = Tiny::default();
    let m = load(t.file(), false);
    let mut s = m.new_session(0);
    let toks = prompt(5, t.vocab, 2);
    s.forward(&m, &toks, Logits::Last).unwrap();
    assert!(s.trace.records().is_empty(), "off by default");
    s.clear();
    s.enable_trace();
    s.forward(&m, &toks, Logits::Last).unwrap();
    let l0 = s.trace.get(Some(0), "linear_attn_out").unwrap();
    assert_eq!((l0.n_tokens, l0.data.len()), (5, 5 * t.d));
    assert!(s.trace.get(Some(3), "attn_output").is_some());
    assert!(s.trace.get(Some(5), "l_out").is_some());
    assert!(s.trace.get(None, "result_norm").is_some());
    assert_eq!(s.last_routes().len(), t.recurrent.len());
    assert_eq!(s.last_routes()[0].len(), 5);
    assert_eq!(s.last_routes()[0][0].len(), t.n_used);
}
