#!/usr/bin/env bash
# Needle in a haystack on the demo model: Red Lite and llama.cpp, greedy, on
# the same prompt token ids, at several prompt lengths and needle depths.
#
#   bench/needle.sh LLAMA_BIN_DIR [LENGTH...]            # default length 8192
#   DEPTHS=50 bench/needle.sh $HOME/llama/build/bin 16384 30000
#   DEVICE=cuda bench/needle.sh /dev/shm/redlite-bench/llama-build/bin 8192 16384 30000
#
# For each LENGTH (most prompt tokens) and depth in DEPTHS (percent of the
# filler before the needle; default 10,50,90), bench/needle_prompt.py builds
# the prompt (generated filler, "The secret passphrase is ...", a question,
# the Qwen2.5 chat template written out as raw text). Then:
#   - redlite generate --raw -f PROMPT -n N_GEN --temp 0
#   - llama-completion -no-cnv -f PROMPT -n N_GEN --temp 0 --top-k 1
#     --verbose-prompt (its prompt ids, checked against `redlite tokenize`)
# and one markdown table on stdout: length, depth, prompt tokens, both
# answers, whether they are the same, whether each holds the passphrase,
# each engine's prefill time. Progress goes to stderr.
#
# Exit status: 0 when every answer (and every prompt's token ids) is the
# same in both engines; 1 when any differs or an engine failed; 2 for a
# missing binary, model or argument.
#
# Environment:
#   DEVICE      cpu (default) or cuda: redlite --device cuda, llama.cpp -ngl 99
#   DEPTHS      comma-separated percentages (default 10,50,90)
#   MODEL       the GGUF (default $REDLITE_CACHE or $HOME/.cache/redlite, demo-model.gguf;
#               scripts/fetch-demo-model.sh puts it there)
#   REDLITE     the redlite binary (default target/release/redlite, else .bench-bin/redlite)
#   N_GEN       tokens to generate (default 24)
#   THREADS     CPU threads for both engines (default: all cores)
#   TIMEOUT     seconds per engine invocation (default 7200)
#   SEED        filler generator seed (default 1)
#   LOG_DIR     prompts, answers, raw logs (default a new folder under /tmp)
#   REDLITE_ARGS, LLAMA_ARGS   extra flags for each engine
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "needle: error: $*" >&2; exit 2; }
log() { echo "needle: $*" >&2; }

