//! A sequence's state exported to the image every backend shares and
//! imported back (what a state file carries), on the CPU: a handoff
//! between two sequences continues as a straight run does, and an image
//! that does not fit (another KV element type, another layer layout, more
//! positions than the context) is refused with an error naming what
//! differs, not a panic. The GPU side of the same checks is in `gpu.rs`.

mod common;

use common::{cpu_engine, PROMPT};
use redlite_engine::parity::{state_handoff, state_roundtrip};
use redlite_engine::{Engine, Logits};
use redlite_model::{KvData, LayerImage, StateImage};
use std::borrow::Cow;

fn engine(name: &str, ctx: usize) -> Engine {
    cpu_engine(name, ctx, 2)
}

/// The expected tokens are the receiving sequence's own straight run (the
/// run itself is checked against llama.cpp's logits on this fixture in
/// `crates/model/tests/fixture_parity.rs`).
#[test]
fn a_state_handed_to_another_sequence_continues_as_a_straight_run() {
    let mut e = engine("tiny-qwen3next-q8_0.gguf", 64);
    let mut a = e.open_sequence(0).unwrap();
    let mut b = e.open_sequence(0).unwrap();
    let h = state_handoff(&mut *a, &mut *b, &PROMPT, 8).unwrap();
    assert_eq!(h.loaded, h.straight);
    assert_eq!(h.loaded.len(), 8);
    assert!(!h.layer_diffs.is_empty());
    // One backend, one path: the images are the same bits.
    assert!(
        h.layer_diffs.iter().all(|&(d, _)| d == 0.0),
        "{:?}",
        h.layer_diffs
    );
    assert!(h.layer_diffs.iter().any(|&(_, m)| m > 0.0));
}

#[test]
fn a_state_saved_and_loaded_by_one_sequence_continues_as_its_straight_run() {
    let mut e = engine("tiny-qwen3next-q4_k_m.gguf", 64);
    let mut a = e.open_sequence(0).unwrap();
    let h = state_roundtrip(&mut *a, &PROMPT, 8).unwrap();
    assert_eq!(h.loaded, h.straight);
    assert_eq!(h.loaded.len(), 8);
}

/// The CPU's image after `PROMPT`, owned.
fn image(e: &mut Engine) -> StateImage<'static> {
    let mut s = e.open_sequence(0).unwrap();
    s.prefill(&PROMPT, Logits::Last).unwrap();
    let cp = s.checkpoint().unwrap();
    let img = s.export_checkpoint(&cp).unwrap();
    StateImage {
        pos: img.pos,
        layers: img
            .layers
            .iter()
            .map(|l| match l {
                LayerImage::Kv { k, v } => LayerImage::Kv {
                    k: owned(k),
                    v: owned(v),
                },
                LayerImage::Recurrent { conv, ssm } => LayerImage::Recurrent {
                    conv: Cow::Owned(conv.to_vec()),
                    ssm: Cow::Owned(ssm.to_vec()),
                },
            })
            .collect(),
    }
}

fn owned(d: &KvData<'_>) -> KvData<'static> {
    match d {
        KvData::F32(v) => KvData::F32(Cow::Owned(v.to_vec())),
        KvData::F16(v) => KvData::F16(Cow::Owned(v.to_vec())),
    }
}

fn import_err(e: &mut Engine, img: StateImage<'_>) -> String {
    let s = e.open_sequence(0).unwrap();
    s.import_checkpoint(img)
        .expect_err("the image must be refused")
        .to_string()
}

#[test]
fn an_image_that_does_not_fit_is_refused_by_name() {
    let mut e = engine("tiny-qwen3next-q8_0.gguf", 64);
    let good = image(&mut e);
    assert!(e
        .open_sequence(0)
        .unwrap()
        .import_checkpoint(good.clone())
        .is_ok());

    // f16 K and V rows (a GPU's default KV type) into the f32 CPU.
    let mut f16 = good.clone();
    for l in &mut f16.layers {
        if let LayerImage::Kv { k, v } = l {
            let bits = |d: &KvData<'_>| match d {
                KvData::F32(x) => KvData::F16(Cow::Owned(
                    x.iter()
                        .map(|&a| half::f16::from_f32(a).to_bits())
                        .collect(),
                )),
                KvData::F16(_) => unreachable!("the CPU exports f32 rows"),
            };
            let (nk, nv) = (bits(k), bits(v));
            (*k, *v) = (nk, nv);
        }
    }
    let m = import_err(&mut e, f16);
    assert!(m.contains("f16") && m.contains("expected f32"), "{m}");

    // A layer missing: another model's layout.
    let mut short = good.clone();
    short.layers.pop();
    let m = import_err(&mut e, short);
    assert!(m.contains("layers, the model has"), "{m}");

    // Attention and DeltaNet layers swapped.
    let mut swapped = good.clone();
    let kv = swapped
        .layers
        .iter()
        .position(|l| matches!(l, LayerImage::Kv { .. }))
        .unwrap();
    let rec = swapped
        .layers
        .iter()
        .position(|l| matches!(l, LayerImage::Recurrent { .. }))
        .unwrap();
    swapped.layers.swap(kv, rec);
    let m = import_err(&mut e, swapped);
    assert!(m.contains("layer"), "{m}");

    // More positions than the receiving context holds.
    let mut small = engine("tiny-qwen3next-q8_0.gguf", 4);
    let m = import_err(&mut small, good);
    assert!(m.contains("does not fit a context of 4"), "{m}");
}
