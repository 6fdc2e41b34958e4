#!/usr/bin/env bash
# The demo, from nothing: creates its own small virtualenv .venv-demo holding only what the demo
# needs (the core, cloudfiles and delta; editable, so it runs this checkout's code), writes JSON
# files to .demo/input, and ingests them into the Delta table .demo/orders with `headrace run`
# (cloudFiles -> transform -> delta, trigger availableNow). Then a second delivery of files
# arrives and a second run ingests only those. No server needed. The test tooling (pyspark,
# ruff, mypy, moto) lives in .venv, made by scripts/test.sh; the demo does not need it.
# Env: HEADRACE_DEMO_VENV (default .venv-demo).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s.%N)
VENV=${HEADRACE_DEMO_VENV:-.venv-demo}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY=$(command -v python3.11 || command -v python3)
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
# re-running is cheap: the install is redone only when one of the three pyproject files changed
stamp=$(cat core/pyproject.toml plugins/cloudfiles/pyproject.toml plugins/delta/pyproject.toml | cksum)
if [ "$(cat "$VENV/.headrace-demo-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "== installing the core, cloudfiles and delta into $VENV"
  pip_log=$(mktemp)
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e core -e plugins/cloudfiles -e plugins/delta >"$pip_log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$pip_log" >&2
    echo "pip install failed" >&2
    exit 1
  fi
  rm -f "$pip_log"
  echo "$stamp" >"$VENV/.headrace-demo-stamp"
fi
export PATH="$VENV/bin:$PATH"
ready=$(date +%s.%N)
rm -rf .demo
python examples/demo/make_data.py .demo/input --files 20 --rows 500
echo "== first run"
headrace run examples/demo/pipeline.toml
python examples/demo/show.py .demo/orders
python examples/demo/make_data.py .demo/input --files 5 --rows 500 --start 20
echo "== second run: only the 5 new files"
headrace run examples/demo/pipeline.toml
python examples/demo/show.py .demo/orders
done=$(date +%s.%N)
awk -v s="$started" -v r="$ready" -v d="$done" \
  'BEGIN { printf "== demo took %.1f s (%.1f s setting up %s, %.1f s running)\n", d - s, r - s, "the virtualenv", d - r }'
