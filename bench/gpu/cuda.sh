#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: the CUDA backend's checks and decode speed, in
# one self-contained call. Logs go to $OUT (or bench/gpu/out).
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                mkdir -p .bench-bin && strip -o .bench-bin/redlite target/release/redlite
# Then:          run(command="bash bench/gpu/cuda.sh", carry=[".bench-bin"])
#
# Steps (STEPS, default all, in this order):
#   selftest  every kernel against its float64 reference (worst error per kernel)
#   parity    the CUDA decoder against the CPU engine on the tiny fixtures
#   kernels   decode attention (4K-128K) and the DeltaNet step, GB/s
#   tiny      decode tok/s of the tiny fixture (the per-kernel launch floor)
#   bench     decode tok/s on a full-size synth file (LAYOUT, default iq2)
#             at DEPTHS (default 0,4096,32768), ACTS int8 and/or f32
#   variants  (not in the default list) decode tok/s at depth 0 for each
#             router GEMV variant in F32_GEMVS (REDLITE_CUDA_F32_GEMV,
#             docs/cuda.md), ROUNDS rounds alternating
#   pdl       (not in the default list) decode tok/s at AB_DEPTHS (default
#             0,32768): PDL launches (the default) and plain ones
#             (--no-pdl), ROUNDS rounds alternating
#   envab     (not in the default list) decode tok/s at AB_DEPTHS under
#             each environment assignment of AB (e.g.
#             "REDLITE_CUDA_Q8_NR=2 REDLITE_CUDA_Q8_NR=4"; REDLITE=path
#             runs another carried binary, e.g. a baseline build),
#             ROUNDS rounds alternating
#   ablate    (not in the default list) what each kernel class costs in the
#             decode chain as it runs: decode tok/s at AB_DEPTHS with the
#             classes of each ';'-separated entry of ABLATE (label
#             substrings, REDLITE_CUDA_ABLATE, docs/cuda.md) left out,
#             each round starting with nothing left out
# NO_PDL=1 adds --no-pdl to selftest, parity, tiny and bench.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
F=tests/fixtures/qwen3next
LAYOUT="${LAYOUT:-iq2}"
exec > >(tee -a "$OUT/cuda.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fail=0
P="${NO_PDL:+--no-pdl}"
# decode_rows DEPTHS [args...]: the result rows of one decode benchmark of
# the synth file $M.
decode_rows() {
  local d=$1; shift
  timeout 200 "${REDLITE:-$R}" bench model -m "$M" --device cuda --depth-fill skip -p 0 -n 64 -d "$d" -r 3 "$@" 2>/dev/null | grep "^| qwen"
}
for s in ${STEPS:-selftest parity kernels tiny bench}; do
  case $s in
    selftest) echo "== selftest"; timeout 300 "$R" selftest $P || fail=1 ;;
    parity) echo "== parity"
      timeout 300 "$R" parity $P -m $F/tiny-qwen3next-f32.gguf $F/tiny-qwen3next-q8_0.gguf \
        $F/tiny-qwen3next-q4_k_m.gguf $F/tiny-qwen3next-iq2_xxs.gguf || fail=1 ;;
    kernels) echo "== bench kernels --decode-only"; timeout 200 "$R" bench kernels --decode-only ;;
    tiny) echo "== decode, tiny fixture"
      timeout 100 "$R" bench model $P -m $F/tiny-qwen3next-f32.gguf --device cuda -p 0 -n 256 -r 3 ;;
    bench)
      M=$(synth_file "$LAYOUT")
      for a in ${ACTS:-int8}; do
        f=""; [[ $a == f32 ]] && f=--f32-activations
        echo "== decode, synth $LAYOUT, $a activations"
        timeout 400 "$R" bench model $P -m "$M" --device cuda --depth-fill skip $f -p 0 -n 64 -d "${DEPTHS:-0,4096,32768}" -r 3
      done ;;
    variants)
      M=$(synth_file "$LAYOUT")
      for round in $(seq "${ROUNDS:-2}"); do
        for v in ${F32_GEMVS:-r1x2 r2 r1}; do
          echo "== round $round: REDLITE_CUDA_F32_GEMV=$v"
          REDLITE_CUDA_F32_GEMV=$v decode_rows 0
        done
      done ;;
    pdl)
      M=$(synth_file "$LAYOUT")
      for round in $(seq "${ROUNDS:-2}"); do
        echo "== round $round: PDL launches"; decode_rows "${AB_DEPTHS:-0,32768}"
        echo "== round $round: plain launches"; decode_rows "${AB_DEPTHS:-0,32768}" --no-pdl
      done ;;
    envab)
      M=$(synth_file "$LAYOUT")
      for round in $(seq "${ROUNDS:-2}"); do
        for v in ${AB:?set AB}; do
          echo "== round $round: $v"
          (export "$v"; decode_rows "${AB_DEPTHS:-0,32768}")
        done
      done ;;
    ablate)
      M=$(synth_file "$LAYOUT")
      IFS=';' read -ra sets <<< "${ABLATE:?set ABLATE}"
      for round in $(seq "${ROUNDS:-1}"); do
        echo "== round $round: nothing left out"; decode_rows "${AB_DEPTHS:-0}"
        for a in "${sets[@]}"; do
          echo "== round $round: without $a"
          REDLITE_CUDA_ABLATE="$a" decode_rows "${AB_DEPTHS:-0}"
        done
      done ;;
    *) echo "unknown step $s"; fail=1 ;;
  esac
done
exit $fail
