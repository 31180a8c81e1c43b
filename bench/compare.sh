#!/usr/bin/env bash
# Red Lite vs llama.cpp on one GGUF, same machine, same run, alternating
# A B A B: decode (tgN) at each depth in DEPTHS and prompt processing (ppP)
# at each length in PROMPTS. Prints one markdown table of medians and
# ratios (redlite / llama.cpp).
#
#   bench/compare.sh MODEL.gguf LLAMA_BIN_DIR
#
# Environment (all optional):
#   REDLITE=target/release/redlite   the redlite binary
#   RUNS=3          timed runs per engine and test (medians are reported)
#   THREADS=nproc   CPU threads for both engines
#   MODE=cpu|gpu    gpu: llama-bench -ngl 99, redlite gets REDLITE_ARGS
#   N_GEN=64        decode tokens per timed run
#   PROMPTS=512     prompt lengths, comma-separated (e.g. 512,2048,8192);
#                   N_PROMPT is the old name of a single length
#   DEPTHS=0        decode depths, comma-separated (e.g. 0,4096,32768)
#   ALTERNATE_DEPTH=0  at depth > 0 each engine runs once with -r RUNS (one
#                   untimed fill, RUNS timed runs; order redlite, llama.cpp);
#                   1: alternate single runs like depth 0 (a fill per run)
#   TESTS=tg,pp     which kinds to run
#   TIMEOUT=0       seconds per engine invocation (0: none)
#   LLAMA_ARGS      extra llama-bench args (CPU default: --repack 0 only on
#                   CPUs with AMX, where llama.cpp's AMX path dies)
#   REDLITE_ARGS    extra redlite args (e.g. a device flag)
#   LOG_DIR         keep every raw output here (default: a temp dir)
#
# redlite side: `redlite bench model -m FILE -p P -n N -d D -t THREADS -r R
# -o json` (contract in bench/README.md: llama-bench-style JSON objects with
# n_prompt, n_gen, n_depth, avg_ts, samples_ts); builds without that
# subcommand fall back to timing `redlite generate` (depth 0 only).
set -euo pipefail

