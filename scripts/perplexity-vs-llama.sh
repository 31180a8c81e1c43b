#!/usr/bin/env bash
# Red Lite's perplexity against llama.cpp's llama-perplexity on the same
# model, texts and settings; fails when a final estimate differs by more
# than 0.5%.
#
#   scripts/perplexity-vs-llama.sh LLAMA_PERPLEXITY [MODEL] [CTX] [CHUNKS]
#
# LLAMA_PERPLEXITY: a llama-perplexity binary (docs/perplexity.md says how
# to build one; nothing of llama.cpp is in this repository). MODEL: the
# demo model by default. CTX: -c (512). CHUNKS: --chunks (all when empty).
# Texts: the GPL-3 licence text (/usr/share/common-licenses/GPL-3, on every
# Debian-family machine) and a long source file of this repository.
# REDLITE: the redlite binary (default target/release/redlite).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA="${1:?usage: $0 LLAMA_PERPLEXITY [MODEL] [CTX] [CHUNKS]}"
MODEL="${2:-$(bash scripts/fetch-demo-model.sh | tail -n 1)}"
CTX="${3:-512}"
CHUNKS="${4:-}"
REDLITE="${REDLITE:-target/release/redlite}"
THREADS="${THREADS:-$(nproc)}"
BOUND_PCT=0.5

texts=(/usr/share/common-licenses/GPL-3 crates/server/src/parse.rs)
chunk_args=()
if [ -n "$CHUNKS" ]; then chunk_args=(--chunks "$CHUNKS"); fi

final() { sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p' | tail -n 1; }

status=0
for t in "${texts[@]}"; do
  [ -f "$t" ] || { echo "missing text $t" >&2; exit 2; }
  # llama.cpp: CPU, the same context and batch, no weight repacking (its
  # AMX repack path is not what Red Lite computes, and dies on some hosts).
  l=$("$LLAMA" -m "$MODEL" -f "$t" -c "$CTX" -b "$CTX" -t "$THREADS" "${chunk_args[@]}" \
        --no-repack 2>&1 | final)
  r=$("$REDLITE" perplexity -m "$MODEL" -f "$t" -c "$CTX" -b "$CTX" -t "$THREADS" \
        "${chunk_args[@]}" 2>/dev/null | final)
  [ -n "$l" ] && [ -n "$r" ] || { echo "$t: no final estimate (llama: '$l', redlite: '$r')" >&2; exit 2; }
  read -r lp le <<<"$l"
  read -r rp re <<<"$r"
  diff=$(python3 -c "print(f'{100*abs($rp-$lp)/$lp:.3f}')")
  ok=$(python3 -c "print('ok' if abs($rp-$lp)/$lp*100 <= $BOUND_PCT else 'FAIL')")
  printf '%-40s c=%s chunks=%s  llama.cpp %s +/- %s  redlite %s +/- %s  diff %s%%  %s\n' \
    "$t" "$CTX" "${CHUNKS:-all}" "$lp" "$le" "$rp" "$re" "$diff" "$ok"
  [ "$ok" = ok ] || status=1
done
exit $status
