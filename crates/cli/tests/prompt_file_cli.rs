//! `redlite tokenize --file` and `redlite generate -f`: prompts read from a
//! file (long prompts do not fit in one command-line argument: Linux caps
//! one at 128 KiB). On the tiny Qwen3-Next fixture: the file's ids equal
//! llama.cpp's tokenization of the same text (`manifest.json`
//! `tokenize_check.llama_ids`), and `-f` gives the same greedy tokens as
//! `-p` with the same text. Skips when the fixture folder has no manifest.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture() -> Option<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next");
    let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) else {
        eprintln!("skipped: no {}/manifest.json", dir.display());
        return None;
    };
    Some((dir, serde_json::from_str(&text).unwrap()))
}

fn redlite(args: &[&str], model: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .arg(args[0])
        .arg("-m")
        .arg(model)
        .args(&args[1..])
        .output()
        .expect("running redlite")
}

fn stdout_ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "redlite failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn tokenize_file_matches_llama_cpp_ids() {
    let Some((dir, m)) = fixture() else { return };
    let model = dir.join("tiny-qwen3next-f32.gguf");
    let text = dir.join(m["tokenize_check"]["text_file"].as_str().unwrap());
    let out = stdout_ok(&redlite(
        &["tokenize", "--file", text.to_str().unwrap()],
        &model,
    ));
    let got: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got, m["tokenize_check"]["llama_ids"]);
}

#[test]
fn generate_file_equals_prompt_argument() {
    let Some((dir, _)) = fixture() else { return };
    let model = dir.join("tiny-qwen3next-f32.gguf");
    let text = "fn main() { println!(\"long context\"); }\n";
    let tmp = std::env::temp_dir().join(format!("redlite-prompt-{}.txt", std::process::id()));
    std::fs::write(&tmp, text).unwrap();
    let common = ["--raw", "--temp", "0", "-n", "8", "--print-ids"];
    let mut a = vec!["generate", "-f", tmp.to_str().unwrap()];
    a.extend(common);
    let from_file = stdout_ok(&redlite(&a, &model));
    let mut b = vec!["generate", "-p", text];
    b.extend(common);
    let from_arg = stdout_ok(&redlite(&b, &model));
    std::fs::remove_file(&tmp).ok();
    assert_eq!(from_file, from_arg);
}

#[test]
fn missing_prompt_file_is_a_clear_error() {
    let Some((dir, _)) = fixture() else { return };
    let model = dir.join("tiny-qwen3next-f32.gguf");
    for cmd in ["generate", "tokenize"] {
        let o = redlite(&[cmd, "--file", "no-such-prompt.txt"], &model);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no-such-prompt.txt"), "{cmd}: {err}");
    }
}
