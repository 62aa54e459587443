#!/usr/bin/env bash
# Installs what the end-to-end run needs, each step a no-op when done:
# Debian's chromium, the Python venv for schemathesis (e2e/.venv, pinned in
# requirements.txt), the npm packages (package-lock.json), and the TypeScript
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
VENV="$E2E_DIR/.venv"
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "e2e: creating the Python venv for schemathesis"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
# Installs only when requirements.txt changed since the last install.
if ! cmp -s requirements.txt "$VENV/installed-requirements.txt"; then
  echo "e2e: pip install -r requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
  cp requirements.txt "$VENV/installed-requirements.txt"
fi

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

