#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: the bounded device expert cache (issue 8) in one
# call. Logs go to $OUT (or bench/gpu/out).
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                mkdir -p .bench-bin && strip -o .bench-bin/redlite target/release/redlite
# Then:          run(command="bash bench/gpu/cache.sh", carry=[".bench-bin"])
#
# Steps (STEPS, default all, in this order):
#   selftest  every kernel (the cache's plan and fetch kernels included)
#   parity    the tiny fixtures: CUDA vs CPU, and every cache size against
#             full residency, bit for bit
#   synth     the iq2 synth file (LAYOUT) into /dev/shm
#   same      greedy tokens and logits of the synth file: full residency vs
#             BUDGETS_SAME device budgets, compared byte for byte
#             (a budget is full, a size like 8G, or 8G-file / 8G-nopre)
#   budgets   decode tok/s, hit rate and PCIe bytes per token at BUDGETS
#             (device memory; "full" = no budget), alternating, ROUNDS times
#   prefill   prompt tok/s and PCIe bytes per prompt token of the batched
#             prefill at BUDGETS_PP (default full 8G; PP default 512,2048)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
F=tests/fixtures/qwen3next
LAYOUT="${LAYOUT:-iq2}"
M="$WORK/synth-$LAYOUT-s0.gguf"
exec > >(tee -a "$OUT/cache.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# A budget: "full" (no budget), or a size ("8G"), optionally "-file" (misses
# read from the file by the host instead of pinned memory) or "-nopre"
# (pre-gating off).
budget_args() {
  local b=$1 a=""
  [[ $b == *-file ]] && { a="$a --expert-source file"; b=${b%-file}; }
  [[ $b == *-nopre ]] && { a="$a --pregate 0"; b=${b%-nopre}; }
  [[ $b == full ]] || a="$a --memory $b"
  echo "$a"
}
fail=0
for s in ${STEPS:-selftest parity synth same budgets prefill}; do
  case $s in
    selftest) echo "== selftest"; timeout 300 "$R" selftest || fail=1 ;;
    parity) echo "== parity (+ cache sweep)"
      timeout 400 "$R" parity -m $F/tiny-qwen3next-f32.gguf $F/tiny-qwen3next-q8_0.gguf \
        $F/tiny-qwen3next-q4_k_m.gguf $F/tiny-qwen3next-iq2_xxs.gguf || fail=1 ;;
    synth)
      [[ -f $M ]] || { echo "== synth $LAYOUT"; timeout 200 "$R" synth --layout "$LAYOUT" --seed 0 --out "$M" --threads "$(nproc)" --quiet || fail=1; } ;;
    same)
      ids=$(seq -s, 11 37)
      for b in full ${BUDGETS_SAME:-8G 4G 8G-file}; do
        echo "== greedy 32, budget $b"
        timeout 300 "$R" generate -m "$M" --device cuda --prompt-ids "$ids" -n 32 --temp 0 \
          --ignore-eos --print-ids -c 128 --dump-logits "$WORK/logits-$b.bin" $(budget_args "$b") \
          > "$WORK/ids-$b.json" || fail=1
        cat "$WORK/ids-$b.json"; echo
      done
      for b in ${BUDGETS_SAME:-8G 4G 8G-file}; do
        if cmp -s "$WORK/logits-full.bin" "$WORK/logits-$b.bin" && cmp -s "$WORK/ids-full.json" "$WORK/ids-$b.json"; then
          echo "budget $b: logits ($(stat -c %s "$WORK/logits-$b.bin") bytes) and greedy ids identical to full residency"
        else
          echo "budget $b: DIFFERS from full residency"; fail=1
        fi
      done ;;
    budgets)
      for round in $(seq "${ROUNDS:-1}"); do
        for b in ${BUDGETS:-full 16G 8G 4G}; do
          echo "== decode, synth $LAYOUT, budget $b, round $round"
          timeout 300 "$R" bench model -m "$M" --device cuda --depth-fill skip -p 0 -n "${N_GEN:-64}" -r "${REPS:-3}" \
            $(budget_args "$b") ${EXTRA:-} || fail=1
        done
      done ;;
    prefill)
      for b in ${BUDGETS_PP:-full 8G}; do
        echo "== prefill, synth $LAYOUT, budget $b"
        timeout 400 "$R" bench model -m "$M" --device cuda -p "${PP:-512,2048}" -n 0 -r "${REPS:-2}" \
          $(budget_args "$b") ${EXTRA:-} 2>"$WORK/pp.err" || fail=1
        grep -E "memory plan|prompts in chunks|run [0-9]+/[0-9]+:" "$WORK/pp.err"
      done ;;
    *) echo "unknown step $s"; fail=1 ;;
  esac
done
exit $fail
