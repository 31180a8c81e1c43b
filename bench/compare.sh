#!/usr/bin/env bash
# Red Lite vs llama.cpp on one GGUF, same machine, same run, alternating
# A B A B: decode at depth 0 (tg) and prompt processing at 512 tokens (pp).
# Prints one markdown table of medians and ratios (redlite / llama.cpp).
#
#   bench/compare.sh MODEL.gguf LLAMA_BIN_DIR
#
# Environment (all optional):
#   REDLITE=target/release/redlite   the redlite binary
#   RUNS=3          timed runs per engine and test (medians are reported)
#   THREADS=nproc   CPU threads for both engines
#   MODE=cpu|gpu    gpu: llama-bench -ngl 99, redlite gets REDLITE_GPU_ARGS
#   N_GEN=64 N_PROMPT=512
#   LLAMA_ARGS      extra llama-bench args (CPU default: --repack 0, because
#                   llama.cpp's AMX repack path dies on the dev machine)
#   REDLITE_ARGS    extra redlite args (e.g. a device flag)
#   LOG_DIR         keep every raw output here (default: a temp dir)
#
# redlite side: uses `redlite bench model` when this build has it, with the
# contract `redlite bench model -m FILE -p N_PROMPT -n N_GEN -t THREADS -r 1
# -o json`, printing llama-bench-style JSON (objects with n_prompt, n_gen,
# avg_ts); otherwise times `redlite generate` (its stderr speed line).
set -euo pipefail

usage() { sed -n '2,25p' "$0"; exit 2; }
[[ $# -eq 2 ]] || usage
MODEL=$1
BIN=$2
REDLITE=${REDLITE:-target/release/redlite}
RUNS=${RUNS:-3}
THREADS=${THREADS:-$(nproc)}
MODE=${MODE:-cpu}
N_GEN=${N_GEN:-64}
N_PROMPT=${N_PROMPT:-512}
LOG_DIR=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
[[ -f $MODEL ]] || { echo "no model file $MODEL" >&2; exit 2; }
[[ -x $BIN/llama-bench ]] || { echo "no llama-bench in $BIN" >&2; exit 2; }
[[ -x $REDLITE ]] || { echo "no redlite binary at $REDLITE (cargo build --release)" >&2; exit 2; }

read -r -a LLAMA_ARGS_A <<< "${LLAMA_ARGS:-}"
read -r -a REDLITE_ARGS_A <<< "${REDLITE_ARGS:-}"
if [[ $MODE == gpu ]]; then
  LLAMA_ARGS_A+=(-ngl 99)
elif [[ -z ${LLAMA_ARGS:-} ]]; then
  LLAMA_ARGS_A+=(--repack 0)
fi

HAVE_BENCH_MODEL=0
if "$REDLITE" bench model --help >/dev/null 2>&1; then HAVE_BENCH_MODEL=1; fi

# A prompt of N_PROMPT ordinary token ids (no special tokens), fixed.
prompt_ids() { python3 -c "import sys; n=int(sys.argv[1]); print(','.join(str(1000 + (i * 7919) % 50000) for i in range(n)))" "$1"; }

# llama-bench JSON -> tokens/s of the single test in it.
json_ts() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d[0]['avg_ts'])" "$1"; }

llama_run() { # kind(tg|pp) run-index -> tok/s
  local kind=$1 i=$2 out="$LOG_DIR/llama-$1-$2.json" args
  if [[ $kind == tg ]]; then args=(-p 0 -n "$N_GEN"); else args=(-p "$N_PROMPT" -n 0); fi
  "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r 1 -o json "${args[@]}" "${LLAMA_ARGS_A[@]}" \
    >"$out" 2>"$LOG_DIR/llama-$kind-$i.err"
  json_ts "$out"
}

redlite_run() { # kind run-index -> tok/s
  local kind=$1 i=$2 log="$LOG_DIR/redlite-$1-$2"
  if [[ $HAVE_BENCH_MODEL == 1 ]]; then
    local args
    if [[ $kind == tg ]]; then args=(-p 0 -n "$N_GEN"); else args=(-p "$N_PROMPT" -n 0); fi
    "$REDLITE" bench model -m "$MODEL" -t "$THREADS" -r 1 -o json "${args[@]}" "${REDLITE_ARGS_A[@]}" \
      >"$log.json" 2>"$log.err"
    json_ts "$log.json"
    return
  fi
  # Fallback: redlite generate, greedy, EOS ignored; read its speed line:
  # "redlite: prompt P tokens in X s (A tok/s) | decode N tokens in Y s (B tok/s)"
  local ids n
  if [[ $kind == tg ]]; then ids=$(prompt_ids 4); n=$N_GEN; else ids=$(prompt_ids "$N_PROMPT"); n=1; fi
  "$REDLITE" generate -m "$MODEL" --prompt-ids "$ids" -n "$n" --ignore-eos --temp 0 \
    -t "$THREADS" -c $((N_PROMPT + N_GEN + 8)) "${REDLITE_ARGS_A[@]}" >"$log.out" 2>"$log.err"
  python3 - "$log.err" "$kind" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"prompt (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\) \| decode (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\)", text)
if not m:
    sys.exit("no speed line in " + sys.argv[1])
print(m.group(6) if sys.argv[2] == "tg" else m.group(3))
PY
}

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

echo "# compare: $(basename "$MODEL"), mode $MODE, $THREADS threads, $RUNS runs, logs in $LOG_DIR" >&2
declare -A R L
for kind in tg pp; do
  R[$kind]=""; L[$kind]=""
  # Warm-up (page cache, clocks): one untimed run of each.
  redlite_run "$kind" warm >/dev/null || { echo "redlite $kind failed, see $LOG_DIR" >&2; exit 1; }
  llama_run "$kind" warm >/dev/null || { echo "llama-bench $kind failed, see $LOG_DIR" >&2; exit 1; }
  for i in $(seq 1 "$RUNS"); do
    r=$(redlite_run "$kind" "$i"); l=$(llama_run "$kind" "$i")
    echo "  $kind run $i: redlite $r tok/s, llama.cpp $l tok/s" >&2
    R[$kind]+=" $r"; L[$kind]+=" $l"
  done
done

echo
echo "| test | redlite tok/s | llama.cpp tok/s | ratio | redlite runs | llama.cpp runs |"
echo "|---|---:|---:|---:|---|---|"
for kind in tg pp; do
  # shellcheck disable=SC2086
  rm_=$(median ${R[$kind]}); lm=$(median ${L[$kind]})
  name=$([[ $kind == tg ]] && echo "decode tg$N_GEN @ depth 0" || echo "prompt pp$N_PROMPT")
  ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$rm_" "$lm")
  printf '| %s | %.2f | %.2f | %s | %s | %s |\n' "$name" "$rm_" "$lm" "$ratio" "${R[$kind]# }" "${L[$kind]# }"
done
