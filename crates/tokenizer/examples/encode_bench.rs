//! Encode throughput: `cargo run --release -p redlite-tokenizer --example encode_bench [GGUF] [TEXT_FILE]`.
//! Without a text file it uses the test corpus plus this repository's Rust sources.

use std::time::Instant;

use redlite_gguf::GgufFile;
use redlite_tokenizer::Tokenizer;

fn collect_sources(dir: &std::path::Path, out: &mut String) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if !p.ends_with("target") && !p.ends_with(".git") {
                collect_sources(&p, out);
            }
        } else if p
            .extension()
            .is_some_and(|e| e == "rs" || e == "md" || e == "json")
        {
            if let Ok(s) = std::fs::read_to_string(&p) {
                out.push_str(&s);
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gguf = args.first().cloned().unwrap_or_else(|| {
        root.join("tests/fixtures/qwen2-tokenizer.gguf")
            .to_string_lossy()
            .into_owned()
    });
    let t0 = Instant::now();
    let file = GgufFile::open(&gguf)?;
    let tok = Tokenizer::from_gguf(file.metadata())?;
    println!("load: {:.3}s ({:?})", t0.elapsed().as_secs_f64(), tok);

    let text = match args.get(1) {
        Some(p) => std::fs::read_to_string(p)?,
        None => {
            let mut s = String::new();
            collect_sources(&root.join("../.."), &mut s);
            s
        }
    };
    println!("text: {} bytes", text.len());
    // Optional third argument: a JSON list of expected ids to compare with.
    if let Some(p) = args.get(2) {
        let want: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(p)?)?;
        let got = tok.encode(&text, true);
        let first_diff = want.iter().zip(&got).position(|(a, b)| a != b);
        println!(
            "compare with {p}: {} expected, {} got, equal: {}, first difference at {:?}",
            want.len(),
            got.len(),
            want == got,
            first_diff
        );
    }
    for round in 0..3 {
        let t = Instant::now();
        let ids = tok.encode(&text, true);
        let dt = t.elapsed().as_secs_f64();
        println!(
            "encode round {round}: {} tokens in {:.3}s = {:.0} tokens/s, {:.1} MB/s",
            ids.len(),
            dt,
            ids.len() as f64 / dt,
            text.len() as f64 / dt / 1e6
        );
        let t = Instant::now();
        let back = tok.decode(&ids);
        let dt = t.elapsed().as_secs_f64();
        assert_eq!(back, text);
        if round == 0 {
            println!("decode: {:.0} tokens/s", ids.len() as f64 / dt);
        }
    }
    // Many small calls (a chat-like workload): lines one by one.
    let t = Instant::now();
    let mut n = 0usize;
    for line in text.lines() {
        n += tok.encode(line, true).len();
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "per-line encode: {n} tokens in {:.3}s = {:.0} tokens/s",
        dt,
        n as f64 / dt
    );
    Ok(())
}
