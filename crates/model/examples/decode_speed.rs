//! Rough prefill/decode speed on a GGUF file (greedy):
//! `cargo run --release -p redlite-model --example decode_speed -- FILE [threads] [prompt_len] [n_decode]`.
//! Prints medians of the per-token decode times. Not a benchmark of record
//! (those are `redlite bench` against llama.cpp, alternating A B A B).

use redlite_model::sample::argmax;
use redlite_model::{LoadOptions, Logits, Model};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_speed FILE [threads] [prompt_len] [n_decode]")?;
    let threads = args.get(2).map_or(Ok(0), |s| s.parse())?;
    let prompt_len: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let n_decode: usize = args.get(4).map_or(Ok(16), |s| s.parse())?;
    let t0 = Instant::now();
    // The file is read into anonymous memory (huge pages), as `redlite
    // generate` does for files that fit in half of the available memory;
    // REDLITE_IN_MEMORY=0 maps it instead.
    let file = Arc::new(
        if std::env::var_os("REDLITE_IN_MEMORY").is_none_or(|v| v != "0") {
            redlite_gguf::GgufFile::open_in_memory(path)?
        } else {
            redlite_gguf::GgufFile::open(path)?
        },
    );
    let model = Model::load(
        file,
        LoadOptions {
            threads,
            ..Default::default()
        },
    )?;
    println!(
        "{}: loaded in {:.2}s, {} threads, reference={}",
        model.arch().name(),
        t0.elapsed().as_secs_f64(),
        model.threads(),
        model.is_reference()
    );
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % model.n_vocab() as u32)
        .collect();
    let mut s = model.new_session(prompt_len + n_decode + 1);
    let t = Instant::now();
    let mut last = s.forward(&model, &prompt, Logits::Last)?;
    let pre = t.elapsed().as_secs_f64();
    println!(
        "prefill {prompt_len} tokens: {pre:.3}s ({:.1} tok/s)",
        prompt_len as f64 / pre
    );
    let mut times = Vec::new();
    let mut toks = Vec::new();
    for _ in 0..n_decode {
        let tok = argmax(&last) as u32;
        toks.push(tok);
        let t = Instant::now();
        last = s.forward(&model, &[tok], Logits::Last)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    println!(
        "decode: median {:.1} ms/token ({:.1} tok/s); tokens {toks:?}",
        med * 1e3,
        1.0 / med
    );
    Ok(())
}
