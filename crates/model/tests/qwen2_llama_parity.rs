//! Qwen2 against llama.cpp on the demo model (Qwen2.5-Coder-0.5B-Instruct,
//! Q5_0/Q8_0/Q4_K/Q6_K weights): logits of every prompt position, the full
//! last-position logits, 32 greedy tokens; and our fast path against our
//! reference path and batched prefill against token by token.
//!
//! Fixtures: `tests/fixtures/qwen2/`, written by
//! `scripts/fixtures/qwen2/make_fixtures.sh` (llama.cpp 0c1e570, CPU, one
//! `llama_decode` per prompt, KV cache f32, no flash attention, no weight
//! repacking). The model itself is not in git: it comes from
//! `REDLITE_DEMO_MODEL`, else `${REDLITE_CACHE:-~/.cache/redlite}/demo-model.gguf`
//! (`scripts/fetch-demo-model.sh`). Without it these tests print a loud skip,
//! except under `CI`, where they fail.
//!
//! How llama.cpp differs from us, and why the bounds are what they are: its
//! CPU matmuls quantize the activations to the weight's `vec_dot_type`
//! (Q8_0 for Q5_0/Q8_0 weights, Q8_K for Q4_K/Q6_K) and dot in integers, as
//! our fast path does — given the same inputs our matmuls are bit-identical
//! to ggml's (see `stages_match_llama_cpp_on_its_inputs`). Its RMSNorm,
//! RoPE (f32 angles), softmax and attention reductions round differently
//! from ours at the 1e-7..1e-6 level, and through 24 layers those ulps flip
//! 8-bit activation roundings, which grow: the end-to-end logits differ by
//! up to ~0.5 although every stage agrees. llama.cpp shows the same spread
//! against itself (batched vs one token per decode on the chat prompt:
//! worst per-position KL 1.4e-2, last-position KL 5.8e-4, max |Δlogit|
//! 0.54, an argmax flip at margin 0.042). So end to end we require: argmax
//! identical where llama.cpp's top-1/top-2 margin exceeds 0.25 (closer
//! positions above 0.05 are printed), last-position KL(llama.cpp‖ours)
//! ≤ 5e-3 (measured 1.5e-3 chat, 1.5e-6 code, 7.3e-4 prose, 5.0e-7 long;
//! 1e-3 would sit on llama.cpp's own noise), and the 32 greedy tokens
//! identical (they are, on all four prompts, through margins down to 0.015).

use redlite_gguf::GgufFile;
use redlite_model::sample::argmax;
use redlite_model::{LoadOptions, Logits, Model};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where llama.cpp's top-1/top-2 margin is above this, our argmax must be
/// its argmax.
const CLEAR_MARGIN: f32 = 0.25;
/// Margins above this but below [`CLEAR_MARGIN`] are counted and printed.
const NOTE_MARGIN: f32 = 0.05;
/// KL(llama.cpp ‖ ours) over the last position's full logits.
const MAX_KL: f64 = 5e-3;

fn model_path() -> Option<PathBuf> {
    let p = match std::env::var_os("REDLITE_DEMO_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("REDLITE_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/redlite")
                });
            cache.join("demo-model.gguf")
        }
    };
    if p.is_file() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "CI is set but the demo model is missing at {} (scripts/fetch-demo-model.sh)",
            p.display()
        );
    }
    eprintln!(
        "\n!!!!!!!! SKIPPED: qwen2 llama.cpp parity needs the demo model at {} \
         (run scripts/fetch-demo-model.sh, or set REDLITE_DEMO_MODEL) !!!!!!!!\n",
        p.display()
    );
    None
}

fn load(path: &Path, reference: bool) -> Model {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let m = Model::load(
        file,
        LoadOptions {
            threads: 2,
            reference,
            ubatch: 512,
        },
    )
    .unwrap();
    assert_eq!(m.arch().name(), "qwen2");
    m
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2")
}

/// One prompt's llama.cpp fixture.
struct Fixture {
    ids: Vec<u32>,
    /// Per prompt position: llama.cpp's top-20 (id, logit).
    prompt_top: Vec<Vec<(u32, f32)>>,
    greedy: Vec<u32>,
    /// Per greedy step: the top-20 of the logits that chose it.
    greedy_top: Vec<Vec<(u32, f32)>>,
    /// The last prompt position's full logits.
    last: Vec<f32>,
}

