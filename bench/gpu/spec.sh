#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: speculative decoding's costs on the iq2 synth
# file (80B shapes), for reading the speed-up at any acceptance rate off.
#
# Prepare here as for prefill.sh (.bench-bin/redlite.gz built with
# --features cuda). Then:
#   run(command="STEPS='verify chunk' bash bench/gpu/spec.sh", carry=[".bench-bin"])
#
# Steps (STEPS; default verify chunk):
#   verify  a verify pass of k = 1, 2, 4, 8, 16 drafts against one decode
#           step, at depths 0 and 8192 (bench model --verify-k)
#   chunk   the batched prefill at the sizes a verify pass would have
#           (k + 1 = 8, 12, 17 tokens; fewer than 8 run as decode steps),
#           the alternative verify path (not bit-identical to decode)
# Result lines start with "RESULT"; everything goes to $OUT/spec.log.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec > >(tee -a "$OUT/spec.log") 2>&1
fail=0
for s in ${STEPS:-verify chunk}; do
  M=$(synth_file iq2)
  case $s in
    verify)
      echo "== verify-pass cost (iq2)"
      timeout 400 "$R" bench model -m "$M" --device cuda --verify-k 1,2,4,8,16 -d 0,8192 -r 5 \
        2>"$WORK/spec.err" | sed 's/^/RESULT /' || fail=1
      grep -E "memory plan|verify k" "$WORK/spec.err" | head -12 | sed 's/^/    /' ;;
    chunk)
      echo "== batched prefill at verify sizes (iq2)"
      timeout 300 "$R" bench model -m "$M" --device cuda -p 8,12,17 -n 1 -r 5 \
        2>"$WORK/spec.err" | grep "^| qwen" | sed 's/^/RESULT /' || fail=1 ;;
  esac
done
exit $fail
