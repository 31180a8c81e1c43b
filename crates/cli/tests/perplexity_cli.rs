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
    v.split(|c: char| c == ' ' || c == '%')
        .next()
        .unwrap()
        .parse()
        .unwrap()
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
