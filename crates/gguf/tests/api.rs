//! Reader and writer round trips through our own code, the metadata
//! getters, views, and the writers' atomicity.

use std::path::{Path, PathBuf};

use redlite_gguf::{
    GgmlType, GgufError, GgufFile, GgufStreamWriter, GgufWriter, Metadata, MetadataArray,
    MetadataValue, TensorDecl, ValueType,
};

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redlite-gguf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn dir_entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn every_type() -> Vec<(&'static str, MetadataValue)> {
    use MetadataValue as V;
    vec![
        ("general.architecture", V::from("qwen3next")),
        ("t.u8", V::U8(250)),
        ("t.i8", V::I8(-7)),
        ("t.u16", V::U16(65000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(1.5e-6)),
        ("t.bool", V::Bool(true)),
        ("t.string", V::from("héllo ✓")),
        ("t.u64", V::U64(u64::MAX - 1)),
        ("t.i64", V::I64(i64::MIN + 1)),
        ("t.f64", V::F64(-2.5e300)),
        ("t.strings", V::string_array(["a", "", "ü€"])),
        (
            "t.i32s",
            V::Array(MetadataArray::new(
                ValueType::I32,
                vec![V::I32(-1), V::I32(2)],
            )),
        ),
        (
            "t.nested",
            V::Array(MetadataArray::new(
                ValueType::Array,
                vec![
                    V::Array(MetadataArray::new(ValueType::U8, vec![V::U8(1), V::U8(2)])),
                    V::string_array(["x"]),
                    V::Array(MetadataArray::new(ValueType::F32, vec![])),
                ],
            )),
        ),
        (
            "t.bools",
            V::Array(MetadataArray::new(
                ValueType::Bool,
                vec![V::Bool(true), V::Bool(false)],
            )),
        ),
        (
            "t.f32s",
            V::Array(MetadataArray::new(
                ValueType::F32,
                vec![V::F32(0.5), V::F32(-1.0)],
            )),
        ),
    ]
}

fn sample_writer() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    for (k, v) in every_type() {
        w.add_kv(k, v);
    }
    let a: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    w.add_tensor("a", [4u64, 3], GgmlType::F32, f32_bytes(&a))
        .unwrap();
    w.add_tensor("b", vec![64u64], GgmlType::Q8_0, vec![7u8; 68])
        .unwrap();
    w.add_tensor("c", [3u64], GgmlType::F16, vec![1u8, 2, 3, 4, 5, 6])
        .unwrap();
    w
}

#[test]
fn round_trip_in_memory_every_value_type() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.path(), None);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    let got: Vec<(&str, &MetadataValue)> = f.metadata().iter().collect();
    let want = every_type();
    assert_eq!(got.len(), want.len());
    for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
        assert_eq!(gk, wk);
        assert_eq!(*gv, wv, "key {wk}");
    }
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let b = f.tensor_info("b").unwrap();
    assert_eq!((b.ty, b.n_bytes, b.offset), (GgmlType::Q8_0, 68, 64));
    assert_eq!(f.tensor("b").unwrap().data, &[7u8; 68][..]);
    assert_eq!(f.tensor("c").unwrap().data, &[1u8, 2, 3, 4, 5, 6][..]);
    assert_eq!(f.tensor_at(2).unwrap().info.name, "c");
    assert!(f.tensor_at(3).is_none());
    // Same bytes through the memory writer and the file writer.
    let d = scratch_dir("same-bytes");
    let p = d.join("m.gguf");
    w.write(&p).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), f.bytes());
}

#[test]
fn open_memory_maps_and_views_are_zero_copy() {
    let d = scratch_dir("open");
    let p = d.join("m.gguf");
    sample_writer().write(&p).unwrap();
    assert_eq!(dir_entries(&d), ["m.gguf"], "no temporary file left");
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.path(), Some(p.as_path()));
    assert_eq!(f.file_size(), std::fs::metadata(&p).unwrap().len());
    let a = f.tensor("a").unwrap();
    assert_eq!(a.info.dims, [4, 3]);
    assert_eq!(a.info.n_elements(), 12);
    assert_eq!(a.info.row_len(), 4);
    assert_eq!(a.info.n_rows(), 3);
    assert_eq!(a.info.row_bytes(), 16);
    let floats = a.as_f32().expect("mmap is page aligned, data 32-aligned");
    assert_eq!(floats[5], 1.25);
    // Zero-copy: the slice points into the mapped file.
    let base = f.bytes().as_ptr() as usize;
    assert_eq!(
        floats.as_ptr() as usize,
        base + (f.data_offset() + a.info.offset) as usize
    );
    assert_eq!(a.row(1), &f32_bytes(&[1.0, 1.25, 1.5, 1.75])[..]);
    assert!(a.get_row(3).is_none());
    assert!(f.tensor("b").unwrap().as_f32().is_none(), "not F32");
    let q = f.tensor("b").unwrap();
    assert_eq!(q.info.row_bytes(), 68);
    assert_eq!(q.row(0).len(), 68);
}

