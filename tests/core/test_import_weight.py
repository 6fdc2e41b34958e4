"""``import headrace`` stays light: the public names are imported on first use (PEP 562), so a
process that needs part of headrace (Spark's Python workers, a plugin's options) does not load
the engine, the transforms or pyarrow."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import headrace


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_headrace_loads_only_the_package_module() -> None:
    out = _run("""
        import sys
        before = set(sys.modules)
        import headrace
        new = sorted(m for m in set(sys.modules) - before)
        print([m for m in new if m.startswith(("headrace.", "pyarrow", "duckdb", "pluggy", "numpy"))])
    """)
    assert out.strip() == "[]", f"import headrace loaded: {out.strip()}"


@pytest.mark.parametrize(
    ("code", "heavy"),
    [
        pytest.param("import headrace.options", ("headrace.engine", "headrace.transforms", "headrace.api", "pyarrow"),
                     id="options-no-engine-no-pyarrow"),
        pytest.param("import headrace.plugins", ("headrace.engine", "headrace.transforms", "headrace.api", "pyarrow"),
                     id="plugins-no-engine-no-pyarrow"),
        pytest.param("from headrace.plugins import ConnectorSpec", ("pluggy", "importlib.metadata", "headrace.engine"),
                     id="connector-spec-no-plugin-discovery"),
        pytest.param("import headrace.errors", ("headrace.options", "headrace.plugins", "pyarrow"),
                     id="errors-alone"),
        pytest.param("from headrace import OptionsError", ("headrace.engine", "headrace.transforms", "pyarrow"),
                     id="an-error-class-no-engine"),
        pytest.param("import headrace.protocols", ("headrace.engine", "headrace.transforms", "pyarrow.compute"),
                     id="protocols-no-engine-no-compute"),
    ],
)
def test_importing_a_part_loads_no_more(code: str, heavy: tuple[str, ...]) -> None:
    out = _run(f"""
        import sys
        {code}
        print(sorted(m for m in sys.modules if m.startswith({heavy!r})))
    """)
    assert out.strip() == "[]", f"{code!r} loaded: {out.strip()}"


def test_every_public_name_is_importable_from_the_package() -> None:
    out = _run("""
        import headrace
        from headrace import *  # noqa: F403
        from headrace import StreamingQuery, read_stream, window, session_window, registry
        missing = [n for n in headrace.__all__ if n not in globals()]
        print(missing, read_stream.__class__.__name__, StreamingQuery.__module__)
    """)
    assert out.split() == ["[]", "DataStreamReader", "headrace.engine.query"]
    assert set(headrace._LAZY) == set(headrace.__all__)
    for name in headrace.__all__:
        value = getattr(headrace, name)
        module = headrace._LAZY[name]
        assert value is getattr(sys.modules[module], name), name


def test_subpackages_loaded_before_are_still_attributes() -> None:
    out = _run("""
        import headrace as hr
        print(hr.progress.QueryProgress.__name__, hr.engine.__name__, hr.transforms.__name__)
    """)
    assert out.split() == ["QueryProgress", "headrace.engine", "headrace.transforms"]


def test_unknown_names_raise_attribute_error_and_dir_lists_the_public_names() -> None:
    with pytest.raises(AttributeError, match="module 'headrace' has no attribute 'no_such_name'"):
        headrace.no_such_name  # noqa: B018
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from headrace import no_such_name", {})
    names = dir(headrace)
    assert set(headrace.__all__) <= set(names)
    assert {"engine", "progress", "__version__"} <= set(names)
    assert not {"importlib", "TYPE_CHECKING", "Any", "_LAZY"} & set(names)
