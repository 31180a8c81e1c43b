//! The engine loop's MTP bookkeeping on the fixture with an MTP block,
//! against llama.cpp: a prompt that resumes from a prompt-cache checkpoint
//! after another conversation ran in between leaves the drafter where a
//! fresh one would be, so its draft for the next token is the argmax of
//! llama.cpp's MTP logits at that position
//! (`tests/fixtures/qwen3next-mtp/llama_mtp_logits.npy`, row p: token x[p]
//! with trunk hidden row p-1; x the manifest's tokens).

use super::*;
use redlite_spec::Drafter;
use std::path::PathBuf;

#[path = "../../../model/tests/common/npy.rs"]
mod npy;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next-mtp")
}

const CTX: usize = 80;

fn fixture_engine() -> Engine {
    let file = Arc::new(
        redlite_gguf::GgufFile::open(dir().join("tiny-qwen3next-mtp-f32.gguf")).expect("fixture"),
    );
    let tok = Arc::new(Tokenizer::from_gguf(file.metadata()).expect("fixture tokenizer"));
    let model = redlite_engine::Model::load(file, Default::default()).expect("fixture loads");
    let mut backend = redlite_engine::Engine::open(
        model,
        &redlite_engine::BackendOptions::default(),
        &redlite_engine::MemoryRequest {
            ctx: CTX,
            sessions: 5,
            ..Default::default()
        },
    )
    .expect("engine opens");
    let model = backend.model().clone();
    let seq = backend.open_sequence(CTX).expect("sequence opens");
    let cfg = EngineConfig {
        ctx: CTX,
        // Prompts in chunks of 4: the drafter catches up chunk by chunk.
        ubatch: 4,
        prompt_cache: true,
        max_checkpoints: 4,
        state_dir: None,
        spec: redlite_spec::SpecOptions {
            mode: redlite_spec::SpecMode::Mtp,
            adaptive: false,
            ..Default::default()
        },
        model: Some(model.clone()),
    };
    let mut e = Engine::new(seq, tok, cfg, Arc::new(Metrics::default()));
    e.mtp = Some(mtp::MtpTrack::open(&model, CTX, e.seq.as_mut()).expect("the fixture has a head"));
    e
}

fn generate(e: &mut Engine, prompt: &[u32], max_tokens: usize) -> Done {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: prompt.to_vec(),
        max_tokens,
        sampler: SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        },
        stop: Vec::new(),
        events: tx,
        logprobs: None,
        grammar: None,
        spec: Default::default(),
    };
    match e.generate(job) {
        Ok(Some(done)) => done,
        Ok(None) => panic!("cancelled"),
        Err(err) => panic!("{err}"),
    }
}

#[test]
fn a_resumed_prompt_leaves_the_drafter_at_llama_cpps_mtp_argmax() {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap())
            .unwrap();
    let x: Vec<u32> = manifest["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let ll = npy::read_npy(&dir().join("llama_mtp_logits.npy"));
    let n_vocab = ll.shape[1];
    let want =
        |p: usize| redlite_model::sample::argmax(&ll.data[p * n_vocab..(p + 1) * n_vocab]) as u32;
    let mut e = fixture_engine();
    let draft_at = |e: &mut Engine, p: usize| {
        let m = e.mtp.as_mut().unwrap();
        assert_eq!(m.drafter().pos(), p);
        m.drafter().draft(&x[..=p], 1)
    };

    // Turn 1: x[..18], computed (one token generated, not run).
    assert_eq!(generate(&mut e, &x[..18], 1).cached_tokens, 0);
    assert_eq!(draft_at(&mut e, 18), vec![want(18)], "after a fresh prompt");
    // Another conversation runs in between (the drafter moves with it).
    let other: Vec<u32> = x[30..50].iter().rev().copied().collect();
    generate(&mut e, &other, 6);
    // Turn 2 resumes from turn 1's prompt checkpoint.
    assert_eq!(generate(&mut e, &x[..27], 1).cached_tokens, 18);
    assert_eq!(
        draft_at(&mut e, 27),
        vec![want(27)],
        "after a resumed prompt"
    );
    // And a prompt wholly in the cache (nothing prefilled).
    assert_eq!(generate(&mut e, &x[..27], 1).cached_tokens, 27);
    assert_eq!(
        draft_at(&mut e, 27),
        vec![want(27)],
        "after a cached prompt"
    );
}
