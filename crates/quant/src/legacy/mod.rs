use crate::Kernels;
use redlite_gguf::GgmlType;

/// The kernels this module provides for `ty`, if any.
pub fn kernels(_ty: GgmlType) -> Option<&'static Kernels> {
    None
}
