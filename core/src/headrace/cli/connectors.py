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
    from headrace.cli import wrap
    from headrace.plugins import registry

    spec = registry().get(args.name)
    print("\n".join(wrap(f"{spec.name} — {spec.description}" if spec.description else spec.name, hang="  ")))
    print(f"distribution: {spec.distribution}" + (f"; aliases: {', '.join(spec.aliases)}" if spec.aliases else ""))
    for role, present, options in (("source", spec.source, spec.source_options), ("sink", spec.sink, spec.sink_options)):
        if present:
            print()
            print(_render_options(f"{role} options:", options))
    return 0


def _render_options(title: str, options: Any) -> str:
    """An option set for ``describe``, wrapped to the terminal: per option its name with type,
    default and whether it is required, then its doc indented below."""
    from headrace.cli import wrap

    rows = options.rows()
    lines = [title]
    if not rows:
        lines.append("  (no options)")
    for r in rows:
        facts = [r["type"]] + (["required"] if r["required"] else []) + ([f"default {r['default']}"] if r["default"] else [])
        lines += wrap(f"{r['name']}  ({'; '.join(facts)})", indent="  ", hang="      ")
        if r["doc"]:
            lines += wrap(r["doc"], indent="      ")
    if options.rules:
        lines += wrap("rules: " + "; ".join(rule.doc for rule in options.rules), indent="  ", hang="    ")
    return "\n".join(lines)


def register(sub: Any) -> None:
    """Add ``connectors`` and ``describe`` to the ``headrace`` parser's subcommands."""
    from headrace.cli.plugins import add_connectors_options

    conn = sub.add_parser("connectors", help="list installed connectors")
    conn.set_defaults(fn=_connectors)
    add_connectors_options(conn)
    d = sub.add_parser("describe", help="show a connector's options")
    d.add_argument("name")
    d.set_defaults(fn=_describe)