fn tops(v: &Value) -> Vec<Vec<(u32, f32)>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                .collect()
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn fixture(name: &str) -> Fixture {
    let dir = fixture_dir();
    let j: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join(format!("{name}.last.f32"))).unwrap();
    let last: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let f = Fixture {
        ids: ids(&j["ids"]),
        prompt_top: tops(&j["prompt_top"]),
        greedy: ids(&j["greedy"]),
        greedy_top: tops(&j["greedy_top"]),
        last,
    };
    // Our tokenizer's ids (what the script fed llama.cpp) are llama.cpp's
    // own tokenization of the same text.
    assert_eq!(f.ids, ids(&j["llama_tokenize"]), "{name}: tokenization");
    assert_eq!(f.prompt_top.len(), f.ids.len());
    assert_eq!(f.last.len(), j["n_vocab"].as_u64().unwrap() as usize);
    f
}

const PROMPTS: [&str; 4] = ["chat", "code", "prose", "long"];

fn margin(top: &[(u32, f32)]) -> f32 {
    top[0].1 - top[1].1
}

/// log-softmax in f64.
fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
    let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    let ls = s.ln();
    x.iter().map(|&v| v as f64 - m - ls).collect()
}

/// KL(p ‖ q) for logits `p`, `q`.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(&a, &b)| a.exp() * (a - b)).sum()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |w, d| if d.is_nan() || d > w { d } else { w })
}

#[test]
fn fixtures_are_consistent() {
    // Runs without the model: the committed fixtures themselves.
    for name in PROMPTS {
        let f = fixture(name);
        assert_eq!(f.greedy.len(), 32, "{name}");
        let last_top = &f.prompt_top[f.ids.len() - 1];
        assert_eq!(argmax(&f.last) as u32, last_top[0].0, "{name}");
        assert_eq!(f.greedy[0], last_top[0].0, "{name}");
        for (g, t) in f.greedy.iter().zip(&f.greedy_top) {
            assert_eq!(
                *g, t[0].0,
                "{name}: greedy token is the top-1 of its logits"
            );
        }
    }
    assert!(fixture("long").ids.len() >= 100);
}

#[test]
fn prompt_logits_match_llama_cpp() {
    let Some(path) = model_path() else { return };
    let m = load(&path, false);
    let nv = m.n_vocab();
    for name in PROMPTS {
        let f = fixture(name);
        let n = f.ids.len();
        let mut s = m.new_session(n + 1);
        let all = s.forward(&m, &f.ids, Logits::All).unwrap();
        assert_eq!(all.len(), n * nv);
        let (mut checked, mut close, mut wrong, mut small, mut worst_top) = (0, 0, 0, 0, 0f32);
        for (i, top) in f.prompt_top.iter().enumerate() {
            let row = &all[i * nv..(i + 1) * nv];
            for &(id, l) in top {
                worst_top = worst_top.max((row[id as usize] - l).abs());
            }
            let ours = argmax(row) as u32;
            if margin(top) > NOTE_MARGIN && margin(top) <= CLEAR_MARGIN && ours != top[0].0 {
                println!(
                    "{name} position {i}: argmax {ours} vs llama.cpp {} at a small margin {:.3}",
                    top[0].0,
                    margin(top)
                );
                small += 1;
            }
            if margin(top) > CLEAR_MARGIN {
                checked += 1;
                if ours != top[0].0 {
                    let d: Vec<(u32, f32, f32)> = top
                        .iter()
                        .take(4)
                        .map(|&(id, l)| (id, l, row[id as usize]))
                        .collect();
                    println!(
                        "{name} position {i}: our argmax {ours} ({:.4}) vs llama.cpp {} \
                         (margin {:.3}); (id, llama.cpp, ours) {d:?}",
                        row[ours as usize],
                        top[0].0,
                        margin(top)
                    );
                    wrong += 1;
                }
            } else {
                close += 1;
            }
        }
        let last = &all[(n - 1) * nv..];
        let k = kl(&f.last, last);
        let d = max_abs_diff(&f.last, last);
        println!(
            "{name}: {n} positions, argmax identical at {checked} with margin > {CLEAR_MARGIN} \
             ({close} closer ones not checked, {small} of them differ); max |Δlogit| on llama.cpp's top-20 of every \
             position {worst_top:.4}; last position: KL(llama.cpp‖ours) = {k:.3e}, \
             max |Δlogit| = {d:.4}"
        );
        assert_eq!(wrong, 0, "{name}: argmax differs at clear positions");
        assert!(k <= MAX_KL, "{name}: KL {k:.3e} > {MAX_KL:e}");
    }
}

