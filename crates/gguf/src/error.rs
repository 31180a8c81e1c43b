//! The one error type of this crate.
//!
//! Every variant names the file it is about (or says the bytes came from
//! memory), and the tensor or metadata key where there is one, so that a
//! message read on its own says what is wrong and where.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::types::GgmlType;

/// Where the bytes of a GGUF file came from, for error messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source(Option<Arc<Path>>);

impl Source {
    /// Bytes that were handed over in memory (`GgufFile::from_bytes`).
    pub fn memory() -> Source {
        Source(None)
    }

    /// A file on disk.
    pub fn file(path: &Path) -> Source {
        Source(Some(Arc::from(path)))
    }

    /// The path, when the bytes came from a file.
    pub fn path(&self) -> Option<&Path> {
        self.0.as_deref()
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(p) => write!(f, "{}", p.display()),
            None => f.write_str("<in-memory GGUF>"),
        }
    }
}

/// The part of a GGUF file an error was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Section {
    /// Magic, version and the two counts.
    Header,
    /// The key/value pairs.
    Metadata,
    /// The tensor infos (name, shape, type, offset).
    TensorTable,
    /// The aligned tensor bytes after the tensor table.
    TensorData,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Header => "header",
            Section::Metadata => "metadata",
            Section::TensorTable => "tensor table",
            Section::TensorData => "tensor data",
        })
    }
}

fn version_hint(version: u32) -> &'static str {
    if version == 1 {
        "GGUF v1 used 32-bit counts and is obsolete; re-convert the model with a current llama.cpp"
    } else if matches!(version.swap_bytes(), 2 | 3) {
        "this looks like a big-endian GGUF file, which is not supported"
    } else {
        "only versions 2 and 3 are supported"
    }
}

