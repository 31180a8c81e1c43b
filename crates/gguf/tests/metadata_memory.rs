//! Parsed metadata stays within a small multiple of its bytes in the file.
//! (A `u8` array once cost 32 bytes of memory per byte of file: 256 MiB of
//! metadata took 8.7 GB to inspect.)

use redlite_gguf::{
    ArrayValues, GgufFile, GgufWriter, MetadataArray, MetadataValue, ValueRef, ValueType,
};

fn file_with(key: &str, v: MetadataValue) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_kv(key, v);
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn a_large_u8_array_costs_about_its_size() {
    let n = 16 << 20;
    let bytes: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let f = file_with("big.u8", MetadataArray::typed(bytes.clone()).into());
    let heap = f.metadata().heap_bytes();
    let size = f.file_size() as usize;
    assert!(heap >= n, "the elements are counted: {heap}");
    assert!(
        heap <= size + size / 8,
        "metadata takes {heap} bytes for a {size}-byte file"
    );
    let a = f.metadata().get_array("big.u8").unwrap();
    assert_eq!(a.elem_type, ValueType::U8);
    assert_eq!(a.values.as_u8_slice(), Some(&bytes[..]));
    assert_eq!(a.values.get(n - 1), Some(ValueRef::U8(bytes[n - 1])));
    assert_eq!(a.values.get(n), None);
}

#[test]
fn a_large_string_array_costs_at_most_twice_its_size() {
    let tokens: Vec<String> = (0..400_000).map(|i| format!("t{i}")).collect();
    let f = file_with(
        "tokenizer.ggml.tokens",
        MetadataValue::string_array(tokens.iter().map(String::as_str)),
    );
    let heap = f.metadata().heap_bytes();
    let size = f.file_size() as usize;
    assert!(
        heap <= 2 * size,
        "metadata takes {heap} bytes for a {size}-byte file"
    );
    let got = f.metadata().get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(got.len(), tokens.len());
    assert!(got.iter().zip(&tokens).all(|(a, b)| a == b));
}

#[test]
fn many_nested_empty_arrays_stay_bounded() {
    // The smallest element of an array of arrays: 12 bytes (type, count).
    let inner = MetadataArray::new(ValueType::U8, vec![]);
    let outer = MetadataArray::typed(vec![inner; 200_000]);
    let f = file_with("nested", outer.into());
    let heap = f.metadata().heap_bytes();
    let size = f.file_size() as usize;
    assert!(
        heap <= 6 * size,
        "metadata takes {heap} bytes for a {size}-byte file"
    );
    assert_eq!(
        f.metadata().get_array("nested").unwrap().values.len(),
        200_000
    );
}

#[test]
fn typed_storage_keeps_the_getters_and_round_trips() {
    let mut w = GgufWriter::new();
    w.add_kv("u8s", MetadataArray::typed(vec![1u8, 200]));
    w.add_kv("i16s", MetadataArray::typed(vec![-3i16, 4]));
    w.add_kv("f64s", MetadataArray::typed(vec![0.25f64, -2.0]));
    w.add_kv(
        "strs",
        MetadataArray::typed(["a", "", "ü€"].into_iter().collect::<ArrayValues>()),
    );
    w.add_kv(
        "built",
        MetadataArray::new(ValueType::U32, vec![7u32.into(), 9u32.into()]),
    );
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let m = f.metadata();
    assert_eq!(m.get_u32_array("u8s").unwrap(), [1, 200]);
    assert_eq!(m.get_i32_array("i16s").unwrap(), [-3, 4]);
    assert_eq!(m.get_f32_array("f64s").unwrap(), [0.25, -2.0]);
    assert_eq!(m.get_str_array("strs").unwrap(), ["a", "", "ü€"]);
    assert_eq!(m.get_u64_array("built").unwrap(), [7, 9]);
    assert!(m.get_str_array("u8s").is_err());
    // What we parsed writes back to the same bytes.
    let mut w2 = GgufWriter::new();
    for (k, v) in m.iter() {
        w2.add_kv(k, v.clone());
    }
    assert_eq!(w2.to_bytes().unwrap(), bytes);
}
