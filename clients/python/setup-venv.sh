#!/usr/bin/env bash
# Makes the Python venv the client's checks use (target/python-venv, or
# $WARDEN_PY_VENV) and installs into it, from PyPI, the pinned packages of
# clients/python/requirements-dev.txt and examples/requirements.txt, then the
# client itself (pip install ./clients/python). Installs again only when a
# requirements file changed. Prints the venv's path last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${WARDEN_PY_VENV:-$ROOT/target/python-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
REQUIREMENTS=("$ROOT/clients/python/requirements-dev.txt" "$ROOT/examples/requirements.txt")

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup-venv: $PYTHON is older than Python 3.11" >&2
  exit 1
fi
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "setup-venv: creating $VENV with $("$PYTHON" --version)" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/installed-requirements.txt"
if ! cat "${REQUIREMENTS[@]}" | cmp -s - "$STAMP"; then
  echo "setup-venv: pip install -r ${REQUIREMENTS[*]#$ROOT/}" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "${REQUIREMENTS[0]}" -r "${REQUIREMENTS[1]}" >&2
  cat "${REQUIREMENTS[@]}" >"$STAMP"
fi
# The client itself, as users install it (its one dependency is pinned above).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-deps --no-build-isolation --force-reinstall "$ROOT/clients/python" >&2
echo "$VENV"
