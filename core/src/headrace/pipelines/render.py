"""The graph as text and as a picture (DOT rendered by graphviz's ``dot`` to SVG or PNG).

Each dataset shows its kind and, once the pipeline has run, its row count (from the Delta
log's statistics, no data read) and last update; edges are solid for stream reads and dashed
for batch reads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from headrace._words import counted
from headrace.pipelines.elements import MATERIALIZED_VIEW, SINK
from headrace.pipelines.graph import DataflowGraph
from headrace.pipelines.resolver import STREAM

__all__ = ["render_dot", "render_text", "write_picture"]

_LABELS = {"streaming_table": "streaming table", "materialized_view": "materialized view",
           "temporary_view": "temporary view", "sink": "sink"}  # fmt: skip
_COLORS = {"streaming_table": "#cfe2ff", "materialized_view": "#d1e7dd", "temporary_view": "#f8f9fa", "sink": "#fff3cd"}


def _stats(graph: DataflowGraph) -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {}
    for ds in graph.datasets:
        out[ds.name] = graph.storage.stats(ds.name) if ds.persisted else None
    return out


def _reads(graph: DataflowGraph) -> dict[str, dict[str, set[str]]]:
    """target -> {input: {stream, static}}."""
    out: dict[str, dict[str, set[str]]] = {ds.name: {} for ds in graph.datasets}
    for info in graph.info.values():
        t = graph.lookup(info.flow.target)
        if t is None:
            continue
        for name, how in info.reads.items():
            out.setdefault(t.name, {}).setdefault(name, set()).update(how)
    return out


def _plan(graph: DataflowGraph, ds: Any, kind: str, exists: bool, pending: set[str]) -> str:
    """What ``pipelines run`` (without refresh options) would do to the dataset."""
    if kind == SINK:
        return f"append new data to the {ds.format} sink"
    if not ds.persisted:
        return "nothing stored (a view, computed where it is read)"
    if ds.name in pending:
        return "full recompute (finishing an interrupted full refresh)"
    if not exists:
        return "create it"
    if kind == MATERIALIZED_VIEW:
        return "full recompute"
    return "append new data"


def render_text(graph: DataflowGraph, *, stats: bool = True, plan: bool = False) -> str:
    """One block per dataset, in dependency order: kind, flows, inputs, rows and last update
    (``stats``: read from the Delta logs, no data read; a persisted dataset without a table
    is "not materialized yet"); ``plan``: also what a run would do to it (create it, append,
    full recompute)."""
    st = _stats(graph) if stats or plan else {}
    pending = graph.storage.pending_full_refreshes() if plan else set()
    reads = _reads(graph)
    order: list[str] = []
    for f in graph.order():
        t = graph.lookup(f.target)
        if t is not None and t.name not in order:
            order.append(t.name)
    order += [ds.name for ds in graph.datasets if ds.name not in order]
    lines = []
    for name in order:
        ds = graph.registry.datasets[name.lower()]
        kind = graph.kind_of(ds)
        head = f"{name}  ({_LABELS.get(kind, kind)}"
        if kind == SINK:
            head += f", format {ds.format}"
        s = st.get(name)
        if s:
            rows = counted(s["rows"], "row") if s.get("rows") is not None else "rows unknown"
            head += f", {rows}, version {s['version']}, updated {s['last_update']}"
        elif ds.persisted and (stats or plan):
            head += ", not materialized yet"
        lines.append(head + ")")
        if plan:
            lines.append(f"  run: {_plan(graph, ds, kind, bool(s), pending)}")
        for src, how in sorted(reads.get(name, {}).items()):
            lines.append(f"  <- {src} ({'stream' if STREAM in how else 'batch'})")
        flows = [f.name for f in graph.flows_into(name) if f.name != name]
        if flows:
            lines.append(f"  flows: {', '.join(flows)}")
    return "\n".join(lines)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dot(graph: DataflowGraph, *, stats: bool = True) -> str:
    st = _stats(graph) if stats else {}
    out = ["digraph pipeline {", "  rankdir=LR;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for ds in graph.datasets:
        kind = graph.kind_of(ds)
        label = [ds.name, _LABELS.get(kind, kind)]
        s = st.get(ds.name)
        if s:
            if s.get("rows") is not None:
                label.append(counted(s["rows"], "row"))
            label.append(f"updated {s['last_update']}")
        shape = ", shape=note" if kind == SINK else (", style=\"rounded,dashed\"" if kind == "temporary_view" else "")
        out.append(f"  {_q(ds.name)} [label={_q(chr(10).join(label))}, fillcolor={_q(_COLORS.get(kind, '#ffffff'))}{shape}];")
    for target, srcs in _reads(graph).items():
        for src, how in sorted(srcs.items()):
            style = "" if STREAM in how else " [style=dashed]"
            out.append(f"  {_q(src)} -> {_q(target)}{style};")
    out.append("}")
    return "\n".join(out) + "\n"


def write_picture(graph: DataflowGraph, path: str) -> tuple[str, str | None]:
    """Write ``path`` (``.svg``, ``.png`` or ``.dot``). Returns (file written, note): without
    graphviz's ``dot`` on PATH the ``.dot`` file is written instead, with a note saying so."""
    base, ext = os.path.splitext(path)
    fmt = ext.lstrip(".").lower() or "svg"
    dot_text = render_dot(graph)
    dot_path = base + ".dot"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(dot_path, "w", encoding="utf-8") as f:
        f.write(dot_text)
    if fmt == "dot":
        return dot_path, None
    exe = shutil.which("dot")
    if exe is None:
        return dot_path, (f"graphviz's `dot` is not installed, so {path} was not drawn; wrote {dot_path} instead "
                          f"(install graphviz, e.g. apt-get install graphviz, then: dot -T{fmt} {dot_path} -o {path})")  # fmt: skip
    if fmt not in ("svg", "png", "pdf"):
        return dot_path, f"unknown picture format {fmt!r}; wrote {dot_path} (use .svg or .png)"
    res = subprocess.run([exe, f"-T{fmt}", dot_path, "-o", path], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return dot_path, f"dot failed ({res.stderr.strip()[:300]}); wrote {dot_path}"
    return path, None
