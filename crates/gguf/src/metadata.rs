//! Metadata values and the ordered key/value table.

use std::collections::HashMap;

pub use crate::array::{ArrayValues, ValueRef};
use crate::error::{GgufError, Source};

/// The value type ids of GGUF metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with this on-disk id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// A short lowercase name (`u32`, `string`, `array`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes on disk (a string is at
    /// least its 8-byte length, an array its 4-byte type and 8-byte count).
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// An array value: one element type, then the elements (stored by type,
/// see [`ArrayValues`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataArray {
    pub elem_type: ValueType,
    pub values: ArrayValues,
}

impl MetadataArray {
    /// An array; the writer checks that every value has `elem_type`.
    pub fn new(elem_type: ValueType, values: Vec<MetadataValue>) -> MetadataArray {
        let mut a = ArrayValues::empty(elem_type);
        a.reserve(values.len());
        for v in values {
            a.push(v);
        }
        MetadataArray {
            elem_type,
            values: a,
        }
    }

    /// An array of one typed vector (`Vec<u8>`, `Vec<i32>`, ...), or of
    /// strings collected into [`ArrayValues`].
    pub fn typed(values: impl Into<ArrayValues>) -> MetadataArray {
        let values = values.into();
        MetadataArray {
            elem_type: values.elem_type().unwrap_or(ValueType::Array),
            values,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetadataValue {
    /// The value's type id.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// The type as words, for messages: `u32`, `array of string`.
    pub fn type_name(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("array of {}", a.elem_type.name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// An array of strings.
    pub fn string_array<I, S>(items: I) -> MetadataValue
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MetadataValue::Array(MetadataArray::typed(
            items.into_iter().map(Into::into).collect::<ArrayValues>(),
        ))
    }

    /// The value as an integer of any width, if it is one.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, if it is an `f32` or `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {
        $( impl From<$t> for MetadataValue {
            fn from(x: $t) -> MetadataValue { MetadataValue::$v(x) }
        } )*
    };
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, MetadataArray => Array, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for MetadataValue {
    fn from(s: &str) -> MetadataValue {
        MetadataValue::String(s.to_string())
    }
}

/// The metadata table of a GGUF file: keys in file order, looked up by name.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
    source: Source,
}

impl PartialEq for Metadata {
    fn eq(&self, other: &Metadata) -> bool {
        self.entries == other.entries
    }
}

impl Metadata {
    /// An empty table.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    pub(crate) fn with_source(source: Source) -> Metadata {
        Metadata {
            source,
            ..Metadata::default()
        }
    }

    /// Add a key, or replace its value in place (keeping its position).
    /// Returns the old value.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<MetadataValue>,
    ) -> Option<MetadataValue> {
        let key = key.into();
        let value = value.into();
        if let Some(&i) = self.index.get(&key) {
            return Some(std::mem::replace(&mut self.entries[i].1, value));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        None
    }

    /// Add a key that must be new; gives the key back if it is not.
    pub(crate) fn insert_new(&mut self, key: String, value: MetadataValue) -> Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(key);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Remove a key, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<MetadataValue> {
        let i = self.index.remove(key)?;
        let (_, v) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(v)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Keys and values in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &MetadataValue)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&MetadataValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.source.clone(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &MetadataValue) -> GgufError {
        GgufError::WrongType {
            file: self.source.clone(),
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T, GgufError> {
        let v = self.require(key)?;
        let i = v
            .as_int()
            .ok_or_else(|| self.wrong_type(key, "an integer", v))?;
        T::try_from(i).map_err(|_| GgufError::ValueOutOfRange {
            file: self.source.clone(),
            key: key.to_string(),
            value: i.to_string(),
            target,
        })
    }

    /// An unsigned integer of any stored width (negative values are errors).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.int(key, "u64")
    }

    /// An integer of any stored width that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.int(key, "u32")
    }

    /// An integer of any stored width that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.int(key, "i64")
    }

    /// An integer of any stored width that fits in `i32`.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.int(key, "i32")
    }

    /// An `f32` or `f64` value, as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_f64(key).map(|v| v as f32)
    }

    /// An `f32` or `f64` value, as `f64`.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.wrong_type(key, "a float (f32 or f64)", v))
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", v))
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetadataValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "a bool", v)),
        }
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray, GgufError> {
        match self.require(key)? {
            MetadataValue::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "an array", v)),
        }
    }

    fn array_map<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl Fn(ValueRef<'a>) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        let v = self.require(key)?;
        let MetadataValue::Array(a) = v else {
            return Err(self.wrong_type(key, expected, v));
        };
        a.values
            .iter()
            .map(|x| f(x).ok_or_else(|| self.wrong_type(key, expected, v)))
            .collect()
    }

    fn int_array<T: TryFrom<i128>>(
        &self,
        key: &str,
        expected: &'static str,
        target: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        let ints = self.array_map(key, expected, ValueRef::as_int)?;
        ints.into_iter()
            .map(|i| {
                T::try_from(i).map_err(|_| GgufError::ValueOutOfRange {
                    file: self.source.clone(),
                    key: key.to_string(),
                    value: i.to_string(),
                    target,
                })
            })
            .collect()
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.array_map(key, "an array of string", ValueRef::as_str)
    }

    /// An array of integers (any width) that fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.int_array(key, "an array of integers", "i32")
    }

    /// An array of integers (any width) that fit in `u32`.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.int_array(key, "an array of integers", "u32")
    }

    /// An array of integers (any width) that fit in `u64`.
    pub fn get_u64_array(&self, key: &str) -> Result<Vec<u64>, GgufError> {
        self.int_array(key, "an array of integers", "u64")
    }

    /// An array of bools.
    pub fn get_bool_array(&self, key: &str) -> Result<Vec<bool>, GgufError> {
        self.array_map(key, "an array of bool", ValueRef::as_bool)
    }

    /// An array of `f32` or `f64`, as `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.array_map(key, "an array of float", |v| v.as_f64().map(|x| x as f32))
    }

    /// Heap bytes the table takes: keys, values, arrays' elements and the
    /// index (an estimate of the hash map's share). Parsing bounds this by
    /// a small multiple of the metadata's size in the file.
    pub fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(String, MetadataValue)>();
        let slot = std::mem::size_of::<(String, usize)>() + 1;
        let values: usize = self
            .entries
            .iter()
            .map(|(k, v)| 2 * k.capacity() + v.heap_bytes())
            .sum();
        values + self.entries.capacity() * entry + self.index.capacity() * slot
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }
}
