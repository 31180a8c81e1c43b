//! CPU kernels below the model.
//!
//! Every kernel with a fast form keeps a plain scalar reference beside it
//! (`*_reference`), and the tests compare the two, and both with a float64
//! implementation written in the test. Nothing here knows about models: the
//! model crate asks for stages (a matmul over quantized rows, an attention
//! over a KV cache, a Gated DeltaNet scan) with plain slices.

pub mod attention;
pub mod attention_tiled;
pub mod conv;
pub mod deltanet;
pub mod error;
pub mod matmul;
pub mod matmul_ref;
pub mod ops;
pub mod pool;
mod vexp;

pub use error::CpuError;
pub use matmul::QMatrix;
pub use pool::Pool;
