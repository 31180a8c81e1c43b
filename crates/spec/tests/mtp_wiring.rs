//! The MTP drafter's bookkeeping against llama.cpp: after the prompt and
//! after a verify pass with a partial accept, the head's first draft is
//! the argmax of llama.cpp's MTP logits at that position
//! (`tests/fixtures/qwen3next-mtp/llama_mtp_logits.npy`, row p: token x[p]
//! with trunk hidden row p-1), so the catch-up feeds the head the right
//! hidden rows at the right positions. A snapshot taken with a sequence
//! checkpoint and restored with it after the sequence ran other tokens
//! (the server's prompt cache between turns) drafts llama.cpp's argmax too.

#[path = "../../model/tests/common/npy.rs"]
mod npy;

use redlite_engine::{BackendOptions, Engine, Logits, MemoryRequest, Model};
use redlite_model::sample::argmax;
use redlite_spec::Drafter;
use std::path::PathBuf;
use std::sync::Arc;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3next-mtp")
}

#[test]
fn first_drafts_are_llama_cpps_mtp_argmax_after_prompt_and_after_a_rollback() {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap())
            .unwrap();
    let tokens: Vec<u32> = manifest["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let ll = npy::read_npy(&dir().join("llama_mtp_logits.npy"));
    let n_vocab = ll.shape[1];
    let want = |p: usize| argmax(&ll.data[p * n_vocab..(p + 1) * n_vocab]) as u32;

    let file =
        Arc::new(redlite_gguf::GgufFile::open(dir().join("tiny-qwen3next-mtp-f32.gguf")).unwrap());
    let mut e = Engine::open(
        Model::load(file, Default::default()).unwrap(),
        &BackendOptions::default(),
        &MemoryRequest {
            ctx: 80,
            sessions: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let m = e.model().clone();
    let mut seq = e.open_sequence(0).unwrap();
    let mut d = redlite_spec::mtp::MtpDrafter::new(m.clone(), 80).unwrap();
    let p = 16;
    seq.keep_hidden(true).unwrap();
    seq.prefill(&tokens[..p], Logits::Last).unwrap();
    d.prime(&mut *seq, &tokens[..p]).unwrap();
    // The draft after x[p] (about to be run at position p).
    let first = d.draft(&tokens[..=p], 1);
    assert_eq!(first, vec![want(p)], "after the prompt");
    // A verify pass of x[p..p+4], three kept.
    seq.verify(&tokens[p..p + 4]).unwrap();
    seq.accept(3).unwrap();
    d.observe(&mut *seq, &tokens[p..p + 4], 3).unwrap();
    let next = d.draft(&tokens[..=p + 3], 1);
    assert_eq!(
        next,
        vec![want(p + 3)],
        "after a verify pass keeping 3 of 4"
    );
    // Plain steps, one token each.
    for q in p + 3..p + 8 {
        seq.prefill(&tokens[q..=q], Logits::Last).unwrap();
        d.observe(&mut *seq, &tokens[q..=q], 1).unwrap();
        assert_eq!(
            d.draft(&tokens[..=q + 1], 1),
            vec![want(q + 1)],
            "after a plain step at {q}"
        );
    }
}

#[test]
fn a_snapshot_restored_with_its_checkpoint_drafts_llama_cpps_mtp_argmax() {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap())
            .unwrap();
    let tokens: Vec<u32> = manifest["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let ll = npy::read_npy(&dir().join("llama_mtp_logits.npy"));
    let n_vocab = ll.shape[1];
    let want = |p: usize| argmax(&ll.data[p * n_vocab..(p + 1) * n_vocab]) as u32;

    let file =
        Arc::new(redlite_gguf::GgufFile::open(dir().join("tiny-qwen3next-mtp-f32.gguf")).unwrap());
    let mut e = Engine::open(
        Model::load(file, Default::default()).unwrap(),
        &BackendOptions::default(),
        &MemoryRequest {
            ctx: 80,
            sessions: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let m = e.model().clone();
    let mut seq = e.open_sequence(0).unwrap();
    let mut d = redlite_spec::mtp_drafter(&m, 80).unwrap();
    let p = 16;
    seq.keep_hidden(true).unwrap();
    seq.prefill(&tokens[..p], Logits::Last).unwrap();
    d.prime(&mut *seq, &tokens[..p]).unwrap();
    let checkpoint = seq.checkpoint().unwrap();
    let snap = d.snapshot();
    assert_eq!(snap.pos(), p);
    // Another turn runs on from there with other tokens.
    let other: Vec<u32> = tokens[p..p + 6]
        .iter()
        .rev()
        .map(|&t| (t + 1) % n_vocab as u32)
        .collect();
    seq.prefill(&other, Logits::Last).unwrap();
    d.observe(&mut *seq, &other, other.len()).unwrap();
    assert_eq!(d.pos(), p + other.len());
    // The next turn resumes from the checkpoint: both go back.
    seq.restore(&checkpoint).unwrap();
    d.restore(&snap).unwrap();
    assert_eq!(d.pos(), seq.pos());
    assert_eq!(
        d.draft(&tokens[..=p], 1),
        vec![want(p)],
        "right after the restore"
    );
    seq.prefill(&tokens[p..p + 4], Logits::Last).unwrap();
    d.observe(&mut *seq, &tokens[p..p + 4], 4).unwrap();
    assert_eq!(
        d.draft(&tokens[..=p + 4], 1),
        vec![want(p + 4)],
        "after the restore and 4 more tokens"
    );
}
