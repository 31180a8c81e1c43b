//! Writing GGUF files (version 3): from memory, or streamed.
//!
//! Both writers lay files out as llama.cpp and the `gguf` package do: the
//! header, key/values and tensor infos, zero padding to the alignment, then
//! each tensor's bytes followed by zero padding to the alignment. Output
//! goes to a temporary file in the target's directory, renamed over the
//! target only when everything was written and synced; on any error (or a
//! stream writer dropped unfinished) the temporary file is removed.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{GgufError, Section, Source};
use crate::metadata::{Metadata, MetadataValue, ValueRef};
use crate::reader::{align_up, tensor_n_bytes};
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH, MAX_TENSOR_NAME};

/// A tensor to be written: name, shape (ggml order) and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorDecl {
    pub fn new(name: impl Into<String>, dims: impl Into<Vec<u64>>, ty: GgmlType) -> TensorDecl {
        TensorDecl {
            name: name.into(),
            dims: dims.into(),
            ty,
        }
    }
}

/// Builds a GGUF file in memory and writes it atomically.
#[derive(Debug, Default)]
pub struct GgufWriter<'a> {
    metadata: Metadata,
    tensors: Vec<(TensorDecl, Cow<'a, [u8]>)>,
    names: HashSet<String>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> GgufWriter<'a> {
        GgufWriter::default()
    }

    /// Set `general.alignment` (a nonzero power of two; default 32).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::InvalidAlignment {
                file: Source::memory(),
                alignment: alignment.into(),
            });
        }
        self.metadata.insert("general.alignment", alignment);
        Ok(())
    }

    /// Add a key/value; a key added twice keeps its first position and
    /// its last value.
    pub fn add_kv(&mut self, key: impl Into<String>, value: impl Into<MetadataValue>) {
        self.metadata.insert(key, value);
    }

    /// The key/values so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The key/values, to edit.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// Add a tensor. Fails on a duplicate or overlong name, a bad shape, or
    /// bytes that do not match the shape and type.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: impl Into<Vec<u64>>,
        ty: GgmlType,
        bytes: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let decl = TensorDecl::new(name, dims, ty);
        let bytes = bytes.into();
        let file = Source::memory();
        let n_bytes = check_decl(&decl, &file)?;
        if n_bytes != bytes.len() as u64 {
            return Err(GgufError::SizeMismatch {
                file,
                tensor: decl.name,
                expected: n_bytes,
                got: bytes.len() as u64,
            });
        }
        if !self.names.insert(decl.name.clone()) {
            return Err(GgufError::DuplicateTensor {
                file,
                tensor: decl.name,
            });
        }
        self.tensors.push((decl, bytes));
        Ok(())
    }

    /// Write the file to `path` atomically (temporary file, then rename).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let decls: Vec<TensorDecl> = self.tensors.iter().map(|(d, _)| d.clone()).collect();
        let mut w = GgufStreamWriter::create(path, &self.metadata, &decls)?;
        for (d, bytes) in &self.tensors {
            w.write_tensor_data(&d.name, bytes)?;
        }
        w.finish()
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let file = Source::memory();
        let decls: Vec<TensorDecl> = self.tensors.iter().map(|(d, _)| d.clone()).collect();
        let plan = plan(&self.metadata, &decls, &file)?;
        let mut out = plan.header;
        for ((_, bytes), info) in self.tensors.iter().zip(&plan.tensors) {
            out.extend_from_slice(bytes);
            let padded = align_up(info.n_bytes, plan.alignment).unwrap_or(info.n_bytes);
            out.resize(out.len() + (padded - info.n_bytes) as usize, 0);
        }
        Ok(out)
    }
}

/// Writes a GGUF file whose tensor bytes arrive in pieces: declare every
/// tensor up front, then pass each tensor's bytes in declaration order (in
/// as many chunks as you like), then [`finish`](GgufStreamWriter::finish).
/// Memory use does not depend on tensor sizes.
pub struct GgufStreamWriter {
    temp: TempFile,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    current: usize,
    written: u64,
}

