#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: the batched prefill (issue: CUDA batched
# prefill) checked and measured in one call, side by side with llama.cpp.
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                strip + gzip target/release/redlite into .bench-bin/redlite.gz
#                bench/gpu/prepare_llama_src.sh   (-> .llama-cuda-src)
# Then:  run(command="bash bench/gpu/prefill.sh", carry=[".bench-bin", ".llama-cuda-src"])
#
# Steps (STEPS, in the order given; default build selftest parity pp budget):
#   build     llama.cpp (CUDA, sm_90) in the background; the llama steps wait
#   selftest  every kernel against its float64 reference (rows not ok, and
#             the prefill rows)
#   parity    the tiny fixtures: the batched prefill against token by token
#             and against the CPU reference (redlite parity)
#   pp        iq2 synth file: prompt tok/s at PP (default 512,2048,8192)
#             and decode tg64, then pp512 and tg64 at depth 32768 (the
#             depth computed by prefill); Red Lite, then llama.cpp (-ngl 99
#             -fa 1, micro-batch 512 = its default, and 2048), ROUNDS rounds
#   profile   iq2 file: where a prompt's time goes (bench model --profile at
#             PP_PROFILE, default 2048) and Red Lite's pp512/pp2048 alone
#   attn      iq2 file: Red Lite alone, prompt tok/s at PP and pp512 at
#             depth 32768
#   deep      iq2 file: decode tg64 at DEEP (default 65536,131072,262144)
#             positions, each filled by the batched prefill; llama.cpp at
#             LL_DEEP (default 65536,131072: its 262,144 fill takes minutes)
#   budget    iq2 file under --memory 8G (Red Lite: tok/s and PCIe MiB a
#             prompt token at PP_BUDGET, default 512,2048) against
#             llama.cpp -ncmoe 35: pp512
#   cf2q4km   cf2 and q4km synth files: pp2048, both engines
#   ubatch    iq2 file: Red Lite pp2048 and pp8192 at --ubatch UBS
#             (default 1024 2048 4096): the chunk size against its scratch
#   ab        iq2 file: prompt tok/s at PP, the binary under test against
#             BASE (default .bench-bin/redlite-base, carried beside it),
#             alternating, ROUNDS rounds (default 2); BINS (paths, in
#             order) replaces the pair with any number of binaries
#   ncu       iq2 file, Nsight Compute on the prefill kernels of one
#             2048-token chunk (NCU_KERNELS, a regex; default the GEMMs and
#             the DeltaNet chunk kernel): speed of light, occupancy, warp
#             stalls, pipe use; skipped where no ncu is installed
# Result lines start with "RESULT"; everything is logged to $OUT/prefill.log.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
F=tests/fixtures/qwen3next
LB="$WORK/llama-build/bin"
NPROC=$(nproc)
exec > >(tee -a "$OUT/prefill.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fail=0

wait_build() {
  [[ -x $LB/llama-bench || -f $WORK/build.started ]] || { echo "(no llama.cpp build: run the build step first)"; return 1; }
  while [[ ! -x $LB/llama-bench ]]; do
    if [[ -f $WORK/build.done ]]; then echo "llama.cpp build failed:"; tail -20 "$WORK/build.log"; return 1; fi
    sleep 5
  done
}
rl_pp() { # file args... -> bench model rows
  local m=$1; shift
  timeout "${RL_TIMEOUT:-300}" "$R" bench model -m "$m" --device cuda "$@" 2>"$WORK/rl.err" | grep "^| qwen"
  grep -E "memory plan|prefill" "$WORK/rl.err" | head -3 | sed 's/^/    /'
}
ll_pp() { # file args...
  local m=$1; shift
  timeout 300 "$LB/llama-bench" -m "$m" -ngl 99 -fa 1 -t "$NPROC" "$@" 2>"$WORK/ll.err" | grep -E "^\| .*(pp|tg)[0-9]"
}

for s in ${STEPS:-build selftest parity pp budget}; do
  case $s in
    build)
      if [[ ! -x $LB/llama-bench ]]; then
        rm -f "$WORK/build.done"; touch "$WORK/build.started"
        ( export PATH="/usr/local/cuda/bin:$PATH"
          cmake -S .llama-cuda-src -B "$WORK/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=OFF \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
          && nice -n 10 cmake --build "$WORK/llama-build" --target llama-bench -j "$NPROC"
          touch "$WORK/build.done" ) >"$WORK/build.log" 2>&1 &
        echo "== llama.cpp build started in the background"
      fi ;;
    selftest)
      echo "== selftest (rows not ok, and every prefill row)"
      timeout 300 "$R" selftest >"$WORK/selftest.txt" 2>&1; rc=$?
      grep -E "gemm|chunk|FAIL|not ok|worst|^\| kernel" "$WORK/selftest.txt"
      tail -3 "$WORK/selftest.txt"
      [[ $rc == 0 ]] || { echo "selftest rc=$rc"; fail=1; } ;;
    parity)
      echo "== parity (tiny fixtures present here)"
      fx=(); for f in $F/tiny-qwen3next-*.gguf; do [[ -f $f ]] && fx+=("$f"); done
      timeout 400 "$R" parity -m "${fx[@]}" --n-prompt ${PARITY_PROMPT:-40} --n-greedy 16 || fail=1 ;;
    pp)
      M=$(synth_file iq2)
      for round in $(seq "${ROUNDS:-1}"); do
        echo "== round $round: Red Lite, iq2: prompts at depth 0, decode; pp512 and tg64 at depth 32768"
        rl_pp "$M" -p "${PP:-512,2048,8192}" -n 64 -d 0 -r "${REPS:-2}"
        rl_pp "$M" -p 512 -n 64 -d 32768 --pp-at-depth -r "${REPS:-2}"
        if wait_build; then
          echo "== round $round: llama.cpp -ngl 99 -fa 1, micro-batch 512 (its default) and 2048"
          ll_pp "$M" -p "${PP:-512,2048,8192}" -n 64 -ub 512,2048 -b 2048 -r "${REPS:-2}"
          ll_pp "$M" -p 512 -n 64 -d 32768 -ub 512,2048 -b 2048 -r "${REPS:-2}"
        fi
      done ;;
    profile)
      M=$(synth_file iq2)
      echo "== Red Lite prefill profile, iq2"
      timeout 300 "$R" bench model -m "$M" --device cuda -p "${PP_PROFILE:-2048}" -n 0 -r 2 --profile 2>&1 | grep -v "^redlite bench: fill"
      rl_pp "$M" -p 512,2048 -n 0 -r 3 ;;
    attn)
      M=$(synth_file iq2)
      echo "== Red Lite, iq2"
      rl_pp "$M" -p "${PP:-512,2048,8192}" -n 0 -r "${REPS:-2}"
      rl_pp "$M" -p 512 -n 0 -d 32768 --pp-at-depth -r "${REPS:-2}" ;;
    deep)
      M=$(synth_file iq2)
      echo "== Red Lite, iq2: tg64 at depths ${DEEP:-65536,131072,262144} (each depth filled by the batched prefill first)"
      RL_TIMEOUT=560 rl_pp "$M" -p 0 -n 64 -d "${DEEP:-65536,131072,262144}" -r "${REPS:-2}"
      grep -E "fill" "$WORK/rl.err" | sed 's/^/    /'
      if wait_build; then
        echo "== llama.cpp tg64 at depths ${LL_DEEP:-65536,131072} (-ub 2048)"
        timeout 560 "$LB/llama-bench" -m "$M" -ngl 99 -fa 1 -t "$NPROC" -p 0 -n 64 -d "${LL_DEEP:-65536,131072}" \
          -ub 2048 -b 2048 -r "${REPS:-2}" 2>"$WORK/ll.err" | grep -E "^\| .*tg[0-9]"
      fi ;;
    budget)
      M=$(synth_file iq2)
      echo "== Red Lite --memory 8G (bounded expert cache: batched prefill, each chunk's experts not in the cache staged once per MoE layer)"
      rl_pp "$M" -p "${PP_BUDGET:-512,2048}" -n 0 -r 2 --memory 8G
      # per run: tok/s, and the experts read from slots / uploaded and the
      # PCIe MiB per prompt token ("cache: ..."); the plan's prefill share
      grep -E "run [0-9]+/[0-9]+:.*cache:|batched prefill:|prompts in chunks" "$WORK/rl.err" | sed 's/^/    /' 
      if wait_build; then
        echo "== llama.cpp -ncmoe 35"
        ll_pp "$M" -p 512 -n 0 -r 2 -ncmoe 35
      fi ;;
    cf2q4km)
      for layout in cf2 q4km; do
        M=$(synth_file "$layout")
        echo "== $layout: Red Lite pp2048"; rl_pp "$M" -p 2048 -n 0 -r "${REPS:-2}"
        if wait_build; then
          echo "== $layout: llama.cpp pp2048 -ub 2048 (its best at 2048 on iq2)"
          ll_pp "$M" -p 2048 -n 0 -r "${REPS:-2}" -ub 2048 -b 2048
        fi
        rm -f "$M"
      done ;;
    ab)
      M=$(synth_file iq2); B="${BASE:-$ROOT/.bench-bin/redlite-base}"
      for round in $(seq "${ROUNDS:-2}"); do
        for bin in ${BINS:-$B $R}; do
          echo "== round $round: $(basename "$bin")"
          timeout 300 "$bin" bench model -m "$M" --device cuda -p "${PP:-512,2048,8192}" -n 0 -r 2 2>/dev/null | grep "^| qwen"
        done
      done ;;
    ubatch)
      M=$(synth_file iq2)
      for ub in ${UBS:-1024 2048 4096}; do
        echo "== Red Lite --ubatch $ub"
        rl_pp "$M" -p 2048,8192 -n 0 -r 2 --ubatch "$ub"
      done ;;
    ncu)
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [[ -z $NCU ]]; then echo "== ncu: not installed"; ls /usr/local/cuda/bin | head -50; continue; fi
      M=$(synth_file iq2)
      echo "== ncu ($NCU), iq2 pp2048, kernels ${NCU_KERNELS:-gemm|gdn_}"
      timeout 400 "$NCU" --kernel-name "regex:${NCU_KERNELS:-gemm|gdn_}" --launch-skip "${NCU_SKIP:-40}" \
        --launch-count "${NCU_COUNT:-12}" --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section LaunchStats --section MemoryWorkloadAnalysis \
        "$R" bench model -m "$M" --device cuda -p 2048 -n 0 -r 1 >"$OUT/ncu.txt" 2>&1
      echo "ncu rc=$?"
      grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Issue Slots Busy|Pipe|Warp Cycles Per Issued|Executed Ipc|L1/TEX Hit|L2 Hit|DRAM Throughput|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Grid Size|Waves Per SM" "$OUT/ncu.txt" | head -400 ;;
    *) echo "unknown step $s"; fail=1 ;;
  esac
done
exit $fail
