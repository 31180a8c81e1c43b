//! Parsing and checking a GGUF file held in memory.
//!
//! Every read is bounds-checked against the bytes we have, and every
//! allocation is bounded by what the remaining bytes could encode, so a
//! corrupt length field costs an error, never gigabytes or a panic.

use std::collections::HashMap;

use crate::error::{GgufError, Section, Source};
use crate::metadata::{ArrayValues, Metadata, MetadataArray, MetadataValue, ValueType};
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};

/// What the header and tables of a file say, after every check.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a Source,
    section: Section,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                file: self.file.clone(),
                section: self.section,
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                file_size: self.buf.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Check that `count` items of at least `min_size` bytes each could fit
    /// in the rest of the file; return the count as usize.
    fn bounded_count(
        &self,
        count: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let needed = count.checked_mul(min_size);
        match needed {
            Some(n) if n <= self.remaining() => {
                usize::try_from(count).map_err(|_| self.overflow(what))
            }
            _ => Err(GgufError::LengthExceedsFile {
                file: self.file.clone(),
                section: self.section,
                what: what(),
                value: count,
                needed: needed.unwrap_or(u64::MAX),
                remaining: self.remaining(),
                offset: self.pos as u64,
            }),
        }
    }

    fn overflow(&self, what: &dyn Fn() -> String) -> GgufError {
        GgufError::Overflow {
            file: self.file.clone(),
            section: self.section,
            what: what(),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        self.str_ref(what).map(str::to_string)
    }

    fn str_ref(&mut self, what: &dyn Fn() -> String) -> Result<&'a str, GgufError> {
        let len_what = || format!("length of {}", what());
        let len = self.u64(&len_what)?;
        let n = self.bounded_count(len, 1, &len_what)?;
        let bytes = self.take(n, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            file: self.file.clone(),
            section: self.section,
            what: what(),
        })
    }

    fn value(
        &mut self,
        ty: ValueType,
        key: &str,
        depth: usize,
    ) -> Result<MetadataValue, GgufError> {
        let what = || format!("value of key `{key}`");
        Ok(match ty {
            ValueType::U8 => MetadataValue::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => MetadataValue::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => MetadataValue::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(self.array(&what)?)),
            // Any nonzero byte reads as true, as in llama.cpp and numpy.
            ValueType::Bool => MetadataValue::Bool(self.array::<1>(&what)?[0] != 0),
            ValueType::String => MetadataValue::String(self.string(&what)?),
            ValueType::U64 => MetadataValue::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        file: self.file.clone(),
                        key: key.to_string(),
                        limit: MAX_ARRAY_DEPTH,
                    });
                }
                let type_what = || format!("array element type of key `{key}`");
                let id = self.u32(&type_what)?;
                let elem_type =
                    ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
                        file: self.file.clone(),
                        key: key.to_string(),
                        id,
                    })?;
                let count_what = || format!("array length of key `{key}`");
                let count = self.u64(&count_what)?;
                let n = self.bounded_count(count, elem_type.min_encoded_size(), &count_what)?;
                // Typed storage: memory stays within a small multiple of
                // the bytes just checked (see `array.rs`).
                let mut values = ArrayValues::empty(elem_type);
                values.reserve(n);
                for _ in 0..n {
                    if elem_type == ValueType::String {
                        values.push_str(self.str_ref(&what)?);
                    } else {
                        values.push(self.value(elem_type, key, depth + 1)?);
                    }
                }
                values.shrink_to_fit();
                MetadataValue::Array(MetadataArray { elem_type, values })
            }
        })
    }
}

/// Smallest tensor info on disk: name length, n_dims, type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
/// Smallest key/value on disk: key length, type, one byte of value.
const MIN_KV: u64 = 8 + 4 + 1;

