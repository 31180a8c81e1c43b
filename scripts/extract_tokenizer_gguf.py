#!/usr/bin/env python3
"""Extract a tokenizer-only GGUF (no tensors) from a full GGUF model.

Copies general.architecture and every `tokenizer.*` metadata key, keeping the
GGUF value types, into a new GGUF file with zero tensors. Used to make the
committed test fixture crates/tokenizer/tests/fixtures/qwen2-tokenizer.gguf
from the demo model (scripts/fetch-demo-model.sh).

Usage (from the repo root, with the venv that has `gguf` installed):
    .venv/bin/python scripts/extract_tokenizer_gguf.py \
        ~/.cache/redlite/demo-model.gguf \
        crates/tokenizer/tests/fixtures/qwen2-tokenizer.gguf
"""
import argparse
import os
import sys

import gguf  # pip install gguf (tested with 0.19.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="input GGUF model")
    ap.add_argument("dst", help="output tokenizer-only GGUF")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.src)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        print(f"error: {args.src} has no general.architecture", file=sys.stderr)
        return 1
    arch = arch_field.contents()

    tmp = args.dst + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch)  # writes general.architecture itself
    n = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if sub == gguf.GGUFValueType.ARRAY:
            print(f"error: nested array in {key} is not supported", file=sys.stderr)
            return 1
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
        n += 1
    if n == 0:
        print(f"error: no tokenizer.* keys in {args.src}", file=sys.stderr)
        return 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, args.dst)
    print(f"wrote {args.dst}: {n} tokenizer keys, arch {arch}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