#[test]
fn greedy_matches_llama_cpp() {
    let Some(path) = model_path() else { return };
    let m = load(&path, false);
    for name in PROMPTS {
        let f = fixture(name);
        let mut s = m.new_session(f.ids.len() + f.greedy.len() + 1);
        let mut logits = s.forward(&m, &f.ids, Logits::Last).unwrap();
        let mut agreed = 0;
        let mut min_margin = f32::MAX;
        for (step, (&want, top)) in f.greedy.iter().zip(&f.greedy_top).enumerate() {
            let got = argmax(&logits) as u32;
            if got != want {
                // Only acceptable where llama.cpp itself nearly tied.
                assert!(
                    margin(top) < CLEAR_MARGIN,
                    "{name}: greedy step {step}: ours {got}, llama.cpp {want} \
                     (llama.cpp margin {:.4})",
                    margin(top)
                );
                println!(
                    "{name}: greedy diverges at step {step} where llama.cpp's margin is only \
                     {:.4} (a float-noise tie); {agreed} tokens identical before it",
                    margin(top)
                );
                break;
            }
            min_margin = min_margin.min(margin(top));
            agreed += 1;
            logits = s.forward(&m, &[got], Logits::Last).unwrap();
        }
        println!(
            "{name}: greedy {agreed}/{} tokens identical to llama.cpp \
             (smallest llama.cpp top-1/top-2 margin on the way {min_margin:.4})",
            f.greedy.len()
        );
    }
}

fn token_by_token(m: &Model, ids: &[u32]) -> Vec<f32> {
    let mut s = m.new_session(ids.len());
    ids.iter()
        .flat_map(|&t| s.forward(m, &[t], Logits::Last).unwrap())
        .collect()
}

#[test]
fn batched_prefill_matches_token_by_token() {
    let Some(path) = model_path() else { return };
    // Reference path: every token's arithmetic is the same whether batched
    // or not, so the two agree to rounding (4 tokens: it is slow).
    let r = load(&path, true);
    let nv = r.n_vocab();
    let ids = &fixture("prose").ids[..4];
    let all = r.new_session(4).forward(&r, ids, Logits::All).unwrap();
    let d = max_abs_diff(&all, &token_by_token(&r, ids));
    println!("prose[..4], reference path: batched vs token by token max |Δlogit| = {d:.3e}");
    assert!(d < 1e-3, "{d}");
    // Fast path: the batch goes through the tile kernels (another f32
    // summation order) and every ulp can flip an 8-bit activation rounding,
    // so the two drift apart like llama.cpp's own batched and one-token
    // decodes do. Measured with llama_dump --stepwise on this chat prompt,
    // llama.cpp against itself: worst per-position KL 1.4e-2, max |Δlogit|
    // 0.54, last-position KL 5.8e-4, one argmax flip (margin 0.042).
    let m = load(&path, false);
    let f = fixture("chat");
    let n = f.ids.len();
    let all = m.new_session(n).forward(&m, &f.ids, Logits::All).unwrap();
    let step = token_by_token(&m, &f.ids);
    let (mut worst_kl, mut flips, mut clear) = (0f64, 0, 0);
    for i in 0..n {
        let (a, b) = (&all[i * nv..(i + 1) * nv], &step[i * nv..(i + 1) * nv]);
        worst_kl = worst_kl.max(kl(b, a));
        if margin(&f.prompt_top[i]) > CLEAR_MARGIN {
            clear += 1;
            flips += usize::from(argmax(a) != argmax(b));
        }
    }
    let last_kl = kl(&step[(n - 1) * nv..], &all[(n - 1) * nv..]);
    println!(
        "chat, fast path: batched vs token by token over {n} positions: worst KL {worst_kl:.3e}, \
         last-position KL {last_kl:.3e}, max |Δlogit| {:.3}, argmax differs at {flips} of {clear} \
         clear positions",
        max_abs_diff(&all, &step)
    );
    assert_eq!(flips, 0);
    assert!(worst_kl < 5e-2, "{worst_kl}");
    assert!(last_kl < MAX_KL, "{last_kl}");
}

