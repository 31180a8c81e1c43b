//! `redlite perplexity` end to end: the demo model's perplexity on a short
//! text against llama.cpp's `llama-perplexity` value for the same file and
//! settings (committed below with the command that produced it), and the
//! KL mode on the tiny Qwen3-Next fixture (a base file written and read
//! back, another quantisation compared with it, bad base files refused).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next")
        .join(name)
}

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-ppl-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn redlite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .arg("perplexity")
        .args(args)
        .output()
        .expect("running redlite perplexity")
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "redlite perplexity failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn fails(o: Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn final_ppl(out: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate in {out:?}"));
    let rest = line.trim_start_matches("Final estimate: PPL = ");
    let (v, e) = rest.split_once(" +/- ").unwrap();
    (v.parse().unwrap(), e.parse().unwrap())
}

fn stat(out: &str, name: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in {out:?}"));
    let v = line.split(':').nth(1).unwrap().trim();
    v.split([' ', '%']).next().unwrap().parse().unwrap()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kl_mode_writes_a_base_and_compares_another_quantisation_with_it() {
    let d = dir("kl");
    let text = fixture("README.md");
    let base = d.join("f32.kld");
    let f32m = fixture("tiny-qwen3next-f32.gguf");
    let common = ["-c", "64", "--chunks", "3", "-b", "16"];
    let plain = ok(redlite(
        &[&["-m", path_str(&f32m), "-f", path_str(&text)][..], &common].concat(),
    ));
    let with_base = ok(redlite(
        &[
            &["-m", path_str(&f32m), "-f", path_str(&text)][..],
            &common,
            &["--kl-divergence-base", path_str(&base)],
        ]
        .concat(),
    ));
    // Writing a base does not change the perplexity beyond float rounding
    // of the other log-softmax expression.
    let (a, _) = final_ppl(&plain);
    let (b, _) = final_ppl(&with_base);
    assert!((a - b).abs() / a < 1e-5, "{a} vs {b}");
    // llama.cpp's layout: header, 3·64 tokens, 3 chunks × 31 rows × (512 + 4) u16.
    assert_eq!(
        std::fs::metadata(&base).unwrap().len(),
        20 + 3 * 64 * 4 + 3 * 31 * 516 * 2
    );
    // The same model against its own base: no divergence, same top token.
    let same = ok(redlite(&[
        "-m",
        path_str(&f32m),
        "--kl-divergence-base",
        path_str(&base),
        "--kl-divergence",
    ]));
    assert!(stat(&same, "Mean    KLD").abs() < 1e-4, "{same}");
    assert_eq!(stat(&same, "Same top p"), 100.0, "{same}");
    let base_ppl = stat(&same, "Mean PPL(base)");
    assert!((base_ppl - a).abs() / a < 1e-3, "{base_ppl} vs {a}");
    // Q8_0 against the F32 base: a small divergence, a Δ perplexity.
    let q8 = ok(redlite(&[
        "-m",
        path_str(&fixture("tiny-qwen3next-q8_0.gguf")),
        "--kl-divergence-base",
        path_str(&base),
        "--kl-divergence",
    ]));
    let kl = stat(&q8, "Mean    KLD");
    assert!(kl > 1e-6 && kl < 0.05, "{q8}");
    assert!(stat(&q8, "Same top p") > 80.0, "{q8}");
    assert!(q8.contains("Mean PPL(Q)-PPL(base)"), "{q8}");

    // A truncated base, and one that is not a base file, are refused.
    let bytes = std::fs::read(&base).unwrap();
    let cut = d.join("cut.kld");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let e = fails(redlite(&[
        "-m",
        path_str(&f32m),
        "--kl-divergence-base",
        path_str(&cut),
        "--kl-divergence",
    ]));
    assert!(e.contains("cut.kld") && e.contains("truncated"), "{e}");
    let e = fails(redlite(&[
        "-m",
        path_str(&f32m),
        "--kl-divergence-base",
        path_str(&text),
        "--kl-divergence",
    ]));
    assert!(e.contains("not a KL base file"), "{e}");
    // Writing the base over the text is refused before anything runs.
    let e = fails(redlite(
        &[
            &["-m", path_str(&f32m), "-f", path_str(&text)][..],
            &common,
            &["--kl-divergence-base", path_str(&text)],
        ]
        .concat(),
    ));
    assert!(e.contains("same file as the input"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_text_shorter_than_two_chunks_is_refused_with_the_numbers() {
    let e = fails(redlite(&[
        "-m",
        path_str(&fixture("tiny-qwen3next-f32.gguf")),
        "-f",
        path_str(&fixture("tokenize_check.txt")),
        "-c",
        "2048",
    ]));
    assert!(
        e.contains("tokenize_check.txt") && e.contains("at least 4096"),
        "{e}"
    );
}

fn demo_model() -> Option<PathBuf> {
    let p = match std::env::var_os("REDLITE_DEMO_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/redlite/demo-model.gguf"),
    };
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but the demo model is missing at {} (scripts/fetch-demo-model.sh)",
        p.display()
    );
    eprintln!("SKIPPED: no demo model at {}", p.display());
    None
}

/// llama.cpp's value for the demo model on the GPL-3 text, 4 chunks of
/// 128 tokens, made with llama-perplexity of llama.cpp 0c1e570 (the
/// llama-cpp-python 0.3.36 sdist), CPU build without AMX, its default
/// f16 KV cache:
///
/// ```text
/// llama-perplexity -m demo-model.gguf -f /usr/share/common-licenses/GPL-3 \
///     -c 128 -b 128 --chunks 4 -t 2 --no-repack
/// [1]3.4734,[2]4.9054,[3]5.8302,[4]6.3622,
/// Final estimate: PPL = 6.3622 +/- 0.83840
/// ```
const LLAMA_GPL3_C128_4: f64 = 6.3622;
/// On so short a text (252 scored tokens) the value moves with float
/// details: llama.cpp itself gives 4.8792 with an f32 KV cache against
/// 4.9054 with f16 on the first two chunks (0.54%), and Red Lite's fast
/// path (int8 activations, f32 KV) was 0.82% below it when this was
/// written. The 0.5% agreement is checked on the whole texts by
/// scripts/perplexity-vs-llama.sh; this test bounds the short run at 1.5%.
const SHORT_BOUND: f64 = 0.015;

#[test]
fn perplexity_matches_llama_cpp_on_a_short_text() {
    let Some(m) = demo_model() else { return };
    let text = Path::new("/usr/share/common-licenses/GPL-3");
    if !text.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but {} is missing",
            text.display()
        );
        eprintln!("SKIPPED: no {}", text.display());
        return;
    }
    let out = ok(redlite(&[
        "-m",
        path_str(&m),
        "-f",
        path_str(text),
        "-c",
        "128",
        "-b",
        "128",
        "--chunks",
        "4",
    ]));
    assert!(out.starts_with("[1]") && out.contains(",[4]"), "{out}");
    let (ppl, err) = final_ppl(&out);
    let rel = (ppl - LLAMA_GPL3_C128_4).abs() / LLAMA_GPL3_C128_4;
    eprintln!(
        "redlite {ppl} +/- {err}, llama.cpp {LLAMA_GPL3_C128_4}: {:.3}%",
        100.0 * rel
    );
    assert!(
        rel < SHORT_BOUND,
        "redlite {ppl} against llama.cpp {LLAMA_GPL3_C128_4}"
    );
    // The error formula: llama.cpp's 0.83840 on nearly the same values.
    assert!((err - 0.8384).abs() / 0.8384 < 0.05, "error {err}");
}
