//! The sequence API on the CPU backend: a checkpoint taken after a
//! prefill and restored after other tokens were decoded gives, bit for
//! bit, the logits of a run that never left the checkpointed path.
//!
//! The run itself is checked against llama.cpp's and transformers' logits
//! on the same fixture elsewhere (`crates/model/tests/fixture_parity.rs`);
//! what this guards is that checkpoint/restore loses nothing: KV rows,
//! the DeltaNet conv window and recurrent state, and the position.

mod common;

use common::{cpu_engine, fixture, PROMPT};
use redlite_engine::{BackendOptions, Engine, Logits, MemoryRequest, Model};
use std::sync::Arc;

fn engine(name: &str, ctx: usize, sessions: usize) -> Engine {
    cpu_engine(name, ctx, sessions)
}

const NEXT: [u32; 4] = [40, 41, 42, 43];
const DETOUR: [u32; 3] = [99, 98, 97];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn restore_after_a_detour_is_bit_identical_to_a_straight_run() {
    for name in ["tiny-qwen3next-q8_0.gguf", "tiny-qwen3next-f32.gguf"] {
        let mut e = engine(name, 64, 2);
        let mut seq = e.open_sequence(0).unwrap();
        assert_eq!(seq.ctx_len(), 64);

        // The straight run.
        let p0 = seq.prefill(&PROMPT, Logits::Last).unwrap();
        let straight: Vec<Vec<u32>> = NEXT
            .iter()
            .map(|&t| bits(&seq.decode(t).unwrap()))
            .collect();

        // Prefill again, checkpoint, go elsewhere, come back.
        seq.reset().unwrap();
        assert_eq!(seq.pos(), 0);
        assert_eq!(
            bits(&seq.prefill(&PROMPT, Logits::Last).unwrap()),
            bits(&p0),
            "{name}: reset"
        );
        let cp = seq.checkpoint().unwrap();
        assert_eq!(cp.pos(), PROMPT.len());
        assert!(cp.bytes() > 0);
        let detour: Vec<Vec<u32>> = DETOUR
            .iter()
            .map(|&t| bits(&seq.decode(t).unwrap()))
            .collect();
        assert_eq!(seq.pos(), PROMPT.len() + DETOUR.len());
        seq.restore(&cp).unwrap();
        assert_eq!(seq.pos(), PROMPT.len());
        let again: Vec<Vec<u32>> = NEXT
            .iter()
            .map(|&t| bits(&seq.decode(t).unwrap()))
            .collect();
        assert_eq!(
            again, straight,
            "{name}: restored run differs from the straight one"
        );
        // The detour really changed the state: without the restore the
        // next logits would not be the straight run's.
        assert_ne!(
            detour[0], straight[0],
            "{name}: the detour did not move the state"
        );
        let mut unrestored = e.open_sequence(0).unwrap();
        unrestored.prefill(&PROMPT, Logits::Last).unwrap();
        for &t in &DETOUR {
            unrestored.decode(t).unwrap();
        }
        assert_ne!(bits(&unrestored.decode(NEXT[0]).unwrap()), straight[0]);

        // A checkpoint restores as often as asked.
        seq.restore(&cp).unwrap();
        assert_eq!(bits(&seq.decode(NEXT[0]).unwrap()), straight[0]);
    }
}

#[test]
fn the_parity_tools_round_trip_passes_on_the_cpu() {
    let mut e = engine("tiny-qwen3next-iq2_xxs.gguf", 32, 2);
    let mut seq = e.open_sequence(0).unwrap();
    let (differing, moved) =
        redlite_engine::parity::checkpoint_roundtrip(&mut *seq, &PROMPT, &NEXT, &DETOUR).unwrap();
    assert_eq!(differing, 0);
    assert!(
        moved,
        "the detour must change the state, or the check proves nothing"
    );
}

