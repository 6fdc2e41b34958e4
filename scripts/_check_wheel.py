"""Run by scripts/check_wheels.sh inside a fresh venv holding the core and ONE distribution.

Loads every connector class the distribution registers through the registry, as a user's query
would, and exits 1 naming the distribution and the import that failed.
"""

from __future__ import annotations

import sys


def main(dist: str) -> int:
    from headrace.plugins import registry

    reg = registry()
    problems: list[str] = []
    for name, d, error in reg.broken():
        if d == dist:
            problems.append(f"plugin module '{name}' does not import: {error.splitlines()[0]}")
    specs = [s for s in reg.specs() if s.distribution == dist]
    if not specs and not problems:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
