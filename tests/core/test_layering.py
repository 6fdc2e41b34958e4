"""Imports run one way: every import in core and in every plugin, read from the source's AST
(imports inside functions included), must go down the layer table (docs/guide.md, "Layers").

A module may import its own layer and the layers below it, never one above. No edge is
allowed by name. Two things are not dependencies and are skipped, by rule:

- imports under ``if TYPE_CHECKING:`` (annotations only, never executed);
- a re-export module kept at an old path for one release: a module whose body is only a
  docstring and ``from X import names`` / ``__all__`` (no code of its own), e.g.
  ``headrace.engine.crash`` for ``headrace.helpers.crash``.

Plugins may import only the contracts and the plugin SDK (``headrace.helpers``), and their own
package.

Besides the order, core modules import each other without cycles: a cycle among module-level
imports (outside functions and outside ``if TYPE_CHECKING:``) is a failure; cycles that close
only through ``TYPE_CHECKING`` imports are allowed and listed in docs/guide.md ("Layers").
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "core" / "src" / "headrace"

# lowest first: each name is a top-level module or package of headrace
LAYERS: list[tuple[str, set[str]]] = [
    ("contracts", {"protocols", "options", "errors", "types", "sql_types", "redaction", "plugins", "_lazy", "logs", "_buffers",
                   "_textfile", "_words"}),
    ("storage", {"state", "checkpoint", "badrecords"}),
    ("transforms", {"transforms", "functions"}),
    ("sdk", {"helpers"}),
    ("engine", {"engine", "connectors", "progress", "history", "query", "_builtin"}),
    ("api", {"api"}),
    ("top", {"pipelines", "cli", "ui", "spark", "pipeline", "testing", "scaffold", "__init__"}),
]  # fmt: skip
RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
PLUGIN_MAY_IMPORT = LAYERS[0][1] | {"helpers"}


def _part(module: str) -> str | None:
    """The top-level part of a headrace module name (``__init__`` for the package itself)."""
    parts = module.split(".")
    if parts[0] != "headrace":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_reexport(tree: ast.Module) -> bool:
    """Only a docstring, ``from __future__``, ``from X import names`` and ``__all__``."""
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and all(a.name != "*" for a in node.names):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def imports(path: Path, package: str) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), with its line, outside TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    if _is_reexport(tree) and path.name != "__init__.py":
        return
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                yield ".".join(base + ([node.module] if node.module else [])), node.lineno
            else:
                yield node.module or "", node.lineno


def _module_of(path: Path, root: Path, top: str) -> tuple[str, str]:
    rel = path.relative_to(root).with_suffix("")
    name = ".".join([top, *rel.parts])
    if path.name == "__init__.py":
        name = name.removesuffix(".__init__")
        return name, name
    return name, name.rsplit(".", 1)[0]


def core_edges_against_the_order() -> list[str]:
    bad = []
    for path in sorted(CORE.rglob("*.py")):
        module, package = _module_of(path, CORE, "headrace")
        src = _part(module)
        assert src in RANK, (
            f"{path}: headrace.{src} is in no layer of LAYERS; add it to the table (and docs/guide.md)"
        )
        for target, line in imports(path, package):
            dst = _part(target)
            if dst is None or dst == src:
                continue
            assert dst in RANK, f"{path}:{line}: imports {target}, in no layer of LAYERS"
            if RANK[dst] > RANK[src]:
                bad.append(f"{path.relative_to(REPO)}:{line}: {LAYERS[RANK[src]][0]} module {module} imports "
                           f"{target} ({LAYERS[RANK[dst]][0]} layer, above it)")  # fmt: skip
    return bad


def plugin_edges_outside_the_sdk() -> list[str]:
    bad = []
    for src_dir in sorted((REPO / "plugins").glob("*/src")):
        for path in sorted(src_dir.rglob("*.py")):
            if ".egg-info" in str(path):
                continue
            module, package = _module_of(path, src_dir, "")
            module, package = module.lstrip("."), package.lstrip(".")
            for target, line in imports(path, package):
                dst = _part(target)
                if dst is not None and dst not in PLUGIN_MAY_IMPORT:
                    bad.append(f"{path.relative_to(REPO)}:{line}: plugin module {module} imports {target}; plugins "
                               "import only the contracts and headrace.helpers (contrib.md, section 6)")  # fmt: skip
    return bad


def test_core_imports_run_down_the_layers() -> None:
    bad = core_edges_against_the_order()
    assert not bad, "\n".join(bad)


def _core_modules() -> dict[str, tuple[Path, str]]:
    """Every core module: name -> (path, the package its relative imports start from)."""
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        module, package = _module_of(path, CORE, "headrace")
        out[module] = (path, package)
    return out


def _module_level(body: list[ast.stmt], *, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: its body's, and those under ``if``/``try``
    at module level (``if TYPE_CHECKING:`` only with ``type_checking``); never in functions."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if _is_type_checking(node.test) and not type_checking:
                continue
            yield from _module_level(node.body, type_checking=type_checking)
            yield from _module_level(node.orelse, type_checking=type_checking)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block, type_checking=type_checking)


def module_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Core module -> the core modules it imports at module level. ``from package import name``
    is an edge to the submodule ``package.name`` when there is one, else to the package."""
    modules = _core_modules()
    graph: dict[str, set[str]] = {}
    for module, (path, package) in modules.items():
        targets: set[str] = set()
        for node in _module_level(ast.parse(path.read_text(), str(path)).body, type_checking=type_checking):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    targets.add(f"{base}.{a.name}")
                elif base in modules:
                    targets.add(base)
        graph[module] = targets - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted; every import cycle lies inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_core_modules_import_each_other_without_cycles() -> None:
    cycles = import_cycles(module_graph())
    assert not cycles, "import cycles among core modules (move the shared code down a layer):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_plugins_import_only_the_contracts_and_the_sdk() -> None:
    bad = plugin_edges_outside_the_sdk()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from headrace.api import frame\nX = frame\n", ["headrace.api"]),
        ("def f():\n    import headrace.pipelines.graph\n", ["headrace.pipelines.graph"]),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from headrace.api import frame\n",
            ["typing"],
        ),
        ('"""Old path."""\nfrom headrace.helpers.crash import crash_point\n__all__ = ["crash_point"]\n', []),
        ("from headrace.helpers.crash import crash_point\nX = crash_point\n", ["headrace.helpers.crash"]),
    ],
    ids=["top-level", "inside-a-function", "type-checking-only", "re-export-module", "re-export-with-code"],
)
def test_the_walk_sees_every_executed_import(tmp_path: Path, source: str, expected: list[str]) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert [t for t, _ in imports(path, "headrace.transforms")] == expected


def test_parse_schema_lives_below_the_transforms() -> None:
    from headrace.api import builder_options
    from headrace.sql_types import parse_schema

    assert builder_options.parse_schema is parse_schema
    assert parse_schema("a INT, b STRING").names == ["a", "b"]
