# Shared by the agent runs: start `redlite serve` with its defaults on the
# demo model, make a scratch git repository with the task's file, and
# summarise the server's access log at the end. Sourced, not run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REDLITE="${REDLITE_BIN:-$ROOT/target/release/redlite}"
MODEL="${REDLITE_DEMO_MODEL:-$(bash "$ROOT/scripts/fetch-demo-model.sh" | tail -1)}"
PORT="${PORT:-18123}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/redlite-agent.XXXXXX")"
SERVER_LOG="$WORK/server.log"
REPO="$WORK/repo"

[ -x "$REDLITE" ] || { echo "no redlite binary at $REDLITE (cargo build --release -p redlite-cli, or set REDLITE_BIN)" >&2; exit 1; }

start_server() {
  # The defaults (no -c: the trained context as far as memory allows):
  # what an agent user gets.
  REDLITE_LOG=info "$REDLITE" serve -m "$MODEL" --port "$PORT" --alias demo-model \
    >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "the server did not come up:" >&2
  cat "$SERVER_LOG" >&2
  exit 1
}

make_repo() {
  mkdir -p "$REPO"
  cd "$REPO"
  git init -q .
  printf 'def greet(name):\n    return "Hello, " + name\n' >hello.py
  git add hello.py
  git -c user.email=agent@example.com -c user.name=agent commit -qm "hello.py"
  cd - >/dev/null
}

summary() {
  echo "== server start-up"
  sed 's/\x1b\[[0-9;]*m//g' "$SERVER_LOG" | grep -E "context:|memory plan" | sed 's/^.*INFO [a-z_:]*: //'
  echo "== requests (access log: method path status, count)"
  sed 's/\x1b\[[0-9;]*m//g' "$SERVER_LOG" | grep -oE "(GET|POST|OPTIONS) [^ ]+ [0-9]{3}" | sort | uniq -c
  echo "== each request"
  sed 's/\x1b\[[0-9;]*m//g' "$SERVER_LOG" | grep -E "(GET|POST) /" | sed 's/^.*INFO [a-z_:]*: //'
  echo "== the edit (git diff of the scratch repository)"
  (cd "$REPO" && git --no-pager diff --stat && git --no-pager diff)
  if grep -qE '"""|'"'''" "$REPO/hello.py"; then echo "RESULT: hello.py has a docstring"; else echo "RESULT: hello.py has no docstring"; fi
  echo "(work dir: $WORK)"
}
