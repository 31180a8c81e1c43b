//! The K-quant formats (256-element super-blocks: Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K) and their activation format Q8_K.

use crate::Kernels;
use redlite_gguf::GgmlType;

pub mod multi;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_k;
pub mod quant_util;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_k::BlockQ4K;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_k::{quantize_block_q8_k, quantize_q8_k, BlockQ8K, QK_K};

static Q8_K: Kernels = Kernels {
    ty: GgmlType::Q8_K,
    dequantize: q8_k::dequantize_q8_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q8_k::dot_q8_k_q8_k,
    dot_fast: q8_k::dot_q8_k_q8_k,
    dot_multi: None,
    quantize: Some(q8_k::quantize_q8_k),
};

static Q2_K: Kernels = Kernels {
    ty: GgmlType::Q2_K,
    dequantize: q2_k::dequantize_q2_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q2_k::dot_q2_k_ref,
    dot_fast: q2_k::dot_q2_k_fast,
    dot_multi: None,
    quantize: None,
};

static Q3_K: Kernels = Kernels {
    ty: GgmlType::Q3_K,
    dequantize: q3_k::dequantize_q3_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q3_k::dot_q3_k_ref,
    dot_fast: q3_k::dot_q3_k_fast,
    dot_multi: None,
    quantize: None,
};

static Q4_K: Kernels = Kernels {
    ty: GgmlType::Q4_K,
    dequantize: q4_k::dequantize_q4_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q4_k::dot_q4_k_ref,
    dot_fast: q4_k::dot_q4_k_fast,
    dot_multi: Some(multi::multi_q4_k),
    quantize: Some(q4_k::quantize_q4_k),
};

static Q5_K: Kernels = Kernels {
    ty: GgmlType::Q5_K,
    dequantize: q5_k::dequantize_q5_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q5_k::dot_q5_k_ref,
    dot_fast: q5_k::dot_q5_k_fast,
    dot_multi: None,
    quantize: None,
};

static Q6_K: Kernels = Kernels {
    ty: GgmlType::Q6_K,
    dequantize: q6_k::dequantize_q6_k,
    vec_dot_type: GgmlType::Q8_K,
    dot_reference: q6_k::dot_q6_k_ref,
    dot_fast: q6_k::dot_q6_k_fast,
    dot_multi: Some(multi::multi_q6_k),
    quantize: Some(q6_k::quantize_q6_k),
};

/// The kernels this module provides for `ty`, if any.
pub fn kernels(ty: GgmlType) -> Option<&'static Kernels> {
    Some(match ty {
        GgmlType::Q8_K => &Q8_K,
        GgmlType::Q2_K => &Q2_K,
        GgmlType::Q3_K => &Q3_K,
        GgmlType::Q4_K => &Q4_K,
        GgmlType::Q5_K => &Q5_K,
        GgmlType::Q6_K => &Q6_K,
        _ => return None,
    })
}
