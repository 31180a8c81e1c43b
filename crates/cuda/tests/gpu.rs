//! GPU tests: `#[ignore]`d because CI and the development machines have no
//! GPU. On the GPU machine: `cargo test -p redlite-cuda -- --ignored`
//! (or `redlite selftest`, which runs the same checks from the release
//! binary). They exercise every `unsafe` kernel launch in the crate.

use redlite_cuda::{selftest, Gpu};

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gemv_kernel_matches_the_f64_reference() {
    let gpu = Gpu::new(0).expect("GPU");
    let rows = selftest::run(&gpu, 7).expect("selftest");
    assert!(selftest::print(&gpu, &rows), "{rows:?}");
}

/// The CUDA decoder against the CPU engine on the tiny fixtures (reference
/// path with f32 activations: the device's math). Skips with a message
/// where there is no GPU (CI, development machines).
#[test]
fn decoder_matches_the_cpu_engine_on_the_tiny_fixtures() {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: no CUDA GPU here ({e:#})");
            return;
        }
    };
    drop(gpu);
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::F32);
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen3next"
    );
    let tuning = redlite_cuda::CudaTuning::default();
    for name in ["f32", "q8_0", "q4_k_m", "iq2_xxs"] {
        let path = format!("{dir}/tiny-qwen3next-{name}.gguf");
        let file = std::sync::Arc::new(redlite_gguf::GgufFile::open(&path).unwrap());
        let mut model = redlite_model::Model::load(file, Default::default()).unwrap();
        model.set_reference(true);
        let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 512).collect();
        let p =
            redlite_cuda::parity::parity(Gpu::new(0).unwrap(), &model, &prompt, 16, false, &tuning)
                .unwrap();
        assert!(p.ok(1e-4), "{name}: {p:?}");
    }
}
