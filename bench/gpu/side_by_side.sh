#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: Red Lite's CUDA decoder and llama.cpp's CUDA build
# side by side on the synth files, in as few calls as the 10-minute limit
# allows (the llama.cpp build and the synth files are cached in /dev/shm, so
# a second call on the still-warm machine continues).
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                strip + gzip target/release/redlite into .bench-bin/redlite.gz
#                bench/gpu/prepare_llama_src.sh   (-> .llama-cuda-src)
# Then:  run(command="STEPS='build budgets' bash bench/gpu/side_by_side.sh",
#            carry=[".bench-bin", ".llama-cuda-src"])
#
# Steps (STEPS, in the order given):
#   build     llama.cpp (CUDA, sm_90) in the background; later steps wait
#   selftest  redlite selftest (every kernel, float64 references)
#   budgets   iq2 file: Red Lite at device budgets BUDGETS (bench model
#             --memory) and llama.cpp with the experts of NCMOE layers on
#             the CPU (llama-bench -ncmoe, 16 threads), ROUNDS rounds, each
#             engine -r REPS per invocation, alternating; the device memory
#             each invocation used (peak nvidia-smi memory.used less the
#             idle reading) is printed beside it
#   depths    for each layout in LAYOUTS: decode tg64 at DEPTHS, all
#             weights on the device, both engines, alternating per round
# Everything is logged to $OUT/side.log; result lines start with "RESULT".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LB="$WORK/llama-build/bin"
NPROC=$(nproc)
exec > >(tee -a "$OUT/side.log") 2>&1

wait_build() {
  while [[ ! -x $LB/llama-bench ]]; do
    if [[ -f $WORK/build.done ]]; then echo "llama.cpp build failed:"; tail -20 "$WORK/build.log"; return 1; fi
    sleep 5
  done
}
# Peak device memory (MiB) above the idle reading while "$@" runs.
IDLE_MIB=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
with_mem() {
  local f="$WORK/mem.$$"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$f" 2>/dev/null &
  local pid=$!
  "$@"; local rc=$?
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  PEAK_MIB=$(( $(sort -n "$f" | tail -1) - IDLE_MIB )); rm -f "$f"
  return $rc
}
redlite_tg() { # file depths reps args... -> prints bench model's table rows
  local m=$1 d=$2 r=$3; shift 3
  timeout 400 "$R" bench model -m "$m" --device cuda --depth-fill skip -p 0 -n 64 -d "$d" -r "$r" "$@" 2>"$WORK/rl.err" | grep "^| qwen"
  grep -E "memory plan|run [0-9]/" "$WORK/rl.err" | sed 's/^/    /'
}
llama_tg() { # file depths reps args...
  local m=$1 d=$2 r=$3; shift 3
  timeout 400 "$LB/llama-bench" -m "$m" -p 0 -n 64 -d "$d" -r "$r" -t "$NPROC" "$@" 2>"$WORK/ll.err" | grep -E "^\| .*tg64"
}

for s in ${STEPS:-build selftest budgets depths}; do
  case $s in
    build)
      if [[ ! -x $LB/llama-bench ]]; then
        rm -f "$WORK/build.done"
        ( export PATH="/usr/local/cuda/bin:$PATH"
          cmake -S .llama-cuda-src -B "$WORK/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
          && cmake --build "$WORK/llama-build" --target llama-bench -j "$NPROC"
          touch "$WORK/build.done" ) >"$WORK/build.log" 2>&1 &
        echo "== llama.cpp build started in the background"
      fi ;;
    selftest) echo "== selftest (rows that are not ok)"; timeout 300 "$R" selftest | grep -v "| ok |" ;;
    budgets)
      M=$(synth_file iq2)
      wait_build || exit 1
      for round in $(seq "${ROUNDS:-1}"); do
        for b in ${BUDGETS:-full 16G 8G 4G}; do
          a=(); [[ $b == full ]] || a=(--memory "$b")
          echo "== round $round: Red Lite, device budget $b"
          with_mem redlite_tg "$M" 0 "${REPS:-3}" "${a[@]}" ${RL_EXTRA:-}
          echo "RESULT redlite budget=$b peak_device_mib=$PEAK_MIB"
        done
        for n in ${NCMOE:-48 45 35 15 0}; do
          echo "== round $round: llama.cpp, experts of $n layers on the CPU (-ngl 99 -ncmoe $n)"
          with_mem llama_tg "$M" 0 "${REPS:-3}" -ngl 99 -ncmoe "$n"
          echo "RESULT llama ncmoe=$n peak_device_mib=$PEAK_MIB"
        done
      done ;;
    depths)
      wait_build || exit 1
      for layout in ${LAYOUTS:-cf2 q4km}; do
        M=$(synth_file "$layout")
        for round in $(seq "${ROUNDS:-1}"); do
          echo "== $layout round $round: Red Lite (CUDA, every weight on the device)"
          redlite_tg "$M" "${DEPTHS:-0,8192,32768}" "${REPS:-3}"
          echo "== $layout round $round: llama.cpp (CUDA, -ngl 99)"
          llama_tg "$M" "${DEPTHS:-0,8192,32768}" "${REPS:-3}" -ngl 99
        done
        [[ ${KEEP:-0} == 1 ]] || rm -f "$M"
      done ;;
    *) echo "unknown step $s" ;;
  esac
done
