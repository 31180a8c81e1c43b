#!/usr/bin/env python3
"""Extra fixtures for the i-quant / MXFP4 tests, from the `gguf` package.

Writes crates/quant/tests/fixtures/iq/MXFP4.qin.f32 (random f32 input,
little-endian) and MXFP4.qout.bin (gguf.quants.quantize of it): 1024 blocks
with block magnitudes over 2^-20 .. 2^20, exact ties between neighbouring
codes, exact powers of two, zero and constant blocks. (The dequantization
fixtures of these types come from scripts/make_quant_fixtures.py.)

Usage (from the repository root):
    .venv/bin/python scripts/make_iq_fixtures.py
"""
from __future__ import annotations

import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "quant" / "tests" / "fixtures" / "iq"


def mxfp4_input(rng: np.random.Generator, nb: int) -> np.ndarray:
    x = rng.standard_normal((nb, 32)).astype(np.float32)
    x *= (2.0 ** rng.uniform(-20, 20, size=(nb, 1))).astype(np.float32)
    kv = np.array(quants.MXFP4.kvalues[:8], dtype=np.float32)  # 0..12 (doubled e2m1)
    for i in range(0, nb, 8):
        # Ties: midpoints between neighbouring codes at the block's scale.
        e = int(rng.integers(110, 140))
        d = np.float32(2.0 ** (e - 128))
        k = rng.integers(0, 7, size=32)
        sign = np.where(rng.random(32) < 0.5, -1, 1).astype(np.float32)
        x[i] = sign * d * (kv[k] + kv[k + 1]) / np.float32(2)
        x[i, 0] = d * np.float32(12.0)  # fixes the block exponent at e
    x[1] = 0.0
    x[2] = np.float32(0.375)
    x[3] = (2.0 ** rng.integers(-10, 10, size=32)).astype(np.float32)
    x[5, 7] = np.float32(4.0)  # a power-of-two maximum
    return x.reshape(-1)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261130)
    x = mxfp4_input(rng, 1024)
    q = quants.quantize(x.reshape(1, -1), T.MXFP4).reshape(-1)
    (OUT / "MXFP4.qin.f32").write_bytes(x.astype("<f4").tobytes())
    (OUT / "MXFP4.qout.bin").write_bytes(q.tobytes())
    print(f"wrote {OUT.relative_to(ROOT)}/MXFP4.qin.f32, MXFP4.qout.bin ({q.size} bytes)")


if __name__ == "__main__":
    main()
