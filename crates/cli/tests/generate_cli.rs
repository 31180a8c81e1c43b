//! `redlite generate` end to end on the tiny random Qwen3-Next F32 fixture
//! (`tests/fixtures/qwen3next/`): greedy ids printed as a JSON array equal
//! transformers' greedy tokens for the fixture's prompt (`manifest.json`
//! `greedy.hf_tokens`; the smallest transformers top-1/top-2 margin on that
//! path is 0.038, far above the engine's 2e-5 logit error on the F32 file).
//! Skips when the fixture folder has no manifest.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn greedy_ids_match_transformers_on_the_f32_fixture() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next");
    let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) else {
        eprintln!("skipped: no {}/manifest.json", dir.display());
        return;
    };
    let m: Value = serde_json::from_str(&text).unwrap();
    let prompt = ids(&m["greedy"]["prompt"]);
    let want = ids(&m["greedy"]["hf_tokens"]);
    let prompt_arg = prompt
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let n = want.len().to_string();
    let model = dir.join("tiny-qwen3next-f32.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(["generate", "-m"])
        .arg(&model)
        .args([
            "--prompt-ids",
            &prompt_arg,
            "-n",
            &n,
            "--temp",
            "0",
            "--print-ids",
        ])
        .output()
        .expect("running redlite generate");
    assert!(
        out.status.success(),
        "redlite generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    // The ids are the one JSON array on stdout.
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with('['))
        .unwrap_or_else(|| panic!("no JSON array in stdout: {stdout:?}"));
    let got = ids(&serde_json::from_str::<Value>(line.trim()).expect("JSON array"));
    assert_eq!(got, want, "greedy ids vs transformers");
}
