#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: state files from and into the CUDA backend
# (issue 22, item 3), checked and timed in one call (about 3 minutes, most
# of it writing the synth file and prefilling 32K positions).
#
# Prepare here:  cargo build --release -p redlite-cli --features cuda
#                mkdir -p .bench-bin && strip -o .bench-bin/redlite target/release/redlite
# Then, on the GPU machine with .bench-bin copied over: bash bench/gpu/state.sh
#
# Steps (STEPS, default "handoff serve big", in the order given):
#   handoff  on each tiny fixture (q8_0, q4_k_m, iq2_xxs): greedy ids of a
#            straight run on cuda and on cpu; a state saved after the prompt
#            on cuda and loaded on cuda and on cpu; one saved on cpu and
#            loaded on cuda. Each continuation is compared with the straight
#            run of the backend that continues it. The pairing is the one
#            `redlite parity` checks: cuda with f32 activations and f32 KV,
#            cpu on the reference path (REDLITE_REFERENCE=f32). A
#            same-backend continuation must match exactly; a cross-backend
#            one must match up to where the two backends' straight runs part
#            (small margins). Then, on the fixtures in FAST (default q8_0),
#            the fast path (int8 activations, f16 KV): saved and loaded on
#            cuda against its straight run, and the cpu refusing the f16
#            file.
#   serve    `serve --device cuda --state-dir` on the q8_0 fixture: a
#            prompt's state saved, the server stopped, a new one on the same
#            directory answering a longer prompt must restore the saved state
#            (its log, usage cached_tokens) and answer as a server that never
#            restarted.
#   big      the iq2 synth file (80B shapes): a BIG-position prompt (default
#            32768) prefilled on the GPU and saved (f16 KV), then loaded:
#            seconds, bytes and MB/s of each. The file goes to STATE_DIR
#            (default $WORK, which is /dev/shm: memory, not a disk).
# DEV=cpu runs the handoff and serve steps' cuda runs on the cpu (a dry run where
# there is no GPU). Result lines start with "RESULT"; everything is logged
# to $OUT/state.log.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
F=tests/fixtures/qwen3next
DEV="${DEV:-cuda}"
N="${N:-16}"
BIG="${BIG:-32768}"
STATE_DIR="${STATE_DIR:-$WORK}"
FAST="${FAST:-q8_0}"
exec > >(tee -a "$OUT/state.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
fail=0
ERR="$WORK/state.err"

# The prompt of the tiny runs: 16 ids, (i * 37 + 11) % 512.
P=""
for i in $(seq 0 15); do P+="$(( (i * 37 + 11) % 512 )),"; done
P=${P%,}

# gen KIND MODEL ARGS...: greedy ids (a JSON array) on stdout. KIND: cpu
# (reference path), gpu (cuda, f32 activations and KV), fast (cuda, int8
# activations, f16 KV).
gen() {
  local kind=$1 m=$2; shift 2
  local dev=(--device "$DEV")
  case $kind in
    cpu) REDLITE_REFERENCE=f32 timeout 120 "$R" generate -m "$m" --reference --temp 0 --print-ids \
           -c 64 --no-warmup "$@" 2>>"$ERR" ;;
    gpu) [[ $DEV == cpu ]] && dev=()
         REDLITE_REFERENCE=f32 timeout 120 "$R" generate -m "$m" "${dev[@]}" --reference \
           ${dev:+--f32-activations --kv-type f32} --temp 0 --print-ids -c 64 --no-warmup "$@" 2>>"$ERR" ;;
    fast) [[ $DEV == cpu ]] && dev=()
          timeout 120 "$R" generate -m "$m" "${dev[@]}" --temp 0 --print-ids -c 64 --no-warmup "$@" 2>>"$ERR" ;;
  esac
}