#[test]
fn all_logits_last_row_matches_last() {
    let mut e = engine("tiny-qwen3next-q8_0.gguf", 32, 1);
    let mut seq = e.open_sequence(0).unwrap();
    let all = seq.prefill(&PROMPT, Logits::All).unwrap();
    let n_vocab = e.model().n_vocab();
    assert_eq!(all.len(), PROMPT.len() * n_vocab);
    seq.reset().unwrap();
    let last = seq.prefill(&PROMPT, Logits::Last).unwrap();
    // All rows go through the output GEMM, the last alone through a GEMV:
    // the same sums in another order, so equal to rounding only.
    let row = &all[(PROMPT.len() - 1) * n_vocab..];
    let worst = row
        .iter()
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |w, d| if d.is_nan() || d > w { d } else { w });
    assert!(worst < 1e-4, "last row of All vs Last: {worst}");
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let mut e = engine("tiny-qwen3next-q8_0.gguf", 8, 1);
    // A sequence longer than the plan made room for.
    let err = e.open_sequence(9).err().expect("refused").to_string();
    assert!(
        err.contains("9 positions") && err.contains("made for 8"),
        "{err}"
    );
    let mut seq = e.open_sequence(4).unwrap();
    let err = seq.prefill(&PROMPT, Logits::Last).unwrap_err().to_string();
    assert!(err.contains("context"), "{err}");
    let err = seq
        .prefill(&[u32::MAX], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocabulary"), "{err}");
    assert!(seq.prefill(&[], Logits::Last).is_err());
    // A checkpoint of a sequence of another length is refused.
    let mut other = e.open_sequence(8).unwrap();
    other.prefill(&PROMPT[..2], Logits::Last).unwrap();
    let cp = other.checkpoint().unwrap();
    let err = seq.restore(&cp).unwrap_err().to_string();
    assert!(err.contains("8-position") && err.contains("4"), "{err}");
    // Skipping positions is a GPU timing tool; the CPU says so.
    let err = seq.skip_to(3).unwrap_err().to_string();
    assert!(
        err.contains("cpu") && err.contains("not supported"),
        "{err}"
    );
}

/// The error of opening the q8_0 fixture with `opts`.
fn open_error(opts: &BackendOptions) -> String {
    let file = Arc::new(redlite_gguf::GgufFile::open(fixture("tiny-qwen3next-q8_0.gguf")).unwrap());
    let model = Model::load(file, Default::default()).unwrap();
    let mem = MemoryRequest {
        ctx: 8,
        sessions: 1,
        ..Default::default()
    };
    Engine::open(model, opts, &mem).unwrap_err().to_string()
}

