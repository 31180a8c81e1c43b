#!/usr/bin/env bash
# pi (`@mariozechner/pi-coding-agent`, print mode) against `redlite serve`'s
# OpenAI-compatible chat endpoint on the demo model, with pi's default
# settings: a models.json that names only the base URL, the API kind and the
# model id. Installs pi into a temporary directory (npm), prints the
# server's access log and the edit. Not part of CI.
#
#   bash scripts/agents/pi.sh               # REDLITE_BIN=... PORT=... to change
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PI_VERSION="${PI_VERSION:-0.73.1}"

npm install --silent --no-audit --no-fund --prefix "$WORK/npm" \
  "@mariozechner/pi-coding-agent@$PI_VERSION" >/dev/null
make_repo
start_server
export PI_CODING_AGENT_DIR="$WORK/pi-agent"
mkdir -p "$PI_CODING_AGENT_DIR"
cat >"$PI_CODING_AGENT_DIR/models.json" <<JSON
{
  "providers": {
    "redlite": {
      "baseUrl": "http://127.0.0.1:$PORT/v1",
      "api": "openai-completions",
      "apiKey": "unused",
      "models": [{ "id": "demo-model" }]
    }
  }
}
JSON
set +e
(cd "$REPO" && timeout "${AGENT_TIMEOUT:-1800}" "$WORK/npm/node_modules/.bin/pi" \
  --provider redlite --model demo-model \
  -p "Add a docstring to the function in hello.py." </dev/null 2>&1 | tee "$WORK/agent.log")
echo "== pi exit status: ${PIPESTATUS[0]}"
set -e
summary