#[test]
fn fast_path_matches_reference_path() {
    // The reference path dequantizes rows and dots in f64 without quantizing
    // the activations, so it is slow (short prompts only) and differs from
    // the fast path (and from llama.cpp) by the Q8 activation rounding.
    let Some(path) = model_path() else { return };
    let fast = load(&path, false);
    let reference = load(&path, true);
    let nv = fast.n_vocab();
    for name in ["prose", "code"] {
        let f = fixture(name);
        let n = f.ids.len();
        let a = fast
            .new_session(n)
            .forward(&fast, &f.ids, Logits::All)
            .unwrap();
        let b = reference
            .new_session(n)
            .forward(&reference, &f.ids, Logits::All)
            .unwrap();
        let (mut worst_kl, mut same, mut clear) = (0f64, 0, 0);
        for i in 0..n {
            let (ra, rb) = (&a[i * nv..(i + 1) * nv], &b[i * nv..(i + 1) * nv]);
            worst_kl = worst_kl.max(kl(rb, ra));
            if margin(&f.prompt_top[i]) > CLEAR_MARGIN {
                clear += 1;
                same += usize::from(argmax(ra) == argmax(rb));
            }
        }
        let k_ll = kl(&f.last, &b[(n - 1) * nv..]);
        println!(
            "{name}: fast vs reference: worst KL(ref‖fast) {worst_kl:.3e}, max |Δlogit| {:.4}, \
             argmax same at {same}/{clear} clear positions; KL(llama.cpp‖reference) last \
             position {k_ll:.3e}",
            max_abs_diff(&a, &b)
        );
        assert_eq!(same, clear, "{name}");
        assert!(worst_kl < 5e-3, "{name}: {worst_kl}");
        assert!(k_ll < 5e-3, "{name}: {k_ll}");
    }
}

/// Relative L2 error of `a` against `b`.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