#[test]
#[should_panic(expected = "row 3 out of range")]
fn row_out_of_range_panics_like_indexing() {
    let f = GgufFile::from_bytes(sample_writer().to_bytes().unwrap()).unwrap();
    let a = f.tensor("a").unwrap();
    let _ = a.row(3);
}

#[test]
fn as_f32_refuses_misaligned_data() {
    // Alignment 1 lets an F32 tensor start at any address. A mapped file
    // starts on a page boundary, so pads of 1..=4 bytes put the tensor at
    // every residue mod 4: exactly one of the four layouts is aligned.
    let d = scratch_dir("misaligned");
    let mut aligned = 0;
    for pad in 1..=4u64 {
        let mut w = GgufWriter::new();
        w.set_alignment(1).unwrap();
        w.add_tensor("pad", [pad], GgmlType::I8, vec![0u8; pad as usize])
            .unwrap();
        w.add_tensor("x", [2u64], GgmlType::F32, f32_bytes(&[1.0, 2.0]))
            .unwrap();
        let p = d.join(format!("m{pad}.gguf"));
        w.write(&p).unwrap();
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.alignment(), 1);
        let x = f.tensor("x").unwrap();
        assert_eq!(x.info.offset, pad);
        let addr = x.data.as_ptr() as usize;
        match x.as_f32() {
            Some(v) => {
                assert_eq!(addr % 4, 0);
                assert_eq!(v, [1.0, 2.0]);
                aligned += 1;
            }
            None => assert_ne!(addr % 4, 0),
        }
    }
    assert_eq!(aligned, 1);
}

#[test]
fn version_2_reads_like_version_3() {
    let mut bytes = sample_writer().to_bytes().unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 3);
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = sample_writer();
    w.set_alignment(256).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset() % 256, 0);
    for t in f.tensors() {
        assert_eq!(t.offset % 256, 0, "{}", t.name);
    }
    assert_eq!(f.metadata().get_u32("general.alignment").unwrap(), 256);
    assert!(matches!(
        w.set_alignment(48),
        Err(GgufError::InvalidAlignment { alignment: 48, .. })
    ));
    assert!(matches!(
        w.set_alignment(0),
        Err(GgufError::InvalidAlignment { alignment: 0, .. })
    ));
}

#[test]
fn getters_convert_and_name_key_and_types() {
    let f = GgufFile::from_bytes(sample_writer().to_bytes().unwrap()).unwrap();
    let m = f.metadata();
    assert_eq!(m.architecture().unwrap(), "qwen3next");
    assert_eq!(m.get_u64("t.u8").unwrap(), 250);
    assert_eq!(m.get_u64("t.u16").unwrap(), 65000);
    assert_eq!(m.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(m.get_u64("t.u64").unwrap(), u64::MAX - 1);
    assert_eq!(m.get_i64("t.i8").unwrap(), -7);
    assert_eq!(m.get_i32("t.i16").unwrap(), -30000);
    assert_eq!(m.get_f32("t.f32").unwrap(), 1.5e-6);
    assert_eq!(m.get_f32("t.f64").unwrap(), f32::NEG_INFINITY);
    assert_eq!(m.get_f64("t.f64").unwrap(), -2.5e300);
    assert!(m.get_bool("t.bool").unwrap());
    assert_eq!(m.get_str("t.string").unwrap(), "héllo ✓");
    assert_eq!(m.get_str_array("t.strings").unwrap(), ["a", "", "ü€"]);
    assert_eq!(m.get_i32_array("t.i32s").unwrap(), [-1, 2]);
    assert_eq!(m.get_bool_array("t.bools").unwrap(), [true, false]);
    assert_eq!(m.get_f32_array("t.f32s").unwrap(), [0.5, -1.0]);
    assert_eq!(m.get_array("t.nested").unwrap().values.len(), 3);
    assert_eq!(m.len(), every_type().len());

    let e = m.get_u32("t.i8").unwrap_err();
    assert!(matches!(&e, GgufError::ValueOutOfRange { key, target: "u32", .. } if key == "t.i8"));
    let e = m.get_u32("t.u64").unwrap_err();
    assert!(matches!(e, GgufError::ValueOutOfRange { .. }));
    assert!(matches!(
        m.get_u32_array("t.i32s"),
        Err(GgufError::ValueOutOfRange { .. })
    ));
    let e = m.get_u64("t.string").unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, GgufError::WrongType { key, found, .. } if key == "t.string" && found == "string")
    );
    assert!(
        msg.contains("t.string") && msg.contains("expected an integer"),
        "{msg}"
    );
    let e = m.get_str_array("t.i32s").unwrap_err();
    assert!(e.to_string().contains("array of i32"), "{e}");
    let e = m.get_str("nope").unwrap_err();
    assert!(matches!(&e, GgufError::MissingKey { key, .. } if key == "nope"));
    assert!(e.to_string().contains("<in-memory GGUF>"), "{e}");
    let e = f.tensor("missing.weight").unwrap_err();
    assert!(matches!(&e, GgufError::MissingTensor { tensor, .. } if tensor == "missing.weight"));
}