#[test]
fn gpu_options_on_the_cpu_are_refused() {
    let err = open_error(&BackendOptions {
        kv_type: Some(redlite_engine::KvType::F16),
        ..Default::default()
    });
    assert!(
        err.contains("--kv-type") && err.contains("--device cuda"),
        "{err}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_names_the_feature() {
    let err = open_error(&BackendOptions {
        device: redlite_engine::Device::Cuda,
        ..Default::default()
    });
    assert!(err.contains("--features cuda"), "{err}");
}

/// `parity::compare_prefill` on the CPU: the batched prefill of the whole
/// prompt against the same backend token by token agrees at every
/// position and in its greedy tokens; against another quantization of the
/// model (q8_0 weights against f32) the same comparison shows a distance,
/// so it is not blind.
#[test]
fn compare_prefill_sees_agreement_and_difference() {
    use redlite_engine::parity::compare_prefill;
    let mut e1 = engine("tiny-qwen3next-f32.gguf", 64, 1);
    let mut e2 = engine("tiny-qwen3next-f32.gguf", 64, 1);
    let (mut a, mut b) = (e1.open_sequence(0).unwrap(), e2.open_sequence(0).unwrap());
    let p = compare_prefill(&mut *a, &mut *b, &PROMPT, 4).unwrap();
    assert_eq!(p.steps, PROMPT.len() + 4);
    assert_eq!(p.argmax_agree, p.steps);
    assert!(p.greedy_equal());
    assert!(p.worst.kl < 1e-6, "KL {}", p.worst.kl);
    let mut e3 = engine("tiny-qwen3next-q8_0.gguf", 64, 1);
    let mut c = e3.open_sequence(0).unwrap();
    let q = compare_prefill(&mut *a, &mut *c, &PROMPT, 0).unwrap();
    assert_eq!(q.steps, PROMPT.len());
    assert!(q.worst.max_abs > 1e-4, "q8_0 against f32: {:?}", q.worst);
}

/// A verify pass gives, bit for bit, the logits of decoding its tokens one
/// by one, and keeping any prefix of it leaves the sequence exactly where
/// decoding that prefix would have: the next tokens' logits are the
/// straight run's. On every quantized fixture, whose formats take
/// different kernels for batches than for one token.
#[test]
fn verify_then_accept_equals_decoding_the_kept_tokens() {
    for name in [
        "tiny-qwen3next-f32.gguf",
        "tiny-qwen3next-q8_0.gguf",
        "tiny-qwen3next-q4_k_m.gguf",
        "tiny-qwen3next-iq2_xxs.gguf",
    ] {
        let mut e = engine(name, 64, 2);
        let n_vocab = e.model().n_vocab();
        let mut seq = e.open_sequence(0).unwrap();
        seq.prefill(&PROMPT, Logits::Last).unwrap();
        let straight: Vec<u32> = NEXT
            .iter()
            .chain(&DETOUR)
            .flat_map(|&t| bits(&seq.decode(t).unwrap()))
            .collect();
        let row = |i: usize| &straight[i * n_vocab..(i + 1) * n_vocab];
        for keep in 0..=NEXT.len() {
            seq.reset().unwrap();
            seq.prefill(&PROMPT, Logits::Last).unwrap();
            let v = seq.verify(&NEXT).unwrap();
            assert_eq!(
                bits(&v),
                straight[..NEXT.len() * n_vocab],
                "{name}: verify rows"
            );
            seq.accept(keep).unwrap();
            assert_eq!(seq.pos(), PROMPT.len() + keep);
            // Continue with the rest of the straight run's tokens.
            for (i, &t) in NEXT[keep..].iter().chain(&DETOUR).enumerate() {
                let l = bits(&seq.decode(t).unwrap());
                assert_eq!(l, row(keep + i), "{name}: keep {keep}, token {i} after");
            }
        }
        // Rejected tokens must have changed the state, or the rollback
        // proves nothing: without it the next logits differ.
        seq.reset().unwrap();
        seq.prefill(&PROMPT, Logits::Last).unwrap();
        seq.verify(&NEXT).unwrap();
        let unrolled = bits(&seq.decode(NEXT[1]).unwrap());
        assert_ne!(
            unrolled,
            row(1),
            "{name}: the rejected tokens did not matter"
        );
        // Verify twice in a row: the second pass keeps the first whole.
        seq.reset().unwrap();
        seq.prefill(&PROMPT, Logits::Last).unwrap();
        seq.verify(&NEXT[..2]).unwrap();
        let v2 = seq.verify(&NEXT[2..]).unwrap();
        assert_eq!(bits(&v2), straight[2 * n_vocab..4 * n_vocab]);
        seq.accept(1).unwrap();
        assert_eq!(bits(&seq.decode(NEXT[3]).unwrap()), row(3));
    }
}

#[test]
fn accept_without_a_verify_pass_is_an_error() {
    let mut e = engine("tiny-qwen3next-q8_0.gguf", 32, 1);
    let mut seq = e.open_sequence(0).unwrap();
    seq.prefill(&PROMPT, Logits::Last).unwrap();
    let err = seq.accept(1).unwrap_err().to_string();
    assert!(err.contains("without a verify pass"), "{err}");
    seq.verify(&NEXT).unwrap();
    let err = seq.accept(5).unwrap_err().to_string();
    assert!(err.contains("keeping 5 tokens of a pass of 4"), "{err}");
    // A decode after the pass keeps all of it, and ends it.
    seq.verify(&NEXT).unwrap();
    seq.decode(7).unwrap();
    assert_eq!(seq.pos(), PROMPT.len() + 2 * NEXT.len() + 1);
    assert!(seq.accept(0).is_err());
    // A verify that overflows the context changes nothing.
    let mut short = e.open_sequence(12).unwrap();
    short.prefill(&PROMPT, Logits::Last).unwrap();
    let err = short.verify(&NEXT).unwrap_err().to_string();
    assert!(err.contains("context"), "{err}");
    assert_eq!(short.pos(), PROMPT.len());
}

#[test]
fn the_parity_tools_verify_round_trip_passes_on_the_cpu() {
    let mut e = engine("tiny-qwen3next-q4_k_m.gguf", 32, 2);
    let mut seq = e.open_sequence(0).unwrap();
    let (differing, compared) =
        redlite_engine::parity::verify_roundtrip(&mut *seq, &PROMPT, &NEXT).unwrap();
    assert_eq!(differing, 0);
    // (n + 1) passes of n rows, plus the tokens decoded after each keep.
    assert_eq!(compared, 5 * 4 + (4 + 3 + 2 + 1));
}