[[ $# -ge 1 ]] || die "usage: bench/needle.sh LLAMA_BIN_DIR [LENGTH...] (see the header of $0)"
LLAMA_BIN_DIR="$1"; shift
LENGTHS=("$@")
[[ ${#LENGTHS[@]} -gt 0 ]] || LENGTHS=(8192)
DEVICE="${DEVICE:-cpu}"
DEPTHS="${DEPTHS:-10,50,90}"
MODEL="${MODEL:-${REDLITE_CACHE:-$HOME/.cache/redlite}/demo-model.gguf}"
N_GEN="${N_GEN:-24}"
THREADS="${THREADS:-$(nproc)}"
TIMEOUT="${TIMEOUT:-7200}"
SEED="${SEED:-1}"
REDLITE_ARGS="${REDLITE_ARGS:-}"
LLAMA_ARGS="${LLAMA_ARGS:-}"
if [[ -z "${REDLITE:-}" ]]; then
  REDLITE="$ROOT/target/release/redlite"
  [[ -x $REDLITE ]] || REDLITE="$ROOT/.bench-bin/redlite"
fi
LC="$LLAMA_BIN_DIR/llama-completion"

[[ -x $REDLITE ]] || die "no redlite binary at $REDLITE (cargo build --release, or set REDLITE=...)"
[[ -x $LC ]] || die "no llama-completion in $LLAMA_BIN_DIR (build llama.cpp's llama-completion target: bench/README.md)"
[[ -f $MODEL ]] || die "no model at $MODEL (bash scripts/fetch-demo-model.sh, or set MODEL=...)"
command -v python3 >/dev/null || die "python3 is needed (bench/needle_prompt.py)"
for l in "${LENGTHS[@]}"; do [[ $l =~ ^[0-9]+$ ]] || die "length '$l' is not a token count"; done
IFS=, read -r -a DEPTH_LIST <<<"$DEPTHS"
for d in "${DEPTH_LIST[@]}"; do [[ $d =~ ^[0-9]+$ && $d -le 100 ]] || die "depth '$d' is not a percentage"; done

read -r -a RL_EXTRA <<<"$REDLITE_ARGS"
read -r -a LL_EXTRA <<<"$LLAMA_ARGS"
case "$DEVICE" in
  cpu)
    RL_DEV=()
    LL_DEV=(-ngl 0)
    # llama.cpp's AMX repack path dies with "Illegal instruction" on some
    # AMX machines (bench/README.md); the plain path gives the same math class.
    grep -qw amx_tile /proc/cpuinfo 2>/dev/null && LL_DEV+=(--no-repack)
    ;;
  cuda)
    RL_DEV=(--device cuda)
    LL_DEV=(-ngl 99)
    ;;
  *) die "DEVICE is cpu or cuda, not '$DEVICE'" ;;
esac
LOG_DIR="${LOG_DIR:-$(mktemp -d /tmp/needle.XXXXXX)}"
mkdir -p "$LOG_DIR"

commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
started=$(date -u '+%F %H:%M')
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
gpu=""
[[ $DEVICE == cuda ]] && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
log "model $MODEL; device $DEVICE; $THREADS threads; lengths ${LENGTHS[*]}; depths $DEPTHS%; logs in $LOG_DIR"

# Markdown cell: one line, pipes escaped, newlines shown as ⏎.
cell() { printf '%s' "$1" | awk 'BEGIN {ORS = ""} NR > 1 {print "⏎"} {gsub(/\|/, "\\|"); print}'; }
found() { [[ $1 == *"$2"* ]] && echo yes || echo no; }
# Seconds between two `date +%s.%N` stamps.
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }

rows=()
fail=0
total=$(( ${#LENGTHS[@]} * ${#DEPTH_LIST[@]} ))
i=0
for len in "${LENGTHS[@]}"; do
  for dep in "${DEPTH_LIST[@]}"; do
    i=$((i + 1))
    tag="needle-$len-d$dep"
    P="$LOG_DIR/$tag.txt"
    log "[$i/$total] length $len, depth $dep%: building the prompt"
    meta=$(python3 "$ROOT/bench/needle_prompt.py" --redlite "$REDLITE" --model "$MODEL" \
      --length "$len" --depth "$(awk -v d="$dep" 'BEGIN {print d / 100}')" --seed "$SEED" --out "$P") \
      || die "needle_prompt.py failed for length $len depth $dep"
    echo "$meta" >"$LOG_DIR/$tag.json"
    ntok=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$meta")
    npos=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["needle_token"])' "$meta")
    pass=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["passphrase"])' "$meta")
    ctx=$((ntok + N_GEN + 8))
    "$REDLITE" tokenize -m "$MODEL" -f "$P" | python3 -c 'import json,sys; print("\n".join(map(str, json.load(sys.stdin))))' \
      >"$LOG_DIR/$tag.redlite.ids"
    log "[$i/$total] $ntok prompt tokens, the needle at token $npos; redlite prefill..."

    rl_ok=1
    t0=$(date +%s.%N)
    timeout "$TIMEOUT" "$REDLITE" generate -m "$MODEL" --raw -f "$P" -n "$N_GEN" --temp 0 --seed 0 \
      -c "$ctx" -t "$THREADS" "${RL_DEV[@]}" "${RL_EXTRA[@]}" \
      >"$LOG_DIR/$tag.redlite.out" 2>"$LOG_DIR/$tag.redlite.err" || rl_ok=0
    t1=$(date +%s.%N)
    rl_ans=$(cat "$LOG_DIR/$tag.redlite.out")
    rl_pp=$(sed -n 's/.*redlite: prompt [0-9]* tokens in \([0-9.]*\) s.*/\1/p' "$LOG_DIR/$tag.redlite.err" | tail -1)
    if ((rl_ok)); then
      log "[$i/$total] redlite: prefill ${rl_pp:-?} s (whole run $(secs "$t0" "$t1") s): $(cell "$rl_ans")"
    else
      log "[$i/$total] redlite FAILED after $(secs "$t0" "$t1") s: $(tail -3 "$LOG_DIR/$tag.redlite.err" | tr '\n' ' ')"
      rl_ans="(failed)"; fail=1
    fi

    # llama.cpp's -f drops one trailing newline; the prompt ends in one
    # ("<|im_start|>assistant\n"), so its copy gets one more.
    { cat "$P"; echo; } >"$P.llama"
    log "[$i/$total] llama.cpp prefill..."
    ll_ok=1
    t0=$(date +%s.%N)
    timeout "$TIMEOUT" "$LC" -m "$MODEL" -f "$P.llama" -n "$N_GEN" --temp 0 --top-k 1 -s 0 \
      -no-cnv --no-display-prompt --verbose-prompt -c "$ctx" -t "$THREADS" "${LL_DEV[@]}" "${LL_EXTRA[@]}" \
      </dev/null >"$LOG_DIR/$tag.llama.out" 2>"$LOG_DIR/$tag.llama.err" || ll_ok=0
    t1=$(date +%s.%N)
    ll_ans=$(sed 's/ \[end of text\]$//' "$LOG_DIR/$tag.llama.out")
    # ms -> s, from "common_perf_print: prompt eval time = X ms / N tokens"
    # (lines may carry a "0.07.138.786 I " time stamp in front).
    ll_pp=$(sed -n 's/.*_perf_print: *prompt eval time = *\([0-9.]*\) ms.*/\1/p' "$LOG_DIR/$tag.llama.err" \
      | tail -1 | awk 'NF {printf "%.2f", $1 / 1000}')
    # --verbose-prompt's "  151644 -> '<|im_start|>'" lines: the ids it ran.
    sed -n "s/^\([0-9.]* [A-Z] \)\{0,1\} *\([0-9][0-9]*\) -> '.*/\2/p" "$LOG_DIR/$tag.llama.err" >"$LOG_DIR/$tag.llama.ids"
    ll_n=$(sed -n 's/.*number of tokens in prompt = \([0-9]*\).*/\1/p' "$LOG_DIR/$tag.llama.err" | tail -1)
    [[ ${ll_n:-x} == "$(wc -l <"$LOG_DIR/$tag.llama.ids")" ]] \
      || log "[$i/$total] warning: llama.cpp says ${ll_n:-?} prompt tokens, $(wc -l <"$LOG_DIR/$tag.llama.ids") id lines read"
    if ((ll_ok)); then
      log "[$i/$total] llama.cpp: prefill ${ll_pp:-?} s (whole run $(secs "$t0" "$t1") s): $(cell "$ll_ans")"
    else
      log "[$i/$total] llama.cpp FAILED after $(secs "$t0" "$t1") s: $(tail -3 "$LOG_DIR/$tag.llama.err" | tr '\n' ' ')"
      ll_ans="(failed)"; fail=1
    fi

    if cmp -s "$LOG_DIR/$tag.redlite.ids" "$LOG_DIR/$tag.llama.ids"; then
      ids="same"
    else
      ids="DIFFER ($(wc -l <"$LOG_DIR/$tag.redlite.ids") vs $(wc -l <"$LOG_DIR/$tag.llama.ids") ids)"
      log "[$i/$total] the prompt token ids differ between the engines: $LOG_DIR/$tag.{redlite,llama}.ids"
      fail=1
    fi
    a=$(printf '%s' "$rl_ans" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')
    b=$(printf '%s' "$ll_ans" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')
    if ((rl_ok && ll_ok)) && [[ $a == "$b" ]]; then same=yes; else same=NO; fail=1; fi
    rows+=("| $len | $dep% | $ntok | $npos | $ids | $(cell "$a") | $(cell "$b") | $same | $(found "$a" "$pass") / $(found "$b" "$pass") | ${rl_pp:-?} | ${ll_pp:-?} |")
    log "[$i/$total] same answer: $same; ids: $ids; row: ${rows[-1]}"
  done
done

echo
echo "Needle in a haystack, $(basename "$MODEL"), $DEVICE${gpu:+ ($gpu)}, $THREADS threads; $started-$(date -u '+%H:%M') UTC; commit $commit"
echo "CPU: ${cpu:-unknown}; greedy, $N_GEN new tokens; llama.cpp: llama-completion -no-cnv ${LL_DEV[*]} ${LL_EXTRA[*]}; redlite: generate --raw ${RL_DEV[*]} ${RL_EXTRA[*]}"
echo
echo "| length | depth | prompt tokens | needle at | prompt ids | redlite answer | llama.cpp answer | same? | passphrase found (redlite / llama.cpp) | redlite prefill s | llama.cpp prefill s |"
echo "|---:|---:|---:|---:|---|---|---|---|---|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "(logs: $LOG_DIR)"
exit "$fail"