# first_diff A B: the index of the first differing id of two JSON arrays
# (their length when one is a prefix of the other; -1 when equal).
first_diff() {
  local -a a b
  IFS=, read -ra a <<< "$(tr -d '[] \n' <<< "$1")"
  IFS=, read -ra b <<< "$(tr -d '[] \n' <<< "$2")"
  local n=${#a[@]} i
  (( ${#b[@]} < n )) && n=${#b[@]}
  for (( i = 0; i < n; i++ )); do
    [[ ${a[i]} == "${b[i]}" ]] || { echo "$i"; return; }
  done
  (( ${#a[@]} == ${#b[@]} )) && echo -1 || echo "$n"
}

# check NAME LOADED STRAIGHT ALLOWED: RESULT line; ALLOWED is the index
# from which a difference is tolerated (-1: none is).
check() {
  local name=$1 got=$2 want=$3 allowed=$4 d
  d=$(first_diff "$got" "$want")
  if [[ -z $got || -z $want ]]; then
    echo "RESULT $name: FAIL (no ids: see $ERR)"; fail=1
  elif (( d == -1 )); then
    echo "RESULT $name: match ($(tr -d '[] \n' <<< "$got" | tr , ' ' | wc -w) tokens)"
  elif (( allowed >= 0 && d >= allowed )); then
    echo "RESULT $name: differ at token $d, where the straight cuda and cpu runs part too (margin)"
  else
    echo "RESULT $name: FAIL: differ at token $d: $got vs $want"; fail=1
  fi
}

handoff() {
  local q=$1 m="$F/tiny-qwen3next-$1.gguf" t0=$SECONDS
  local sg sc lgg lgc lcg part
  : > "$ERR"
  sg=$(gen gpu "$m" --prompt-ids "$P" -n "$N")
  sc=$(gen cpu "$m" --prompt-ids "$P" -n "$N")
  part=$(first_diff "$sg" "$sc")
  echo "straight $q: cuda $sg"
  echo "straight $q: cpu  $sc (first difference: $part)"
  gen gpu "$m" --prompt-ids "$P" -n 0 --save-state "$WORK/$q-gpu.state" > /dev/null || fail=1
  gen cpu "$m" --prompt-ids "$P" -n 0 --save-state "$WORK/$q-cpu.state" > /dev/null || fail=1
  lgg=$(gen gpu "$m" --load-state "$WORK/$q-gpu.state" -n "$N")
  lgc=$(gen cpu "$m" --load-state "$WORK/$q-gpu.state" -n "$N")
  lcg=$(gen gpu "$m" --load-state "$WORK/$q-cpu.state" -n "$N")
  check "$q saved on cuda, loaded on cuda" "$lgg" "$sg" -1
  check "$q saved on cuda, loaded on cpu" "$lgc" "$sc" "$part"
  check "$q saved on cpu, loaded on cuda" "$lcg" "$sg" "$part"
  # The fast path: f16 KV rows (the export code is the same whatever the
  # weights' format, so by default on one fixture only: FAST).
  local sf lf msg
  if [[ " $FAST " != *" $q "* ]]; then
    grep -h "state saved\|state loaded" "$ERR" | sed 's/^/    /' | head -3
    echo "($q: $((SECONDS - t0)) s)"
    return
  fi
  sf=$(gen fast "$m" --prompt-ids "$P" -n "$N")
  gen fast "$m" --prompt-ids "$P" -n 0 --save-state "$WORK/$q-fast.state" > /dev/null || fail=1
  lf=$(gen fast "$m" --load-state "$WORK/$q-fast.state" -n "$N")
  check "$q fast path (int8, f16 KV) saved and loaded on cuda" "$lf" "$sf" -1
  if [[ $DEV == cuda ]]; then
    if gen cpu "$m" --load-state "$WORK/$q-fast.state" -n 1 > /dev/null; then
      echo "RESULT $q f16 state on the cpu: FAIL: accepted"; fail=1
    else
      msg=$(grep -o "KV rows are f16[^)]*)" "$ERR" | tail -1)
      echo "RESULT $q f16 state on the cpu: refused (${msg:-see $ERR})"
      [[ -n $msg ]] || fail=1
    fi
  fi
  grep -h "state saved\|state loaded" "$ERR" | sed 's/^/    /' | head -3
  echo "($q: $((SECONDS - t0)) s)"
}

# serve_start LOG ARGS...: a server on $PORT (its pid in $SPID), up.
PORT="${PORT:-18093}"
serve_start() {
  local log=$1; shift
  local dev=(--device "$DEV")
  [[ $DEV == cpu ]] && dev=()
  "$R" serve -m "$F/tiny-qwen3next-q8_0.gguf" "${dev[@]}" -c 256 --port "$PORT" --no-warmup "$@" > "$log" 2>&1 &
  SPID=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0; sleep 0.5; done
  echo "the server did not come up:"; tail -5 "$log"; return 1
}
serve_stop() { kill "$SPID"; wait "$SPID" 2> /dev/null; }
# complete PROMPT N: "text<TAB>cached tokens" of a greedy N-token completion.
complete() {
  local body
  body=$(python3 -c 'import json, sys; print(json.dumps({"model": "m", "prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "temperature": 0}))' "$1" "$2")
  curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d "$body" |
    python3 -c 'import json, sys; v = json.load(sys.stdin); print(v["choices"][0]["text"] + "\t" + str(v["usage"]["prompt_tokens_details"]["cached_tokens"]))'
}

for s in ${STEPS:-handoff serve big}; do
  case $s in
    handoff)
      echo "== handoff ($DEV / cpu), $N greedy tokens after a 16-token prompt"
      for q in q8_0 q4_k_m iq2_xxs; do handoff "$q"; done ;;
    serve)
      echo "== serve ($DEV) --state-dir across a restart, q8_0 fixture"
      D="$WORK/serve-states"; rm -rf "$D"; mkdir -p "$D"
      p1="The quick brown fox jumps over the lazy dog. One two three four five six seven"
      t0=$SECONDS
      if serve_start "$WORK/serve1.log" --state-dir "$D"; then
        # One token: nothing generated is fed back, so the saved state is
        # the prompt's, which the longer prompt below begins with.
        a1=$(complete "$p1" 1); serve_stop
        p2="$p1 eight nine ten and then"
        n=$(ls "$D" | wc -l)
        serve_start "$WORK/serve2.log" --state-dir "$D" && { a2=$(complete "$p2" 8); serve_stop; }
        # A server that never restarted: the same two requests, the first
        # prompt's state kept in memory (the same computation as restored).
        serve_start "$WORK/serve3.log" && { complete "$p1" 1 > /dev/null; a3=$(complete "$p2" 8); serve_stop; }
        restored=$(grep -o "restored [0-9]* prompt tokens[^\"]*" "$WORK/serve2.log" | head -1)
        echo "    first answer: ${a1%$'\t'*}"
        echo "    after the restart: ${a2%$'\t'*} (cached ${a2##*$'\t'}; $n state files; ${restored:-nothing restored})"
        echo "    a server that never restarted: ${a3%$'\t'*}"
        if [[ -n $restored && ${a2##*$'\t'} -gt 0 && -n ${a3%$'\t'*} && ${a2%$'\t'*} == "${a3%$'\t'*}" ]]; then
          echo "RESULT serve --state-dir on $DEV: restored after a restart (${restored}), answer as a server that never restarted"
        else
          echo "RESULT serve --state-dir on $DEV: FAIL"; fail=1
          grep -h "state-dir" "$WORK"/serve[12].log | tail -5
        fi
      else
        fail=1
      fi
      echo "(serve: $((SECONDS - t0)) s)" ;;
    big)
      M=$(synth_file iq2)
      echo "== big: iq2 synth file, a $BIG-position state (f16 KV) saved and loaded on cuda, file in $STATE_DIR"
      # 2-digit ids: the single argument stays under the kernel's 128 KiB limit.
      IDS=$(awk -v n="$BIG" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 10 + (i * 7919) % 90 }')
      ST="$STATE_DIR/big-$BIG.state"
      rm -f "$ST"
      t0=$SECONDS
      timeout 300 "$R" generate -m "$M" --device cuda --prompt-ids "$IDS" -n 0 -c $((BIG + 64)) \
        --temp 0 --no-warmup --save-state "$ST" > /dev/null 2> "$WORK/big-save.err" || { fail=1; tail -5 "$WORK/big-save.err"; }
      echo "(save run: $((SECONDS - t0)) s)"
      grep -E "prompt [0-9]+ tokens|state saved" "$WORK/big-save.err" | sed 's/^/    /'
      t0=$SECONDS
      ids=$(timeout 300 "$R" generate -m "$M" --device cuda -n 4 -c $((BIG + 64)) --temp 0 --print-ids \
        --no-warmup --load-state "$ST" 2> "$WORK/big-load.err") || { fail=1; tail -5 "$WORK/big-load.err"; }
      echo "(load run: $((SECONDS - t0)) s; 4 tokens after the state: $ids)"
      grep -E "state loaded" "$WORK/big-load.err" | sed 's/^/    /'
      save=$(grep -o "state saved.*" "$WORK/big-save.err")
      load=$(grep -o "state loaded.*" "$WORK/big-load.err")
      if [[ -n $save && -n $load ]]; then
        awk -v s="$save" -v l="$load" 'BEGIN {
          # saved: "... N positions, B bytes in T s (checkpoint and export X s, write Y s)"
          na = split(s, a, " "); for (i = 1; i <= na; i++) {
            if (a[i + 1] == "positions,") pos = a[i]
            if (a[i + 1] == "bytes") bytes = a[i]
            if (a[i] == "in" && a[i + 2] == "s") ts = a[i + 1]
            if (a[i] == "export") te = a[i + 1]
            if (a[i] == "write") tw = a[i + 1]
          }
          # loaded: "... B bytes, read in R s, restored in S s (import into the cuda backend X s)"
          nb = split(l, b, " "); for (i = 1; i <= nb; i++) {
            if (b[i] == "read") tr = b[i + 2]
            if (b[i] == "restored") tl = b[i + 2]
            if (b[i] == "backend") ti = b[i + 1]
          }
          mb = bytes / 1e6
          printf "RESULT big save: %d positions, %d bytes, %.3f s (checkpoint + device-to-host export %.3f s, file write %.3f s), %.0f MB/s\n", pos, bytes, ts, te, tw, mb / ts
          printf "RESULT big load: %.3f s (file read and checks %.3f s, host-to-device import + restore %.3f s, import %.3f s), %.0f MB/s\n", tr + tl, tr, tl, ti, mb / (tr + tl)
        }'
      else
        echo "RESULT big: FAIL (no save or load line)"; fail=1
      fi
      rm -f "$ST" ;;
    *) echo "unknown step $s"; fail=1 ;;
  esac
done
exit $fail
