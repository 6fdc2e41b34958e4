# Sourced by scripts/test.sh and scripts/demo.sh: make sure .venv exists and holds every
# package of the repo. Re-running is cheap (pip only checks what is there).
VENV=${HEADRACE_VENV:-.venv}
PY=$(command -v python3.11 || command -v python3)
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $PY"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
pkgs=(-e "core[spark]")
for d in plugins/*/; do
  [ -f "$d/pyproject.toml" ] && pkgs+=(-e "$d")
done
echo "== installing ${pkgs[*]} and requirements-dev.txt"
"$VENV/bin/python" -m pip install -q "${pkgs[@]}" -r requirements-dev.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -c "import headrace" || { echo "installation failed" >&2; exit 1; }
export PATH="$PWD/$VENV/bin:$PATH"
