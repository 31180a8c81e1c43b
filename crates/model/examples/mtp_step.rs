//! Rough cost of one MTP draft step against one trunk decode step on a
//! Qwen3-Next GGUF with a NextN block (greedy):
//! `cargo run --release -p redlite-model --example mtp_step -- FILE [threads] [prompt_len] [n_steps]`.
//! The trunk decodes `n_steps` tokens after the prompt; the MTP head
//! catches up over the prompt (one batch) and then drafts `n_steps` tokens
//! one at a time, each from its own previous hidden row (depth-n chaining).
//! Prints medians. Not a benchmark of record.

use redlite_model::sample::argmax;
use redlite_model::{LoadOptions, Logits, Model};
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: mtp_step FILE [threads] [prompt_len] [n_steps]")?;
    let threads = args.get(2).map_or(Ok(0), |s| s.parse())?;
    let prompt_len: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let n_steps: usize = args.get(4).map_or(Ok(8), |s| s.parse())?;
    let file = Arc::new(redlite_gguf::GgufFile::open(path)?);
    let model = Model::load(
        file,
        LoadOptions {
            threads,
            ..Default::default()
        },
    )?;
    let head = model.mtp().ok_or("the file has no NextN (MTP) block")?;
    let d = model.arch().n_embd();
    println!(
        "{}: {} trunk layers + NextN block {}, {} threads; MTP tensors {:.3} GB of {:.3} GB",
        model.arch().name(),
        model.arch().n_layer(),
        head.block,
        model.threads(),
        model.mtp_bytes() as f64 / 1e9,
        model.file().file_size() as f64 / 1e9
    );
    // Touch everything once so the timings are not page faults.
    model.touch_weights(|_, _| {});
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % model.n_vocab() as u32)
        .collect();
    let ctx = prompt_len + n_steps + 1;
    let mut s = model.new_session(ctx);
    s.set_keep_hidden(true);
    let mut last = s.forward(&model, &prompt, Logits::Last)?;
    let h = s.last_hidden().to_vec();

    // The MTP catches up over the prompt: entry p = (h[p-1], x[p]).
    let mut st = head.new_state(ctx);
    let mut shifted = vec![0f32; h.len()];
    shifted[d..].copy_from_slice(&h[..h.len() - d]);
    let t = Instant::now();
    head.forward(&model, &mut st, &shifted, &prompt, Logits::Last)?;
    let catch_up = t.elapsed().as_secs_f64();

    // Drafts: the first from the trunk's last row and the next token.
    let mut prev = h[h.len() - d..].to_vec();
    let mut tok = argmax(&last) as u32;
    let mut mtp_times = Vec::new();
    for _ in 0..n_steps {
        let t = Instant::now();
        let o = head.forward(&model, &mut st, &prev, &[tok], Logits::Last)?;
        mtp_times.push(t.elapsed().as_secs_f64());
        prev = o.hidden;
        tok = argmax(&o.logits) as u32;
    }
    s.set_keep_hidden(false);
    let mut trunk_times = Vec::new();
    for _ in 0..n_steps {
        let tok = argmax(&last) as u32;
        let t = Instant::now();
        last = s.forward(&model, &[tok], Logits::Last)?;
        trunk_times.push(t.elapsed().as_secs_f64());
    }
    let (m, tr) = (median(mtp_times), median(trunk_times));
    println!(
        "MTP catch-up over {prompt_len} positions: {:.1} ms; MTP draft step: median {:.1} ms; trunk decode step: median {:.1} ms ({:.2} of a trunk step)",
        catch_up * 1e3,
        m * 1e3,
        tr * 1e3,
        m / tr
    );
    Ok(())
}
