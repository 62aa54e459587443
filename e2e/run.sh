#!/usr/bin/env bash
# End-to-end checks against a real Warden and a real Postgres:
#  1. a TypeScript client generated from the committed openapi/openapi.json
#     must compile and complete create / status / stop / resume;
#  2. the dashboard, in Debian's headless Chromium driven by Playwright, must
#     create, show, stop and resume a session live;
#  3. a real reference MCP server (@modelcontextprotocol/server-filesystem,
#     pinned in package.json) serves an `llm` session's tools, driven by a
#     fake OpenAI-compatible model (fake-model.mjs): a read runs at once, a
#     write waits for a person, who approves it with edited arguments; and
#     the same for a server on the Python SDK (FastMCP, fastmcp/server.py,
#     `mcp` pinned in fastmcp/requirements.txt), over stdio and over
#     Streamable HTTP;
#  4. the TypeScript package (clients/typescript, built by setup.sh) runs
#     its tests against the server;
#  5. Redocly's recommended lint of the document (@redocly/cli, pinned in
#     package.json; redocly.yaml), then Schemathesis (pinned in requirements.txt, settings in schemathesis.toml)
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
# The MCP server's config and the one folder it may touch.
MCP_TMP="$(mktemp -d)"
E2E_MCP_DIR="$MCP_TMP/shared"
E2E_MCP_TENANT=e2e-mcp
export E2E_MCP_DIR E2E_MCP_TENANT
# Where the FastMCP servers log each call's tool name (`py.log`, `pyweb.log`).
E2E_FASTMCP_LOGS="$MCP_TMP"
export E2E_FASTMCP_LOGS
SERVER_PID=""
FASTMCP_PID=""

cleanup() {
  status=$?
  for pid in "$SERVER_PID" "$FASTMCP_PID"; do
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [ "$status" -ne 0 ] && [ -f "$LOG" ]; then
    echo "e2e: --- last lines of the server log ---" >&2
    tail -n 60 "$LOG" >&2 || true
  fi
  psql "$ADMIN_URL" -qtAc "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORKSPACES" "$MCP_TMP"
  exit "$status"
}
trap cleanup EXIT INT TERM

psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -qtAc "CREATE DATABASE $DB_NAME" >/dev/null

PORT="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
export WARDEN_URL="http://127.0.0.1:$PORT"

# The MCP servers, all declared for one tenant only: the sessions of every
# other tenant (Schemathesis' among them) see them undeclared, as the
# committed document describes a replica with none. `fs`: the reference
# filesystem server on stdio, run from node_modules (nothing is fetched at
# run time), limited to the folder above. `py` and `pyweb`: the FastMCP
# server from its venv, on stdio and over Streamable HTTP on loopback.
mkdir -p "$E2E_MCP_DIR"
FS_SERVER="$E2E_DIR/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
[ -f "$FS_SERVER" ] || { echo "e2e: FATAL: $FS_SERVER is missing (npm ci)" >&2; exit 1; }
FASTMCP_PYTHON="$E2E_DIR/.venv-fastmcp/bin/python"
[ -x "$FASTMCP_PYTHON" ] || { echo "e2e: FATAL: $FASTMCP_PYTHON is missing (setup.sh)" >&2; exit 1; }
FASTMCP_PORT="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
MCP_FIXTURE_LOG="$E2E_FASTMCP_LOGS/pyweb.log" \
  "$FASTMCP_PYTHON" "$E2E_DIR/fastmcp/server.py" --http "$FASTMCP_PORT" >"$MCP_TMP/pyweb.out" 2>&1 &
