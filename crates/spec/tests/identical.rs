//! Speculative decoding returns, token for token, what plain greedy
//! decoding returns: on the four tiny Qwen3-Next fixtures (DeltaNet state
//! rolled back on every rejection) and the demo model when it is present,
//! for every draft length, with prompt lookup and with a drafter that is
//! right for a while and then wrong (so both the kept and the rejected
//! paths run, which lookup alone on random weights rarely gives).
//!
//! Plain greedy decoding itself is checked against llama.cpp and
//! transformers elsewhere (`crates/model/tests/fixture_parity.rs`,
//! `qwen2_llama_parity.rs`); this guards that speculation changes nothing.

use redlite_engine::{BackendOptions, Engine, Logits, MemoryRequest, Model};
use redlite_model::sample::Sampler;
use redlite_model::sequence::Sequence;
use redlite_spec::{Drafter, PromptLookup, SpecOptions, Speculator};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next")
        .join(name)
}

fn engine(path: &std::path::Path, ctx: usize) -> Engine {
    let file = Arc::new(redlite_gguf::GgufFile::open(path).expect("model opens"));
    let model = Model::load(file, Default::default()).expect("model loads");
    Engine::open(
        model,
        &BackendOptions::default(),
        &MemoryRequest {
            ctx,
            sessions: 1,
            ..Default::default()
        },
    )
    .expect("engine opens")
}

fn plain(seq: &mut dyn Sequence, prompt: &[u32], n: usize) -> Vec<u32> {
    seq.reset().unwrap();
    let mut sampler = Sampler::greedy();
    let mut history = prompt.to_vec();
    let mut logits = seq.prefill(prompt, Logits::Last).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let t = sampler.sample(&logits, &history);
        out.push(t);
        history.push(t);
        if i + 1 < n {
            logits = seq.decode(t).unwrap();
        }
    }
    out
}

fn speculative<D: Drafter>(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    n: usize,
    spec: &mut Speculator<D>,
) -> Vec<u32> {
    seq.reset().unwrap();
    let mut sampler = Sampler::greedy();
    let mut history = prompt.to_vec();
    let mut logits = seq.prefill(prompt, Logits::Last).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let step = spec
            .step(
                seq,
                &mut sampler,
                &mut history,
                &mut logits,
                n - out.len(),
                &|_| false,
            )
            .unwrap();
        assert!(step.stop.is_none());
        out.extend(step.tokens);
        assert_eq!(history.len(), prompt.len() + out.len());
        if step.all_run {
            assert_eq!(seq.pos(), history.len(), "the sequence runs what it emits");
        }
    }
    assert_eq!(out.len(), n, "never more than the budget");
    out
}

/// Proposes the true continuation with one wrong token every `period`
/// positions.
struct Scripted {
    truth: Vec<u32>,
    prompt_len: usize,
    period: usize,
}

impl Drafter for Scripted {
    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let at = history.len() - self.prompt_len;
        (at..at + max)
            .take_while(|&i| i < self.truth.len())
            .map(|i| {
                if i % self.period == self.period - 1 {
                    (self.truth[i] + 1) % 64
                } else {
                    self.truth[i]
                }
            })
            .collect()
    }
}

fn check_model(path: &std::path::Path, prompt: &[u32], n: usize, draft_maxes: &[usize]) {
    let mut e = engine(path, 256);
    let mut seq = e.open_sequence(0).unwrap();
    let want = plain(&mut *seq, prompt, n);
    let name = path.file_name().unwrap().to_string_lossy();
    for &draft_max in draft_maxes {
        // Every step drafts (no timing-based back-off): the test must run
        // the same passes on any machine.
        let opts = SpecOptions {
            draft_max,
            adaptive: false,
            ..Default::default()
        };
        let mut s = Speculator::new(PromptLookup::new(opts.ngram_min, opts.ngram_max), opts);
        assert_eq!(
            speculative(&mut *seq, prompt, n, &mut s),
            want,
            "{name}: lookup, draft-max {draft_max}"
        );
        for period in [3usize, 7] {
            let d = Scripted {
                truth: want.clone(),
                prompt_len: prompt.len(),
                period,
            };
            let mut s = Speculator::new(d, opts);
            assert_eq!(
                speculative(&mut *seq, prompt, n, &mut s),
                want,
                "{name}: scripted drafts (wrong every {period}), draft-max {draft_max}"
            );
            assert!(s.stats.accepted > 0, "{name}: nothing kept: {:?}", s.stats);
            if draft_max >= period {
                assert!(
                    s.stats.accepted < s.stats.drafted,
                    "{name}: nothing rejected: {:?}",
                    s.stats
                );
            }
        }
    }
}

