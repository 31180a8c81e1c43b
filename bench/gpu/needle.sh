#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: bench/needle.sh with DEVICE=cuda (Red Lite
# --device cuda, llama.cpp -ngl 99) on the demo model.
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                copy (or strip + gzip) target/release/redlite into .bench-bin/
#                bench/gpu/prepare_llama_src.sh   (-> .llama-cuda-src)
# The demo model (491 MB) must already be on that machine, at $MODEL
# (default /dev/shm/redlite-bench/demo.gguf): it is larger than what one
# device call carries; bench/README.md ("GPU") says how to ship it in
# pieces to a warm machine and check its sha256.
# Then:  run(command="bash bench/gpu/needle.sh 8192 16384 30000",
#            carry=[".bench-bin", ".llama-cuda-src"])
#
# Builds llama-completion with CUDA into /dev/shm/redlite-bench/llama-build
# (the folder the other bench/gpu scripts use) unless it is there, then runs
# bench/needle.sh on the lengths given (default 8192 16384 30000); DEPTHS,
# N_GEN, TIMEOUT pass through. Progress and the table go to $OUT/needle.md,
# the prompts and raw logs to $OUT/needle-logs.tgz.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LB="$WORK/llama-build/bin"
MODEL="${MODEL:-$WORK/demo.gguf}"
[[ -f $MODEL ]] || { echo "needle: no demo model at $MODEL (ship it in pieces as bench/README.md says, or set MODEL=...)" >&2; exit 2; }
if [[ ! -x $LB/llama-completion ]]; then
  [[ -f .llama-cuda-src/CMakeLists.txt ]] \
    || { echo "needle: no llama.cpp source (bench/gpu/prepare_llama_src.sh, carry .llama-cuda-src)" >&2; exit 2; }
  echo "== building llama-completion (CUDA) in $WORK/llama-build"
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake -S .llama-cuda-src -B "$WORK/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    >"$OUT/needle-cmake.log" 2>&1
  cmake --build "$WORK/llama-build" --target llama-completion -j "$(nproc)" >"$OUT/needle-build.log" 2>&1 \
    || { echo "needle: llama.cpp build failed:" >&2; tail -30 "$OUT/needle-build.log" >&2; exit 2; }
fi
[[ $# -gt 0 ]] || set -- 8192 16384 30000
rm -rf "$WORK/needle-logs"
rc=0
DEVICE=cuda MODEL="$MODEL" REDLITE="$R" LOG_DIR="$WORK/needle-logs" \
  bash bench/needle.sh "$LB" "$@" 2>&1 | tee "$OUT/needle.md" || rc=$?
# $OUT brings back a few files only: the logs travel as one archive.
tar -czf "$OUT/needle-logs.tgz" -C "$WORK" needle-logs
exit "$rc"
