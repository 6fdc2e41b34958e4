#!/usr/bin/env bash
# The whole test suite, from nothing: creates .venv, installs every package in the repo
# (core + every plugin, editable) and the dev tools, installs the test servers pip does
# not bring (scripts/services.sh), then runs ruff, mypy and pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
bash scripts/services.sh
echo "== ruff"; "$VENV/bin/ruff" check .
echo "== mypy"; "$VENV/bin/mypy" core/src $(ls -d plugins/*/src 2>/dev/null)
echo "== pytest"
set +e
"$VENV/bin/python" -m pytest "$@"
rc=$?
set -e
exit $rc