impl GgufStreamWriter {
    /// Check the declarations, compute the layout, and write the header to
    /// a temporary file next to `path`.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: &[TensorDecl],
    ) -> Result<GgufStreamWriter, GgufError> {
        let path = path.as_ref();
        let file = Source::file(path);
        let plan = plan(metadata, tensors, &file)?;
        let mut temp = TempFile::create(path, file)?;
        temp.write_all(&plan.header)?;
        Ok(GgufStreamWriter {
            temp,
            tensors: plan.tensors,
            alignment: plan.alignment,
            current: 0,
            written: 0,
        })
    }

    /// The tensors as they will be in the file (offsets filled in).
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The next chunk of tensor `name`'s bytes. `name` must be the tensor
    /// being written, or the next one once the previous is complete.
    pub fn write_tensor_data(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        let file = || self.temp.source.clone();
        let Some(t) = self.tensors.get(self.current) else {
            return Err(GgufError::UnexpectedTensor {
                file: file(),
                expected: None,
                got: name.to_string(),
            });
        };
        if t.name != name {
            return Err(if self.written == 0 {
                GgufError::UnexpectedTensor {
                    file: file(),
                    expected: Some(t.name.clone()),
                    got: name.to_string(),
                }
            } else {
                GgufError::IncompleteTensor {
                    file: file(),
                    tensor: t.name.clone(),
                    written: self.written,
                    expected: t.n_bytes,
                }
            });
        }
        let total = self.written.checked_add(bytes.len() as u64);
        if total.is_none_or(|n| n > t.n_bytes) {
            return Err(GgufError::SizeMismatch {
                file: file(),
                tensor: t.name.clone(),
                expected: t.n_bytes,
                got: total.unwrap_or(u64::MAX),
            });
        }
        let n_bytes = t.n_bytes;
        self.temp.write_all(bytes)?;
        self.written += bytes.len() as u64;
        if self.written == n_bytes {
            let padded = align_up(n_bytes, self.alignment).unwrap_or(n_bytes);
            self.temp.write_zeros(padded - n_bytes)?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Check that every tensor is complete, sync, and rename into place.
    pub fn finish(self) -> Result<(), GgufError> {
        if let Some(t) = self.tensors.get(self.current) {
            return Err(GgufError::IncompleteTensor {
                file: self.temp.source.clone(),
                tensor: t.name.clone(),
                written: self.written,
                expected: t.n_bytes,
            });
        }
        self.temp.commit()
    }
}

struct Plan {
    header: Vec<u8>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
}

fn check_decl(d: &TensorDecl, file: &Source) -> Result<u64, GgufError> {
    if d.name.len() > MAX_TENSOR_NAME {
        return Err(GgufError::InvalidInput {
            file: file.clone(),
            name: d.name.clone(),
            reason: format!(
                "tensor names longer than {MAX_TENSOR_NAME} bytes cannot be loaded by llama.cpp"
            ),
        });
    }
    tensor_n_bytes(&d.name, &d.dims, d.ty, file, Section::TensorTable)
}

fn alignment_of(metadata: &Metadata, file: &Source) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(MetadataValue::U32(a)) => Err(GgufError::InvalidAlignment {
            file: file.clone(),
            alignment: u64::from(*a),
        }),
        Some(v) => Err(GgufError::WrongType {
            file: file.clone(),
            key: "general.alignment".into(),
            expected: "u32",
            found: v.type_name(),
        }),
    }
}