pub(crate) fn parse(buf: &[u8], file: &Source) -> Result<Parsed, GgufError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        file,
        section: Section::Header,
    };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            file: file.clone(),
            found: magic,
        });
    }
    let version = c.u32(&|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion {
            file: file.clone(),
            version,
        });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata key/value count".into())?;

    c.section = Section::Metadata;
    let n_kv = c.bounded_count(n_kv, MIN_KV, &|| "metadata key/value count".into())?;
    let mut metadata = Metadata::with_source(file.clone());
    for i in 0..n_kv {
        let key = c.string(&|| format!("key of metadata entry #{i}"))?;
        let id = c.u32(&|| format!("value type of key `{key}`"))?;
        let ty = ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            file: file.clone(),
            key: key.clone(),
            id,
        })?;
        let value = c.value(ty, &key, 0)?;
        metadata
            .insert_new(key, value)
            .map_err(|key| GgufError::DuplicateKey {
                file: file.clone(),
                key,
            })?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(MetadataValue::U32(a)) => {
            return Err(GgufError::InvalidAlignment {
                file: file.clone(),
                alignment: u64::from(*a),
            })
        }
        // llama.cpp and the gguf package both insist on u32 here.
        Some(v) => {
            return Err(GgufError::WrongType {
                file: file.clone(),
                key: "general.alignment".into(),
                expected: "u32",
                found: v.type_name(),
            })
        }
    };

    c.section = Section::TensorTable;
    let n_tensors = c.bounded_count(n_tensors, MIN_TENSOR_INFO, &|| "tensor count".into())?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let t = read_tensor_info(&mut c, name, alignment)?;
        if index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor {
                file: file.clone(),
                tensor: t.name,
            });
        }
        tensors.push(t);
    }

    let data_offset = align_up(c.pos as u64, alignment)
        .ok_or_else(|| c.overflow(&|| "data section offset".into()))?;
    let data_size = (buf.len() as u64).saturating_sub(data_offset);
    check_tensor_ranges(&tensors, data_size, file)?;

    Ok(Parsed {
        version,
        metadata,
        tensors,
        index,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(
    c: &mut Cursor<'_>,
    name: String,
    alignment: u64,
) -> Result<TensorInfo, GgufError> {
    let file = c.file;
    let n_dims = c.u32(&|| format!("dimension count of tensor `{name}`"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::InvalidDimCount {
            file: file.clone(),
            tensor: name,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&|| format!("dimension {d} of tensor `{name}`"))?);
    }
    let id = c.u32(&|| format!("type of tensor `{name}`"))?;
    let offset = c.u64(&|| format!("offset of tensor `{name}`"))?;
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownTensorType {
        file: file.clone(),
        tensor: name.clone(),
        id,
    })?;
    let n_bytes = tensor_n_bytes(&name, &dims, ty, file, Section::TensorTable)?;
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedOffset {
            file: file.clone(),
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_bytes,
    })
}

/// Check a shape against a type and return the byte size. Shared with the
/// writer, so that we never write what we would refuse to read.
pub(crate) fn tensor_n_bytes(
    name: &str,
    dims: &[u64],
    ty: GgmlType,
    file: &Source,
    section: Section,
) -> Result<u64, GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::InvalidDimCount {
            file: file.clone(),
            tensor: name.to_string(),
            n_dims: dims.len().try_into().unwrap_or(u32::MAX),
        });
    }
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            file: file.clone(),
            tensor: name.to_string(),
            dims: dims.to_vec(),
        });
    }
    let overflow = |what: &str| GgufError::Overflow {
        file: file.clone(),
        section,
        what: format!("{what} of tensor `{name}` with shape {dims:?} and type {ty}"),
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| overflow("element count"))?;
    let block = ty.block_size() as u64;
    if !dims[0].is_multiple_of(block) {
        return Err(GgufError::PartialBlock {
            file: file.clone(),
            tensor: name.to_string(),
            ty,
            row_len: dims[0],
            block_size: block,
        });
    }
    let n_bytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| overflow("byte size"))?;
    // Views index rows with usize; make sure a row's byte count fits.
    let row_bytes = (dims[0] / block).checked_mul(ty.type_size() as u64);
    if row_bytes.and_then(|r| usize::try_from(r).ok()).is_none() {
        return Err(overflow("row byte size"));
    }
    Ok(n_bytes)
}

fn check_tensor_ranges(
    tensors: &[TensorInfo],
    data_size: u64,
    file: &Source,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset >= data_size {
            return Err(GgufError::OffsetOutOfRange {
                file: file.clone(),
                tensor: t.name.clone(),
                offset: t.offset,
                data_size,
            });
        }
        // offset < data_size, so a sum that overflows is past the end too.
        if t.offset
            .checked_add(t.n_bytes)
            .is_none_or(|end| end > data_size)
        {
            return Err(GgufError::TensorDataTruncated {
                file: file.clone(),
                tensor: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_size,
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.offset + a.n_bytes; // checked above
        if b.offset < a_end {
            return Err(GgufError::TensorOverlap {
                file: file.clone(),
                tensor: b.name.clone(),
                offset: b.offset,
                other: a.name.clone(),
                other_end: a_end,
            });
        }
    }
    Ok(())
}

/// `x` rounded up to a multiple of `align` (a power of two).
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}