/// Everything that can go wrong reading, checking or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The operating system refused an operation.
    #[error("{file}: {op}: {source}")]
    Io {
        file: Source,
        op: &'static str,
        #[source]
        source: io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error(
        "{file}: not a GGUF file: the magic is {found:02x?}, expected \"GGUF\" ([47, 47, 55, 46])"
    )]
    BadMagic { file: Source, found: [u8; 4] },

    /// A version other than 2 or 3.
    #[error("{file}: unsupported GGUF version {version}: {}", version_hint(*.version))]
    UnsupportedVersion { file: Source, version: u32 },

    /// A fixed-size field runs past the end of the file.
    #[error("{file}: truncated {section}: {what} needs {needed} bytes at offset {offset}, but the file is only {file_size} bytes long")]
    Truncated {
        file: Source,
        section: Section,
        what: String,
        offset: u64,
        needed: u64,
        file_size: u64,
    },

    /// A length or count field claims more than the rest of the file can hold.
    #[error("{file}: {section}: {what} is {value}, which needs at least {needed} bytes, but only {remaining} bytes remain after offset {offset} (truncated or corrupt file)")]
    LengthExceedsFile {
        file: Source,
        section: Section,
        what: String,
        value: u64,
        needed: u64,
        remaining: u64,
        offset: u64,
    },

    /// Size arithmetic (element counts, byte sizes, offsets) overflows 64 bits.
    #[error("{file}: {section}: size arithmetic overflows for {what}")]
    Overflow {
        file: Source,
        section: Section,
        what: String,
    },

    /// A string (key, value or tensor name) is not UTF-8.
    #[error("{file}: {section}: {what} is not valid UTF-8")]
    InvalidUtf8 {
        file: Source,
        section: Section,
        what: String,
    },

    /// A metadata value type id this crate does not know.
    #[error("{file}: metadata key `{key}` has unknown value type id {id}")]
    UnknownValueType { file: Source, key: String, id: u32 },

    /// Arrays nested deeper than we are willing to recurse.
    #[error("{file}: metadata key `{key}` nests arrays more than {limit} levels deep")]
    NestingTooDeep {
        file: Source,
        key: String,
        limit: usize,
    },

    /// The same metadata key twice.
    #[error("{file}: duplicate metadata key `{key}`")]
    DuplicateKey { file: Source, key: String },

    /// The same tensor name twice.
    #[error("{file}: duplicate tensor name `{tensor}`")]
    DuplicateTensor { file: Source, tensor: String },

    /// `general.alignment` that is zero or not a power of two.
    #[error("{file}: general.alignment is {alignment}; it must be a nonzero power of two")]
    InvalidAlignment { file: Source, alignment: u64 },

    /// A tensor with no dimensions or more than four.
    #[error("{file}: tensor `{tensor}` has {n_dims} dimensions; GGUF allows 1 to 4")]
    InvalidDimCount {
        file: Source,
        tensor: String,
        n_dims: u32,
    },

    /// A tensor with a dimension of size zero.
    #[error("{file}: tensor `{tensor}` has a zero dimension in shape {dims:?}")]
    ZeroDim {
        file: Source,
        tensor: String,
        dims: Vec<u64>,
    },

    /// A tensor type id this crate does not know.
    #[error("{file}: tensor `{tensor}` has unknown ggml type id {id}")]
    UnknownTensorType {
        file: Source,
        tensor: String,
        id: u32,
    },

    /// A row length that is not a whole number of quantization blocks.
    #[error("{file}: tensor `{tensor}` of type {ty} has rows of {row_len} elements, not a multiple of the block size {block_size}")]
    PartialBlock {
        file: Source,
        tensor: String,
        ty: GgmlType,
        row_len: u64,
        block_size: u64,
    },

    /// A tensor offset that is not a multiple of the alignment.
    #[error("{file}: tensor `{tensor}` has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        file: Source,
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    /// A tensor whose data starts at or past the end of the file.
    #[error("{file}: tensor `{tensor}` starts at data offset {offset}, at or past the end of the {data_size}-byte data section (truncated file or corrupt offset)")]
    OffsetOutOfRange {
        file: Source,
        tensor: String,
        offset: u64,
        data_size: u64,
    },

    /// A tensor whose data starts inside the file but runs past its end.
    #[error("{file}: truncated tensor data: tensor `{tensor}` needs {n_bytes} bytes at data offset {offset}, but the data section is only {data_size} bytes")]
    TensorDataTruncated {
        file: Source,
        tensor: String,
        offset: u64,
        n_bytes: u64,
        data_size: u64,
    },

    /// Two tensors whose byte ranges overlap.
    #[error("{file}: tensor `{tensor}` (data offset {offset}) overlaps tensor `{other}`, which ends at data offset {other_end}")]
    TensorOverlap {
        file: Source,
        tensor: String,
        offset: u64,
        other: String,
        other_end: u64,
    },

    /// `GgufFile::tensor` with a name the file does not have.
    #[error("{file}: no tensor named `{tensor}`")]
    MissingTensor { file: Source, tensor: String },

    /// A metadata getter with a key the file does not have.
    #[error("{file}: missing metadata key `{key}`")]
    MissingKey { file: Source, key: String },

    /// A metadata getter on a value of another type.
    #[error("{file}: metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        file: Source,
        key: String,
        expected: &'static str,
        found: String,
    },

    /// A metadata integer that does not fit the type asked for.
    #[error("{file}: metadata key `{key}` has value {value}, which does not fit in {target}")]
    ValueOutOfRange {
        file: Source,
        key: String,
        value: String,
        target: &'static str,
    },

    /// Writer: tensor bytes that do not match the declared shape and type.
    #[error("{file}: tensor `{tensor}` should have {expected} bytes of data, got {got}")]
    SizeMismatch {
        file: Source,
        tensor: String,
        expected: u64,
        got: u64,
    },

    /// Stream writer: data for a tensor other than the next one declared.
    #[error("{file}: got data for tensor `{got}`, but the next tensor to write is {}", .expected.as_deref().map(|e| format!("`{e}`")).unwrap_or_else(|| "none (all tensors are written)".into()))]
    UnexpectedTensor {
        file: Source,
        expected: Option<String>,
        got: String,
    },

    /// Stream writer: moved on or finished before a tensor was complete.
    #[error("{file}: tensor `{tensor}` is incomplete: {written} of {expected} bytes written")]
    IncompleteTensor {
        file: Source,
        tensor: String,
        written: u64,
        expected: u64,
    },

    /// Writer: a metadata value or tensor declaration that cannot be written.
    #[error("{file}: cannot write `{name}`: {reason}")]
    InvalidInput {
        file: Source,
        name: String,
        reason: String,
    },
}

impl GgufError {
    /// The file the error is about, if it came from a file.
    pub fn path(&self) -> Option<&Path> {
        self.source_file().path()
    }

    /// The source the error is about.
    pub fn source_file(&self) -> &Source {
        use GgufError::*;
        match self {
            Io { file, .. }
            | BadMagic { file, .. }
            | UnsupportedVersion { file, .. }
            | Truncated { file, .. }
            | LengthExceedsFile { file, .. }
            | Overflow { file, .. }
            | InvalidUtf8 { file, .. }
            | UnknownValueType { file, .. }
            | NestingTooDeep { file, .. }
            | DuplicateKey { file, .. }
            | DuplicateTensor { file, .. }
            | InvalidAlignment { file, .. }
            | InvalidDimCount { file, .. }
            | ZeroDim { file, .. }
            | UnknownTensorType { file, .. }
            | PartialBlock { file, .. }
            | MisalignedOffset { file, .. }
            | OffsetOutOfRange { file, .. }
            | TensorDataTruncated { file, .. }
            | TensorOverlap { file, .. }
            | MissingTensor { file, .. }
            | MissingKey { file, .. }
            | WrongType { file, .. }
            | ValueOutOfRange { file, .. }
            | SizeMismatch { file, .. }
            | UnexpectedTensor { file, .. }
            | IncompleteTensor { file, .. }
            | InvalidInput { file, .. } => file,
        }
    }
}
