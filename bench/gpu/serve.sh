#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: `redlite serve --device cuda` on a synth file,
# measured with the official openai client (bench/gpu/serve_bench.py,
# wheels carried in .bench-wheels), with and without prompt reuse, and
# `bench model` on the same file for the decode comparison.
#
# Prepare here:  the release binary in .bench-bin (see cuda.sh) and
#                pip download openai==3.51.0 --python-version 3.12 \
#                  --platform manylinux2014_x86_64 --only-binary=:all: -d .bench-wheels
# Then:          run(command="bash bench/gpu/serve.sh", carry=[".bench-bin", ".bench-wheels"])
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LAYOUT="${LAYOUT:-iq2}"
CTX="${CTX:-8192}"
exec > >(tee -a "$OUT/serve.log") 2>&1
PY="$WORK/py"
[[ -d $PY ]] || python3 -m pip install -q --no-index --find-links .bench-wheels --target "$PY" openai
M=$(synth_file "$LAYOUT")
port=18080
for mode in ${MODES:-reuse no-reuse}; do
  extra=""; [[ $mode == no-reuse ]] && extra=--no-prompt-cache
  "$R" serve -m "$M" --device cuda -c "$CTX" --port $port $extra > "$OUT/serve-$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  grep -E "memory plan|cuda:|prompt cache" "$OUT/serve-$mode.log" | head -5
  PYTHONPATH="$PY" timeout 400 python3 bench/gpu/serve_bench.py "http://127.0.0.1:$port/v1" "$mode" \
    --repeats "${REPEATS:-2}"
  kill $pid; wait $pid 2>/dev/null
done
echo "== bench model, same file, depth 0 (decode after a short prompt, as the server's)"
timeout 200 "$R" bench model -m "$M" --device cuda -p 0 -n 256 -d 0 -r 3 2>&1 | grep -E "^\| qwen|memory plan"
