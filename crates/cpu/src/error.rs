use redlite_gguf::GgmlType;

/// Errors of the CPU kernels: wrong shapes or unsupported weight types.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(
        "matrix of type {ty} with {rows} rows × {cols} columns needs {expected} bytes, got {found}"
    )]
    MatrixBytes {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("{what}: expected {expected} values, got {found}")]
    Shape {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error(transparent)]
    Quant(#[from] redlite_quant::QuantError),
}
