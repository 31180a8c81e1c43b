//! Errors of the synthesizer.

use redlite_gguf::{GgmlType, GgufError};
use redlite_quant::QuantError;

/// What can go wrong while planning or writing a synthetic file.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown layout {0:?} (known: iq2, cf2, q4km)")]
    UnknownLayout(String),
    #[error("layer count {0} is out of range (1..={max})", max = crate::MAX_LAYERS)]
    BadLayers(usize),
    #[error("MTP layer count {0} is out of range (0..={max})", max = crate::MAX_MTP_LAYERS)]
    BadMtpLayers(usize),
    #[error("the tokenizer source {source_name} has no tokenizer.* metadata")]
    NoTokenizer { source_name: String },
    #[error("the tokenizer in {source_name} has {got} tokens, the model needs {want}")]
    VocabMismatch {
        source_name: String,
        got: usize,
        want: usize,
    },
    #[error("tensor {tensor}: {ty} cannot hold a row of {row} elements")]
    BadRow {
        tensor: String,
        ty: GgmlType,
        row: u64,
    },
    #[error("no block generator for {0}")]
    NoGenerator(GgmlType),
    #[error("tensor {0} is not in the plan")]
    NoSuchTensor(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Output(#[from] redlite_outfile::OutfileError),
    #[error("writing to stdout")]
    Stdout(#[source] std::io::Error),
}
