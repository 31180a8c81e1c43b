//! Round trips with llama.cpp's `gguf` Python package, both ways.
//!
//! `tests/data/py_written.gguf` was written by the package through
//! `scripts/gguf_roundtrip.py write`, which also wrote
//! `tests/data/py_written.json`, a description of the file as the package
//! reads it back. We read the file and compare against the description;
//! then we write a file from the description and have the package check it
//! (`scripts/gguf_roundtrip.py check`).
//!
//! The interpreter comes from `REDLITE_PYTHON`, else `.venv/bin/python` at
//! the workspace root. Without one the Python half is skipped loudly, unless
//! `CI` is set, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use redlite_gguf::{
    GgmlType, GgufFile, GgufStreamWriter, GgufWriter, MetadataArray, MetadataValue, TensorDecl,
    ValueType,
};
use serde_json::Value;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn description() -> Value {
    let text = std::fs::read_to_string(data_dir().join("py_written.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn value_type(name: &str) -> ValueType {
    (0..=12)
        .filter_map(ValueType::from_id)
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}

/// A typed JSON value (see the script's docstring) as a metadata value.
fn from_json(j: &Value) -> MetadataValue {
    let ty = j["type"].as_str().unwrap();
    let int = || {
        j["value"]
            .as_i64()
            .map(i128::from)
            .or(j["value"].as_u64().map(i128::from))
            .unwrap()
    };
    let bits = || j["bits"].as_u64().unwrap();
    match ty {
        "u8" => MetadataValue::U8(int() as u8),
        "i8" => MetadataValue::I8(int() as i8),
        "u16" => MetadataValue::U16(int() as u16),
        "i16" => MetadataValue::I16(int() as i16),
        "u32" => MetadataValue::U32(int() as u32),
        "i32" => MetadataValue::I32(int() as i32),
        "u64" => MetadataValue::U64(int() as u64),
        "i64" => MetadataValue::I64(int() as i64),
        "f32" => MetadataValue::F32(f32::from_bits(bits() as u32)),
        "f64" => MetadataValue::F64(f64::from_bits(bits())),
        "bool" => MetadataValue::Bool(j["value"].as_bool().unwrap()),
        "string" => MetadataValue::String(j["value"].as_str().unwrap().to_string()),
        "array" => MetadataValue::Array(MetadataArray::new(
            value_type(j["elem_type"].as_str().unwrap()),
            j["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(from_json)
                .collect(),
        )),
        other => panic!("unknown type {other}"),
    }
}

/// Equality that compares floats by bit pattern (NaN equals itself).
fn same(a: &MetadataValue, b: &MetadataValue) -> bool {
    use MetadataValue as M;
    match (a, b) {
        (M::F32(x), M::F32(y)) => x.to_bits() == y.to_bits(),
        (M::F64(x), M::F64(y)) => x.to_bits() == y.to_bits(),
        (M::Array(x), M::Array(y)) => {
            x.elem_type == y.elem_type
                && x.values.len() == y.values.len()
                && x.values
                    .iter()
                    .zip(&y.values)
                    .all(|(p, q)| same(&p.to_value(), &q.to_value()))
        }
        _ => a == b,
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

struct Tensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    offset: u64,
    bytes: Vec<u8>,
}

fn tensors(d: &Value) -> Vec<Tensor> {
    d["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Tensor {
            name: t["name"].as_str().unwrap().to_string(),
            ty: GgmlType::from_name(t["type"].as_str().unwrap()).unwrap(),
            dims: t["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect(),
            offset: t["offset"].as_u64().unwrap(),
            bytes: unhex(t["data_hex"].as_str().unwrap()),
        })
        .collect()
}

#[test]
fn reads_file_written_by_gguf_package() {
    let d = description();
    let f = GgufFile::open(data_dir().join("py_written.gguf")).unwrap();
    assert_eq!(u64::from(f.version()), d["version"].as_u64().unwrap());
    assert_eq!(f.alignment(), d["alignment"].as_u64().unwrap());
    assert_eq!(f.alignment(), 64, "the fixture uses a custom alignment");
    assert_eq!(f.data_offset(), d["data_offset"].as_u64().unwrap());

    let want = d["metadata"].as_array().unwrap();
    assert_eq!(f.metadata().len(), want.len());
    for ((key, got), w) in f.metadata().iter().zip(want) {
        assert_eq!(key, w["key"].as_str().unwrap());
        let expected = from_json(w);
        assert!(
            same(got, &expected),
            "{key}: got {got:?}, expected {expected:?}"
        );
    }
    // Spot checks through the getters.
    let m = f.metadata();
    assert_eq!(m.architecture().unwrap(), "roundtrip");
    assert_eq!(m.get_u64("test.u64").unwrap(), u64::MAX);
    assert_eq!(m.get_i64("test.i64").unwrap(), i64::MIN);
    assert_eq!(m.get_str("test.empty_string").unwrap(), "");
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap()[4], "日本");
    assert!(m.get_f64("test.f64_nan").unwrap().is_nan());
    let nested = m.get_array("test.arr.nested").unwrap();
    assert_eq!(nested.elem_type, ValueType::Array);
    assert_eq!(nested.values.len(), 5);

    let want = tensors(&d);
    assert_eq!(f.tensors().len(), want.len());
    let mut types = Vec::new();
    for (t, w) in f.tensors().iter().zip(&want) {
        assert_eq!(t.name, w.name);
        assert_eq!(t.ty, w.ty, "{}", t.name);
        assert_eq!(t.dims, w.dims, "{}", t.name);
        assert_eq!(t.offset, w.offset, "{}", t.name);
        assert_eq!(t.n_bytes, w.bytes.len() as u64, "{}", t.name);
        assert_eq!(f.tensor(&t.name).unwrap().data, &w.bytes[..], "{}", t.name);
        types.push(t.ty);
    }
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K] {
        assert!(types.contains(&ty), "fixture should hold a {ty} tensor");
    }
    let up = f.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!(up.info.dims, [8, 3], "ggml order: row length first");
    assert_eq!(up.as_f32().unwrap().len(), 24);
}

/// Our writer, fed the description, in memory and streamed.
fn write_from_description(d: &Value) -> (GgufWriter<'static>, Vec<TensorDecl>, Vec<Tensor>) {
    let mut w = GgufWriter::new();
    for kv in d["metadata"].as_array().unwrap() {
        w.add_kv(kv["key"].as_str().unwrap(), from_json(kv));
    }
    let ts = tensors(d);
    let mut decls = Vec::new();
    for t in &ts {
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, t.bytes.clone())
            .unwrap();
        decls.push(TensorDecl::new(t.name.clone(), t.dims.clone(), t.ty));
    }
    (w, decls, ts)
}

fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REDLITE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = workspace_root().join(".venv/bin/python");
    venv.exists().then_some(venv)
}

