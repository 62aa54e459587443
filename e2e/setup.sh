#!/usr/bin/env bash
# Installs what the end-to-end run needs, each step a no-op when done:
# Debian's chromium, the Python venvs for schemathesis (e2e/.venv, pinned in
# requirements.txt) and for the Python SDK's MCP server (e2e/.venv-fastmcp,
# fastmcp/requirements.txt), the npm packages (package-lock.json), and the TypeScript
# client generated from the committed openapi/openapi.json. run.sh calls it;
# CI also starts it early, beside the build.
set -euo pipefail
cd "$(dirname "$0")"
E2E_DIR="$(pwd)"

CHROMIUM_PATH="${CHROMIUM_PATH:-/usr/bin/chromium}"
export CHROMIUM_PATH

if [ ! -x "$CHROMIUM_PATH" ]; then
  echo "e2e: installing Debian's chromium"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
"$CHROMIUM_PATH" --version

PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
# Makes the venv $1 (when it has no pip) and installs into it the pinned
# requirements file $2, only when that file changed since the last install.
python_venv() {
  local venv=$1 requirements=$2
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "e2e: creating the Python venv $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
  fi
  if ! cmp -s "$requirements" "$venv/installed-requirements.txt"; then
    echo "e2e: pip install -r $requirements (into $venv)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/installed-requirements.txt"
  fi
}
# Schemathesis.
python_venv "$E2E_DIR/.venv" requirements.txt
# The Python SDK's MCP server (fastmcp/server.py; the `mcp` package needs 3.10+).
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "e2e: $PYTHON is older than Python 3.10 (the mcp package needs 3.10+)" >&2
  exit 1
fi
python_venv "$E2E_DIR/.venv-fastmcp" fastmcp/requirements.txt

# Installs only when package-lock.json changed since the last install (npm
# ci alone removes and reinstalls node_modules every time).
if ! cmp -s package-lock.json node_modules/.installed-package-lock.json; then
  echo "e2e: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.installed-package-lock.json
fi

echo "e2e: generating the TypeScript client types from openapi/openapi.json"
npx --no-install openapi-typescript ../openapi/openapi.json -o generated/schema.d.ts
npx --no-install tsc -p tsconfig.json


# The TypeScript package (clients/typescript): its own pinned packages, then
# its build (types generated from the same document, tsc). run.sh tests it.
TS_CLIENT="$E2E_DIR/../clients/typescript"
if ! cmp -s "$TS_CLIENT/package-lock.json" "$TS_CLIENT/node_modules/.installed-package-lock.json"; then
  echo "e2e: npm ci (clients/typescript)"
  (cd "$TS_CLIENT" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$TS_CLIENT/package-lock.json" "$TS_CLIENT/node_modules/.installed-package-lock.json"
fi
echo "e2e: building the TypeScript package clients/typescript"
(cd "$TS_CLIENT" && npm run --silent build)