#[test]
fn errors_name_the_file() {
    let d = scratch_dir("names-file");
    let p = d.join("broken.gguf");
    std::fs::write(&p, b"GGML\x03\0\0\0").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }));
    assert_eq!(e.path(), Some(p.as_path()));
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    let e = GgufFile::open(d.join("absent.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { op: "open", .. }), "{e}");
    std::fs::write(&p, b"").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
}

#[test]
fn writer_refuses_bad_input() {
    let mut w = GgufWriter::new();
    assert!(matches!(
        w.add_tensor("x", [3u64], GgmlType::F32, vec![0u8; 11]),
        Err(GgufError::SizeMismatch {
            expected: 12,
            got: 11,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("q", [33u64], GgmlType::Q8_0, vec![0u8; 34]),
        Err(GgufError::PartialBlock { .. })
    ));
    assert!(matches!(
        w.add_tensor("z", [0u64], GgmlType::F32, vec![]),
        Err(GgufError::ZeroDim { .. })
    ));
    assert!(matches!(
        w.add_tensor("five", [1u64, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidDimCount { n_dims: 5, .. })
    ));
    assert!(matches!(
        w.add_tensor("n".repeat(64), [1u64], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidInput { .. })
    ));
    w.add_tensor("x", [1u64], GgmlType::F32, vec![0; 4])
        .unwrap();
    assert!(matches!(
        w.add_tensor("x", [1u64], GgmlType::F32, vec![0; 4]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    // An array whose elements do not match its declared type.
    w.add_kv(
        "bad",
        MetadataArray::new(ValueType::U8, vec![MetadataValue::U16(1)]),
    );
    let d = scratch_dir("bad-input");
    let e = w.write(d.join("out.gguf")).unwrap_err();
    assert!(
        matches!(&e, GgufError::InvalidInput { name, .. } if name == "bad"),
        "{e}"
    );
    assert!(dir_entries(&d).is_empty(), "failed write leaves nothing");
    // general.alignment must be u32, as llama.cpp requires.
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", 64u64);
    assert!(matches!(w.to_bytes(), Err(GgufError::WrongType { .. })));
}

#[test]
fn write_replaces_target_atomically() {
    let d = scratch_dir("atomic");
    let p = d.join("m.gguf");
    std::fs::write(&p, b"old contents").unwrap();
    sample_writer().write(&p).unwrap();
    assert!(GgufFile::open(&p).is_ok());
    assert_eq!(dir_entries(&d), ["m.gguf"]);
    // A failing write keeps the old file intact.
    let mut bad = GgufWriter::new();
    bad.add_kv("general.alignment", MetadataValue::U32(3));
    assert!(bad.write(&p).is_err());
    assert!(GgufFile::open(&p).is_ok());
    assert_eq!(dir_entries(&d), ["m.gguf"]);
}

fn stream_decls() -> Vec<TensorDecl> {
    vec![
        TensorDecl::new("first", [8u64], GgmlType::F32),
        TensorDecl::new("second", [32u64, 2], GgmlType::Q8_0),
    ]
}

#[test]
fn stream_writer_in_chunks_matches_memory_writer() {
    let d = scratch_dir("stream");
    let p = d.join("s.gguf");
    let mut meta = Metadata::new();
    meta.insert("general.architecture", "test");
    meta.insert("general.alignment", 64u32);
    let first: Vec<u8> = (0..32).collect();
    let second: Vec<u8> = (0..68).map(|i| (i * 3) as u8).collect();
    let mut s = GgufStreamWriter::create(&p, &meta, &stream_decls()).unwrap();
    assert_eq!(s.tensor_infos()[1].offset, 64);
    s.write_tensor_data("first", &first[..10]).unwrap();
    s.write_tensor_data("first", &first[10..]).unwrap();
    for chunk in second.chunks(7) {
        s.write_tensor_data("second", chunk).unwrap();
    }
    assert_eq!(dir_entries(&d).len(), 1);
    assert!(!p.exists(), "target appears only on finish");
    s.finish().unwrap();
    assert_eq!(dir_entries(&d), ["s.gguf"]);

    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "test");
    w.set_alignment(64).unwrap();
    w.add_tensor("first", [8u64], GgmlType::F32, &first[..])
        .unwrap();
    w.add_tensor("second", [32u64, 2], GgmlType::Q8_0, &second[..])
        .unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), w.to_bytes().unwrap());
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.tensor("second").unwrap().data, &second[..]);
    assert_eq!(f.tensor("second").unwrap().row(1), &second[34..]);
}

#[test]
fn stream_writer_checks_order_and_sizes() {
    let d = scratch_dir("stream-checks");
    let p = d.join("s.gguf");
    let meta = Metadata::new();
    let mut s = GgufStreamWriter::create(&p, &meta, &stream_decls()).unwrap();
    let e = s.write_tensor_data("second", &[0; 4]).unwrap_err();
    assert!(
        matches!(&e, GgufError::UnexpectedTensor { expected: Some(x), got, .. } if x == "first" && got == "second"),
        "{e}"
    );
    s.write_tensor_data("first", &[0; 30]).unwrap();
    let e = s.write_tensor_data("first", &[0; 3]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::SizeMismatch {
                expected: 32,
                got: 33,
                ..
            }
        ),
        "{e}"
    );
    let e = s.write_tensor_data("second", &[0; 3]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::IncompleteTensor {
                written: 30,
                expected: 32,
                ..
            }
        ),
        "{e}"
    );
    s.write_tensor_data("first", &[0; 2]).unwrap();
    s.write_tensor_data("second", &[0; 68]).unwrap();
    let e = s.write_tensor_data("third", &[0; 1]).unwrap_err();
    assert!(
        matches!(e, GgufError::UnexpectedTensor { expected: None, .. }),
        "{e}"
    );
    s.finish().unwrap();
    assert!(GgufFile::open(&p).is_ok());

    let mut s = GgufStreamWriter::create(&p, &meta, &stream_decls()).unwrap();
    s.write_tensor_data("first", &[0; 32]).unwrap();
    let e = s.finish().unwrap_err();
    assert!(
        matches!(&e, GgufError::IncompleteTensor { tensor, written: 0, expected: 68, .. } if tensor == "second"),
        "{e}"
    );
    assert_eq!(dir_entries(&d), ["s.gguf"], "temp file removed on failure");
}

#[test]
fn stream_writer_dropped_unfinished_removes_temp_file() {
    let d = scratch_dir("stream-drop");
    let p = d.join("s.gguf");
    {
        let mut s = GgufStreamWriter::create(&p, &Metadata::new(), &stream_decls()).unwrap();
        s.write_tensor_data("first", &[1; 32]).unwrap();
        assert_eq!(dir_entries(&d).len(), 1);
    }
    assert!(dir_entries(&d).is_empty());
    let e = GgufStreamWriter::create(d.join("no-such-dir").join("x.gguf"), &Metadata::new(), &[])
        .err()
        .unwrap();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
}

#[test]
fn empty_file_with_no_tensors() {
    let w = GgufWriter::new();
    let bytes = w.to_bytes().unwrap();
    assert_eq!(bytes.len(), 32, "24-byte header padded to 32");
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(f.tensors().is_empty() && f.metadata().is_empty());
    // A header without the trailing padding is accepted too.
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()[..24].to_vec()).unwrap();
    assert_eq!(f.data_offset(), 32);
}

