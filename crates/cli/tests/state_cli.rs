//! `generate --save-state` / `--load-state` end to end: a run split by a
//! state file gives bit-identical tokens and logits to the same run in
//! one piece (sampled, so the RNG and the penalties' history travel too),
//! on the tiny Qwen3-Next fixture (attention KV rows and DeltaNet conv and
//! recurrent states) and on the demo model (qwen2, when it is here); and a
//! state file for another model, a truncated one, or a prompt that does not
//! extend it, are refused naming the file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next")
        .join(name)
}

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-state-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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

fn redlite(model: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(["generate", "--no-warmup", "-c", "256", "-m"])
        .arg(model)
        .args(args)
        .output()
        .expect("running redlite generate")
}

fn ok(o: Output) -> (Vec<u64>, String) {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "redlite generate failed: {err}");
    let out = String::from_utf8(o.stdout).unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with('['))
        .unwrap_or_else(|| panic!("no ids in {out:?}"));
    (serde_json::from_str(line).unwrap(), err)
}

fn fails(o: Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One run of `n` tokens against the same run split at `k` tokens by a
/// state file: the same ids, and the split run's logits rows (decodes
/// after the load) are byte for byte the one-piece run's last rows.
fn split_run_matches(model: &Path, prompt: &str, n: usize, k: usize, tag: &str) {
    let d = dir(tag);
    let (state, a_log, c_log) = (d.join("s.state"), d.join("a.f32"), d.join("c.f32"));
    let sampling = [
        "--temp",
        "1.5",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "--repeat-penalty",
        "1.3",
        "--print-ids",
    ];
    let whole = [&["--prompt-ids", prompt, "--seed", "11"][..], &sampling].concat();
    let (all, _) = ok(redlite(
        model,
        &[
            &whole[..],
            &[
                "-n",
                &n.to_string(),
                "--dump-logits",
                a_log.to_str().unwrap(),
            ],
        ]
        .concat(),
    ));
    let (first, err) = ok(redlite(
        model,
        &[
            &whole[..],
            &[
                "-n",
                &k.to_string(),
                "--save-state",
                state.to_str().unwrap(),
            ],
        ]
        .concat(),
    ));
    assert!(err.contains("state saved to"), "{err}");
    let (second, err) = ok(redlite(
        model,
        &[
            &sampling[..],
            &[
                "-n",
                &(n - k).to_string(),
                "--load-state",
                state.to_str().unwrap(),
                "--dump-logits",
                c_log.to_str().unwrap(),
            ],
        ]
        .concat(),
    ));
    assert!(err.contains("state loaded from"), "{err}");
    assert_eq!(
        all.len(),
        n,
        "ran past an end-of-generation token; pick another prompt"
    );
    assert_eq!([first, second].concat(), all);
    // The sampled path must not be greedy's, or the RNG would not matter.
    let (greedy, _) = ok(redlite(
        model,
        &[
            "--prompt-ids",
            prompt,
            "--temp",
            "0",
            "-n",
            &n.to_string(),
            "--print-ids",
        ],
    ));
    assert_ne!(greedy, all, "the sampled run equals the greedy one");
    let a = std::fs::read(&a_log).unwrap();
    let c = std::fs::read(&c_log).unwrap();
    assert!(!c.is_empty());
    assert_eq!(
        &a[a.len() - c.len()..],
        &c[..],
        "logits after the load differ"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_run_split_by_a_state_file_is_bit_identical_on_the_qwen3next_fixture() {
    split_run_matches(
        &fixture("tiny-qwen3next-f32.gguf"),
        "1,2,3,4,5,6,7",
        14,
        5,
        "q3n",
    );
}

#[test]
fn a_run_split_by_a_state_file_is_bit_identical_on_the_demo_model() {
    let Some(m) = demo_model() else { return };
    // "def fibonacci(n):" in the demo model's tokenizer.
    split_run_matches(&m, "750,75698,1445,1648", 10, 4, "demo");
}

#[test]
fn a_prompt_that_extends_a_saved_prompt_prefills_only_the_rest() {
    let m = fixture("tiny-qwen3next-f32.gguf");
    let d = dir("extend");
    let state = d.join("p.state");
    let (_, err) = ok(redlite(
        &m,
        &[
            "--prompt-ids",
            "9,8,7",
            "-n",
            "0",
            "--print-ids",
            "--save-state",
            state.to_str().unwrap(),
        ],
    ));
    assert!(err.contains("3 positions"), "{err}");
    let full = [
        "--prompt-ids",
        "9,8,7,6,5,4",
        "--temp",
        "0",
        "-n",
        "6",
        "--print-ids",
    ];
    let (direct, _) = ok(redlite(&m, &full));
    let (resumed, err) = ok(redlite(
        &m,
        &[&full[..], &["--load-state", state.to_str().unwrap()]].concat(),
    ));
    assert!(
        err.contains("prompt 3 tokens"),
        "only the 3 new tokens are prefilled: {err}"
    );
    assert_eq!(resumed, direct);
    let e = fails(redlite(
        &m,
        &[
            "--prompt-ids",
            "9,8,1,2",
            "-n",
            "1",
            "--load-state",
            state.to_str().unwrap(),
        ],
    ));
    assert!(
        e.contains("p.state") && e.contains("differs from the state's tokens at token 2"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_state_of_another_model_or_a_truncated_one_is_refused() {
    let f32 = fixture("tiny-qwen3next-f32.gguf");
    let d = dir("refuse");
    let state = d.join("f32.state");
    ok(redlite(
        &f32,
        &[
            "--prompt-ids",
            "1,2,3",
            "-n",
            "2",
            "--print-ids",
            "--save-state",
            state.to_str().unwrap(),
        ],
    ));
    // The Q8_0 file has the same architecture and shapes but another
    // tensor table (types, sizes, offsets).
    let e = fails(redlite(
        &fixture("tiny-qwen3next-q8_0.gguf"),
        &["-n", "1", "--load-state", state.to_str().unwrap()],
    ));
    assert!(
        e.contains("f32.state") && e.contains("another model") && e.contains("tensor table hash"),
        "{e}"
    );
    let bytes = std::fs::read(&state).unwrap();
    let cut = d.join("cut.state");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = fails(redlite(
        &f32,
        &["-n", "1", "--load-state", cut.to_str().unwrap()],
    ));
    assert!(e.contains("cut.state") && e.contains("truncated"), "{e}");
    // Saving over the model is refused before anything runs.
    let e = fails(redlite(
        &f32,
        &[
            "--prompt-ids",
            "1",
            "-n",
            "1",
            "--save-state",
            f32.to_str().unwrap(),
        ],
    ));
    assert!(e.contains("same file as the input"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}
