//! The legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the float
//! formats (F32, F16, BF16), and the activation format Q8_0.

use crate::Kernels;
use redlite_gguf::GgmlType;

pub mod float;
pub mod multi;
pub mod q4;
pub mod q5;
pub mod q8_0;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use q4::{BlockQ40, BlockQ41};
pub use q5::{BlockQ50, BlockQ51};
pub use q8_0::{quantize_block_q8_0, quantize_q8_0, BlockQ80, QK8_0};

static F32: Kernels = Kernels {
    ty: GgmlType::F32,
    dequantize: float::dequantize_f32,
    vec_dot_type: GgmlType::F32,
    dot_reference: float::dot_f32_ref,
    dot_fast: float::dot_f32_fast,
    dot_multi: None,
    quantize: Some(float::quantize_f32),
};

static F16: Kernels = Kernels {
    ty: GgmlType::F16,
    dequantize: float::dequantize_f16,
    vec_dot_type: GgmlType::F32,
    dot_reference: float::dot_f16_ref,
    dot_fast: float::dot_f16_fast,
    dot_multi: None,
    quantize: Some(float::quantize_f16),
};

static BF16: Kernels = Kernels {
    ty: GgmlType::BF16,
    dequantize: float::dequantize_bf16,
    vec_dot_type: GgmlType::F32,
    dot_reference: float::dot_bf16_ref,
    dot_fast: float::dot_bf16_fast,
    dot_multi: None,
    quantize: Some(float::quantize_bf16),
};

static Q4_0: Kernels = Kernels {
    ty: GgmlType::Q4_0,
    dequantize: q4::dequantize_q4_0,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: q4::dot_q4_0_ref,
    dot_fast: multi::dot_q4_0_fast,
    dot_multi: Some(multi::multi_q4_0),
    quantize: Some(q4::quantize_q4_0),
};

static Q4_1: Kernels = Kernels {
    ty: GgmlType::Q4_1,
    dequantize: q4::dequantize_q4_1,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: q4::dot_q4_1_ref,
    dot_fast: q4::dot_q4_1_fast,
    dot_multi: None,
    quantize: Some(q4::quantize_q4_1),
};

static Q5_0: Kernels = Kernels {
    ty: GgmlType::Q5_0,
    dequantize: q5::dequantize_q5_0,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: q5::dot_q5_0_ref,
    dot_fast: multi::dot_q5_0_fast,
    dot_multi: Some(multi::multi_q5_0),
    quantize: Some(q5::quantize_q5_0),
};

static Q5_1: Kernels = Kernels {
    ty: GgmlType::Q5_1,
    dequantize: q5::dequantize_q5_1,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: q5::dot_q5_1_ref,
    dot_fast: q5::dot_q5_1_fast,
    dot_multi: None,
    quantize: Some(q5::quantize_q5_1),
};

static Q8_0: Kernels = Kernels {
    ty: GgmlType::Q8_0,
    dequantize: q8_0::dequantize_q8_0,
    vec_dot_type: GgmlType::Q8_0,
    dot_reference: q8_0::dot_q8_0_ref,
    dot_fast: multi::dot_q8_0_fast,
    dot_multi: Some(multi::multi_q8_0),
    quantize: Some(q8_0::quantize_q8_0),
};

/// The kernels this module provides for `ty`, if any.
pub fn kernels(ty: GgmlType) -> Option<&'static Kernels> {
    Some(match ty {
        GgmlType::F32 => &F32,
        GgmlType::F16 => &F16,
        GgmlType::BF16 => &BF16,
        GgmlType::Q4_0 => &Q4_0,
        GgmlType::Q4_1 => &Q4_1,
        GgmlType::Q5_0 => &Q5_0,
        GgmlType::Q5_1 => &Q5_1,
        GgmlType::Q8_0 => &Q8_0,
        _ => return None,
    })
}
