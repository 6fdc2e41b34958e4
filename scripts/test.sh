#!/usr/bin/env bash
# The whole test suite, from nothing: creates .venv, installs every package in the repo
# (core + every plugin, editable) and the dev tools, installs the test servers pip does
# not bring (scripts/services.sh), then runs ruff, mypy, the per-distribution wheel check
# (scripts/check_wheels.sh) and pytest, in HEADRACE_TEST_WORKERS worker processes (default 2;
# tests/conftest.py says which tests share a worker). Extra arguments go to pytest (`-n 0`
# runs it in one process); the exit status is pytest's, or 1 when the wheel check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
bash scripts/services.sh
echo "== ruff"; "$VENV/bin/ruff" check .
echo "== mypy"; "$VENV/bin/mypy" core/src $(ls -d plugins/*/src examples/*/src 2>/dev/null) bench tests $(ls -d examples/*/tests 2>/dev/null)
set +e
bash scripts/check_wheels.sh
wheels_rc=$?
echo "== pytest"
"$VENV/bin/python" -m pytest -n "${HEADRACE_TEST_WORKERS:-2}" --dist loadscope "$@"
rc=$?
set -e
if [ $rc -eq 0 ] && [ $wheels_rc -ne 0 ]; then
  echo "== the tests passed but the wheel check failed (scripts/check_wheels.sh, above)" >&2
  rc=1
fi
exit $rc
