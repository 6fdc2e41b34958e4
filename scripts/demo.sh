#!/usr/bin/env bash
# The demo, from nothing: creates .venv with headrace and its plugins, writes JSON files to
# .demo/input, and ingests them into the Delta table .demo/orders with `headrace run`
# (cloudFiles -> transform -> delta, trigger availableNow). Then a second delivery of files
# arrives and a second run ingests only those. No server needed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
rm -rf .demo
python examples/demo/make_data.py .demo/input --files 20 --rows 500
echo "== first run"
headrace run examples/demo/pipeline.toml
python examples/demo/show.py .demo/orders
python examples/demo/make_data.py .demo/input --files 5 --rows 500 --start 20
echo "== second run: only the 5 new files"
headrace run examples/demo/pipeline.toml
python examples/demo/show.py .demo/orders
