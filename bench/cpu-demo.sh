#!/usr/bin/env bash
# CPU prompt (512 tokens) and decode speed of Red Lite vs llama.cpp on the
# demo model, alternating A B A B, medians of RUNS runs each.
#
#   bench/cpu-demo.sh [MODEL] [THREADS] [RUNS]
#
# Red Lite: the `decode_speed` example (prefill PROMPT tokens, then DECODE
# greedy tokens; it prints prefill tok/s and the median per-token decode).
# llama.cpp: `llama-bench -p 512 -n 64 -r 1` per run (pp512 and tg64 rows),
# from $LLAMA_BIN (default $HOME/llama/build/bin); `--no-repack`-free CPU
# build as made by the llama.cpp recipe in docs; skipped if absent.
# Extra env: REDLITE_BIN (a decode_speed binary to use instead of building).
set -euo pipefail
MODEL=${1:-$HOME/.cache/redlite/demo-model.gguf}
THREADS=${2:-2}
RUNS=${3:-3}
PROMPT=512
DECODE=64
LLAMA_BIN=${LLAMA_BIN:-$HOME/llama/build/bin}
cd "$(dirname "$0")/.."
if [[ -z "${REDLITE_BIN:-}" ]]; then
  cargo build --release -q -p redlite-model --example decode_speed
  REDLITE_BIN=target/release/examples/decode_speed
fi
have_llama=0
[[ -x "$LLAMA_BIN/llama-bench" ]] && have_llama=1
rl_pp=(); rl_tg=(); ll_pp=(); ll_tg=()
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# Warm-up (page cache, CPU frequency): one short run of each.
"$REDLITE_BIN" "$MODEL" "$THREADS" 16 4 >/dev/null
for ((i = 1; i <= RUNS; i++)); do
  out=$("$REDLITE_BIN" "$MODEL" "$THREADS" "$PROMPT" "$DECODE")
  pp=$(sed -n 's/.*prefill.*(\([0-9.]*\) tok\/s).*/\1/p' <<<"$out")
  tg=$(sed -n 's/.*decode: median.*(\([0-9.]*\) tok\/s).*/\1/p' <<<"$out")
  rl_pp+=("$pp"); rl_tg+=("$tg")
  echo "run $i redlite: pp$PROMPT $pp tok/s, tg $tg tok/s" >&2
  if ((have_llama)); then
    out=$("$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$DECODE" -r 1 -o csv 2>/dev/null)
    pp=$(awk -F, -v p="$PROMPT" 'NR>1 && $0 ~ "\"" p "\",\"0\"" {gsub(/"/,"",$0); print}' <<<"$out" | awk -F, '{print $(NF-1)}' | head -1)
    tg=$(awk -F, -v d="$DECODE" 'NR>1 && $0 ~ "\"0\",\"" d "\"" {gsub(/"/,"",$0); print}' <<<"$out" | awk -F, '{print $(NF-1)}' | head -1)
    ll_pp+=("$pp"); ll_tg+=("$tg")
    echo "run $i llama.cpp: pp$PROMPT $pp tok/s, tg$DECODE $tg tok/s" >&2
  fi
done
rp=$(median "${rl_pp[@]}"); rt=$(median "${rl_tg[@]}")
echo
echo "| engine | prompt tok/s ($PROMPT) | decode tok/s |"
echo "|---|---|---|"
echo "| redlite | $rp | $rt |"
if ((have_llama)); then
  lp=$(median "${ll_pp[@]}"); lt=$(median "${ll_tg[@]}")
  echo "| llama.cpp | $lp | $lt |"
  awk -v a="$rp" -v b="$lp" -v c="$rt" -v d="$lt" \
    'BEGIN {printf "| redlite / llama.cpp | %.2f | %.2f |\n", a / b, c / d}'
fi
echo "(medians of $RUNS alternating runs, $THREADS threads, $(date -u +%F))"
