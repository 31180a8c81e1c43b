//! Limits on what the command line and the model file give, end to end:
//! stdout errors (a closed pipe, a full disk) are not panics, thread counts
//! are capped with a warning, sampling parameters are range-checked at
//! parse time, a context above the trained one is warned about, and a chat
//! template that does not parse is an error with --chat and a warning
//! otherwise. Runs on the tiny Qwen3-Next fixture (tests/fixtures/qwen3next).

use redlite_gguf::{GgufFile, GgufWriter};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q4_k_m.gguf");
    p.exists().then_some(p).or_else(|| {
        eprintln!("skipped: no fixture");
        None
    })
}

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_redlite"));
    c.args(args).env("RUST_BACKTRACE", "0");
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn generate(m: &Path, extra: &[&str]) -> Output {
    cmd(&["generate", "-m"])
        .arg(m)
        .args([
            "--prompt-ids",
            "1,2,3",
            "-n",
            "2",
            "--temp",
            "0",
            "--print-ids",
            "--no-warmup",
        ])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn stdout_on_a_full_disk_is_an_error_naming_stdout() {
    let Some(m) = fixture() else { return };
    let m = m.to_str().unwrap();
    for args in [vec!["inspect", m], vec!["tokenize", "-m", m, "hello world"]] {
        let o = cmd(&args)
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains("writing to stdout"), "{e}");
        assert!(e.contains("No space left on device"), "{e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn a_closed_pipe_ends_quietly_with_141() {
    let Some(m) = fixture() else { return };
    // About 250 KB of ids: more than a pipe holds, so the writer is
    // blocked in write() when the reader goes away.
    let long = " a".repeat(50_000);
    let mut child = cmd(&["tokenize", "-m", m.to_str().unwrap(), &long])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    out.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"[");
    drop(out);
    let o = child.wait_with_output().unwrap();
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{e}");
    assert!(!e.contains("panicked") && !e.contains("Error"), "{e}");
}

#[test]
fn thread_counts_are_capped_with_a_warning() {
    let Some(m) = fixture() else { return };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let o = generate(&m, &["-t", "100000", "--io-threads", "100000"]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "--threads 100000: more threads than 4 per core ({cores} cores) cannot help; using {}",
            4 * cores
        )),
        "{e}"
    );
    assert!(e.contains(&format!("{} threads", 4 * cores)), "{e}");
    assert!(
        e.contains(&format!("--io-threads 100000: more I/O threads than 4 per core ({cores} cores) cannot help; using {}", (4 * cores).max(64))),
        "{e}"
    );
    // synth's -t as well (checked before planning; --report only).
    let o = cmd(&[
        "synth",
        "--report",
        "--layers",
        "1",
        "--report-tokens",
        "2",
        "-t",
        "100000",
    ])
    .stdout(Stdio::null())
    .output()
    .unwrap();
    // --report does not use the threads; the cap is applied (and warned
    // about) before the command runs.
    assert!(
        text(&o.stderr).contains("--threads 100000"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn sampling_parameters_out_of_range_are_refused_at_parse_time() {
    let Some(m) = fixture() else { return };
    for (flag, value, range) in [
        ("--top-p", "2", "between 0 and 1"),
        ("--min-p", "2", "between 0 and 1"),
        ("--temp", "-1", "between 0 and 2"),
        ("--temp", "nan", "between 0 and 2"),
        ("--repeat-penalty", "inf", "between 0 and 10"),
    ] {
        let o = cmd(&["generate", "-m", m.to_str().unwrap(), "--prompt-ids", "1"])
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {e}");
        assert!(
            e.contains(&format!("invalid value '{value}' for '{flag}")),
            "{e}"
        );
        assert!(e.contains(range), "{e}");
    }
}

#[test]
fn a_context_above_the_trained_one_is_warned_about() {
    let Some(m) = fixture() else { return };
    let trained = GgufFile::open(&m)
        .unwrap()
        .metadata()
        .get_u64("qwen3next.context_length")
        .unwrap();
    let above = (trained + 1).to_string();
    let o = generate(&m, &["-c", &above]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "--ctx-size {above} is above the model's trained context of {trained} tokens"
        )),
        "{e}"
    );
    let o = generate(&m, &["-c", &trained.to_string()]);
    assert!(!text(&o.stderr).contains("trained context"));
}

/// The fixture with `tokenizer.chat_template` set to `template`.
fn with_template(dir: &Path, template: &str) -> PathBuf {
    let src = GgufFile::open(fixture().unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if k != "general.alignment" {
            w.add_kv(k, v.clone());
        }
    }
    w.add_kv("tokenizer.chat_template", template);
    for t in src.tensors() {
        let data = src.tensor(&t.name).unwrap().data.to_vec();
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, data)
            .unwrap();
    }
    let p = dir.join("templated.gguf");
    w.write(&p).unwrap();
    p
}

#[test]
fn a_template_that_does_not_parse_is_an_error_with_chat_and_a_warning_otherwise() {
    if fixture().is_none() {
        return;
    }
    let d = std::env::temp_dir().join(format!("redlite-limits-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let m = with_template(&d, "{% for m in messages %}{{ m.content }");
    let run = |extra: &[&str]| {
        cmd(&["generate", "-m"])
            .arg(&m)
            .args(["-p", "hello", "-n", "1", "--temp", "0", "--no-warmup"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = run(&["--chat"]);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains(&format!("--chat: {}", m.display())), "{e}");
    assert!(e.contains("tokenizer.chat_template"), "{e}");
    assert!(e.contains("does not parse"), "{e}");
    let o = run(&[]);
    let e = text(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("WARN") && e.contains("does not parse"), "{e}");
    // The server needs the template (/v1/chat/completions): it refuses to
    // start instead of serving without one.
    let mut child = cmd(&["serve", "--port", "0", "--no-warmup", "-m"])
        .arg(&m)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("serve started with a template that does not parse");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains(&format!("serve {}", m.display())), "{e}");
    assert!(
        e.contains("tokenizer.chat_template") && e.contains("does not parse"),
        "{e}"
    );
    // A looping template is stopped by the step limit, with --chat or by default.
    let m = with_template(
        &d,
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    );
    let o = cmd(&["generate", "-m"])
        .arg(&m)
        .args(["-p", "hello", "-n", "1", "--no-warmup"])
        .output()
        .unwrap();
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("template steps"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
