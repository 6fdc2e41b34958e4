# Sourced by scripts/test.sh and scripts/demo.sh: make sure .venv exists and holds every
# package of the repo (core + every plugin, editable) and the dev tools. Re-running is cheap.
VENV=${HEADRACE_VENV:-.venv}
PY=$(command -v python3.11 || command -v python3)
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $PY"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
pkgs=(-e "core[spark,sql,rocksdb,pipelines,ui]")
for d in plugins/*/; do
  d=${d%/}
  [ -f "$d/pyproject.toml" ] || continue
  # a plugin's optional client libraries (extra "all") are needed by its tests
  if grep -qE '^all *=' "$d/pyproject.toml"; then pkgs+=(-e "$d[all]"); else pkgs+=(-e "$d"); fi
done
# example plugins (their own distributions, e.g. examples/headrace-sqlite) are tested like plugins
for d in examples/*/; do
  [ -f "$d/pyproject.toml" ] && pkgs+=(-e "${d%/}")
done
echo "== installing ${pkgs[*]} -r requirements-dev.txt"
pip_log=$(mktemp)
if ! "$VENV/bin/python" -m pip install -q "${pkgs[@]}" -r requirements-dev.txt >"$pip_log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$pip_log" >&2
  echo "pip install failed" >&2
  exit 1
fi
rm -f "$pip_log"
export PATH="$PWD/$VENV/bin:$PATH"
