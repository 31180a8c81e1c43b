//! Just enough of NumPy's `.npy` and `.npz` (stored zip) to read fixtures.
#![allow(dead_code)]

use std::collections::HashMap;

/// An array: shape and values as f32 (from `<f4` or `<i4`).
#[derive(Clone, Debug)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Parse one `.npy` at the start of `b`; returns the array and bytes used.
pub fn parse_npy(b: &[u8]) -> (Array, usize) {
    assert_eq!(&b[..6], b"\x93NUMPY", "not an npy");
    let major = b[6];
    let (hlen, hstart) = if major == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[hstart..hstart + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let descr = header
        .split("'descr':")
        .nth(1)
        .unwrap()
        .split('\'')
        .nth(1)
        .unwrap();
    let shape_s = header.split("'shape':").nth(1).unwrap();
    let shape_s = &shape_s[shape_s.find('(').unwrap() + 1..shape_s.find(')').unwrap()];
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let n: usize = shape.iter().product();
    let d = hstart + hlen;
    let data: Vec<f32> = match descr {
        "<f4" => b[d..d + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "<i4" => b[d..d + 4 * n]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        "<i8" => b[d..d + 8 * n]
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        other => panic!("npy dtype {other} not handled"),
    };
    let size = if descr == "<i8" { 8 } else { 4 };
    (Array { shape, data }, d + size * n)
}

pub fn read_npy(path: &std::path::Path) -> Array {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_npy(&b).0
}

/// Members of an `.npz` written by `np.savez` (stored, not compressed),
/// keyed without the `.npy` suffix.
pub fn read_npz(path: &std::path::Path) -> HashMap<String, Array> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = HashMap::new();
    let mut p = 0;
    while p + 30 <= b.len() && b[p..p + 4] == [0x50, 0x4b, 0x03, 0x04] {
        let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
        assert_eq!(u16at(p + 8), 0, "npz member is compressed");
        let (nlen, xlen) = (u16at(p + 26), u16at(p + 28));
        let name = String::from_utf8(b[p + 30..p + 30 + nlen].to_vec()).unwrap();
        let start = p + 30 + nlen + xlen;
        let (arr, used) = parse_npy(&b[start..]);
        out.insert(name.trim_end_matches(".npy").to_string(), arr);
        // Next local header (skipping an optional data descriptor).
        let mut q = start + used;
        while q + 4 <= b.len()
            && b[q..q + 4] != [0x50, 0x4b, 0x03, 0x04]
            && b[q..q + 4] != [0x50, 0x4b, 0x01, 0x02]
        {
            q += 1;
        }
        p = q;
    }
    out
}
