#!/usr/bin/env bash
# Builds and installs the Python package into .venv, then runs its tests
# (tests/python). Run scripts/setup.sh first on a fresh machine.
# The build directory (build-py/, see pyproject.toml) persists, so a reinstall
# only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "test_python: .venv missing; run scripts/setup.sh" >&2; exit 2; }
start=$(date +%s)
"$PY" -m pip install --no-build-isolation --root-user-action=ignore -q . ||
  { echo "test_python: pip install . failed" >&2; exit 1; }
echo "test_python: package installed in $(( $(date +%s) - start )) s" >&2
# Run from tests/python so `import tileattn` finds the installed package, not python/tileattn.
cd tests/python
exec "../../$PY" -m pytest -q -rs -p no:cacheprovider "$@" .
