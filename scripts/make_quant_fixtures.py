#!/usr/bin/env python3
"""Make block-format fixtures for crates/quant from the `gguf` package.

For every requested type this writes, under crates/quant/tests/fixtures/:

  <TYPE>.bin   random valid blocks (raw bytes; scale fields are finite,
               moderate f16 values so nothing dequantizes to NaN/Inf)
  <TYPE>.f32   gguf.quants.dequantize of those bytes (little-endian f32)

For the types the gguf package can quantize (``--quant-types``) it also
writes

  <TYPE>.qin.f32   random f32 input (varied block scales, ties, zero block)
  <TYPE>.qout.bin  gguf.quants.quantize of that input

and with ``--dequant-dir DIR`` it dequantizes every ``DIR/<TYPE>.bin`` made
by our own quantizers into ``DIR/<TYPE>.f32`` (see tests/quantize.rs).

Usage (from the repository root):
  .venv/bin/python scripts/make_quant_fixtures.py               # all types
  .venv/bin/python scripts/make_quant_fixtures.py Q4_K Q6_K     # some types
  .venv/bin/python scripts/make_quant_fixtures.py --quant-types Q8_0 --no-dequant
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf import quants

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "quant" / "tests" / "fixtures"

N_BLOCKS = 16
FLOAT_ELEMS = 256  # elements written for the 1-element "block" types

# Byte offsets of the f16 scale fields inside one block, for the types whose
# random bytes would otherwise dequantize to NaN/Inf or absurd magnitudes.
F16_FIELDS: dict[str, list[int]] = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ1_S": [0], "IQ4_NL": [0], "IQ4_XS": [0],
    "TQ1_0": [52], "TQ2_0": [64],
}

DEFAULT_QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def dequantizable_types() -> list[str]:
    names = ["F32", "F16", "BF16"]
    names += [t.name for t in quants._type_traits if t.name not in names]
    return names


def rng_for(name: str, salt: str = "") -> np.random.Generator:
    return np.random.default_rng(zlib.crc32((name + salt).encode()))


def moderate_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 values of magnitude 2^-8 .. 1 with random sign."""
    mag = 2.0 ** rng.uniform(-8, 0, size=n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (sign * mag).astype(np.float16)


def random_blocks(name: str) -> np.ndarray:
    rng = rng_for(name)
    qtype = T[name]
    if name == "F32":
        return (rng.standard_normal(FLOAT_ELEMS).astype(np.float32)
                * np.float32(3.0)).view(np.uint8)
    if name == "F16":
        v = rng.standard_normal(FLOAT_ELEMS) * 100.0
        v[:4] = [6.0e-8, -3.0e-6, 65504.0, 0.0]  # subnormal, largest, zero
        return v.astype(np.float16).view(np.uint8)
    if name == "BF16":
        v = (rng.standard_normal(FLOAT_ELEMS) * 10.0).astype(np.float32)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)

    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
    for i in range(N_BLOCKS):
        for _attempt in range(100):
            set_scales(name, blocks[i], rng, subnormal=(i == 1))
            y = quants.dequantize(blocks[i:i + 1].copy(), qtype)
            if np.all(np.isfinite(y)):
                break
            blocks[i] = rng.integers(0, 256, size=type_size, dtype=np.uint8)
        else:
            raise RuntimeError(f"{name}: could not make a finite block")
    return blocks.reshape(-1)


def set_scales(name: str, block: np.ndarray, rng: np.random.Generator, subnormal: bool) -> None:
    if name in F16_FIELDS:
        offs = F16_FIELDS[name]
        vals = moderate_f16(rng, len(offs))
        if subnormal:
            vals[0] = np.float16(3.0e-6)  # exercise f16 subnormal decoding
        raw = vals.view(np.uint8)
        for k, o in enumerate(offs):
            block[o:o + 2] = raw[2 * k:2 * k + 2]
    elif name == "IQ1_M":
        # The f16 scale is split over the top nibbles of the four u16 scale words.
        h = int(moderate_f16(rng, 1).view(np.uint16)[0])
        base = GGML_QUANT_SIZES[T.IQ1_M][1] - 8
        for k in range(4):
            w = int(block[base + 2 * k]) | (int(block[base + 2 * k + 1]) << 8)
            w = (w & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
            block[base + 2 * k] = w & 0xFF
            block[base + 2 * k + 1] = w >> 8
    elif name == "MXFP4":
        block[0] = rng.integers(118, 134)  # E8M0 exponent near 2^0


def quant_input(name: str) -> np.ndarray:
    rng = rng_for(name, "quant")
    block_size = GGML_QUANT_SIZES[T[name]][0]
    nb = N_BLOCKS
    x = rng.standard_normal((nb, block_size)).astype(np.float32)
    x *= (2.0 ** rng.uniform(-6, 4, size=(nb, 1))).astype(np.float32)
    x[0] = 0.0  # all-zero block
    x[1] = np.abs(x[1])  # all positive
    x[2] = -np.abs(x[2])  # all negative
    x[3, :] = 0.01  # constant
    # Ties: with amax 127 (Q8_0) the scale is exactly 1, so these hit .5.
    x[4] = (np.arange(block_size) % 20 - 10 + 0.5).astype(np.float32)
    x[4, 0] = 127.0
    x[5] = rng.integers(-8, 8, size=block_size).astype(np.float32)  # Q4 grid
    x[5, 3] = -8.0
    x[6, 7] = 1000.0 * (abs(x[6]).max() + 1)  # outlier
    return x.reshape(-1)


def write(path: pathlib.Path, data: np.ndarray) -> None:
    path.write_bytes(np.ascontiguousarray(data).tobytes())
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("types", nargs="*", help="gguf type names (default: every type gguf can dequantize)")
    ap.add_argument("--quant-types", nargs="*", default=None,
                    help=f"types to make quantize fixtures for (default when no types given: {' '.join(DEFAULT_QUANT_TYPES)})")
    ap.add_argument("--no-dequant", action="store_true", help="skip the dequantization fixtures")
    ap.add_argument("--dequant-dir", type=pathlib.Path,
                    help="dequantize every <TYPE>.bin in this folder into <TYPE>.f32 and stop")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args()
    from importlib.metadata import version
    print(f"gguf {version('gguf')}, numpy {np.__version__}")

    if args.dequant_dir is not None:
        for p in sorted(args.dequant_dir.resolve().glob("*.bin")):
            raw = np.fromfile(p, dtype=np.uint8)
            write(p.with_suffix(".f32"), quants.dequantize(raw, T[p.stem]).astype("<f4"))
        return 0

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    types = args.types or dequantizable_types()
    if not args.no_dequant:
        for name in types:
            if name not in T.__members__:
                print(f"unknown type {name}", file=sys.stderr)
                return 1
            raw = random_blocks(name)
            y = quants.dequantize(raw.copy(), T[name]).astype("<f4").reshape(-1)
            assert np.all(np.isfinite(y)), name
            write(args.out / f"{name}.bin", raw)
            write(args.out / f"{name}.f32", y)

    qtypes = args.quant_types
    if qtypes is None:
        qtypes = DEFAULT_QUANT_TYPES if not args.types else [t for t in args.types if t in DEFAULT_QUANT_TYPES]
    for name in qtypes:
        x = quant_input(name)
        q = quants.quantize(x.reshape(-1, GGML_QUANT_SIZES[T[name]][0] * N_BLOCKS), T[name])
        write(args.out / f"{name}.qin.f32", x.astype("<f4"))
        write(args.out / f"{name}.qout.bin", q.view(np.uint8).reshape(-1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
