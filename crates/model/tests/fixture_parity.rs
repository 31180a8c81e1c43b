//! Parity on the tiny random Qwen3-Next of `tests/fixtures/qwen3next/`
//! (made by `scripts/fixtures/qwen3next/make_fixtures.sh`): against
//! transformers on the F32 file, against llama.cpp on every quantized file,
//! and reference path against fast path. Skips (with a message) when the
//! fixture folder has no manifest.

mod common;

use common::npy::{read_npy, read_npz, Array};
use redlite_gguf::GgufFile;
use redlite_model::{LoadOptions, Logits, Model, ModelError};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

fn fixture_dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next");
    if d.join("manifest.json").exists() {
        Some(d)
    } else {
        eprintln!("skipped: no {}/manifest.json", d.display());
        None
    }
}

fn manifest(d: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(d.join("manifest.json")).unwrap()).unwrap()
}

fn tokens(m: &Value, key: &str) -> Vec<u32> {
    m[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn load(d: &std::path::Path, file: &str, reference: bool) -> Result<Model, ModelError> {
    let f = Arc::new(GgufFile::open(d.join(file))?);
    Model::load(
        f,
        LoadOptions {
            threads: 2,
            reference,
            ubatch: 512,
        },
    )
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .unwrap()
        .0
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn abs_max(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, v| m.max(v.abs()))
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

struct Cmp {
    max_abs: f32,
    range: f32,
    argmax_agree: usize,
    n: usize,
}

fn compare_rows(reference: &[f32], got: &[f32], vocab: usize) -> Cmp {
    let (lo, hi) = reference
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    Cmp {
        max_abs: max_abs(reference, got),
        range: hi - lo,
        argmax_agree: reference
            .chunks(vocab)
            .zip(got.chunks(vocab))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count(),
        n: reference.len() / vocab,
    }
}

#[test]
fn f32_matches_transformers_prefill_and_token_by_token() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m, "tokens");
    let hf: Array = read_npy(&d.join("hf_prefill_logits.npy"));
    let vocab = hf.shape[1];
    let model = load(&d, "tiny-qwen3next-f32.gguf", false).unwrap();
    assert_eq!(model.n_vocab(), vocab);
    let mut s = model.new_session(0);
    let pre = s.forward(&model, &toks, Logits::All).unwrap();
    let c = compare_rows(&hf.data, &pre, vocab);
    println!(
        "F32 vs transformers, batched prefill ({} tokens): max |Δlogit| {:.3e} = {:.3e} of the logit range {:.2}; argmax {}/{}",
        c.n, c.max_abs, c.max_abs / c.range, c.range, c.argmax_agree, c.n
    );
    assert_eq!(c.argmax_agree, c.n);
    assert!(c.max_abs <= 1e-4 * c.range, "{}", c.max_abs);
    let mut s = model.new_session(0);
    let step: Vec<f32> = toks
        .iter()
        .flat_map(|&t| s.forward(&model, &[t], Logits::Last).unwrap())
        .collect();
    let c = compare_rows(&hf.data, &step, vocab);
    println!(
        "F32 vs transformers, token by token: max |Δlogit| {:.3e} = {:.3e} of the range; argmax {}/{}",
        c.max_abs,
        c.max_abs / c.range,
        c.argmax_agree,
        c.n
    );
    assert_eq!(c.argmax_agree, c.n);
    assert!(c.max_abs <= 1e-4 * c.range, "{}", c.max_abs);
}

#[test]
fn f32_per_layer_hidden_states_match_transformers() {
    let Some(d) = fixture_dir() else { return };
    let short = read_npz(&d.join("hf_short.npz"));
    let toks: Vec<u32> = short["tokens"].data.iter().map(|&t| t as u32).collect();
    let model = load(&d, "tiny-qwen3next-f32.gguf", false).unwrap();
    let n_layer = model.arch().n_layer();
    let mut s = model.new_session(0);
    s.enable_trace();
    let logits = s.forward(&model, &toks, Logits::All).unwrap();
    let mut worst = 0f32;
    let mut check = |what: &str, hf: &Array, ours: &[f32]| {
        let e = max_abs(&hf.data, ours);
        let rel = e / abs_max(&hf.data).max(1e-6);
        println!("  {what:<28} max |Δ| {e:.3e} (rel {rel:.2e})");
        worst = worst.max(rel);
    };
    check(
        "embed",
        &short["embed"],
        &s.trace.get(None, "inp_embd").unwrap().data,
    );
    for il in 0..n_layer {
        let t = Some(il);
        let get = |name: &str| {
            s.trace
                .get(t, name)
                .unwrap_or_else(|| panic!("no trace {name} at layer {il}"))
                .data
                .clone()
        };
        let p = |k: &str| format!("l{il}.{k}");
        check(&p("attn_norm"), &short[&p("attn_norm")], &get("attn_norm"));
        let mixer = if s.trace.get(t, "linear_attn_out").is_some() {
            "linear_attn_out"
        } else {
            "attn_output"
        };
        if mixer == "linear_attn_out" {
            check(
                &p("deltanet_core"),
                &short[&p("deltanet_core")],
                &get("attn_output_raw"),
            );
        }
        check(&p("mixer_out"), &short[&p("mixer_out")], &get(mixer));
        check(
            &p("ffn_norm"),
            &short[&p("ffn_norm")],
            &get("attn_post_norm"),
        );
        check(
            &p("router_logits"),
            &short[&p("router_logits")],
            &get("ffn_moe_logits"),
        );
        check(&p("moe_out"), &short[&p("moe_out")], &get("ffn_out"));
        check(&p("out"), &short[&p("out")], &get("l_out"));
    }
    check(
        "final_norm",
        &short["final_norm"],
        &s.trace.get(None, "result_norm").unwrap().data,
    );
    check("logits", &short["logits"], &logits);
    println!("worst relative error over all stages: {worst:.3e}");
    assert!(worst < 1e-4, "{worst}");
}

#[test]
fn routers_match_transformers() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m, "tokens");
    let hf = read_npy(&d.join("hf_router_logits.npy")); // [n_layer, n_seq, n_expert]
    let (n_layer, n_seq, n_exp) = (hf.shape[0], hf.shape[1], hf.shape[2]);
    let k = m["config"]["num_experts_per_tok"].as_u64().unwrap() as usize;
    let model = load(&d, "tiny-qwen3next-f32.gguf", false).unwrap();
    let mut s = model.new_session(0);
    s.forward(&model, &toks, Logits::Last).unwrap();
    let mut mismatches = 0;
    for l in 0..n_layer {
        for t in 0..n_seq {
            let row = &hf.data[(l * n_seq + t) * n_exp..(l * n_seq + t + 1) * n_exp];
            let mut idx: Vec<usize> = (0..n_exp).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            let mut want: Vec<usize> = idx[..k].to_vec();
            let mut got: Vec<usize> = s.last_routes()[l][t].iter().map(|r| r.0).collect();
            want.sort();
            got.sort();
            if want != got {
                mismatches += 1;
            }
        }
    }
    println!(
        "router mismatches vs transformers: {mismatches} of {} (layer, token) pairs",
        n_layer * n_seq
    );
    assert!(mismatches <= n_layer * n_seq / 1000, "{mismatches}");
}