#[test]
fn stages_match_llama_cpp_on_its_inputs() {
    // Each stage of layers 1 and 2 (between them Q5_0, Q8_0, Q6_K and Q4_K
    // weights) is fed llama.cpp's own input for that stage and compared with
    // llama.cpp's output. Free of the amplification through the layers (a
    // 1-ulp difference can flip an 8-bit activation rounding, and a flip
    // grows), this is where exactness shows: measured on this machine, the
    // quantized matmuls are bit-identical to ggml's and norms, RoPE, SwiGLU
    // agree to ~1e-7, attention to ~2e-6 (relative).
    use redlite_cpu::attention::AttnShape;
    use redlite_cpu::ops::{add_inplace, rms_norm, swiglu, Rope};
    use redlite_model::arch::Arch;
    use redlite_model::exec::Exec;
    let Some(path) = model_path() else { return };
    let m = load(&path, false);
    let Arch::Qwen2(q) = m.arch() else {
        panic!("not qwen2")
    };
    let dir = fixture_dir();
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("stages.json")).unwrap()).unwrap();
    let blob: Vec<f32> = std::fs::read(dir.join("stages.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let n = index["tokens"].as_u64().unwrap() as usize;
    let pool = redlite_cpu::Pool::new(2);
    let c = &q.cfg;
    let shape = AttnShape {
        n_head: c.n_head,
        n_kv_head: c.n_head_kv,
        head_dim: c.head_dim,
    };
    let rope = Rope::new(c.head_dim, c.rope_base);
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    for reference in [false, true] {
        let ex = Exec {
            file: m.file(),
            pool: &pool,
            reference,
            experts: None,
            pregate: 0,
            batching: Default::default(),
        };
        // The fast path must match ggml's arithmetic; the reference path
        // (f64 dots, maybe f32 activations) only its meaning.
        let (tol_mm, tol) = if reference {
            (1e-2, 1e-5)
        } else {
            (1e-6, 1e-5)
        };
        for (layer, ent) in index["layers"].as_object().unwrap() {
            let l: usize = layer.parse().unwrap();
            let w = &q.layers[l];
            let get = |k: &str| -> Vec<f32> {
                let (off, len) = (ent[k][0].as_u64().unwrap(), ent[k][1].as_u64().unwrap());
                blob[off as usize..(off + len) as usize].to_vec()
            };
            let mut report = Vec::new();
            let mut check = |what: &str, ours: &[f32], want: &[f32], bound: f64| {
                let e = rel_err(ours, want);
                report.push(format!("{what} {e:.1e}"));
                assert!(
                    e <= bound,
                    "layer {l} {what}: rel err {e:.3e} > {bound:e} (reference={reference})"
                );
            };
            let with_bias = |mut x: Vec<f32>, b: &Option<Vec<f32>>| {
                let b = b.as_ref().expect("qwen2 has q/k/v biases");
                x.chunks_exact_mut(b.len()).for_each(|r| add_inplace(r, b));
                x
            };
            let roped = |mut x: Vec<f32>| {
                let width = x.len() / n;
                for (i, row) in x.chunks_exact_mut(width).enumerate() {
                    rope.apply(row, c.head_dim, i);
                }
                x
            };
            let mut h = get("inp");
            rms_norm(&mut h, &w.attn_norm, c.eps);
            check("attn_norm", &h, &get("attn_norm"), tol);
            let x = get("attn_norm");
            for (k, wt, b) in [
                ("q", &w.attn.wq, &w.attn.bq),
                ("k", &w.attn.wk, &w.attn.bk),
                ("v", &w.attn.wv, &w.attn.bv),
            ] {
                check(
                    &format!("{k}_mm[{:?}]", wt.ty),
                    &ex.linear(wt, &x, n).unwrap(),
                    &get(&format!("{k}_mm")),
                    tol_mm,
                );
                check(
                    &format!("{k}_bias"),
                    &with_bias(get(&format!("{k}_mm")), b),
                    &get(&format!("{k}_bias")),
                    tol,
                );
            }
            check("q_rope", &roped(get("q_bias")), &get("q_rope"), tol);
            check("k_rope", &roped(get("k_bias")), &get("k_rope"), tol);
            let o = ex
                .attention(
                    &shape,
                    &get("q_rope"),
                    &get("k_rope"),
                    &get("v_bias"),
                    0,
                    n,
                    scale,
                )
                .unwrap();
            check("attention", &o, &get("kqv_out"), tol);
            let mut r = ex.linear(&w.attn.wo, &get("kqv_out"), n).unwrap();
            add_inplace(&mut r, &get("inp"));
            check(
                &format!("wo[{:?}]+residual", w.attn.wo.ty),
                &r,
                &get("ffn_inp"),
                tol_mm,
            );
            let mut h = get("ffn_inp");
            rms_norm(&mut h, &w.ffn_norm, c.eps);
            check("ffn_norm", &h, &get("ffn_norm"), tol);
            let x = get("ffn_norm");
            let mut g = ex.linear(&w.ffn.gate, &x, n).unwrap();
            swiglu(&mut g, &ex.linear(&w.ffn.up, &x, n).unwrap());
            check(
                &format!("gate,up[{:?}]+swiglu", w.ffn.gate.ty),
                &g,
                &get("ffn_swiglu"),
                tol_mm.max(1e-6),
            );
            check(
                &format!("down[{:?}]", w.ffn.down.ty),
                &ex.linear(&w.ffn.down, &get("ffn_swiglu"), n).unwrap(),
                &get("ffn_out"),
                tol_mm,
            );
            let mut y = get("ffn_inp");
            add_inplace(&mut y, &get("ffn_out"));
            check("l_out", &y, &get("l_out"), tol);
            println!(
                "layer {l} ({}): {}",
                if reference { "reference" } else { "fast" },
                report.join(", ")
            );
        }
    }
}
