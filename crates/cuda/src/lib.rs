//! Red Lite's CUDA backend (issue 7), built only behind the `cuda` feature
//! of `redlite-cli`.
//!
//! - `kernels/*.cu`: one kernel family per file, compiled at run time with
//!   NVRTC for sm_90 ([`kernels`] says why).
//! - [`layout`]: how quantized matrices sit on the device (payloads 16-byte
//!   aligned, f16 scales split out; formats without a kernel dequantized to
//!   F32).
//! - [`gemv`]: decode GEMV launches, one matrix or routed experts through
//!   slot indices (the slot table is the identity at full residency, the
//!   [`expert_cache`]'s device tables otherwise). Two activation paths: f32 x
//!   (`DeviceMatrix::gemv`, every format) and int8 x (`Q8Vec`, then
//!   `gemv_q8` for the formats of `gemv::Q8_TYPES`,
//!   `ExpertStack::gemv_gate_up_q8` and `DeviceMatrix::gemv_q8_pair`):
//!   1.5-2.2x faster on the H200 for IQ2_XXS, Q8_0 and Q4_K
//!   (bench/RESULTS.md), r2 the best default; Q6_K, IQ2_XS and IQ1_M not
//!   yet measured.
//! - [`ops`]: the other decode kernels (RMSNorm, attention input, split-K
//!   grouped attention + merge, the fused Gated DeltaNet step, router
//!   top-k, SwiGLU / MoE combine), one module per kernel file, each with a
//!   float64 reference in [`crate::reference`].
//! - [`device`]: the GPU handle, the one launch path, raw-address helpers.
//! - [`decoder`]: a whole decode token as one CUDA graph, recorded from the
//!   architecture's stages (`redlite_model::stages`), weights and state
//!   resident on the device (its module docs map its files); [`parity`]
//!   checks it against the CPU engine.
//! - [`tuning`]: [`CudaTuning`], every switch of the backend, parsed once
//!   by the caller (the crate reads no environment variable).
//! - [`selftest`] (GEMVs; `selftest::ops`, the other kernels;
//!   `selftest::expert_cache`) and [`crate::bench`]: `redlite selftest`,
//!   `redlite bench kernels`.
//!
//! libcuda and libnvrtc are loaded at run time (cudarc `dynamic-loading`):
//! building this crate needs no CUDA toolkit and no GPU. Tests that need a
//! GPU skip themselves (or are `#[ignore]`d) where there is none; on the
//! GPU machine the release binary runs the same checks (`redlite selftest`,
//! `redlite parity`).
//!
//! No CUDA type crosses into `redlite-model`: the model only describes its
//! stages; callers get `Gpu`, `CudaDecoder`, `DeviceMatrix`, `ExpertStack`
//! and plain slices.

#[cfg(test)]
mod arg_layouts;
pub mod bench;
pub mod decoder;
pub mod device;
pub mod device_plan;
pub mod error;
pub mod expert_cache;
#[cfg(test)]
mod gdn_wy_model;
pub mod gemv;
#[cfg(test)]
mod kernel_model;
pub mod kernels;
pub mod layout;
pub mod ops;
pub mod parity;
pub mod prefill_experts;
pub mod reference;
pub mod selftest;
pub mod sequence;
pub mod state_image;
pub mod tables_cuh;
pub mod testdata;
pub mod tuning;

pub use device::Gpu;
pub use error::{CudaError, Result};
pub use gemv::{DeviceMatrix, ExpertStack};
pub use tuning::CudaTuning;

/// `redlite selftest`: open GPU 0, run every kernel against float64
/// references, print the table. Errors if any kernel fails. `pdl`: every
/// launch with programmatic dependent launch ([`Gpu::pdl`]); the kernels
/// compiled with `tuning`'s defines.
pub fn selftest_cli(pdl: bool, tuning: &CudaTuning) -> Result<()> {
    let mut gpu = Gpu::with_defines(0, &tuning.defines)?;
    gpu.pdl = pdl;
    let rows = selftest::run(&gpu, 0x2e4d_11fe)?;
    error::ensure!(selftest::print(&gpu, &rows), "CUDA selftest failed");
    Ok(())
}

/// `redlite bench kernels`: copy bandwidth, then every GEMV kernel and
/// shape at 1, 2 and 4 rows per warp, one or two chunks per step, the
/// int8-activation kernels, decode attention and the DeltaNet step
/// (`decode_only`: only the last two). `pdl`, `tuning`: as for
/// [`selftest_cli`].
pub fn bench_cli(decode_only: bool, pdl: bool, tuning: &CudaTuning) -> Result<()> {
    let mut gpu = Gpu::with_defines(0, &tuning.defines)?;
    gpu.pdl = pdl;
    let copy = bench::copy_bandwidth(&gpu)?;
    let rows = if decode_only {
        bench::run_decode_ops(&gpu)?
    } else {
        bench::run(&gpu, &gemv::Variant::ALL)?
    };
    bench::print(&gpu, copy, &rows);
    Ok(())
}