#[test]
fn gguf_package_reads_file_we_write() {
    let d = description();
    let (w, decls, ts) = write_from_description(&d);
    let dir = std::env::temp_dir().join(format!("redlite-gguf-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("ours.gguf");
    w.write(&ours).unwrap();

    // Same layout as the package's writer, byte for byte.
    let theirs = std::fs::read(data_dir().join("py_written.gguf")).unwrap();
    assert!(
        std::fs::read(&ours).unwrap() == theirs,
        "our bytes differ from the gguf package's"
    );

    // The stream writer, fed in odd-sized chunks, writes the same bytes.
    let streamed = dir.join("streamed.gguf");
    let mut s = GgufStreamWriter::create(&streamed, w.metadata(), &decls).unwrap();
    for t in &ts {
        for chunk in t.bytes.chunks(13) {
            s.write_tensor_data(&t.name, chunk).unwrap();
        }
    }
    s.finish().unwrap();
    assert!(std::fs::read(&streamed).unwrap() == theirs);

    let Some(py) = python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but no Python with the gguf package was found: set REDLITE_PYTHON or create .venv"
        );
        eprintln!(
            "\n!!!!!!!!!! SKIPPED: gguf_package_reads_file_we_write found no Python !!!!!!!!!!"
        );
        eprintln!("!!!!!!!!!! set REDLITE_PYTHON or create .venv with `pip install gguf==0.19.0` !!!!!!!!!!\n");
        return;
    };
    let script = workspace_root().join("scripts/gguf_roundtrip.py");
    let expected = data_dir().join("py_written.json");
    let out = Command::new(&py)
        .arg(&script)
        .arg("check")
        .arg(&ours)
        .arg(&expected)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", py.display()));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the gguf package does not read our file as described:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stdout));
}