FASTMCP_PID=$!
MCP_DIR="$E2E_MCP_DIR" MCP_TENANT="$E2E_MCP_TENANT" NODE_BIN="$(command -v node)" FS_SERVER="$FS_SERVER" \
  FASTMCP_PYTHON="$FASTMCP_PYTHON" FASTMCP_SERVER="$E2E_DIR/fastmcp/server.py" \
  FASTMCP_URL="http://127.0.0.1:$FASTMCP_PORT/mcp" \
  node -e 'const e = process.env; const only = { tenants: [e.MCP_TENANT], timeout_ms: 20000 };
    console.log(JSON.stringify({ mcpServers: {
      fs: { command: e.NODE_BIN, args: [e.FS_SERVER, e.MCP_DIR], ...only },
      py: { command: e.FASTMCP_PYTHON, args: [e.FASTMCP_SERVER],
            env: { MCP_FIXTURE_LOG: e.E2E_FASTMCP_LOGS + "/py.log" }, ...only },
      pyweb: { url: e.FASTMCP_URL, ...only } } }))' \
  >"$MCP_TMP/mcp.json"
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$FASTMCP_PORT") 2>/dev/null && break
  if ! kill -0 "$FASTMCP_PID" 2>/dev/null; then
    echo "e2e: FATAL: the FastMCP server exited during start-up:" >&2
    cat "$MCP_TMP/pyweb.out" >&2
    exit 1
  fi
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$FASTMCP_PORT") 2>/dev/null || {
  echo "e2e: FATAL: the FastMCP server is not listening on 127.0.0.1:$FASTMCP_PORT" >&2
  exit 1
}

echo "e2e: starting warden on $WARDEN_URL"
# The model endpoint is a closed port: `llm` sessions can be created (and
# fail on their first call), and `generate_criteria` answers its documented
# 503. The MCP test's session names its own fake model as `base_url`.
# Keys are required: an admin token from the environment, and an operator key
# made through the API below for the client and dashboard tests. Loopback
# is allowed as a destination: the dashboard test's webhook agent listens there.
WARDEN_ADMIN_TOKEN="e2e-admin-$(node -e 'console.log(require("crypto").randomBytes(16).toString("hex"))')"
export WARDEN_ADMIN_TOKEN
DATABASE_URL="$DB_URL" WARDEN_LISTEN_ADDR="127.0.0.1:$PORT" WARDEN_WORKSPACE_ROOT="$WORKSPACES" \
  WARDEN_LLM_BASE_URL="http://127.0.0.1:9/v1" WARDEN_LLM_MODEL=e2e WARDEN_LLM_MAX_RETRIES=0 \
  WARDEN_EGRESS_ALLOW=127.0.0.1 WARDEN_MCP_CONFIG="$MCP_TMP/mcp.json" WARDEN_MODEL_PRICES='*=1/2' \
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

echo "e2e: node --test (generated client, dashboard in Chromium, real MCP servers)"
node --test --test-concurrency=1 dist/client.test.js dashboard.test.mjs mcp.test.mjs

echo "e2e: the TypeScript package clients/typescript against the server"
(cd "$ROOT/clients/typescript" && node --test dist/test/)

echo "e2e: Redocly's recommended lint of the committed openapi/openapi.json"
# Config in redocly.yaml, known exceptions (with reasons) in .redocly.lint-ignore.yaml;
# no telemetry or update check (CI has no internet but the registries).
(cd "$ROOT" && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  "$E2E_DIR/node_modules/.bin/redocly" lint --format stylish openapi/openapi.json)

echo "e2e: schemathesis against the committed openapi/openapi.json"
# NUL is left out of generated strings: the document says with patterns that
# no string or key may hold one (Postgres cannot store it; NulFreeJson for
# free-form data), and the run looks for other faults.
"$VENV/bin/schemathesis" --config-file schemathesis.toml run ../openapi/openapi.json \
  --url "$WARDEN_URL" --header "Authorization: Bearer $WARDEN_ADMIN_TOKEN" --checks all --max-examples "${SCHEMATHESIS_EXAMPLES:-30}" \
  ${SCHEMATHESIS_SEED:+--seed "$SCHEMATHESIS_SEED"} --request-timeout 10 \
  --generation-allow-x00 false --generation-database none --suppress-health-check all \
  --max-failures 20 --no-color
echo "e2e: passed; screenshots in $E2E_DIR/screenshots"
