//! Expert routing of the real Red Lite forward pass over a synthetic file:
//! mean share of the top-k experts that consecutive tokens (lag 1) and
//! tokens 8 apart (lag 8) have in common, per layer, and the usage skew.
//!
//! `cargo run --release -p redlite-synth --example route_overlap -- [LAYERS] [DIR] [before]`
//! writes an iq2 file with LAYERS layers (default 8) into DIR (default
//! /dev/shm), runs 64 tokens of English text one at a time and prints the
//! table; `before` builds the file without the context subspace (`after`
//! with it); a fifth argument N runs N tokens (the text repeated) and adds
//! the lag-1 overlap per 64-token window.

use redlite_gguf::{GgufFile, MetadataValue};
use redlite_synth::{write, Layout, Plan, TokenizerSource, WriteOptions};
use std::collections::HashMap;
use std::sync::Arc;

const TEXT: &str = "The history of the city begins in the early years of the river trade \
when small boats carried grain and wood from the hills to the coast and the people who \
lived near the water built houses of stone and learned to read the seasons of the flood \
so that each year they could plant the fields and store the harvest for the long winter \
and in time the town grew into a market where merchants from many lands came to sell";

fn text_ids() -> Vec<u32> {
    let f = GgufFile::from_bytes(redlite_synth::EMBEDDED_TOKENIZER.to_vec()).unwrap();
    let Some(MetadataValue::Array(a)) = f.metadata().get("tokenizer.ggml.tokens") else {
        panic!("no tokens");
    };
    let mut id: HashMap<String, u32> = HashMap::new();
    for (i, v) in a.values.iter().enumerate() {
        if let Some(s) = v.as_str() {
            id.insert(s.to_string(), i as u32);
        }
    }
    TEXT.split_whitespace()
        .enumerate()
        .filter_map(|(i, w)| {
            let key = if i == 0 {
                w.to_string()
            } else {
                format!("\u{120}{w}")
            };
            id.get(&key).copied()
        })
        .take(64)
        .collect()
}

fn overlap(r: &[Vec<(usize, f32)>], lag: usize) -> f64 {
    let n = r.len() - lag;
    (0..n)
        .map(|t| {
            let k = r[t].len().max(1);
            r[t + lag]
                .iter()
                .filter(|(e, _)| r[t].iter().any(|(f, _)| f == e))
                .count() as f64
                / k as f64
        })
        .sum::<f64>()
        / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let layers: usize = args.get(1).map_or(8, |s| s.parse().unwrap());
    let dir = std::path::PathBuf::from(args.get(2).map_or("/dev/shm", |s| s.as_str()));
    let before = args.get(3).is_some_and(|s| s == "before");
    let mut plan = Plan::new(Layout::Iq2, layers, 0, &TokenizerSource::Embedded).unwrap();
    if before {
        plan = plan.without_context();
    }
    let path = dir.join(format!(
        "route_overlap_{}_{layers}.gguf",
        std::process::id()
    ));
    write(&plan, &path, &WriteOptions::default()).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let model = redlite_model::Model::load(file, redlite_model::LoadOptions::default()).unwrap();
    let n_tok: usize = args.get(4).map_or(64, |s| s.parse().unwrap());
    let ids = text_ids();
    let toks: Vec<u32> = ids.iter().copied().cycle().take(n_tok).collect();
    let mut s = model.new_session(toks.len() + 1);
    // routes[layer][token]
    let mut routes: Vec<Vec<Vec<(usize, f32)>>> = vec![Vec::new(); layers];
    let mut max_abs = 0f32;
    for &t in &toks {
        let l = s
            .forward(&model, &[t], redlite_model::Logits::Last)
            .unwrap();
        assert!(l.iter().all(|v| v.is_finite()), "non-finite logits");
        max_abs = l.iter().fold(max_abs, |m, v| m.max(v.abs()));
        for (acc, lr) in routes.iter_mut().zip(s.last_routes()) {
            for r in lr {
                acc.push(r.clone());
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    println!(
        "{} tokens, {layers} layers, {}; max |logit| {max_abs:.1}",
        toks.len(),
        if before {
            "before (no context subspace)"
        } else {
            "after (context subspace)"
        }
    );
    println!("| layer | lag-1 overlap | lag-8 overlap | distinct experts | max/mean use | top-10% experts' share |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (layer, r) in routes.iter().enumerate() {
        let mut use_ = vec![0usize; 512];
        for t in r {
            for &(e, _) in t {
                use_[e] += 1;
            }
        }
        let total: usize = use_.iter().sum();
        let distinct = use_.iter().filter(|&&u| u > 0).count();
        let mut sorted = use_.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mean = total as f64 / 512.0;
        let top: usize = sorted[..51].iter().sum();
        println!(
            "| {layer} | {:.1}% | {:.1}% | {distinct} | {:.1} | {:.1}% |",
            100.0 * overlap(r, 1),
            100.0 * overlap(r, 8),
            sorted[0] as f64 / mean,
            100.0 * top as f64 / total as f64
        );
    }
    if toks.len() > 64 {
        println!("lag-1 overlap per 64-token window (mean of layers 3..):");
        for w in 0..toks.len() / 64 {
            let v: Vec<f64> = routes[3.min(layers - 1)..]
                .iter()
                .map(|r| overlap(&r[w * 64..(w + 1) * 64], 1))
                .collect();
            let m = v.iter().sum::<f64>() / v.len() as f64;
            println!("  tokens {}..{}: {:.1}%", w * 64, (w + 1) * 64, 100.0 * m);
        }
    }
}
