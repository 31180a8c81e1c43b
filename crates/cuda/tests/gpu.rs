//! GPU tests: `#[ignore]`d because CI and the development machines have no
//! GPU. On the GPU machine: `cargo test -p redlite-cuda -- --ignored`
//! (or `redlite selftest`, which runs the same checks from the release
//! binary). They exercise every `unsafe` kernel launch in the crate.

use redlite_cuda::{selftest, Gpu};

// The decoder against the CPU engine: crates/engine/tests/gpu.rs.

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gemv_kernel_matches_the_f64_reference() {
    let gpu = Gpu::new(0).expect("GPU");
    let rows = selftest::run(&gpu, 7).expect("selftest");
    assert!(selftest::print(&gpu, &rows), "{rows:?}");
}
