#!/usr/bin/env python3
"""GGUF round trips between redlite-gguf and llama.cpp's `gguf` package.

    gguf_roundtrip.py write OUT.gguf OUT.json
        Write a small GGUF file with the `gguf` package's GGUFWriter (every
        metadata value type, arrays of every type, string arrays, nested
        arrays, F32/F16/I32/BF16/Q8_0/Q4_K tensors, custom alignment 64) and a
        JSON description of what it contains. The Rust test
        `python_roundtrip::reads_file_written_by_gguf_package` reads the pair.

    gguf_roundtrip.py check FILE EXPECTED.json
        Read FILE with the `gguf` package's GGUFReader, describe it the same
        way, and compare with EXPECTED.json. Exit status 1 and a list of
        differences when they disagree. The Rust test
        `python_roundtrip::gguf_package_reads_file_we_write` runs this.

    gguf_roundtrip.py describe FILE
        Print the description of FILE.

JSON description:
    {"version": 3, "alignment": 64, "data_offset": ...,
     "metadata": [{"key": K, ...typed value...}, ...],          # file order
     "tensors": [{"name", "type", "dims" (ggml order, dims[0] = row length),
                  "offset" (relative to the data section), "n_bytes",
                  "data_hex"}, ...]}                            # file order
A typed value is {"type": "u8"|...|"f64"|"bool"|"string", "value": V} with
floats also given exactly as "bits" (the IEEE bit pattern as an integer;
"value" is left out when not finite), or {"type": "array", "elem_type": T,
"values": [typed values]}.

Regenerate the committed fixture from the repository root with
    .venv/bin/python scripts/gguf_roundtrip.py write \
        crates/gguf/tests/data/py_written.gguf crates/gguf/tests/data/py_written.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

TYPE_NAMES = {
    V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16",
    V.UINT32: "u32", V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool",
    V.STRING: "string", V.ARRAY: "array", V.UINT64: "u64", V.INT64: "i64",
    V.FLOAT64: "f64",
}
NP_TYPES = {
    V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16,
    V.UINT32: np.uint32, V.INT32: np.int32, V.FLOAT32: np.float32,
    V.UINT64: np.uint64, V.INT64: np.int64, V.FLOAT64: np.float64,
}


def scalar(vtype: V, x: Any) -> dict[str, Any]:
    """A typed JSON value for one scalar or string."""
    name = TYPE_NAMES[vtype]
    if vtype == V.STRING:
        s = x if isinstance(x, str) else bytes(x).decode("utf-8")
        return {"type": name, "value": s}
    if vtype == V.BOOL:
        return {"type": name, "value": bool(x)}
    if vtype in (V.FLOAT32, V.FLOAT64):
        arr = np.array([x], dtype=NP_TYPES[vtype])
        bits = arr.view(np.uint32 if vtype == V.FLOAT32 else np.uint64)[0]
        out: dict[str, Any] = {"type": name, "bits": int(bits)}
        if np.isfinite(arr[0]):
            out["value"] = float(arr[0])
        return out
    return {"type": name, "value": int(x)}


# ---------------------------------------------------------------- write ----

def typed_array(elem: V, values: list[Any]) -> dict[str, Any]:
    return {"type": "array", "elem_type": TYPE_NAMES[elem],
            "values": [scalar(elem, v) for v in values]}


def write(out_gguf: str, out_json: str) -> None:
    rng = np.random.default_rng(20240601)
    w = gguf.GGUFWriter(out_gguf, arch="roundtrip")
    w.add_custom_alignment(64)
    meta: list[dict[str, Any]] = [
        {"key": "general.architecture", **scalar(V.STRING, "roundtrip")},
        {"key": "general.alignment", **scalar(V.UINT32, 64)},
    ]

    scalars = [
        ("test.u8", V.UINT8, 255), ("test.i8", V.INT8, -128),
        ("test.u16", V.UINT16, 65535), ("test.i16", V.INT16, -32768),
        ("test.u32", V.UINT32, 4294967295), ("test.i32", V.INT32, -2147483648),
        ("test.f32", V.FLOAT32, 3.14159274), ("test.bool", V.BOOL, True),
        ("test.bool_false", V.BOOL, False),
        ("test.string", V.STRING, "Grüße, 世界! 🦀 \"quoted\"\n\ttab"),
        ("test.empty_string", V.STRING, ""),
        ("test.u64", V.UINT64, 18446744073709551615),
        ("test.i64", V.INT64, -9223372036854775808),
        ("test.f64", V.FLOAT64, -1.0e-300),
        ("test.f32_inf", V.FLOAT32, float("inf")),
        ("test.f64_nan", V.FLOAT64, float("nan")),
    ]
    for key, vt, val in scalars:
        # add_string skips empty strings; add_key_value writes them.
        w.add_key_value(key, val, vt)
        meta.append({"key": key, **scalar(vt, val)})

    arrays = [
        ("test.arr.u8", V.UINT8, [0, 1, 255]),
        ("test.arr.i8", V.INT8, [-128, 0, 127]),
        ("test.arr.u16", V.UINT16, [0, 65535]),
        ("test.arr.i16", V.INT16, [-32768, 32767]),
        ("test.arr.u32", V.UINT32, [0, 4294967295, 7]),
        ("test.arr.i32", V.INT32, [-1, 0, 2147483647]),
        ("test.arr.f32", V.FLOAT32, [0.5, -0.0, 1e-45, 3.4e38]),
        ("test.arr.bool", V.BOOL, [True, False, True]),
        ("tokenizer.ggml.tokens", V.STRING,
         ["<|endoftext|>", "Ġthe", "", "é", "日本", "\u0120\u010a"]),
        ("test.arr.u64", V.UINT64, [0, 18446744073709551615]),
        ("test.arr.i64", V.INT64, [-9223372036854775808, 9223372036854775807]),
        ("test.arr.f64", V.FLOAT64, [2.5, -1e300]),
    ]
    for key, vt, vals in arrays:
        w.add_key_value(key, vals, V.ARRAY, sub_type=vt)
        meta.append({"key": key, **typed_array(vt, vals)})

    # Nested arrays: the package infers inner element types from Python
    # values (int -> i32, float -> f32, str -> string, bytes -> u8, list ->
    # array).
    nested = [[1, -2, 3], ["x", "yz"], [1.5], b"\x01\x02\xff", [[True], [False, True]]]
    w.add_key_value("test.arr.nested", nested, V.ARRAY, sub_type=V.ARRAY)
    meta.append({"key": "test.arr.nested", "type": "array", "elem_type": "array", "values": [
        typed_array(V.INT32, [1, -2, 3]),
        typed_array(V.STRING, ["x", "yz"]),
        typed_array(V.FLOAT32, [1.5]),
        typed_array(V.UINT8, [1, 2, 255]),
        {"type": "array", "elem_type": "array", "values": [
            typed_array(V.BOOL, [True]), typed_array(V.BOOL, [False, True])]},
    ]})

    tensors: list[tuple[str, np.ndarray, Q | None]] = [
        ("blk.0.attn_norm.weight", rng.standard_normal(16).astype(np.float32), None),
        ("blk.0.ffn_up.weight", rng.standard_normal((3, 8)).astype(np.float32), None),
        ("blk.0.ffn_gate.weight", rng.standard_normal((5, 4)).astype(np.float16), None),
        ("token_types", rng.integers(-1000, 1000, size=(2, 3)).astype(np.int32), None),
        # Raw quantized bytes: (rows, bytes per row).
        ("blk.0.attn_q.weight", rng.integers(0, 256, size=(2, 2 * 34), dtype=np.uint8), Q.Q8_0),
        ("blk.0.ffn_down.weight", rng.integers(0, 256, size=(1, 144), dtype=np.uint8), Q.Q4_K),
        ("output_norm.bf16", rng.integers(0, 256, size=(2, 6), dtype=np.uint8), Q.BF16),
    ]
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    desc = describe(out_gguf)
    # What we meant to write must be what the package itself reads back.
    problems = compare({"metadata": meta}, {"metadata": desc["metadata"]})
    if problems:
        raise SystemExit("the gguf package does not read back what it wrote:\n" + "\n".join(problems))
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(desc, f, indent=1, ensure_ascii=False, allow_nan=False)
        f.write("\n")


# ----------------------------------------------------------- describe ----

def decode(parts: list[np.ndarray], i: int, vtype: V) -> tuple[dict[str, Any], int]:
    """Decode the value of type `vtype` whose first part is parts[i].

    GGUFReader keeps every field as a flat list of numpy parts and flattens
    nested arrays in `contents()`, so walk the parts ourselves to keep the
    nesting: a string is (length, bytes), an array is (elem type, count,
    elements...), a scalar is one part."""
    if vtype == V.STRING:
        return scalar(V.STRING, parts[i + 1].tobytes()), i + 2
    if vtype == V.ARRAY:
        elem = V(int(parts[i][0]))
        count = int(parts[i + 1][0])
        i += 2
        values = []
        for _ in range(count):
            v, i = decode(parts, i, elem)
            values.append(v)
        return {"type": "array", "elem_type": TYPE_NAMES[elem], "values": values}, i
    return scalar(vtype, parts[i][0]), i + 1


def describe(path: str) -> dict[str, Any]:
    r = gguf.GGUFReader(path)
    meta = []
    version = None
    for key, field in r.fields.items():
        if key == "GGUF.version":
            version = int(field.parts[0][0])
        if key.startswith("GGUF."):
            continue
        # parts: key length, key bytes, value type, then the value's parts.
        vtype = V(int(field.parts[2][0]))
        value, end = decode(field.parts, 3, vtype)
        assert end == len(field.parts), key
        meta.append({"key": key, **value})
    tensors = []
    for t in r.tensors:
        data = np.ascontiguousarray(t.data).tobytes()
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset) - int(r.data_offset),
            "n_bytes": int(t.n_bytes),
            "data_hex": data.hex(),
        })
        assert len(data) == t.n_bytes, t.name
    return {"version": version, "alignment": int(r.alignment),
            "data_offset": int(r.data_offset), "metadata": meta, "tensors": tensors}


def compare(want: Any, got: Any, where: str = "") -> list[str]:
    """Differences between two descriptions, as readable lines."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{where}.{k}: missing")
            elif k not in want:
                out.append(f"{where}.{k}: unexpected {got[k]!r:.80}")
            else:
                out += compare(want[k], got[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        out = []
        if len(want) != len(got):
            out.append(f"{where}: length {len(got)}, expected {len(want)}")
        for i, (a, b) in enumerate(zip(want, got)):
            label = a.get("key", a.get("name", i)) if isinstance(a, dict) else i
            out += compare(a, b, f"{where}[{label}]")
        return out
    if want != got or type(want) is not type(got):
        return [f"{where}: got {got!r:.80}, expected {want!r:.80}"]
    return []


def package_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # not installed as a distribution
        return "?"


def check(path: str, expected_json: str) -> int:
    with open(expected_json, encoding="utf-8") as f:
        want = json.load(f)
    got = describe(path)
    problems = compare(want, got)
    if problems:
        print(f"{path} does not match {expected_json}:", file=sys.stderr)
        for p in problems[:50]:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"ok: gguf {package_version()} reads {path} as described "
          f"({len(got['metadata'])} keys, {len(got['tensors'])} tensors)")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "write":
        write(argv[2], argv[3])
        return 0
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "describe":
        json.dump(describe(argv[2]), sys.stdout, indent=1, ensure_ascii=False)
        print()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
