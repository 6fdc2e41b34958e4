"""Each plugin with one of its client libraries missing: ``headrace connectors`` lists it with an
install hint naming the missing library (no crash), and loading the connector raises a
PluginError with that hint. Each run hides the library in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A finder that makes the top-level package ``BLOCKED`` (and everything under it) not installed.
_PRELUDE = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == BLOCKED or name.startswith(BLOCKED + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""

CASES = [
    ("pubsub", "google", "google-cloud-pubsub"),
    ("lakebase", "numpy", "numpy"),
    ("lakebase", "psycopg", "psycopg[binary]"),
    ("kafka", "confluent_kafka", "confluent-kafka"),
    ("kinesis", "boto3", "boto3"),
    ("delta", "deltalake", "deltalake"),
]


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("connector, blocked, dist", CASES, ids=[f"{c}-without-{b}" for c, b, _ in CASES])
def test_missing_client_library_shows_the_install_hint(connector: str, blocked: str, dist: str) -> None:
    code = _PRELUDE.format(blocked=blocked) + (
        "import sys\n"
        "from headrace.cli import main\n"
        "rc = main(['connectors'])\n"
        "print('EXIT', rc)\n"
    )
    done = run(code)
    assert done.returncode == 0 and "EXIT 0" in done.stdout, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(connector + " ") or ln.startswith(connector + "("))
    assert f"missing {blocked}" in line and "pip install" in line and f"'{dist}" in line, line
    assert "Traceback" not in done.stderr

    code = _PRELUDE.format(blocked=blocked) + (
        "import headrace as hr\n"
        "from headrace.errors import PluginError\n"
        f"spec = hr.registry().get({connector!r})\n"
        "try:\n"
        "    (spec.load_source if spec.source else spec.load_sink)()\n"
        "except PluginError as e:\n"
        "    print('ERROR', e)\n"
    )
    done = run(code)
    assert f"ERROR connector '{connector}' needs" in done.stdout and f"'{dist}" in done.stdout, (
        done.stdout + done.stderr
    )
