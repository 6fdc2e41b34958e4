"""``headrace connectors`` and ``headrace describe NAME``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _connectors(args: argparse.Namespace) -> int:
    from headrace.plugins import registry

    reg = registry()
    rows = []
    for spec in reg.specs():
        roles = "/".join(r for r, v in (("source", spec.source), ("sink", spec.sink)) if v)
        missing = spec.missing_requirements()
        status = f"missing {', '.join(missing)}: {spec.install_hint}" if missing else "ok"
        rows.append((spec.name + (f" ({', '.join(spec.aliases)})" if spec.aliases else ""), roles,
                     spec.distribution, status, spec.description))  # fmt: skip
    headers = ("NAME", "PROVIDES", "DISTRIBUTION", "STATUS")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + "  DESCRIPTION")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    for name, dist, error in reg.broken():
        print(f"! plugin '{name}' from {dist} failed to load: {error.splitlines()[0]}")
    for name, dists in reg.duplicates().items():
        print(f"! connector name '{name}' is claimed by {' and '.join(dists)}")
    from headrace.cli.plugins import connectors_report

    return connectors_report(args, reg)


def _describe(args: argparse.Namespace) -> int:
    from headrace.plugins import registry

    spec = registry().get(args.name)
    print(f"{spec.name} — {spec.description}" if spec.description else spec.name)
    print(f"distribution: {spec.distribution}" + (f"; aliases: {', '.join(spec.aliases)}" if spec.aliases else ""))
    if spec.source:
        print()
        print(spec.source_options.render("source options:"))
    if spec.sink:
        print()
        print(spec.sink_options.render("sink options:"))
    return 0


def register(sub: Any) -> None:
    """Add ``connectors`` and ``describe`` to the ``headrace`` parser's subcommands."""
    from headrace.cli.plugins import add_connectors_options

    conn = sub.add_parser("connectors", help="list installed connectors")
    conn.set_defaults(fn=_connectors)
    add_connectors_options(conn)
    d = sub.add_parser("describe", help="show a connector's options")
    d.add_argument("name")
    d.set_defaults(fn=_describe)