#[test]
fn quantized_files_match_llama_cpp() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks = tokens(&m, "tokens");
    let variants = m["variants"].as_object().unwrap();
    let mut failures = Vec::new();
    for (v, ent) in variants {
        let file = ent["gguf"].as_str().unwrap();
        let model = match load(&d, file, false) {
            Ok(m) => m,
            Err(e) => {
                println!("{v}: cannot load: {e}");
                failures.push(format!("{v}: load: {e}"));
                continue;
            }
        };
        let vocab = model.n_vocab();
        let ll = read_npy(&d.join(ent["logits_file"].as_str().unwrap()));
        let positions: Vec<usize> = match &ent["logits_positions"] {
            Value::String(_) => (0..toks.len()).collect(),
            Value::Array(a) => a.iter().map(|x| x.as_u64().unwrap() as usize).collect(),
            _ => panic!("logits_positions"),
        };
        let mut s = model.new_session(0);
        let all = s.forward(&model, &toks, Logits::All).unwrap();
        let ours: Vec<f32> = positions
            .iter()
            .flat_map(|&p| all[p * vocab..(p + 1) * vocab].to_vec())
            .collect();
        let kls: Vec<f64> = ll
            .data
            .chunks(vocab)
            .zip(ours.chunks(vocab))
            .map(|(a, b)| kl(a, b))
            .collect();
        let kl_mean = kls.iter().sum::<f64>() / kls.len() as f64;
        let kl_max = kls.iter().copied().fold(0.0, f64::max);
        let c = compare_rows(&ll.data, &ours, vocab);
        // Greedy from the fixture's prompt, against llama.cpp's tokens.
        let prompt = tokens(&m["greedy"], "prompt");
        let want: Vec<u32> = tokens(ent, "greedy_tokens");
        let mut s = model.new_session(0);
        let mut last = s.forward(&model, &prompt, Logits::Last).unwrap();
        let (mut got, mut margins) = (Vec::new(), Vec::new());
        for _ in 0..want.len() {
            let t = argmax(&last) as u32;
            let mut sorted = last.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            margins.push(sorted[0] - sorted[1]);
            got.push(t);
            last = s.forward(&model, &[t], Logits::Last).unwrap();
        }
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!(
            "{v:>8}: vs llama.cpp at {} positions: KL mean {kl_mean:.3e} max {kl_max:.3e}; max |Δlogit| {:.3e} (range {:.2}); argmax {}/{}; greedy prefix {agree}/{} (our smallest margin before divergence {:.3})",
            c.n,
            c.max_abs,
            c.range,
            c.argmax_agree,
            c.n,
            want.len(),
            margins[..=agree.min(margins.len() - 1)].iter().copied().fold(f32::MAX, f32::min)
        );
        if kl_mean > 1e-3 {
            failures.push(format!("{v}: KL mean {kl_mean:.3e} > 1e-3"));
        }
        // A divergence is acceptable only where our top-1/top-2 margin is small.
        if agree < want.len() && margins[agree] > 0.1 {
            failures.push(format!(
                "{v}: greedy diverges at step {agree} with margin {:.3}",
                margins[agree]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn reference_path_matches_fast_path_on_fixtures() {
    let Some(d) = fixture_dir() else { return };
    let m = manifest(&d);
    let toks: Vec<u32> = tokens(&m, "tokens")[..96].to_vec();
    for (v, ent) in m["variants"].as_object().unwrap() {
        let file = ent["gguf"].as_str().unwrap();
        let (Ok(fast), Ok(refm)) = (load(&d, file, false), load(&d, file, true)) else {
            println!("{v}: cannot load, skipped");
            continue;
        };
        let vocab = fast.n_vocab();
        let a = fast
            .new_session(0)
            .forward(&fast, &toks, Logits::All)
            .unwrap();
        let b = refm
            .new_session(0)
            .forward(&refm, &toks, Logits::All)
            .unwrap();
        let c = compare_rows(&b, &a, vocab);
        let kls: Vec<f64> = b
            .chunks(vocab)
            .zip(a.chunks(vocab))
            .map(|(x, y)| kl(x, y))
            .collect();
        let kl_mean = kls.iter().sum::<f64>() / kls.len() as f64;
        println!(
            "{v:>8}: reference vs fast: max |Δlogit| {:.3e} (range {:.2}), KL mean {kl_mean:.3e}, argmax {}/{}",
            c.max_abs, c.range, c.argmax_agree, c.n
        );
        if v == "f32" {
            assert!(c.max_abs <= 1e-4 * c.range);
        } else {
            assert!(kl_mean <= 1e-3, "{v}: {kl_mean}");
        }
    }
}

/// The fixture reader on files laid out as `np.save` / `np.savez` write
/// them (stored zip members with zip64 extras), made by Python's zipfile.
#[test]
fn npy_and_npz_reader() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let a = read_npy(&dir.join("tiny.npy"));
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(a.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
    let z = read_npz(&dir.join("tiny.npz"));
    assert_eq!(z["x"].data, a.data);
    assert_eq!(z["tokens"].shape, vec![4]);
    assert_eq!(z["tokens"].data, vec![7.0, 8.0, 9.0, -1.0]);
}
