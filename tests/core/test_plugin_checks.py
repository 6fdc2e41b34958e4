"""What the registry and ``headrace connectors`` tell a plugin author: misspelled or undecorated
hooks, plugins without connectors, broken plugins blamed by identity only, wrong ``module:Class``
paths (``--check``), tracebacks (``-v``), and the plugin API version."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.errors import ConnectorNotFoundError, PluginError
from headrace.plugins import PLUGIN_API_VERSION, Registry
from tests.cli_runner import cli_env, run_cli

GOOD = """
from headrace.plugins import ConnectorSpec, hookimpl
@hookimpl
def headrace_connectors():
    return [ConnectorSpec(name="{name}", source="headrace.connectors.rate:RateSource"{extra})]
"""

Install = Callable[[str, str], None]


@pytest.fixture
def dists(tmp_path: Path) -> Iterator[Install]:
    """install(name, module source): a distribution ``headrace-<name>`` with a ``headrace`` entry
    point, found through real metadata on sys.path (for this process and subprocesses)."""
    modules: list[str] = []

    def install(name: str, body: str) -> None:
        module = f"fake_plugin_{name.replace('-', '_')}"
        info = tmp_path / f"headrace_{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: headrace-{name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[headrace]\n{name} = {module}\n")
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
        modules.append(module)

    sys.path.insert(0, str(tmp_path))
    try:
        yield install
    finally:
        sys.path.remove(str(tmp_path))
        for m in modules:
            sys.modules.pop(m, None)


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=cli_env(tmp), timeout=60)


def test_a_misspelled_hook_is_reported(dists: Install) -> None:
    dists("typo", """
        from headrace.plugins import ConnectorSpec, hookimpl
        @hookimpl
        def headrace_connector():
            return [ConnectorSpec(name="typo")]
    """)
    reg = Registry()
    problems = [p for n, d, p in reg.problems() if d == "headrace-typo"]
    assert any("headrace_connector() is not a headrace hook (did you mean headrace_connectors()?)" in p for p in problems), problems
    assert any("registers no connector" in p for p in problems), problems
    with pytest.raises(PluginError, match="plugin 'typo' from headrace-typo: headrace_connector\\(\\) is not a headrace hook"):
        reg.get("typo")


def test_an_undecorated_hook_is_reported(dists: Install) -> None:
    dists("plain", """
        from headrace.plugins import ConnectorSpec
        def headrace_connectors():
            return [ConnectorSpec(name="plain")]
    """)
    problems = [p for n, d, p in Registry().problems() if d == "headrace-plain"]
    assert any("headrace_connectors() is not decorated with @hookimpl" in p for p in problems), problems


def test_a_plugin_with_no_connector_is_reported(dists: Install) -> None:
    dists("empty", "from headrace.plugins import hookimpl\n@hookimpl\ndef headrace_connectors():\n    return []\n")
    assert ("empty", "headrace-empty") in {(n, d) for n, d, p in Registry().problems() if "registers no connector" in p}


def test_a_listener_plugin_needs_no_connector(dists: Install) -> None:
    """A plugin with only query listener hooks (metrics, tracing: headrace-prometheus) is fine;
    one with no hook at all is reported."""
    dists("listener", "from headrace.plugins import hookimpl\n@hookimpl\n"
                      "def headrace_query_progress(progress):\n    pass\n")  # fmt: skip
    dists("nothing", "X = 1\n")
    problems = {(n, p) for n, _, p in Registry().problems()}
    assert not [p for n, p in problems if n == "listener"], problems
    assert any(n == "nothing" and "registers no connector" in p for n, p in problems), problems


def test_a_broken_plugin_is_blamed_by_identity_not_by_its_error_text(dists: Install) -> None:
    dists("exploding", "import no_such_module_anywhere_xyz\n")
    reg = Registry()
    # "module" appears in the broken plugin's "No module named ..." error: it must not be blamed
    with pytest.raises(ConnectorNotFoundError, match="no connector named 'module'"):
        reg.get("module")
    with pytest.raises(PluginError, match="plugin 'exploding' from headrace-exploding failed to load"):
        reg.get("exploding")


def test_an_incompatible_plugin_api_version_is_refused(dists: Install) -> None:
    major = int(PLUGIN_API_VERSION.split(".")[0])
    dists("future", GOOD.format(name="future", extra=f', api_version="{major + 1}.0"'))
    dists("current", GOOD.format(name="current", extra=f', api_version="{major}.7"'))
    reg = Registry()
    assert reg.get("current").api_version == f"{major}.7"
    with pytest.raises(PluginError) as e:
        reg.get("future")
    msg = str(e.value)
    assert f"headrace-future is written for headrace plugin API {major + 1}.0" in msg
    assert f"this headrace implements plugin API {PLUGIN_API_VERSION}" in msg


def test_connectors_check_imports_every_class(dists: Install, tmp_path: Path) -> None:
    dists("wrongpath", GOOD.format(name="wrongpath", extra="").replace("rate:RateSource", "rate:NoSuchClass"))
    plain = _cli(tmp_path, "connectors")
    assert plain.returncode == 0 and "wrongpath" in plain.stdout
    checked = _cli(tmp_path, "connectors", "--check")
    assert checked.returncode == 1
    assert "FAIL wrongpath source headrace.connectors.rate:NoSuchClass (headrace-wrongpath)" in checked.stdout
    assert "has no 'NoSuchClass'" in checked.stdout
    assert "ok   rate-micro-batch source" in checked.stdout


def test_connectors_verbose_shows_a_broken_plugins_traceback(dists: Install, tmp_path: Path) -> None:
    dists("kaput", "def helper():\n    raise RuntimeError('kaput at import')\nhelper()\n")
    short = _cli(tmp_path, "connectors")
    assert "plugin 'kaput' from headrace-kaput failed to load: RuntimeError: kaput at import" in short.stdout
    assert "Traceback" not in short.stdout
    verbose = _cli(tmp_path, "connectors", "-v")
    assert "traceback of plugin 'kaput' from headrace-kaput" in verbose.stdout
    assert "Traceback (most recent call last)" in verbose.stdout and "in helper" in verbose.stdout


def test_plugin_modules_named_by_the_environment_are_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "env_plugin_mod.py").write_text(GOOD.format(name="from-env", extra=""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HEADRACE_PLUGINS", "env_plugin_mod")
    assert Registry().get("from-env").distribution == "HEADRACE_PLUGINS=env_plugin_mod"
