//! Every file `redlite` writes goes through a temporary beside the target
//! and is renamed into place when complete: an output that is the model
//! file (by device and inode: the same path, a hard link, a symlink) is
//! refused before anything is written, a directory is refused up front,
//! and SIGINT/SIGTERM leave neither a temporary nor a partial target.
//! Runs on a copy of the tiny Qwen3-Next fixture (tests/fixtures/qwen3next).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fixture() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q4_k_m.gguf");
    p.exists().then_some(p).or_else(|| {
        eprintln!("skipped: no fixture");
        None
    })
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-outputs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A scratch directory holding a copy of the fixture as `model.gguf`.
fn with_model(tag: &str) -> Option<(PathBuf, PathBuf, Vec<u8>)> {
    let src = fixture()?;
    let d = scratch(tag);
    let m = d.join("model.gguf");
    std::fs::copy(&src, &m).unwrap();
    let bytes = std::fs::read(&m).unwrap();
    Some((d, m, bytes))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn redlite(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("running redlite")
}

fn generate(m: &Path, extra: &[&std::ffi::OsStr]) -> Output {
    let mut a: Vec<&std::ffi::OsStr> = vec!["generate".as_ref(), "-m".as_ref(), m.as_os_str()];
    for s in [
        "--prompt-ids",
        "1,2,3",
        "-n",
        "3",
        "--temp",
        "0",
        "--print-ids",
        "--no-warmup",
    ] {
        a.push(s.as_ref());
    }
    a.extend_from_slice(extra);
    redlite(&a)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_refused(o: &Output, target: &Path, flag: &str) {
    let e = stderr(o);
    assert!(!o.status.success(), "accepted: {e}");
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains(flag), "{e}");
    assert!(e.contains(&format!("output {}", target.display())), "{e}");
    assert!(e.contains("is the same file as the input"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn an_output_that_is_the_model_is_refused_and_the_model_kept() {
    let Some((d, m, bytes)) = with_model("same") else {
        return;
    };
    let hard = d.join("hard.gguf");
    std::fs::hard_link(&m, &hard).unwrap();
    let sym = d.join("sym.gguf");
    std::os::unix::fs::symlink(&m, &sym).unwrap();
    for target in [&m, &hard, &sym] {
        for (flag, mmap) in [
            ("--dump-logits", false),
            ("--dump-logits", true),
            ("--dump-trace", false),
        ] {
            let mut extra: Vec<&std::ffi::OsStr> = vec![flag.as_ref(), target.as_os_str()];
            if mmap {
                extra.push("--mmap".as_ref());
            }
            let o = generate(&m, &extra);
            assert_refused(&o, target, flag);
            assert!(
                std::fs::read(&m).unwrap() == bytes,
                "{flag} {}: model changed",
                target.display()
            );
        }
        let o = redlite(&[
            "inspect".as_ref(),
            m.as_os_str(),
            "--tensor".as_ref(),
            "token_embd.weight".as_ref(),
            "--dump".as_ref(),
            target.as_os_str(),
        ]);
        assert_refused(&o, target, "--dump");
        assert!(
            std::fs::read(&m).unwrap() == bytes,
            "inspect --dump: model changed"
        );
    }
    // Nothing else appeared: no temporary, no partial file.
    assert_eq!(names(&d), ["hard.gguf", "model.gguf", "sym.gguf"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn dumps_appear_complete_and_nothing_is_left_on_failure() {
    let Some((d, m, _)) = with_model("dumps") else {
        return;
    };
    let logits = d.join("logits.bin");
    let trace = d.join("trace.jsonl");
    let o = generate(
        &m,
        &[
            "--dump-logits".as_ref(),
            logits.as_os_str(),
            "--dump-trace".as_ref(),
            trace.as_os_str(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // 3 prompt rows and 2 decode rows (the third token is sampled from the
    // last forward) of n_vocab f32 each.
    let f = redlite_gguf::GgufFile::open(&m).unwrap();
    let n_vocab = f
        .tensors()
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap()
        .dims[1];
    drop(f);
    assert_eq!(std::fs::metadata(&logits).unwrap().len(), 5 * 4 * n_vocab);
    assert!(std::fs::read_to_string(&trace).unwrap().lines().count() > 0);
    assert_eq!(names(&d), ["logits.bin", "model.gguf", "trace.jsonl"]);

    // A run that fails after the outputs were opened (the prompt does not
    // fit the context) leaves neither a 0-byte file nor a temporary, and
    // the earlier dump is untouched.
    let before = std::fs::read(&logits).unwrap();
    let fresh = d.join("fresh.bin");
    let o = generate(
        &m,
        &[
            "-c".as_ref(),
            "2".as_ref(),
            "--dump-logits".as_ref(),
            fresh.as_os_str(),
            "--dump-trace".as_ref(),
            trace.as_os_str(),
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("exceeds the context"), "{}", stderr(&o));
    assert_eq!(names(&d), ["logits.bin", "model.gguf", "trace.jsonl"]);
    assert_eq!(std::fs::read(&logits).unwrap(), before);
    // A run that fails after the logits were written (stdout is full):
    // the dump is not left behind as if it were complete.
    let o = Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(["generate", "-m"])
        .arg(&m)
        .args([
            "--prompt-ids",
            "1,2,3",
            "-n",
            "3",
            "--temp",
            "0",
            "--print-ids",
            "--no-warmup",
        ])
        .arg("--dump-logits")
        .arg(&fresh)
        .env("RUST_BACKTRACE", "0")
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("writing to stdout"), "{}", stderr(&o));
    assert_eq!(names(&d), ["logits.bin", "model.gguf", "trace.jsonl"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_directory_as_output_or_input_is_refused_up_front() {
    let Some((d, m, _)) = with_model("dirs") else {
        return;
    };
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let o = generate(&m, &["--dump-logits".as_ref(), sub.as_os_str()]);
    assert!(
        stderr(&o).contains(&format!("output {}: is a directory", sub.display())),
        "{}",
        stderr(&o)
    );
    let o = redlite(&[
        "synth".as_ref(),
        "--out".as_ref(),
        sub.as_os_str(),
        "--layers".as_ref(),
        "1".as_ref(),
        "--quiet".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("output {}: is a directory", sub.display())),
        "{}",
        stderr(&o)
    );
    let o = redlite(&["inspect".as_ref(), sub.as_os_str()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("{}: is a directory", sub.display())),
        "{}",
        stderr(&o)
    );
    let o = generate(&sub, &[]);
    assert!(
        stderr(&o).contains(&format!("--model {}: is a directory", sub.display())),
        "{}",
        stderr(&o)
    );
    // Nothing was written anywhere.
    assert!(names(&sub).is_empty());
    assert_eq!(names(&d), ["model.gguf", "sub"]);
    // synth --out the --tokenizer file is the same-file case.
    let o = redlite(&[
        "synth".as_ref(),
        "--out".as_ref(),
        m.as_os_str(),
        "--tokenizer".as_ref(),
        m.as_os_str(),
        "--quiet".as_ref(),
    ]);
    assert_refused(&o, &m, "output");
    let _ = std::fs::remove_dir_all(&d);
}

/// Start `synth` writing a 0.9 GB file, wait until its temporary holds
/// data (so it is mid-write), send `signal`, and check the exit status and
/// that the directory is empty again.
fn interrupt_synth(signal: &str, status: i32) {
    let d = scratch(&format!("sig{signal}"));
    let target = d.join("synth.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_redlite"))
        .args(["synth", "--layers", "1", "-t", "1", "--quiet", "--out"])
        .arg(&target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mid_write = loop {
        let written: u64 = walk(&d)
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum();
        if written > 1 << 20 {
            break true;
        }
        if child.try_wait().unwrap().is_some() || start.elapsed() > Duration::from_secs(60) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(mid_write, "synth never started writing");
    let killed = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(status), "{st:?}");
    assert!(names(&d).is_empty(), "left behind: {:?}", walk(&d));
    let _ = std::fs::remove_dir_all(&d);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn sigint_during_synth_leaves_nothing() {
    interrupt_synth("INT", 130);
}

#[test]
fn sigterm_during_synth_leaves_nothing() {
    interrupt_synth("TERM", 143);
}
