#!/usr/bin/env bash
# Packaging check: builds every distribution of the repo as a wheel (core,
# each plugins/* and examples/*), then for each one creates a fresh virtualenv holding the core's
# wheel and that distribution's wheel ALONE (plus what its default install pulls in, no extras),
# and loads each of its connector classes through the registry. A plugin that imports something
# it does not declare fails here, naming the distribution and the missing import.
# Then the scaffold round trip: in a fresh venv with the core's wheel,
# `headrace new-plugin` writes a plugin, which is installed and its contract tests run.
#
# Fast: one `pip wheel` call for all builds, venvs made without pip (the dev venv's pip installs
# into them with --python), the pip cache for third-party wheels, several venvs at once, and the
# core installed once: its venv is checked first, then each plugin's venv sees the core's
# site-packages (the core wheel and its own dependencies only) through a .pth file, so pip
# installs just the plugin and what the plugin itself declares.
# Usage: scripts/check_wheels.sh [dist-dir ...]   (default: core and every plugins/*)
# Env: HEADRACE_VENV (the dev venv, default .venv), CHECK_WHEELS_JOBS (default 3),
#      CHECK_WHEELS_DIR (work folder, default a temp dir, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${HEADRACE_VENV:-.venv}" && pwd)
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
PY=$(command -v python3.11 || command -v python3)
JOBS=${CHECK_WHEELS_JOBS:-3}
WORK=${CHECK_WHEELS_DIR:-$(mktemp -d -t headrace-wheels.XXXXXX)}
[ -n "${CHECK_WHEELS_DIR:-}" ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/wheels" "$WORK/logs"

if [ $# -gt 0 ]; then dists=("$@"); else
  dists=(core)
  for d in plugins/*/ examples/*/; do [ -f "$d/pyproject.toml" ] && dists+=("${d%/}"); done
fi

quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

echo "== wheels: building ${dists[*]}"
# from clean copies: setuptools leaves build/ in the folder it builds, whose stale files would
# end up in the next wheel (and the work tree stays as it was)
for d in $(printf '%s\n' core "${dists[@]}" | sort -u); do
  mkdir -p "$WORK/src/$d"
  tar -C "$d" --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - . | tar -C "$WORK/src/$d" -xf -
done
if ! (cd "$WORK/src" && "${PIP[@]}" wheel -q --no-deps -w "$WORK/wheels" $(printf './%s ' core "${dists[@]}" | tr ' ' '\n' | sort -u)) >"$WORK/logs/build.log" 2>&1; then
  quiet <"$WORK/logs/build.log" >&2
  echo "wheels: FAILED to build a wheel (see above)" >&2
  exit 1
fi

# the wheel file of a distribution folder, from its pyproject name
wheel_of() {
  local name
  name=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$1/pyproject.toml" | head -n1 | tr '-' '_')
  ls "$WORK"/wheels/"$name"-*.whl
}
core_whl=$(wheel_of core)

# make the core's venv (checked first) visible in a plugin's fresh venv
core_site() {
  local site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$WORK/venv-core/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/headrace-core.pth"
}

check_one() {
  local dir=$1 slug dist whl env log
  slug=$(basename "$dir")
  dist=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$dir/pyproject.toml" | head -n1)
  whl=$(wheel_of "$dir")
  env="$WORK/venv-$slug"
  log="$WORK/logs/$slug.log"
  {
    "$PY" -m venv --without-pip "$env" &&
    if [ "$dir" != core ]; then core_site "$env"; fi &&
    "${PIP[@]}" --python "$env/bin/python" install -q "$core_whl" "$whl"
  } >"$log" 2>&1 || { echo "FAIL $dist: pip install of its wheel failed:"; quiet <"$log" | tail -n 20; return 1; }
  if ! "$env/bin/python" scripts/_check_wheel.py "$dist" >>"$log" 2>&1; then
    echo "FAIL $dist:"; quiet <"$log" | grep -v '^ok ' | tail -n 40; return 1
  fi
  echo "ok   $dist ($(grep -c "^ok " "$log") connector classes or listener hooks loaded)"
}
export -f check_one wheel_of quiet core_site
export WORK PY core_whl VENV
export PIP_STR="${PIP[*]}"

scaffold_round_trip() {
  local env="$WORK/venv-scaffold" log="$WORK/logs/scaffold.log" out="$WORK/headrace-acme"
  {
    "$PY" -m venv --without-pip "$env" &&
    core_site "$env" &&
    "$env/bin/python" -m headrace.cli new-plugin acme --dir "$out" &&
    "${PIP[@]}" --python "$env/bin/python" install -q "$out[test]" &&
    (cd "$out" && "$env/bin/python" -m pytest -q -p no:cacheprovider -k "not kill_and_restart or connector-points")
  } >"$log" 2>&1 || { echo "FAIL scaffold: the plugin written by 'headrace new-plugin acme' does not install or pass its tests:"; quiet <"$log" | tail -n 40; return 1; }
  echo "ok   scaffold: headrace new-plugin acme -> installed, $(grep -Eo '[0-9]+ passed' "$log" | tail -n1) in a fresh venv"
}
export -f scaffold_round_trip

echo "== wheels: installing each alone in a fresh venv and loading its connectors; the scaffold round trip ($JOBS at a time)"
status=0
check_one core || exit 1
{ printf '%s\n' "${dists[@]}" | grep -vx core; [ $# -gt 0 ] || echo "@scaffold"; } |
  xargs -P "$JOBS" -I{} bash -c 'PIP=($PIP_STR); if [ "$1" = @scaffold ]; then scaffold_round_trip; else check_one "$1"; fi' _ {} || status=1
if [ $status -ne 0 ]; then
  echo >&2
  echo "wheels: some distributions cannot load their connectors when installed alone (see FAIL lines above)" >&2
fi
exit $status
