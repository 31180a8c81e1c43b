//! `--memory` / `--expert-cache` end to end on the tiny Qwen3-Next fixture:
//! the plan line is printed, a bounded cache gives the same greedy ids as
//! the mapped run, and a budget that cannot hold the minimum is refused
//! before loading, with the numbers.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q4_k_m.gguf");
    p.exists().then_some(p).or_else(|| {
        eprintln!("skipped: no fixture");
        None
    })
}

fn generate(extra: &[&str]) -> Option<Output> {
    let m = model()?;
    Some(
        Command::new(env!("CARGO_BIN_EXE_redlite"))
            .args(["generate", "-m"])
            .arg(m)
            .args([
                "--prompt-ids",
                "49,337,220,43,325",
                "-n",
                "12",
                "--temp",
                "0",
                "--print-ids",
            ])
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("running redlite generate"),
    )
}

#[test]
fn bounded_cache_same_ids_and_plan_line() {
    let Some(mapped) = generate(&[]) else { return };
    assert!(mapped.status.success());
    let err = String::from_utf8_lossy(&mapped.stderr);
    assert!(
        err.contains("memory plan:") && err.contains("resident with the other weights, no cache"),
        "{err}"
    );
    // 17.5 KiB experts: 6 slots
    let cached = generate(&["--expert-cache", "110K", "--cache-policy", "lfu"]).unwrap();
    let err = String::from_utf8_lossy(&cached.stderr);
    assert!(cached.status.success(), "{err}");
    assert!(err.contains("cache of 6 slots"), "{err}");
    assert!(
        err.contains("expert cache:") && err.contains("misses"),
        "{err}"
    );
    assert_eq!(cached.stdout, mapped.stdout, "greedy ids");
}

#[test]
fn refuses_before_loading_with_numbers() {
    let Some(out) = generate(&["--memory", "1M"]) else {
        return;
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not fit") && err.contains("budget is 1.00 MiB"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = generate(&["--expert-cache", "20K"]).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fewer than the 4 experts"), "{err}");
    let out = generate(&["--memory", "eight"]).unwrap();
    assert!(!out.status.success());
}

/// With `--spec mtp` the start-up line says the plan's state holds the MTP
/// head's KV (one attention layer's rows for every position); without it,
/// nothing is said.
#[test]
fn the_mtp_heads_kv_is_in_the_plan_line() {
    let m = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next-mtp/tiny-qwen3next-mtp-f32.gguf");
    assert!(m.exists(), "{} is committed", m.display());
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_redlite"))
            .args(["generate", "-m"])
            .arg(&m)
            .args([
                "--prompt-ids",
                "49,337,220,43,325",
                "-n",
                "4",
                "--temp",
                "0",
                "-c",
                "64",
            ])
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("running redlite generate")
    };
    let with = run(&["--spec", "mtp"]);
    let err = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{err}");
    assert!(
        err.contains("state includes the MTP head's KV")
            && err.contains("64 positions x 1 sessions"),
        "{err}"
    );
    let plain = run(&[]);
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success(), "{err}");
    assert!(!err.contains("MTP head's KV"), "{err}");
}
