//! Fuzz the GGUF parser: any bytes must give `Ok` or a typed error, never a
//! panic, an out-of-bounds read or a huge allocation. Files that parse are
//! also walked (every view, row and getter) and written back out: writing
//! what we read and reading it again must reproduce the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use redlite_gguf::{GgufFile, GgufWriter, MAX_TENSOR_NAME};

fn rewrite(f: &GgufFile) -> Option<Vec<u8>> {
    if f.tensors().iter().any(|t| t.name.len() > MAX_TENSOR_NAME) {
        return None; // the writer refuses names llama.cpp cannot load
    }
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add_kv(k, v.clone());
    }
    for t in f.tensors() {
        let view = f.tensor(&t.name).expect("listed tensor has a view");
        w.add_tensor(t.name.clone(), t.dims.clone(), t.ty, view.data)
            .expect("a tensor we read is one we can write");
    }
    Some(w.to_bytes().expect("metadata we read is metadata we can write"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let m = f.metadata();
    for (k, _) in m.iter() {
        let _ = m.get_u64(k);
        let _ = m.get_f32(k);
        let _ = m.get_str_array(k);
        let _ = m.get_i32_array(k);
    }
    for (i, t) in f.tensors().iter().enumerate() {
        let v = f.tensor_at(i).expect("every listed tensor has a view");
        assert_eq!(v.data.len() as u64, t.n_bytes);
        assert_eq!(t.n_rows() * t.row_bytes() as u64, t.n_bytes);
        let _ = v.as_f32();
        let last = t.n_rows() as usize - 1;
        assert_eq!(v.get_row(last).map(<[u8]>::len), Some(t.row_bytes()));
        assert!(v.get_row(last + 1).is_none());
    }
    if let Some(bytes1) = rewrite(&f) {
        let f2 = GgufFile::from_bytes(bytes1.clone()).expect("our own output parses");
        assert_eq!(f2.tensors().len(), f.tensors().len());
        for t in f.tensors() {
            assert_eq!(f2.tensor(&t.name).unwrap().data, f.tensor(&t.name).unwrap().data);
        }
        let bytes2 = rewrite(&f2).expect("second rewrite");
        assert_eq!(bytes1, bytes2, "write(read(x)) is not stable");
    }
});
