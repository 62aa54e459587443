#!/usr/bin/env bash
# End to end for the Python client and the LangGraph worker: a real warden
# (WARDEN_BIN, else built here with cargo), a fake OpenAI-compatible model
# (e2e/fake_openai.py) and examples/langgraph_worker.py as processes. Checks
# that a session completes, that a stop interrupts the worker mid-step, and
# that a SIGKILLed worker's task is re-offered and completed once.
# Runs on the embedded store, or with DATABASE_URL on a database of its own
# that it creates on that server and drops after.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$ROOT"

VENV="$(clients/python/setup-venv.sh)"
if [ -z "${WARDEN_BIN:-}" ]; then
  echo "python e2e: building warden"
  cargo build --locked --bin warden
  WARDEN_BIN="$ROOT/target/debug/warden"
fi
export WARDEN_BIN

DB_NAME=""
cleanup() {
  if [ -n "$DB_NAME" ]; then
    psql "$ADMIN_URL" -qtAc "DROP DATABASE IF EXISTS $DB_NAME WITH (FORCE)" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
if [ -n "${DATABASE_URL:-}" ]; then
  ADMIN_URL="$DATABASE_URL"
  DB_NAME="warden_py_e2e_$$"
  psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -qtAc "CREATE DATABASE $DB_NAME" >/dev/null
  export DATABASE_URL="${ADMIN_URL%/*}/$DB_NAME"
  echo "python e2e: on Postgres ($DB_NAME)"
else
  echo "python e2e: on the embedded store"
fi

cd clients/python
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m e2e e2e "$@"
