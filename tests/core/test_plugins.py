from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import headrace as hr
from headrace.errors import ConnectorNotFoundError, PluginError
from headrace.options import Option, OptionSchema, String
from headrace.plugins import ConnectorSpec, Registry, hookimpl


def _module(name: str, specs: list[ConnectorSpec]) -> ModuleType:
    mod = ModuleType(name)

    @hookimpl
    def headrace_connectors() -> list[ConnectorSpec]:
        return specs

    mod.headrace_connectors = headrace_connectors  # type: ignore[attr-defined]
    return mod


def test_builtins_are_found_through_the_entry_point() -> None:
    reg = Registry()
    spec = reg.get("rate-micro-batch")
    assert spec.distribution == "headrace"
    assert {"rate", "memory", "console", "noop", "files", "foreach_batch"} <= set(reg.names())


def test_lookup_is_case_insensitive_and_knows_aliases() -> None:
    reg = Registry(load_entry_points=False)
    reg.register_module(_module("p", [ConnectorSpec(name="cloudFiles", aliases=("cloudfiles-alias",))]), "dist-a")
    assert reg.get("CLOUDFILES").name == "cloudFiles"
    assert reg.get("cloudfiles-alias").name == "cloudFiles"


def test_unknown_name_lists_installed_connectors_with_a_suggestion() -> None:
    with pytest.raises(ConnectorNotFoundError) as e:
        Registry().get("rate-mikro-batch")
    msg = str(e.value)
    assert "did you mean 'rate-micro-batch'?" in msg
    assert "installed:" in msg and "memory" in msg


def test_duplicate_names_name_both_distributions() -> None:
    reg = Registry(load_entry_points=False)
    reg.register_module(_module("a", [ConnectorSpec(name="dup"), ConnectorSpec(name="fine")]), "headrace-dup-a")
    reg.register_module(_module("b", [ConnectorSpec(name="dup")]), "headrace-dup-b")
    with pytest.raises(PluginError, match="headrace-dup-a and headrace-dup-b"):
        reg.get("dup")
    assert reg.get("fine").name == "fine"
    assert reg.duplicates() == {"dup": ["headrace-dup-a", "headrace-dup-b"]}


def test_missing_client_library_says_what_to_install() -> None:
    spec = ConnectorSpec(name="x", source="nowhere_at_all:Source", requires=("no_such_client_lib_xyz",),
                         install_hint="pip install headrace-x")  # fmt: skip
    with pytest.raises(PluginError, match="needs no_such_client_lib_xyz, which is not installed; fix: pip install headrace-x"):
        spec.load_source()


@pytest.fixture
def fake_dists(tmp_path: Path) -> Iterator[Path]:
    """Two installed distributions on sys.path: one whose plugin module fails to import,
    one that works; found through real entry-point metadata."""
    for dist, module, body in (
        ("headrace_broken", "headrace_broken_plugin", "raise RuntimeError('plugin exploded')\n"),
        ("headrace_okay", "headrace_okay_plugin", textwrap.dedent("""
            from headrace.plugins import ConnectorSpec, hookimpl
            @hookimpl
            def headrace_connectors():
                return [ConnectorSpec(name="okay", source="headrace.connectors.rate:RateSource")]
        """)),
    ):
        info = tmp_path / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[headrace]\n{dist.removeprefix('headrace_')} = {module}\n")
        (tmp_path / f"{module}.py").write_text(body)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for m in ("headrace_broken_plugin", "headrace_okay_plugin"):
            sys.modules.pop(m, None)


def test_a_broken_plugin_is_reported_when_asked_for_and_others_work(fake_dists: Path) -> None:
    reg = Registry()
    assert reg.get("okay").distribution == "headrace_okay"
    with pytest.raises(PluginError, match="plugin 'broken' from headrace_broken failed to load.*plugin exploded"):
        reg.get("broken")
    with pytest.raises(ConnectorNotFoundError, match=r"plugins that failed to load: broken \(headrace_broken\)"):
        reg.get("something-else")


def test_loading_the_registry_imports_no_client_library() -> None:
    code = textwrap.dedent("""
        import sys, headrace
        names = headrace.registry().names()
        heavy = [m for m in ("deltalake", "confluent_kafka", "psycopg", "google.cloud.pubsub_v1", "boto3", "pyspark",
                             "watchdog") if m in sys.modules]
        print(len(names), heavy)
        assert not heavy, heavy
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


class _Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def headrace_query_started(self, event: dict[str, Any]) -> None:
        self.events.append(("started", event))

    @hookimpl
    def headrace_query_progress(self, progress: dict[str, Any]) -> None:
        self.events.append(("progress", progress))

    @hookimpl
    def headrace_query_terminated(self, event: dict[str, Any]) -> None:
        self.events.append(("terminated", event))


def test_listeners_hear_start_progress_and_end(tmp_path: Path) -> None:
    from headrace.plugins import register_listener, unregister_listener

    listener = _Listener()
    register_listener(listener)
    try:
        q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=30).load()
             .write_stream.format("noop").trigger(available_now=True).start())  # fmt: skip
        q.await_termination(30)
    finally:
        unregister_listener(listener)
    kinds = [k for k, _ in listener.events]
    assert kinds == ["started", "progress", "progress", "progress", "terminated"]
    assert listener.events[0][1]["deliveryGuarantee"] == "exactly-once"
    assert listener.events[-1][1]["exception"] is None


def test_plugins_can_add_their_own_hookspecs() -> None:
    import pluggy

    class Specs:
        @pluggy.HookspecMarker("headrace")(firstresult=True)
        def headrace_myplugin_resolve(self, endpoint: str) -> str:  # type: ignore[empty-body]
            """Resolve an endpoint."""

    plugin = ModuleType("with_hooks")

    @hookimpl
    def headrace_addhooks(pluginmanager: pluggy.PluginManager) -> None:
        pluginmanager.add_hookspecs(Specs)

    plugin.headrace_addhooks = headrace_addhooks  # type: ignore[attr-defined]
    resolver = ModuleType("resolver")

    @hookimpl
    def headrace_myplugin_resolve(endpoint: str) -> str:
        return endpoint.upper()

    resolver.headrace_myplugin_resolve = headrace_myplugin_resolve  # type: ignore[attr-defined]
    reg = Registry(load_entry_points=False)
    reg.register_module(plugin, "p")
    reg.register_module(resolver, "r")
    assert reg.hook.headrace_myplugin_resolve(endpoint="proj.branch") == "PROJ.BRANCH"


def test_option_schemas_are_used_by_the_reader() -> None:
    reg_spec = ConnectorSpec(name="needs-path", source="headrace.connectors.rate:RateSource",
                             source_options=OptionSchema([Option("path", String(), required=True)]))  # fmt: skip
    assert reg_spec.source_options.parse({"path": "/x"})["path"] == "/x"
