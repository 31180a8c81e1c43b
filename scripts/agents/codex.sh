#!/usr/bin/env bash
# OpenAI's Codex CLI (`codex exec`, the Responses API through a custom model
# provider) against `redlite serve` on the demo model, on a small
# file-editing task. Installs Codex into a temporary directory (npm),
# prints the server's access log and the edit. Not part of CI.
#
#   bash scripts/agents/codex.sh            # REDLITE_BIN=... PORT=... to change
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"

npm install --silent --no-audit --no-fund --prefix "$WORK/npm" "@openai/codex@$CODEX_VERSION" >/dev/null
make_repo
start_server
mkdir -p "$WORK/codex-home"
cat >"$WORK/codex-home/config.toml" <<TOML
model = "demo-model"
model_provider = "redlite"

[model_providers.redlite]
name = "Red Lite"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
TOML
set +e
(cd "$REPO" && CODEX_HOME="$WORK/codex-home" OPENAI_API_KEY=unused \
  timeout "${AGENT_TIMEOUT:-1800}" "$WORK/npm/node_modules/.bin/codex" exec \
  --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --color never \
  "Add a docstring to the function in hello.py." </dev/null 2>&1 | tee "$WORK/agent.log")
echo "== codex exit status: ${PIPESTATUS[0]}"
set -e
summary
