#!/usr/bin/env bash
# Speculative decoding on a code-rewrite task, Red Lite against llama.cpp's
# n-gram mode (llama-lookup) on the same file and prompt, alternating.
#
#   bench/spec/rewrite.sh LLAMA_BIN [MODEL] [PROMPT]
#
# LLAMA_BIN: a directory with llama.cpp's llama-completion and llama-lookup
# (nothing of llama.cpp is in this repository; docs/speculative.md says how
# to build them). MODEL: default the demo model. PROMPT: default
# bench/spec/rewrite-chatml.txt (the rewrite instruction and a Python file,
# already in the model's chat format, so both engines see the same tokens).
# Env: N (tokens, default 256), ROUNDS (default 3), DEVICE (cpu or cuda),
# DRAFT_MAX (default 16), REDLITE (the binary, default target/release/redlite).
# Greedy, end-of-generation ignored, so both decode exactly N tokens.
set -euo pipefail
LB=${1:?usage: bench/spec/rewrite.sh LLAMA_BIN [MODEL] [PROMPT]}
M=${2:-$(bash "$(dirname "$0")/../../scripts/fetch-demo-model.sh" | tail -1)}
P=${3:-$(dirname "$0")/rewrite-chatml.txt}
N=${N:-256}; ROUNDS=${ROUNDS:-3}; DEVICE=${DEVICE:-cpu}; DRAFT_MAX=${DRAFT_MAX:-16}
R=${REDLITE:-target/release/redlite}
NGL=0; [[ $DEVICE == cuda ]] && NGL=99
for round in $(seq "$ROUNDS"); do
  "$R" bench model -m "$M" --device "$DEVICE" --prompt-file "$P" --raw --spec lookup \
    --draft-max "$DRAFT_MAX" -n "$N" -r 1 -o json 2>/dev/null \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print("RESULT redlite plain %.2f lookup %.2f tok/s speedup %.2fx acceptance %.1f%% tokens/pass %.2f identical %s" % (r["plain_ts"], r["spec_ts"], r["speedup"], 100*r["acceptance"], r["mean_accepted_len"], r["identical"]))'
  "$LB/llama-completion" -m "$M" -f "$P" -n "$N" --temp 0 --ignore-eos -ngl $NGL -no-cnv --no-warmup 2>&1 \
    | grep -E " eval time" | grep -v prompt | sed 's/^.*eval time/eval time/' | sed 's/^/RESULT llama plain: /'
  "$LB/llama-lookup" -m "$M" -f "$P" -n "$N" --temp 0 --ignore-eos -ngl $NGL --spec-draft-n-max "$DRAFT_MAX" 2>&1 \
    | grep -E " (encoded|decoded|accept) " | sed 's/^[0-9.]* I //' | tr -s ' ' | paste -sd' ' | sed 's/^/RESULT llama lookup: /'
done
