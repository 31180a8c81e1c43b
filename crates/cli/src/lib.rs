//! The logic behind the `redlite` command, kept in a library so tests reach it.

#[cfg(feature = "cuda")]
pub mod cudabench;
#[cfg(feature = "cuda")]
pub mod cudastate;
pub mod generate;
pub mod grammarbench;
pub mod inspect;
pub mod limits;
pub mod memory;
pub mod modelbench;
pub mod out;
pub mod perplexity;
pub mod quantbench;
pub mod residency;
pub mod rollbackbench;
pub mod state;

/// The GPU tuning switches (`REDLITE_CUDA_*`, docs/cuda.md) in the
/// environment, as (name, value) pairs: the one place they are read. The
/// engine's CUDA backend parses them into a typed `CudaTuning` once, when
/// it opens, and names a bad one.
pub fn tuning_vars() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("REDLITE_CUDA_"))
        .collect()
}