usage() { sed -n '2,33p' "$0"; exit 2; }
[[ $# -eq 2 ]] || usage
MODEL=$1
BIN=$2
REDLITE=${REDLITE:-target/release/redlite}
RUNS=${RUNS:-3}
THREADS=${THREADS:-$(nproc)}
MODE=${MODE:-cpu}
N_GEN=${N_GEN:-64}
PROMPTS=${PROMPTS:-${N_PROMPT:-512}}
DEPTHS=${DEPTHS:-0}
ALTERNATE_DEPTH=${ALTERNATE_DEPTH:-0}
TESTS=${TESTS:-tg,pp}
TIMEOUT=${TIMEOUT:-0}
LOG_DIR=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
[[ -f $MODEL ]] || { echo "no model file $MODEL" >&2; exit 2; }
[[ -x $BIN/llama-bench ]] || { echo "no llama-bench in $BIN" >&2; exit 2; }
[[ -x $REDLITE ]] || { echo "no redlite binary at $REDLITE (cargo build --release)" >&2; exit 2; }

read -r -a LLAMA_ARGS_A <<< "${LLAMA_ARGS:-}"
read -r -a REDLITE_ARGS_A <<< "${REDLITE_ARGS:-}"
if [[ $MODE == gpu ]]; then
  LLAMA_ARGS_A+=(-ngl 99)
elif [[ -z ${LLAMA_ARGS:-} ]] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  LLAMA_ARGS_A+=(--repack 0)
fi

HAVE_BENCH_MODEL=0
if "$REDLITE" bench model --help >/dev/null 2>&1; then HAVE_BENCH_MODEL=1; fi

tmo() { if [[ $TIMEOUT -gt 0 ]]; then timeout "$TIMEOUT" "$@"; else "$@"; fi; }

# A prompt of n ordinary token ids (no special tokens), fixed.
prompt_ids() { python3 -c "import sys; n=int(sys.argv[1]); print(','.join(str(1000 + (i * 7919) % 50000) for i in range(n)))" "$1"; }

# llama-bench-style JSON -> tokens/s of each run of the test (n_prompt,
# n_gen, n_depth), space-separated.
json_ts() {
  python3 - "$@" <<'PY'
import json, sys
path, p, n, d = sys.argv[1], *map(int, sys.argv[2:5])
for o in json.load(open(path)):
    if o.get("n_prompt") == p and o.get("n_gen") == n and o.get("n_depth", 0) == d:
        print(" ".join(f"{x:.4f}" for x in o.get("samples_ts") or [o["avg_ts"]]))
        sys.exit(0)
sys.exit(f"no test p={p} n={n} d={d} in {path}")
PY
}

# test = "tg:DEPTH" or "pp:LEN"; args: test tag reps -> tok/s of each run
test_pnd() { # test -> "P N D"
  local kind=${1%%:*} v=${1#*:}
  if [[ $kind == tg ]]; then echo "0 $N_GEN $v"; else echo "$v 0 0"; fi
}

llama_run() {
  local t=$1 tag=$2 reps=$3 p n d out
  read -r p n d <<< "$(test_pnd "$t")"
  out="$LOG_DIR/llama-${t/:/-}-$tag"
  tmo "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r "$reps" -o json -p "$p" -n "$n" -d "$d" \
    "${LLAMA_ARGS_A[@]}" >"$out.json" 2>"$out.err" || { echo "llama-bench $t failed, see $out.err" >&2; return 1; }
  json_ts "$out.json" "$p" "$n" "$d"
}

redlite_run() {
  local t=$1 tag=$2 reps=$3 p n d log
  read -r p n d <<< "$(test_pnd "$t")"
  log="$LOG_DIR/redlite-${t/:/-}-$tag"
  if [[ $HAVE_BENCH_MODEL == 1 ]]; then
    tmo "$REDLITE" bench model -m "$MODEL" -t "$THREADS" -r "$reps" -o json -p "$p" -n "$n" -d "$d" \
      "${REDLITE_ARGS_A[@]}" >"$log.json" 2>"$log.err" || { echo "redlite $t failed, see $log.err" >&2; return 1; }
    json_ts "$log.json" "$p" "$n" "$d"
    return
  fi
  [[ $d == 0 ]] || { echo "this redlite has no 'bench model': depth $d unsupported" >&2; return 1; }
  # Fallback: redlite generate, greedy, EOS ignored; read its speed line:
  # "redlite: prompt P tokens in X s (A tok/s) | decode N tokens in Y s (B tok/s)"
  local ids k out=""
  for ((k = 0; k < reps; k++)); do
    if [[ $p == 0 ]]; then ids=$(prompt_ids 4); else ids=$(prompt_ids "$p"); fi
    tmo "$REDLITE" generate -m "$MODEL" --prompt-ids "$ids" -n "$([[ $p == 0 ]] && echo "$n" || echo 1)" \
      --ignore-eos --temp 0 -t "$THREADS" -c $((p + n + 8)) "${REDLITE_ARGS_A[@]}" >"$log.out" 2>"$log.err"
    out+=" $(python3 - "$log.err" "$p" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"prompt (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\) \| decode (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\)", text)
if not m:
    sys.exit("no speed line in " + sys.argv[1])
print(m.group(6) if sys.argv[2] == "0" else m.group(3))
PY
)"
  done
  echo "${out# }"
}

median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

TEST_LIST=()
if [[ ,$TESTS, == *,tg,* ]]; then for d in ${DEPTHS//,/ }; do TEST_LIST+=("tg:$d"); done; fi
if [[ ,$TESTS, == *,pp,* ]]; then for p in ${PROMPTS//,/ }; do TEST_LIST+=("pp:$p"); done; fi

echo "# compare: $(basename "$MODEL"), mode $MODE, $THREADS threads, $RUNS runs, tests ${TEST_LIST[*]}, logs in $LOG_DIR" >&2
declare -A R L
for t in "${TEST_LIST[@]}"; do
  R[$t]=""; L[$t]=""
  read -r p n d <<< "$(test_pnd "$t")"
  if [[ $d != 0 && $ALTERNATE_DEPTH != 1 ]]; then
    # One invocation each: one untimed fill to depth d, RUNS timed runs.
    echo "  $t: one fill per engine, $RUNS runs each" >&2
    R[$t]=$(redlite_run "$t" block "$RUNS")
    echo "  $t: redlite ${R[$t]} tok/s" >&2
    L[$t]=$(llama_run "$t" block "$RUNS")
    echo "  $t: llama.cpp ${L[$t]} tok/s" >&2
    continue
  fi
  # Warm-up (page cache, clocks): one untimed invocation of each.
  redlite_run "$t" warm 1 >/dev/null
  llama_run "$t" warm 1 >/dev/null
  for i in $(seq 1 "$RUNS"); do
    r=$(redlite_run "$t" "$i" 1); l=$(llama_run "$t" "$i" 1)
    echo "  $t run $i: redlite $r tok/s, llama.cpp $l tok/s" >&2
    R[$t]+=" $r"; L[$t]+=" $l"
  done
done

echo
echo "$(date -u +%F) | commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?') | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $THREADS threads | $(basename "$MODEL") | llama.cpp args: ${LLAMA_ARGS_A[*]:-(none)}"
echo
echo "| test | redlite tok/s | llama.cpp tok/s | ratio | redlite runs | llama.cpp runs |"
echo "|---|---:|---:|---:|---|---|"
for t in "${TEST_LIST[@]}"; do
  read -r p n d <<< "$(test_pnd "$t")"
  # shellcheck disable=SC2086
  rm_=$(median ${R[$t]}); lm=$(median ${L[$t]})
  if [[ $p == 0 ]]; then name="decode tg$n @ depth $d"; else name="prompt pp$p"; fi
  ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$rm_" "$lm")
  printf '| %s | %.3f | %.3f | %s | %s | %s |\n' "$name" "$rm_" "$lm" "$ratio" "$(echo ${R[$t]})" "$(echo ${L[$t]})"
done
