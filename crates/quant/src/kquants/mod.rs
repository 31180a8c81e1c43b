//! The K-quant formats (256-element super-blocks) and their activation
//! format Q8_K.

use crate::Kernels;
use redlite_gguf::GgmlType;

pub mod q8_k;

pub use q8_k::{quantize_block_q8_k, quantize_q8_k, BlockQ8K, QK_K};

static Q8_K: Kernels = Kernels {
    ty: GgmlType::Q8_K,
    dequantize: q8_k::dequantize_q8_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q8_k::dot_q8_k_q8_k,
    dot_fast: q8_k::dot_q8_k_q8_k,
    quantize: Some(q8_k::quantize_q8_k),
};

/// The kernels this module provides for `ty`, if any.
pub fn kernels(ty: GgmlType) -> Option<&'static Kernels> {
    match ty {
        GgmlType::Q8_K => Some(&Q8_K),
        _ => None,
    }
}
