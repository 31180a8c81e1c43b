//! llama.cpp block formats: `#[repr(C)]` layouts, dequantization, dot
//! products against quantized activations, and quantization.
//!
//! Every format registers a [`Kernels`] entry. Each entry carries a scalar
//! reference dot product and, where one exists, a SIMD dot product chosen at
//! run time; tests compare the two with a per-type error budget.
//! [`set_reference_mode`] (the binaries map `REDLITE_REFERENCE` to it)
//! makes [`dot`] use the scalar reference everywhere, for A/B runs.

pub mod block;
pub mod error;
pub mod f16util;
pub mod iquants;
pub mod kquants;
pub mod legacy;
pub mod matvec;
pub mod reference;
pub mod registry;

pub use error::QuantError;
pub use matvec::{matvec, matvec_f32};
pub use redlite_gguf::GgmlType;
pub use reference::{reference_mode, set_reference_mode, ReferenceMode, ReferenceModeError};
pub use registry::{
    batch_matches_decode, dequantize, dot, dot_multi, dot_rows_fn, gemm_fn, kernels, quantize,
    quantize_activations, DotMultiFn, DotRowsFn, GemmFn, Kernels, MULTI_MAX,
};
