#!/usr/bin/env bash
# End-to-end checks against a real Warden and a real Postgres:
#  1. a TypeScript client generated from the committed openapi/openapi.json
#     must compile and complete create / status / stop / resume;
#  2. the dashboard, in Debian's headless Chromium driven by Playwright, must
#     create, show, stop and resume a session live;
#  3. Schemathesis (pinned in requirements.txt, settings in schemathesis.toml)
#     runs every operation of the committed document against the server with
#     all checks, a bounded number of examples and stateful links: 0 failures.
# Installs what it needs (Chromium from Debian, packages from npm, a Python
# venv in e2e/.venv from PyPI), starts its own server on a free port against a
# database it creates, and cleans up. SCHEMATHESIS_EXAMPLES (default 30) and
# SCHEMATHESIS_SEED tune the fuzzing run.
set -euo pipefail
cd "$(dirname "$0")"
E2E_DIR="$(pwd)"
ROOT="$(cd .. && pwd)"

ADMIN_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
# Chromium, the schemathesis venv, npm packages, the generated client.
./setup.sh
CHROMIUM_PATH="${CHROMIUM_PATH:-/usr/bin/chromium}"
export CHROMIUM_PATH
VENV="$E2E_DIR/.venv"

echo "e2e: building warden"
(cd "$ROOT" && cargo build --locked --bin warden)

DB_NAME="warden_e2e_$$"
DB_URL="${ADMIN_URL%/*}/$DB_NAME"
WORKSPACES="$(mktemp -d)"
LOG="$WORKSPACES/warden.log"
SERVER_PID=""

cleanup() {
  status=$?
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ -f "$LOG" ]; then
    echo "e2e: --- last lines of the server log ---" >&2
    tail -n 60 "$LOG" >&2 || true
  fi
  psql "$ADMIN_URL" -qtAc "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORKSPACES"
  exit "$status"
}
trap cleanup EXIT INT TERM

psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -qtAc "CREATE DATABASE $DB_NAME" >/dev/null

PORT="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
export WARDEN_URL="http://127.0.0.1:$PORT"

echo "e2e: starting warden on $WARDEN_URL"
# The model endpoint is a closed port: `llm` sessions can be created (and
# fail on their first call), and `generate_criteria` answers its documented 503.
# Keys are required: an admin token from the environment, and an operator key
# made through the API below for the client and dashboard tests. Loopback
# is allowed as a destination: the dashboard test's webhook agent listens there.
WARDEN_ADMIN_TOKEN="e2e-admin-$(node -e 'console.log(require("crypto").randomBytes(16).toString("hex"))')"
export WARDEN_ADMIN_TOKEN
DATABASE_URL="$DB_URL" WARDEN_LISTEN_ADDR="127.0.0.1:$PORT" WARDEN_WORKSPACE_ROOT="$WORKSPACES" \
  WARDEN_LLM_BASE_URL="http://127.0.0.1:9/v1" WARDEN_LLM_MODEL=e2e WARDEN_LLM_MAX_RETRIES=0 \
  WARDEN_EGRESS_ALLOW=127.0.0.1 \
  WARDEN_LOG_FORMAT=json RUST_LOG="${RUST_LOG:-warden=info}" \
  "$ROOT/target/debug/warden" >"$LOG" 2>&1 &
SERVER_PID=$!

for _ in $(seq 1 100); do
  if curl -fsS "$WARDEN_URL/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "e2e: FATAL: warden exited during start-up" >&2
    exit 1
  fi
  sleep 0.1
done
curl -fsS "$WARDEN_URL/readyz" >/dev/null

echo "e2e: creating an operator key through POST /api/keys"
WARDEN_KEY="$(curl -fsS -X POST "$WARDEN_URL/api/keys" -H "authorization: Bearer $WARDEN_ADMIN_TOKEN" \
  -H 'content-type: application/json' -d '{"tenant":"e2e","role":"operator"}' \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).secret))')"
export WARDEN_KEY

echo "e2e: node --test (generated client, dashboard in Chromium)"
node --test --test-concurrency=1 dist/client.test.js dashboard.test.mjs

echo "e2e: schemathesis against the committed openapi/openapi.json"
# NUL is left out of generated strings: the document says (422 InvalidBody)
# that Postgres cannot store it, which no JSON Schema keyword expresses.
"$VENV/bin/schemathesis" --config-file schemathesis.toml run ../openapi/openapi.json \
  --url "$WARDEN_URL" --header "Authorization: Bearer $WARDEN_ADMIN_TOKEN" --checks all --max-examples "${SCHEMATHESIS_EXAMPLES:-30}" \
  ${SCHEMATHESIS_SEED:+--seed "$SCHEMATHESIS_SEED"} --request-timeout 10 \
  --generation-allow-x00 false --generation-database none --suppress-health-check all \
  --max-failures 20 --no-color
echo "e2e: passed; screenshots in $E2E_DIR/screenshots"