fn plan(metadata: &Metadata, decls: &[TensorDecl], file: &Source) -> Result<Plan, GgufError> {
    let alignment = alignment_of(metadata, file)?;
    let mut h = Vec::new();
    h.extend_from_slice(&GGUF_MAGIC);
    h.extend_from_slice(&GGUF_VERSION.to_le_bytes());
    h.extend_from_slice(&(decls.len() as u64).to_le_bytes());
    h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata.iter() {
        put_str(&mut h, key);
        h.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
        put_value(&mut h, value.as_ref(), key, 0, file)?;
    }
    let mut names = HashSet::with_capacity(decls.len());
    let mut tensors = Vec::with_capacity(decls.len());
    let mut offset = 0u64;
    for d in decls {
        let n_bytes = check_decl(d, file)?;
        if !names.insert(d.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                file: file.clone(),
                tensor: d.name.clone(),
            });
        }
        put_str(&mut h, &d.name);
        h.extend_from_slice(&(d.dims.len() as u32).to_le_bytes());
        for &dim in &d.dims {
            h.extend_from_slice(&dim.to_le_bytes());
        }
        h.extend_from_slice(&(d.ty as u32).to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        tensors.push(TensorInfo {
            name: d.name.clone(),
            dims: d.dims.clone(),
            ty: d.ty,
            offset,
            n_bytes,
        });
        offset = offset
            .checked_add(n_bytes)
            .and_then(|end| align_up(end, alignment))
            .ok_or_else(|| GgufError::Overflow {
                file: file.clone(),
                section: Section::TensorData,
                what: format!("data offset after tensor `{}`", d.name),
            })?;
    }
    let padded = align_up(h.len() as u64, alignment).unwrap_or(h.len() as u64);
    h.resize(padded as usize, 0);
    Ok(Plan {
        header: h,
        tensors,
        alignment,
    })
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(
    out: &mut Vec<u8>,
    v: ValueRef<'_>,
    key: &str,
    depth: usize,
    file: &Source,
) -> Result<(), GgufError> {
    match v {
        ValueRef::U8(x) => out.push(x),
        ValueRef::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::Bool(x) => out.push(u8::from(x)),
        ValueRef::String(s) => put_str(out, s),
        ValueRef::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        ValueRef::Array(a) => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    file: file.clone(),
                    key: key.to_string(),
                    limit: MAX_ARRAY_DEPTH,
                });
            }
            out.extend_from_slice(&(a.elem_type as u32).to_le_bytes());
            out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
            for (i, x) in a.values.iter().enumerate() {
                if x.value_type() != a.elem_type {
                    return Err(GgufError::InvalidInput {
                        file: file.clone(),
                        name: key.to_string(),
                        reason: format!(
                            "array of {} has element {i} of type {}",
                            a.elem_type.name(),
                            x.type_name()
                        ),
                    });
                }
                put_value(out, x, key, depth + 1, file)?;
            }
        }
    }
    Ok(())
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file being written under a temporary name, renamed on commit and
/// removed if dropped before.
struct TempFile {
    source: Source,
    dest: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
}

impl TempFile {
    fn create(dest: &Path, source: Source) -> Result<TempFile, GgufError> {
        let name = dest.file_name().ok_or_else(|| GgufError::InvalidInput {
            file: source.clone(),
            name: dest.display().to_string(),
            reason: "the output path has no file name".into(),
        })?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".tmp.{}.{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = dir.join(tmp_name);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_err(&source, "create temporary file", e))?;
        Ok(TempFile {
            source,
            dest: dest.to_path_buf(),
            tmp,
            out: Some(BufWriter::with_capacity(8 << 20, f)),
        })
    }

    fn out(&mut self) -> Result<&mut BufWriter<File>, GgufError> {
        let source = &self.source;
        self.out.as_mut().ok_or_else(|| {
            io_err(
                source,
                "write",
                io::Error::other("temporary file already closed"),
            )
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let r = self.out()?.write_all(bytes);
        r.map_err(|e| io_err(&self.source, "write temporary file", e))
    }

    fn write_zeros(&mut self, n: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..k])?;
            left -= k as u64;
        }
        Ok(())
    }

    fn commit(mut self) -> Result<(), GgufError> {
        let out = self.out.take().ok_or_else(|| {
            io_err(
                &self.source,
                "commit",
                io::Error::other("temporary file already closed"),
            )
        })?;
        let f = out
            .into_inner()
            .map_err(|e| io_err(&self.source, "flush temporary file", e.into_error()))?;
        f.sync_all()
            .map_err(|e| io_err(&self.source, "sync temporary file", e))?;
        drop(f);
        fs::rename(&self.tmp, &self.dest)
            .map_err(|e| io_err(&self.source, "rename temporary file into place", e))?;
        // Renamed: nothing left for Drop to remove.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        drop(self.out.take());
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn io_err(source: &Source, op: &'static str, e: io::Error) -> GgufError {
    GgufError::Io {
        file: source.clone(),
        op,
        source: e,
    }
}
