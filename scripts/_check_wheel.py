"""Run by scripts/check_wheels.sh inside a fresh venv holding the core and ONE distribution.

Loads every connector class the distribution registers through the registry, as a user's query
would, and exits 1 naming the distribution and the import that failed. A listener plugin (no
connector, only ``headrace_query_*`` hooks) gets the events of a real one-batch query instead.
"""

from __future__ import annotations

import sys
from typing import Any


def main(dist: str) -> int:
    from headrace.plugins import registry

    reg = registry()
    problems: list[str] = []
    for name, d, error in reg.broken():
        if d == dist:
            problems.append(f"plugin module '{name}' does not import: {error.splitlines()[0]}")
    specs = [s for s in reg.specs() if s.distribution == dist]
    if not specs and not problems:
        listeners = _listener_hooks(reg, dist)
        if listeners:
            problems.extend(_exercise_listeners(listeners))
        else:
            problems.append("registers no connector (no 'headrace' entry point, or its hook returned nothing)")
    for spec in specs:
        for role, path in (("source", spec.source), ("sink", spec.sink)):
            if not path:
                continue
            try:
                getattr(spec, f"load_{role}")()
            except Exception as e:  # report every failure, not just the first
                cause = e.__cause__ or e.__context__
                missing = getattr(cause, "name", None) if isinstance(cause, ImportError) else None
                what = f"missing import {missing!r}: " if missing else ""
                problems.append(f"connector '{spec.name}' {role} {path}: {what}{e}")
            else:
                print(f"ok {spec.name} {role} {path}")
    for p in problems:
        print(f"  {dist}: {p}", file=sys.stderr)
    if problems:
        print(f"  {dist} cannot be used when installed alone (pip install {dist}); declare the missing "
              "imports in its pyproject dependencies", file=sys.stderr)  # fmt: skip
    return 1 if problems else 0


def _listener_hooks(reg: Any, dist: str) -> list[tuple[str, Any]]:
    """(hook name, function) of the listener hooks that ``dist``'s plugin modules implement."""
    from importlib.metadata import entry_points

    modules = {ep.module for ep in entry_points(group="headrace") if ep.dist is not None and ep.dist.name == dist}
    out = []
    for hook in ("headrace_query_started", "headrace_query_progress", "headrace_query_terminated"):
        for impl in getattr(reg.hook, hook).get_hookimpls():
            if getattr(impl.plugin, "__name__", "") in modules:
                out.append((hook, impl.function))
    return out


def _exercise_listeners(listeners: list[tuple[str, Any]]) -> list[str]:
    """Call each listener hook with the events of a real one-batch query (rate-micro-batch ->
    memory); a hook that raises (e.g. a missing import) is a problem."""
    import headrace as hr

    seen: list[dict[str, Any]] = []
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
         .write_stream.format("memory").query_name("wheel_check").on_progress(lambda p: seen.append(p.to_dict()))
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    events = {
        "headrace_query_started": {"event": {"id": q.id, "runId": q.run_id, "name": q.name, "timestamp": 0.0,
                                             "deliveryGuarantee": q.delivery_guarantee}},
        "headrace_query_progress": {"progress": seen[-1] if seen else {}},
        "headrace_query_terminated": {"event": {"id": q.id, "runId": q.run_id, "name": q.name, "exception": None,
                                                "lastBatchId": 0}},
    }  # fmt: skip
    problems = []
    for hook, fn in listeners:
        try:
            fn(**events[hook])
        except Exception as e:
            problems.append(f"listener {hook}() fails: {type(e).__name__}: {e}")
        else:
            print(f"ok listener {hook}")
    return problems


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
