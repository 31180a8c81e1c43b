//! The CUDA backend against the CPU engine through the engine API, on the
//! tiny fixtures: the CPU reference path and the GPU with f32 activations
//! (the same math) must agree on every argmax within KL 1e-4, greedy
//! identical; a GPU checkpoint restored after a detour gives the straight
//! run's logits bit for bit. Built with `--features cuda`; skips with a
//! message where there is no GPU (CI, development machines). On the GPU
//! machine the release binary runs the same checks (`redlite parity`).
#![cfg(feature = "cuda")]

mod common;

use redlite_engine::parity::{checkpoint_roundtrip, compare};
use redlite_engine::{Activations, BackendOptions, Device, Engine};

fn engine(path: &str, reference: bool, opts: &BackendOptions, ctx: usize) -> Engine {
    common::open(std::path::Path::new(path), reference, opts, ctx, 2)
}

#[test]
fn the_gpu_sequence_matches_the_cpu_engine_on_the_tiny_fixtures() {
    if let Err(e) = redlite_cuda::Gpu::new(0) {
        eprintln!("skipped: no CUDA GPU here ({e:#})");
        return;
    }
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::F32);
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen3next"
    );
    let gpu_opts = BackendOptions {
        device: Device::Cuda,
        activations: Activations::F32,
        ..Default::default()
    };
    for name in ["f32", "q8_0", "q4_k_m", "iq2_xxs"] {
        let path = format!("{dir}/tiny-qwen3next-{name}.gguf");
        let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 512).collect();
        let mut cpu = engine(&path, true, &BackendOptions::default(), 40);
        let mut gpu = engine(&path, true, &gpu_opts, 40);
        let (mut a, mut b) = (cpu.open_sequence(0).unwrap(), gpu.open_sequence(0).unwrap());
        let p = compare(&mut *a, &mut *b, &prompt, 16).unwrap();
        assert!(p.ok(1e-4), "{name}: {p:?}");
        let (differing, moved) =
            checkpoint_roundtrip(&mut *b, &prompt, &[40, 41, 42, 43], &[99, 98, 97]).unwrap();
        assert_eq!(differing, 0, "{name}: the restored GPU run differs");
        assert!(moved, "{name}: the detour did not move the state");
    }
}

/// A state carried between the GPU and the CPU through the shared image
/// (what `--save-state` / `--load-state` write and read): the receiving
/// backend continues with its own straight run's greedy tokens (up to
/// where the two backends' own runs part, if they do: the CPU reference
/// path and the GPU's f32 path agree on every argmax of these fixtures
/// token by token, the test above, but the batched prefill rounds its GEMM
/// inputs to f16), and the two backends' images after the same prompt
/// agree per layer to rounding (a row, head, window or transposition
/// mix-up would differ by the values' own size). With f16 KV the GPU's
/// image round-trips on the GPU, and the CPU (f32 rows) refuses it, as an
/// f16 GPU sequence refuses the CPU's f32 image.
#[test]
fn a_state_carries_between_the_gpu_and_the_cpu_on_the_tiny_fixtures() {
    use redlite_engine::parity::{first_diff, state_handoff, MAX_LAYER_REL};
    use redlite_engine::KvType;
    if let Err(e) = redlite_cuda::Gpu::new(0) {
        eprintln!("skipped: no CUDA GPU here ({e:#})");
        return;
    }
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::F32);
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen3next"
    );
    let gpu_f32 = BackendOptions {
        device: Device::Cuda,
        activations: Activations::F32,
        kv_type: Some(KvType::F32),
        ..Default::default()
    };
    let gpu_f16 = BackendOptions {
        activations: Activations::Int8,
        kv_type: Some(KvType::F16),
        ..gpu_f32.clone()
    };
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 512).collect();
    for name in ["q8_0", "q4_k_m", "iq2_xxs"] {
        let path = format!("{dir}/tiny-qwen3next-{name}.gguf");
        let mut cpu = engine(&path, true, &BackendOptions::default(), 40);
        let mut gpu = engine(&path, true, &gpu_f32, 40);
        let (mut c, mut g) = (cpu.open_sequence(0).unwrap(), gpu.open_sequence(0).unwrap());
        let to_cpu = state_handoff(&mut *g, &mut *c, &prompt, 12).unwrap();
        let to_gpu = state_handoff(&mut *c, &mut *g, &prompt, 12).unwrap();
        let part = first_diff(&to_cpu.straight, &to_gpu.straight);
        for (dir, h) in [("gpu -> cpu", &to_cpu), ("cpu -> gpu", &to_gpu)] {
            assert!(
                h.continues(part),
                "{name} {dir}: loaded {:?}, straight {:?} (the backends part at {part:?})",
                h.loaded,
                h.straight
            );
            assert!(
                h.worst_rel() <= MAX_LAYER_REL,
                "{name} {dir}: per layer (max |diff|, max |value|) {:?}",
                h.layer_diffs
            );
            assert!(
                h.layer_diffs.iter().any(|&(_, m)| m > 0.0),
                "{name} {dir}: all zero"
            );
        }
        drop((g, gpu));
        let mut gpu = engine(&path, true, &gpu_f16, 40);
        let mut g = gpu.open_sequence(0).unwrap();
        let mut g2 = gpu.open_sequence(0).unwrap();
        let h = state_handoff(&mut *g, &mut *g2, &prompt, 12).unwrap();
        assert_eq!(h.loaded, h.straight, "{name}: f16 KV on the GPU");
        assert!(
            h.worst_rel() <= MAX_LAYER_REL,
            "{name}: {:?}",
            h.layer_diffs
        );
        let e = state_handoff(&mut *g, &mut *c, &prompt, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f16"), "{name}: an f16 image on the CPU: {e}");
        let e = state_handoff(&mut *c, &mut *g, &prompt, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f32"), "{name}: an f32 image on an f16 GPU: {e}");
    }
}
