//! GGUF: the file format of llama.cpp models.
//!
//! [`GgufFile`] parses and checks a whole file up front (header, metadata,
//! tensor table, that every tensor lies inside the file without overlap)
//! and then hands out zero-copy [`TensorView`]s of the memory-mapped bytes.
//! [`GgufWriter`] writes small files from memory; [`GgufStreamWriter`]
//! streams tensor bytes for files too large to hold. Both write to a
//! temporary file next to the target and rename it into place on success.
//!
//! Format (versions 2 and 3, little-endian): magic `GGUF`, `u32` version,
//! `u64` tensor count, `u64` key/value count; key/values (`u64`-length
//! string key, `u32` type, value); tensor infos (name, `u32` n_dims, `u64`
//! dims, `u32` ggml type, `u64` offset); padding to `general.alignment`
//! (default 32); tensor data, each tensor at an aligned offset.
//!
//! Errors: every failure is a [`GgufError`] variant naming the file (or
//! `<in-memory GGUF>`) and the key or tensor involved; malformed input never
//! panics. Lengths and counts are checked against the bytes left before
//! anything is allocated, size arithmetic is checked, and nested metadata
//! arrays are limited to [`MAX_ARRAY_DEPTH`] levels. Checks beyond the
//! format's letter, matching llama.cpp: `general.alignment` must be a `u32`
//! power of two; a tensor has 1 to 4 dimensions, none zero, and rows of
//! whole blocks; tensors lie inside the file at aligned offsets and do not
//! overlap. `tests/malformed/` holds one file per error, and `fuzz/` fuzzes
//! the parser (see `docs/fuzzing.md`).

#![deny(unsafe_op_in_unsafe_fn)]

mod array;
pub mod error;
pub mod metadata;
mod reader;
pub mod tensor;
pub mod types;
pub mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

pub use error::{GgufError, Section, Source};
pub use metadata::{ArrayValues, Metadata, MetadataArray, MetadataValue, ValueRef, ValueType};
pub use tensor::{TensorInfo, TensorView};
pub use types::GgmlType;
pub use writer::{GgufStreamWriter, GgufWriter, TensorDecl};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version this crate writes.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays we accept (the format has no limit;
/// we bound recursion so a hostile file cannot overflow the stack).
pub const MAX_ARRAY_DEPTH: usize = 32;
/// Longest tensor name llama.cpp accepts (`GGML_MAX_NAME` - 1); the writer
/// refuses longer names so that what we write llama.cpp can load.
pub const MAX_TENSOR_NAME: usize = 63;

enum Storage {
    Mmap(memmap2::Mmap),
    /// The file read into anonymous memory ([`GgufFile::open_in_memory`]).
    Anon(memmap2::Mmap),
    Bytes(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) | Storage::Anon(m) => m,
            Storage::Bytes(v) => v,
        }
    }
}

/// A parsed, checked GGUF file and its bytes.
pub struct GgufFile {
    storage: Storage,
    source: Source,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    data_offset: u64,
    alignment: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("source", &self.source)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("alignment", &self.alignment)
            .field("file_size", &self.file_size())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let source = Source::file(path);
        let io = |op| {
            let source = source.clone();
            move |e| GgufError::Io {
                file: source,
                op,
                source: e,
            }
        };
        let file = File::open(path).map_err(io("open"))?;
        let len = file.metadata().map_err(io("stat"))?.len();
        let storage = if len == 0 {
            // Mapping zero bytes is an error on some systems; nothing to map.
            Storage::Bytes(Vec::new())
        } else {
            // SAFETY: `Mmap::map` is unsafe because the mapping aliases the
            // file: if another process truncates or rewrites it while we hold
            // the map, reads may fault or see changing bytes. We map
            // read-only, never hand out `&mut`, and treat the model file as
            // immutable while loaded, the same contract llama.cpp and every
            // mmap-based loader rely on; copying tens of gigabytes into RAM
            // instead is not an option for this engine. Exercised by every
            // test that uses `GgufFile::open`.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("mmap"))?;
            Storage::Mmap(map)
        };
        GgufFile::from_storage(storage, source)
    }

    /// Read a whole file into anonymous memory (transparent huge pages
    /// requested) and parse it: the weights can then not be evicted by the
    /// page cache, and long sequential reads cross 2 MiB pages instead of
    /// 4 KiB ones (fewer TLB misses, hardware prefetch not stopped every
    /// 4 KiB). Costs the file's size in RAM and a read of the whole file.
    pub fn open_in_memory(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        use std::io::Read;
        let path = path.as_ref();
        let source = Source::file(path);
        let io = |op| {
            let source = source.clone();
            move |e| GgufError::Io {
                file: source,
                op,
                source: e,
            }
        };
        let mut file = File::open(path).map_err(io("open"))?;
        let len = file.metadata().map_err(io("stat"))?.len() as usize;
        if len == 0 {
            return GgufFile::from_storage(Storage::Bytes(Vec::new()), source);
        }
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(io("allocate"))?;
        #[cfg(target_os = "linux")]
        {
            // A hint: without THP the mapping simply keeps 4 KiB pages.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        file.read_exact(&mut map[..]).map_err(io("read"))?;
        let map = map.make_read_only().map_err(io("protect"))?;
        GgufFile::from_storage(Storage::Anon(map), source)
    }

    /// [`GgufFile::open_in_memory`] when the file takes at most half of
    /// `available` bytes (the rest stays for state, caches and everything
    /// else), else [`GgufFile::open`] (mapped, paged in on demand).
    pub fn open_auto(
        path: impl AsRef<Path>,
        available: Option<u64>,
    ) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX);
        match available {
            Some(avail) if len <= avail / 2 => GgufFile::open_in_memory(path),
            _ => GgufFile::open(path),
        }
    }

    /// Whether the bytes were read into anonymous memory rather than mapped.
    pub fn is_in_memory(&self) -> bool {
        matches!(self.storage, Storage::Anon(_))
    }

    /// Parse a file held in memory (tests, fuzzing, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        GgufFile::from_storage(Storage::Bytes(bytes), Source::memory())
    }

    fn from_storage(storage: Storage, source: Source) -> Result<GgufFile, GgufError> {
        let p = reader::parse(storage.bytes(), &source)?;
        Ok(GgufFile {
            storage,
            source,
            version: p.version,
            metadata: p.metadata,
            tensors: p.tensors,
            index: p.index,
            data_offset: p.data_offset,
            alignment: p.alignment,
        })
    }

    /// The path, when opened from a file.
    pub fn path(&self) -> Option<&Path> {
        self.source.path()
    }

    /// Where the bytes came from, as used in error messages.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The key/value table.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor called `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor {
                file: self.source.clone(),
                tensor: name.to_string(),
            })?;
        self.view(info)
    }

    /// The bytes of the `i`-th tensor in file order.
    pub fn tensor_at(&self, i: usize) -> Option<TensorView<'_>> {
        self.tensors.get(i).and_then(|t| self.view(t).ok())
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> Result<TensorView<'a>, GgufError> {
        // The parser checked the range; stay checked anyway.
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|s| Some(s..s.checked_add(info.n_bytes)?))
            .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?));
        let data = range.and_then(|r| self.storage.bytes().get(r));
        match data {
            Some(data) => Ok(TensorView { info, data }),
            None => Err(GgufError::TensorDataTruncated {
                file: self.source.clone(),
                tensor: info.name.clone(),
                offset: info.offset,
                n_bytes: info.n_bytes,
                data_size: self.file_size().saturating_sub(self.data_offset),
            }),
        }
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Alignment of tensor data.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }
}