#[test]
fn greedy_tokens_are_identical_on_the_tiny_fixtures() {
    // A prompt that repeats itself, so lookup has n-grams to match.
    let prompt: Vec<u32> = [1, 17, 33, 5, 250, 7, 91, 12, 3, 17, 33, 5, 250, 7]
        .into_iter()
        .collect();
    for name in [
        "tiny-qwen3next-f32.gguf",
        "tiny-qwen3next-q8_0.gguf",
        "tiny-qwen3next-q4_k_m.gguf",
        "tiny-qwen3next-iq2_xxs.gguf",
    ] {
        check_model(&fixture(name), &prompt, 40, &(1..=16).collect::<Vec<_>>());
    }
}

#[test]
fn greedy_tokens_are_identical_on_the_demo_model() {
    let Some(path) = std::env::var_os("REDLITE_DEMO_MODEL").map(PathBuf::from) else {
        eprintln!("REDLITE_DEMO_MODEL not set: the demo-model half of this test is skipped");
        return;
    };
    let file = redlite_gguf::GgufFile::open(&path).unwrap();
    let tok = redlite_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n# The same two functions again, renamed:\ndef plus(a, b):\n";
    let prompt = tok.encode(text, true);
    // Every length on the fixtures; here the lengths either side of the
    // scripted drafter's error periods and the default maximum.
    check_model(&path, &prompt, 32, &[1, 2, 3, 6, 7, 8, 16]);
}

/// `--spec mtp` on the fixture with a NextN block (its MTP head is
/// checked against llama.cpp's in `crates/model/tests/mtp_fixture.rs`):
/// the head drafts, and the output is plain decoding's for every length.
#[test]
fn mtp_drafts_keep_greedy_tokens_identical() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next-mtp/tiny-qwen3next-mtp-f32.gguf");
    let mut e = engine(&path, 128);
    let model = e.model().clone();
    let mut seq = e.open_sequence(0).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 11) % 200).collect();
    let want = plain(&mut *seq, &prompt, 32);
    for draft_max in [1usize, 2, 4, 8] {
        let opts = SpecOptions {
            mode: redlite_spec::SpecMode::Mtp,
            draft_max,
            adaptive: false,
            ..Default::default()
        };
        let mut s = redlite_spec::from_options(&opts, &model, 128)
            .unwrap()
            .unwrap();
        assert!(s.needs_hidden());
        seq.reset().unwrap();
        seq.keep_hidden(true).unwrap();
        let mut sampler = Sampler::greedy();
        let mut history = prompt.clone();
        let mut logits = seq.prefill(&prompt, Logits::Last).unwrap();
        s.prime(&mut *seq, &prompt).unwrap();
        let mut out = Vec::new();
        while out.len() < 32 {
            let step = s
                .step(
                    &mut *seq,
                    &mut sampler,
                    &mut history,
                    &mut logits,
                    32 - out.len(),
                    &|_| false,
                )
                .unwrap();
            out.extend(step.tokens);
        }
        assert_eq!(out, want, "mtp, draft-max {draft_max}: {:?}", s.stats());
        assert!(s.stats().drafted > 0, "the head drafted nothing");
        eprintln!("mtp draft-max {draft_max}: {}", s.stats().line());
    }
    // A file without the layer says so.
    let nomtp = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next-mtp/tiny-qwen3next-nomtp-f32.gguf");
    let e2 = engine(&nomtp, 32);
    let opts = SpecOptions {
        mode: redlite_spec::SpecMode::Mtp,
        ..Default::default()
    };
    let err = redlite_spec::from_options(&opts, e2.model(), 32)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no multi-token-prediction layer"), "{err}");
}
