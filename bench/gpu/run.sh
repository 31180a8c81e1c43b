#!/usr/bin/env bash
# Runs ON THE GPU MACHINE, self-contained: build llama.cpp with CUDA, write a
# full-size synthetic Qwen3-Next-80B-A3B file with `redlite synth`, check that
# llama.cpp generates from it, run bench/compare.sh (MODE=gpu) and print the
# table last. Logs go to $OUT (or bench/gpu/out).
#
# Prepare here first:  cargo build --release [--features cuda]
#                      bench/gpu/prepare_llama_src.sh
# Then:  run(command="bash bench/gpu/run.sh", carry=[".llama-cuda-src", ".bench-bin"], timeout_s=600)
#
# Each device command is limited to 10 minutes. Work is cached under
# /dev/shm/redlite-bench (llama.cpp build, synthetic file), so if the first
# call runs out of time, a second call on the still-warm machine continues.
#
# Environment: LAYOUT=iq2|cf2|q4km (default iq2), SEED=0, RUNS=3,
# REDLITE_ARGS (e.g. a device flag), LLAMA_ARGS, N_GEN, N_PROMPT,
# LLAMA_SRC (default .llama-cuda-src), REDLITE (default .bench-bin/redlite).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/bench/gpu/out}"
mkdir -p "$OUT"
LAYOUT="${LAYOUT:-iq2}"
SEED="${SEED:-0}"
LLAMA_SRC="${LLAMA_SRC:-$ROOT/.llama-cuda-src}"
REDLITE="${REDLITE:-$ROOT/.bench-bin/redlite}"
[[ -x $REDLITE ]] || REDLITE="$ROOT/target/release/redlite"
WORK=/dev/shm/redlite-bench
mkdir -p "$WORK"
NPROC=$(nproc)
exec > >(tee -a "$OUT/run.log") 2>&1

echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cpus $NPROC; redlite $REDLITE; llama src $LLAMA_SRC; layout $LAYOUT seed $SEED"
[[ -x $REDLITE ]] || { echo "no redlite binary (carry .bench-bin)"; exit 2; }
[[ -f $LLAMA_SRC/CMakeLists.txt ]] || { echo "no llama.cpp source (bench/gpu/prepare_llama_src.sh, carry .llama-cuda-src)"; exit 2; }

MODEL="$WORK/synth-$LAYOUT-s$SEED.gguf"
synth() {
  if [[ -f $MODEL ]]; then echo "cached $MODEL"; return; fi
  "$REDLITE" synth --layout "$LAYOUT" --seed "$SEED" --out "$MODEL" --threads "$NPROC" --quiet
}
build_llama() {
  local B="$WORK/llama-build"
  if [[ -x $B/bin/llama-bench && -x $B/bin/llama-completion ]]; then echo "cached $B"; return; fi
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake -S "$LLAMA_SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$OUT/cmake.log" 2>&1
  cmake --build "$B" --target llama-bench llama-completion -j "$NPROC" >"$OUT/build.log" 2>&1
}

echo "== synth file and llama.cpp build (in parallel)"
t0=$(date +%s)
synth >"$OUT/synth.log" 2>&1 &
SYNTH_PID=$!
build_llama || { echo "llama.cpp build failed:"; tail -30 "$OUT/build.log"; exit 1; }
wait "$SYNTH_PID" || { echo "synth failed:"; cat "$OUT/synth.log"; exit 1; }
cat "$OUT/synth.log"
echo "ready after $(( $(date +%s) - t0 )) s"
ls -la "$MODEL"

echo "== llama.cpp generates from the synthetic file"
"$WORK/llama-build/bin/llama-completion" -m "$MODEL" -p "The capital of France is" -n 8 \
  -no-cnv --temp 0 -ngl 99 --no-warmup >"$OUT/completion.out" 2>"$OUT/completion.err" \
  || { echo "llama-completion failed:"; tail -20 "$OUT/completion.err"; }
cat "$OUT/completion.out"; echo
grep -iE "nan|error" "$OUT/completion.err" | head -5 || true

echo "== benchmark"
MODE=gpu REDLITE="$REDLITE" LOG_DIR="$OUT/compare" THREADS="$NPROC" \
  bash bench/compare.sh "$MODEL" "$WORK/llama-build/bin" | tee "$OUT/table.md"
