//! The CUDA backend against the CPU engine through the engine API, on the
//! tiny fixtures: the CPU reference path and the GPU with f32 activations
//! (the same math) must agree on every argmax within KL 1e-4, greedy
//! identical; a GPU checkpoint restored after a detour gives the straight
//! run's logits bit for bit. Built with `--features cuda`; skips with a
//! message where there is no GPU (CI, development machines). On the GPU
//! machine the release binary runs the same checks (`redlite parity`).
#![cfg(feature = "cuda")]

use redlite_engine::parity::{checkpoint_roundtrip, compare};
use redlite_engine::{Activations, BackendOptions, Device, Engine, MemoryRequest, Model};
use std::sync::Arc;

fn engine(path: &str, reference: bool, opts: &BackendOptions, ctx: usize) -> Engine {
    let file = Arc::new(redlite_gguf::GgufFile::open(path).unwrap());
    let mut model = Model::load(file, Default::default()).unwrap();
    model.set_reference(reference);
    let mem = MemoryRequest {
        ctx,
        sessions: 2,
        ..Default::default()
    };
    Engine::open(model, opts, &mem).unwrap()
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