/// Reading a file into anonymous memory gives the same bytes and views as
/// mapping it; `open_auto` reads small files in and maps big ones; a missing
/// file is an error naming it.
#[test]
fn open_in_memory_equals_mapped() {
    let d = scratch_dir("in-memory");
    let p = d.join("m.gguf");
    sample_writer().write(&p).unwrap();
    let mapped = GgufFile::open(&p).unwrap();
    let inmem = GgufFile::open_in_memory(&p).unwrap();
    assert!(!mapped.is_in_memory() && inmem.is_in_memory());
    assert_eq!(mapped.bytes(), inmem.bytes());
    assert_eq!(inmem.tensor("b").unwrap().data, &[7u8; 68][..]);
    assert_eq!(inmem.path(), mapped.path());
    let len = std::fs::metadata(&p).unwrap().len();
    assert!(GgufFile::open_auto(&p, Some(2 * len))
        .unwrap()
        .is_in_memory());
    assert!(!GgufFile::open_auto(&p, Some(2 * len - 1))
        .unwrap()
        .is_in_memory());
    assert!(!GgufFile::open_auto(&p, None).unwrap().is_in_memory());
    let err = GgufFile::open_in_memory(d.join("missing.gguf")).unwrap_err();
    assert!(err.to_string().contains("missing.gguf"), "{err}");
}
