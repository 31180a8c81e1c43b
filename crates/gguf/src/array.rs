//! Metadata arrays stored by element type.
//!
//! A tokenizer's vocabulary is an array of 150 000 strings, and a hostile
//! file can hold an array of hundreds of millions of bytes. One enum value
//! per element costs 32 bytes of memory per element whatever its type (a
//! `u8` array took 32 times its file size), so arrays keep one typed vector
//! instead: a `u8` array costs a byte per element, and strings share one
//! text buffer with an end offset each (at most twice the bytes of their
//! encoding, which spends 8 bytes on each string's length).

use crate::metadata::{MetadataArray, MetadataValue, ValueType};

/// The elements of a [`MetadataArray`].
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayValues(Repr);

#[derive(Clone, Debug, PartialEq)]
enum Repr {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    /// All strings concatenated; `ends[i]` is where string `i` ends.
    Str {
        text: String,
        ends: Vec<usize>,
    },
    Array(Vec<MetadataArray>),
    /// Values that do not all have one type. Only [`MetadataArray::new`]
    /// builds this (never the parser), so that the writer can refuse such
    /// an array with the index of the odd element, as it always has.
    Mixed(Vec<MetadataValue>),
}

/// One element of an array (or any value), borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(&'a MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> ValueRef<'a> {
    /// The value's type id.
    pub fn value_type(self) -> ValueType {
        match self {
            ValueRef::U8(_) => ValueType::U8,
            ValueRef::I8(_) => ValueType::I8,
            ValueRef::U16(_) => ValueType::U16,
            ValueRef::I16(_) => ValueType::I16,
            ValueRef::U32(_) => ValueType::U32,
            ValueRef::I32(_) => ValueType::I32,
            ValueRef::F32(_) => ValueType::F32,
            ValueRef::Bool(_) => ValueType::Bool,
            ValueRef::String(_) => ValueType::String,
            ValueRef::Array(_) => ValueType::Array,
            ValueRef::U64(_) => ValueType::U64,
            ValueRef::I64(_) => ValueType::I64,
            ValueRef::F64(_) => ValueType::F64,
        }
    }

    /// The type as words, for messages: `u32`, `array of string`.
    pub fn type_name(self) -> String {
        match self {
            ValueRef::Array(a) => format!("array of {}", a.elem_type.name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer of any width, if it is one.
    pub fn as_int(self) -> Option<i128> {
        Some(match self {
            ValueRef::U8(v) => v.into(),
            ValueRef::I8(v) => v.into(),
            ValueRef::U16(v) => v.into(),
            ValueRef::I16(v) => v.into(),
            ValueRef::U32(v) => v.into(),
            ValueRef::I32(v) => v.into(),
            ValueRef::U64(v) => v.into(),
            ValueRef::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, if it is an `f32` or `f64`.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            ValueRef::F32(v) => Some(v.into()),
            ValueRef::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if the value is one (borrowed from the array).
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            ValueRef::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if the value is one.
    pub fn as_bool(self) -> Option<bool> {
        match self {
            ValueRef::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An owned copy.
    pub fn to_value(self) -> MetadataValue {
        match self {
            ValueRef::U8(v) => MetadataValue::U8(v),
            ValueRef::I8(v) => MetadataValue::I8(v),
            ValueRef::U16(v) => MetadataValue::U16(v),
            ValueRef::I16(v) => MetadataValue::I16(v),
            ValueRef::U32(v) => MetadataValue::U32(v),
            ValueRef::I32(v) => MetadataValue::I32(v),
            ValueRef::F32(v) => MetadataValue::F32(v),
            ValueRef::Bool(v) => MetadataValue::Bool(v),
            ValueRef::String(s) => MetadataValue::String(s.to_string()),
            ValueRef::Array(a) => MetadataValue::Array(a.clone()),
            ValueRef::U64(v) => MetadataValue::U64(v),
            ValueRef::I64(v) => MetadataValue::I64(v),
            ValueRef::F64(v) => MetadataValue::F64(v),
        }
    }
}

impl MetadataValue {
    /// The value borrowed, as array elements are handed out.
    pub fn as_ref(&self) -> ValueRef<'_> {
        match self {
            MetadataValue::U8(v) => ValueRef::U8(*v),
            MetadataValue::I8(v) => ValueRef::I8(*v),
            MetadataValue::U16(v) => ValueRef::U16(*v),
            MetadataValue::I16(v) => ValueRef::I16(*v),
            MetadataValue::U32(v) => ValueRef::U32(*v),
            MetadataValue::I32(v) => ValueRef::I32(*v),
            MetadataValue::F32(v) => ValueRef::F32(*v),
            MetadataValue::Bool(v) => ValueRef::Bool(*v),
            MetadataValue::String(s) => ValueRef::String(s),
            MetadataValue::Array(a) => ValueRef::Array(a),
            MetadataValue::U64(v) => ValueRef::U64(*v),
            MetadataValue::I64(v) => ValueRef::I64(*v),
            MetadataValue::F64(v) => ValueRef::F64(*v),
        }
    }

    /// Heap bytes this value owns (not counting its own inline size).
    pub fn heap_bytes(&self) -> usize {
        match self {
            MetadataValue::String(s) => s.capacity(),
            MetadataValue::Array(a) => a.values.heap_bytes(),
            _ => 0,
        }
    }
}

fn vec_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

impl ArrayValues {
    /// No elements, typed as `elem_type`.
    pub fn empty(elem_type: ValueType) -> ArrayValues {
        ArrayValues(match elem_type {
            ValueType::U8 => Repr::U8(Vec::new()),
            ValueType::I8 => Repr::I8(Vec::new()),
            ValueType::U16 => Repr::U16(Vec::new()),
            ValueType::I16 => Repr::I16(Vec::new()),
            ValueType::U32 => Repr::U32(Vec::new()),
            ValueType::I32 => Repr::I32(Vec::new()),
            ValueType::F32 => Repr::F32(Vec::new()),
            ValueType::Bool => Repr::Bool(Vec::new()),
            ValueType::U64 => Repr::U64(Vec::new()),
            ValueType::I64 => Repr::I64(Vec::new()),
            ValueType::F64 => Repr::F64(Vec::new()),
            ValueType::String => Repr::Str {
                text: String::new(),
                ends: Vec::new(),
            },
            ValueType::Array => Repr::Array(Vec::new()),
        })
    }

    /// Room for `n` more elements (the parser has checked that the file
    /// holds at least `n` encoded elements, so this is bounded by its size).
    pub(crate) fn reserve(&mut self, n: usize) {
        match &mut self.0 {
            Repr::U8(v) => v.reserve_exact(n),
            Repr::I8(v) => v.reserve_exact(n),
            Repr::U16(v) => v.reserve_exact(n),
            Repr::I16(v) => v.reserve_exact(n),
            Repr::U32(v) => v.reserve_exact(n),
            Repr::I32(v) => v.reserve_exact(n),
            Repr::F32(v) => v.reserve_exact(n),
            Repr::Bool(v) => v.reserve_exact(n),
            Repr::U64(v) => v.reserve_exact(n),
            Repr::I64(v) => v.reserve_exact(n),
            Repr::F64(v) => v.reserve_exact(n),
            Repr::Str { ends, .. } => ends.reserve_exact(n),
            Repr::Array(v) => v.reserve_exact(n),
            Repr::Mixed(v) => v.reserve_exact(n),
        }
    }

    /// Append one element; a value of another type turns the array into a
    /// mixed one, which the writer refuses.
    pub fn push(&mut self, v: MetadataValue) {
        match (&mut self.0, v) {
            (Repr::U8(a), MetadataValue::U8(x)) => a.push(x),
            (Repr::I8(a), MetadataValue::I8(x)) => a.push(x),
            (Repr::U16(a), MetadataValue::U16(x)) => a.push(x),
            (Repr::I16(a), MetadataValue::I16(x)) => a.push(x),
            (Repr::U32(a), MetadataValue::U32(x)) => a.push(x),
            (Repr::I32(a), MetadataValue::I32(x)) => a.push(x),
            (Repr::F32(a), MetadataValue::F32(x)) => a.push(x),
            (Repr::Bool(a), MetadataValue::Bool(x)) => a.push(x),
            (Repr::U64(a), MetadataValue::U64(x)) => a.push(x),
            (Repr::I64(a), MetadataValue::I64(x)) => a.push(x),
            (Repr::F64(a), MetadataValue::F64(x)) => a.push(x),
            (Repr::Str { text, ends }, MetadataValue::String(s)) => {
                text.push_str(&s);
                ends.push(text.len());
            }
            (Repr::Array(a), MetadataValue::Array(x)) => a.push(x),
            (Repr::Mixed(a), x) => a.push(x),
            (_, x) => {
                let mut all: Vec<MetadataValue> = self.iter().map(ValueRef::to_value).collect();
                all.push(x);
                self.0 = Repr::Mixed(all);
            }
        }
    }

    /// Give back spare capacity (the strings' text grows by doubling).
    pub(crate) fn shrink_to_fit(&mut self) {
        if let Repr::Str { text, .. } = &mut self.0 {
            text.shrink_to_fit();
        }
    }

    /// Append one string (the parser's path: no `String` per element).
    pub(crate) fn push_str(&mut self, s: &str) {
        match &mut self.0 {
            Repr::Str { text, ends } => {
                text.push_str(s);
                ends.push(text.len());
            }
            _ => self.push(MetadataValue::String(s.to_string())),
        }
    }

    /// The element type, when every element has the same one (`None` for
    /// an array built from values of several types).
    pub fn elem_type(&self) -> Option<ValueType> {
        Some(match &self.0 {
            Repr::U8(_) => ValueType::U8,
            Repr::I8(_) => ValueType::I8,
            Repr::U16(_) => ValueType::U16,
            Repr::I16(_) => ValueType::I16,
            Repr::U32(_) => ValueType::U32,
            Repr::I32(_) => ValueType::I32,
            Repr::F32(_) => ValueType::F32,
            Repr::Bool(_) => ValueType::Bool,
            Repr::U64(_) => ValueType::U64,
            Repr::I64(_) => ValueType::I64,
            Repr::F64(_) => ValueType::F64,
            Repr::Str { .. } => ValueType::String,
            Repr::Array(_) => ValueType::Array,
            Repr::Mixed(_) => return None,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::U8(v) => v.len(),
            Repr::I8(v) => v.len(),
            Repr::U16(v) => v.len(),
            Repr::I16(v) => v.len(),
            Repr::U32(v) => v.len(),
            Repr::I32(v) => v.len(),
            Repr::F32(v) => v.len(),
            Repr::Bool(v) => v.len(),
            Repr::U64(v) => v.len(),
            Repr::I64(v) => v.len(),
            Repr::F64(v) => v.len(),
            Repr::Str { ends, .. } => ends.len(),
            Repr::Array(v) => v.len(),
            Repr::Mixed(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Option<ValueRef<'_>> {
        Some(match &self.0 {
            Repr::U8(v) => ValueRef::U8(*v.get(i)?),
            Repr::I8(v) => ValueRef::I8(*v.get(i)?),
            Repr::U16(v) => ValueRef::U16(*v.get(i)?),
            Repr::I16(v) => ValueRef::I16(*v.get(i)?),
            Repr::U32(v) => ValueRef::U32(*v.get(i)?),
            Repr::I32(v) => ValueRef::I32(*v.get(i)?),
            Repr::F32(v) => ValueRef::F32(*v.get(i)?),
            Repr::Bool(v) => ValueRef::Bool(*v.get(i)?),
            Repr::U64(v) => ValueRef::U64(*v.get(i)?),
            Repr::I64(v) => ValueRef::I64(*v.get(i)?),
            Repr::F64(v) => ValueRef::F64(*v.get(i)?),
            Repr::Str { text, ends } => {
                let end = *ends.get(i)?;
                let start = if i == 0 { 0 } else { ends[i - 1] };
                ValueRef::String(&text[start..end])
            }
            Repr::Array(v) => ValueRef::Array(v.get(i)?),
            Repr::Mixed(v) => v.get(i)?.as_ref(),
        })
    }

    /// The elements in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = ValueRef<'_>> + '_ {
        (0..self.len()).map(move |i| self.get(i).expect("index below len"))
    }

    /// The bytes of a `u8` array, without copying.
    pub fn as_u8_slice(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::U8(v) => Some(v),
            _ => None,
        }
    }

    /// Heap bytes the elements take.
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::U8(v) => vec_bytes(v),
            Repr::I8(v) => vec_bytes(v),
            Repr::U16(v) => vec_bytes(v),
            Repr::I16(v) => vec_bytes(v),
            Repr::U32(v) => vec_bytes(v),
            Repr::I32(v) => vec_bytes(v),
            Repr::F32(v) => vec_bytes(v),
            Repr::Bool(v) => vec_bytes(v),
            Repr::U64(v) => vec_bytes(v),
            Repr::I64(v) => vec_bytes(v),
            Repr::F64(v) => vec_bytes(v),
            Repr::Str { text, ends } => text.capacity() + vec_bytes(ends),
            Repr::Array(v) => vec_bytes(v) + v.iter().map(|a| a.values.heap_bytes()).sum::<usize>(),
            Repr::Mixed(v) => vec_bytes(v) + v.iter().map(MetadataValue::heap_bytes).sum::<usize>(),
        }
    }
}

impl<'a> IntoIterator for &'a ArrayValues {
    type Item = ValueRef<'a>;
    type IntoIter = Box<dyn ExactSizeIterator<Item = ValueRef<'a>> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

macro_rules! typed_from {
    ($($t:ty => $v:ident),*) => {
        $( impl From<Vec<$t>> for ArrayValues {
            fn from(v: Vec<$t>) -> ArrayValues { ArrayValues(Repr::$v(v)) }
        } )*
    };
}
typed_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64, MetadataArray => Array);

impl<S: AsRef<str>> FromIterator<S> for ArrayValues {
    /// An array of strings.
    fn from_iter<I: IntoIterator<Item = S>>(items: I) -> ArrayValues {
        let mut a = ArrayValues::empty(ValueType::String);
        for s in items {
            a.push_str(s.as_ref());
        }
        a
    }
}
